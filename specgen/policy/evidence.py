"""Acceptance evidence per draft position: the decayed counts the cost policy learns from.

`Acceptance` keeps, for one key (a match length, or the draft model), how often
each draft position was reached and accepted, and turns them into estimates: a
Beta per position whose prior is the estimate at the position before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

# A free key's position with less evidence than this many (decayed) rounds starts from
# the lower of the key's estimate at the position before and all free keys' evidence
# there (`Acceptance.pool`).
POOL_UNTIL = 2.0


@dataclass
class Acceptance:
    """Decayed counts of 'reached position i' and 'accepted at position i', with
    the posterior they give: a Beta per position, whose prior mean is the
    estimate at the position before (evidence at early positions speaks for
    unseen later ones) and whose prior weighs `strength` rounds. Where a position
    has less evidence than POOL_UNTIL rounds and `pool` holds a figure for it
    (what all keys of its drafter met there), its prior mean is the lower of the two."""

    prior: float
    strength: float = 2.0
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    # per position, what all the keys of its drafter met there (`CostAware._free_pool`;
    # None where none reached it)
    pool: Sequence[float | None] = ()

    def rates(self, k: int, z: float = 0.0) -> list[float]:
        """α_0 … α_{k-1}: the posterior means (z = 0), or each shifted by z of its
        posterior's standard deviation (a normal approximation of the Beta),
        the same z at every position."""
        out, prior, s, pool = [], self.prior, self.strength, self.pool
        for i in range(k):
            r = self.reached[i] if i < len(self.reached) else 0.0
            a = self.accepted[i] if i < len(self.accepted) else 0.0
            if 0 < i < len(pool) and pool[i] is not None and r < POOL_UNTIL:
                prior = min(prior, pool[i])
            mean = (a + s * prior) / (r + s)
            if z:
                sd = math.sqrt(mean * (1.0 - mean) / (r + s + 1.0))
                out.append(min(max(mean + z * sd, 0.0), 1.0))
            else:
                out.append(mean)
            prior = mean
        return out

    def add(self, k: int, accepted: int, decay: float, fade_unseen: bool = True) -> None:
        """One round's evidence: positions 1 … accepted reached and accepted, the next
        reached and rejected. The positions it reaches fade by `decay` first, and
        those past them too unless `fade_unseen` is False."""
        while len(self.reached) < k:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        seen = min(accepted + 1, k)  # positions the rule looked at
        for i in range(len(self.reached) if fade_unseen else seen):
            self.reached[i] *= decay
            self.accepted[i] *= decay
        for i in range(seen):
            self.reached[i] += 1.0
            if i < accepted:
                self.accepted[i] += 1.0

    def forget(self, decay: float) -> None:
        for i in range(len(self.reached)):
            self.reached[i] *= decay
            self.accepted[i] *= decay
