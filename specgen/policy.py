"""Draft-length policies: how many drafted tokens to verify this round (0 … k_max).

Pure bookkeeping, no model calls. A policy sees each round's outcome through
`update` and answers `choose(key, limit)`. `key` groups rounds whose
acceptance behaves alike: for prompt lookup the length of the n-gram match
(a 3-gram match is accepted far more often than a 1-gram one), for a draft
model always 0.

- FixedK: always the limit (what `-k/--draft-max` means without --adaptive).
- Heuristic: transformers' schedule, k += 2 after a fully accepted round,
  k -= 1 otherwise.
- CostAware: estimates the acceptance probability at each draft position
  (per key) and the cost of verifying n rows, and picks the k that maximises
  expected tokens per second, k = 0 (a plain step) included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


def expected_tokens(alphas: Sequence[float]) -> float:
    """E[tokens per round] drafting len(alphas) tokens (Leviathan et al.).

    alphas[i]: probability that draft position i is accepted given the ones
    before it were; the round always adds the target's own token, so the
    result is 1 + Σ_j Π_{i<=j} alphas[i]. With one α at every position this
    is (1 − α^(k+1)) / (1 − α).
    """
    tokens = reach = 1.0
    for a in alphas:
        reach *= a
        tokens += reach
    return tokens


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """expected_tokens with the same acceptance α at each of k positions."""
    return expected_tokens([alpha] * max(k, 0))


class FixedK:
    name = "fixed"

    def choose(self, key: int, limit: int) -> int:
        return limit

    def update(self, key: int, k: int, accepted: int, verify_s: float, draft_s: float) -> None:
        pass


class Heuristic:
    name = "heuristic"

    def __init__(self, k_max: int, k_start: int = 4) -> None:
        self.k_max = k_max
        self.k = min(k_start, k_max)

    def choose(self, key: int, limit: int) -> int:
        return min(self.k, limit)

    def update(self, key: int, k: int, accepted: int, verify_s: float, draft_s: float) -> None:
        if k == 0:
            return
        self.k = min(self.k + 2, self.k_max) if accepted == k else max(self.k - 1, 1)


@dataclass
class _Acceptance:
    """Decayed counts of 'reached position i' and 'accepted at position i'."""

    prior: float
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def rates(self, k: int, strength: float = 2.0) -> list[float]:
        """α_0 … α_{k-1}. Each position's prior is the estimate of the one
        before it, so evidence at early positions speaks for unseen later ones."""
        out, prior = [], self.prior
        for i in range(k):
            r = self.reached[i] if i < len(self.reached) else 0.0
            a = self.accepted[i] if i < len(self.accepted) else 0.0
            prior = (a + strength * prior) / (r + strength)
            out.append(prior)
        return out

    def add(self, k: int, accepted: int, decay: float) -> None:
        while len(self.reached) < k:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        for i in range(len(self.reached)):
            self.reached[i] *= decay
            self.accepted[i] *= decay
        for i in range(min(accepted + 1, k)):  # positions the rule looked at
            self.reached[i] += 1.0
            if i < accepted:
                self.accepted[i] += 1.0


class CostAware:
    """Choose k to maximise expected tokens per second.

    E[tokens | k] = 1 + Σ_{j<=k} Π_{i<=j} α_i   (α_i: acceptance at position i
    given the earlier ones were accepted), cost(k) = verify(k + 1 rows) +
    k · draft step. verify costs start from a measured profile and follow the
    round times actually observed. Estimates decay, so a bad patch is
    forgotten; while nothing is drafted, each key's estimate drifts back
    toward its prior and a short probing draft is verified now and then, so
    drafting resumes when it pays again.
    """

    name = "cost"
    PROBE_AFTER = 16  # plain rounds in a row before a probing draft
    PROBE_K = 2

    def __init__(self, k_max: int, verify_s: list[float], draft_step_s: float = 0.0,
                 prior: float = 0.6, decay: float = 0.95) -> None:
        # verify_s[n] = seconds for a target pass with n logit rows (index 0 unused)
        self.k_max = k_max
        self.verify_s = list(verify_s)
        self.draft_step_s = draft_step_s
        self.prior = prior
        self.decay = decay
        self.stats: dict[int, _Acceptance] = {}
        self._idle: dict[int, int] = {}  # plain rounds in a row, per key

    def _acc(self, key: int) -> _Acceptance:
        if key not in self.stats:
            self.stats[key] = _Acceptance(prior=self.prior)
        return self.stats[key]

    def _verify(self, rows: int) -> float:
        v = self.verify_s
        if rows < len(v):
            return v[rows]
        # beyond the profile: extend linearly from its last two points
        return v[-1] + (rows - len(v) + 1) * (v[-1] - v[-2])

    def expected_rate(self, key: int, k: int) -> float:
        """Expected tokens per second if k tokens are drafted and verified."""
        tokens, reach = 1.0, 1.0
        for a in self._acc(key).rates(k):
            reach *= a
            tokens += reach
        return tokens / (self._verify(k + 1) + k * self.draft_step_s)

    def choose(self, key: int, limit: int) -> int:
        limit = min(limit, self.k_max)
        alphas = self._acc(key).rates(limit)
        best_k, best = 0, 1.0 / self._verify(1)
        tokens, reach = 1.0, 1.0
        for k in range(1, limit + 1):
            reach *= alphas[k - 1]
            tokens += reach
            r = tokens / (self._verify(k + 1) + k * self.draft_step_s)
            if r > best:
                best_k, best = k, r
        return self._explore(key, best_k, limit)

    def _explore(self, key: int, best_k: int, limit: int) -> int:
        """No evidence is gathered while not drafting: let estimates drift back
        to the prior, and (prompt lookup) after PROBE_AFTER plain rounds in a
        row verify a short draft anyway, so a policy that starts or ends up
        pessimistic can still learn that drafts pay."""
        if best_k > 0:
            self._idle[key] = 0
            return best_k
        acc = self._acc(key)
        for i in range(len(acc.reached)):
            acc.reached[i] *= self.decay
            acc.accepted[i] *= self.decay
        self._idle[key] = self._idle.get(key, 0) + 1
        # Only a free drafter (prompt lookup) probes. A draft model that has
        # sat out also has its cache to catch up, which the cost model does
        # not see: measured, its probes cost 10 % where drafting cannot pay.
        if self.draft_step_s == 0 and self._idle[key] >= self.PROBE_AFTER and limit > 0:
            self._idle[key] = 0
            return min(limit, self.PROBE_K)
        return 0

    def update(self, key: int, k: int, accepted: int, verify_s: float, draft_s: float) -> None:
        if k > 0:
            self._acc(key).add(k, accepted, self.decay)
            if draft_s > 0 and self.draft_step_s > 0:
                self.draft_step_s += 0.1 * (draft_s / k - self.draft_step_s)
        rows = k + 1
        if rows < len(self.verify_s) and verify_s > 0:
            self.verify_s[rows] += 0.1 * (verify_s - self.verify_s[rows])
