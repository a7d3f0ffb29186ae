"""Draft-length policies: how many drafted tokens to verify this round (0 … k_max).

Pure bookkeeping, no model calls. A policy sees each round's outcome through
`update` and answers `choose(key, limit, situation)`. `key` groups rounds whose
acceptance behaves alike: for prompt lookup the length of the n-gram match
(a 3-gram match is accepted far more often than a 1-gram one), for a draft
model always 0. `Situation` says what else the round holds: a drafter's cache
to catch up first, the tokens left, and in a shared server step the other
sequences' rows.

- FixedK: always the limit (what `-k/--draft-max` means without --adaptive).
- Heuristic: transformers' schedule, k += 2 after a fully accepted round,
  k -= 1 otherwise.
- CostAware: the k (0 included) that maximises expected tokens per second
  under the measured costs, deciding by Thompson sampling over its acceptance
  estimates (below).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specgen.rules.trees import DraftTree


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


def unused_offer_outcome(offer: Sequence[int], emitted: Sequence[int]) -> tuple[int, int]:
    """What a free drafter's offer, left unverified this round, would have met:
    (positions the acceptance rule would have reached, of them accepted),
    judged against the tokens the round emitted. Where the offer parts from
    them it would have been rejected there; where it runs past them, nothing
    is known. The emitted token at each position follows the target's
    distribution (greedy: its argmax; sampled: the lossless rule's output),
    so matching it has the offer's acceptance probability: the same evidence
    a verified offer gives, for free."""
    n = min(len(offer), len(emitted))
    j = 0
    while j < n and offer[j] == emitted[j]:
        j += 1
    return (j + 1, j) if j < n else (n, n)


def verify_cost(curve: Sequence[float], rows: int) -> float:
    """Seconds of a target pass with `rows` logit rows; curve[n] measured for n < len(curve)
    (index 0 unused), extended linearly beyond by its mean slope over the last 4 rows
    (one period of the CPU curve's sawtooth: `costs.ROW_POINTS`; the last two points
    alone may fall)."""
    if rows < len(curve):
        return curve[rows]
    span = min(4, len(curve) - 2)  # measured points only (index 0 is unused) ...
    slope = (curve[-1] - curve[-1 - span]) / span if span > 0 else curve[-1]  # ... or one: as 0 to it
    return curve[-1] + (rows - len(curve) + 1) * max(slope, 0.0)


def shaped_cost(curve: Sequence[float], rows: int, group: int) -> float:
    """A shared step's cost when it will be brought to a multiple of `group` rows
    (`generation.fit_rows` lengthens or cuts drafts to a whole block): interpolated
    between the multiples around `rows`, not read off the CPU curve's sawtooth
    (5 rows cost 1.5x 4, and 8 about as much as 5), which would price the first
    drafted row of a full block as if the step stopped there."""
    if group <= 1 or rows % group == 0 or rows < group:
        return verify_cost(curve, rows)
    lo = rows - rows % group
    a, b = verify_cost(curve, lo), verify_cost(curve, lo + group)
    return a + (b - a) * (rows - lo) / group


@dataclass(frozen=True)
class Situation:
    """What a round holds besides this sequence's own draft."""

    lag: int = 0  # tokens the drafter must feed in bulk before it drafts (a draft model's catch-up)
    remaining: int = 1 << 30  # tokens this generation may still emit
    others_rows: int = 0  # rows the rest of a shared step holds
    others_tokens: float = 0.0  # tokens the rest of that step is expected to emit
    # a free drafter's evidence for this offer, per drafted token: (seen, total), how often
    # its index saw the match so far go on with that token, of all the ways it went on
    # (`with_counts`); () for none. Never a draft model's.
    counts: tuple[tuple[int, int], ...] = ()
    # a shared step is brought to a multiple of this many rows after planning
    # (`generation.fit_rows`), so its rows are priced between those multiples
    row_group: int = 1


ALONE = Situation()
# The weight, in earlier occurrences, of the policy's measured acceptance against
# the index's counts along one draft (`with_counts`). The suffix drafter sends no
# counts by default: replayed, they chose worse lengths (docs/notes/2026-11-drafting-and-policy.md).
COUNTS_STRENGTH = 1.0


def with_counts(rates: Sequence[float], counts: Sequence[tuple[int, int]],
                strength: float = COUNTS_STRENGTH) -> list[float]:
    """One draft's acceptance per position: each measured rate (the policy's estimate
    for the draft's key) weighs `strength` occurrences as a prior, updated by the
    index's counts at that step of the drafted path, (seen, total):
    (seen + strength · rate) / (total + strength). A step without counts keeps its
    rate. A draft whose every step the index saw many times, always alike, is
    trusted long; one the index saw once leans on the key's measured rate."""
    out = list(rates)
    for i, (seen, total) in enumerate(counts[: len(out)]):
        if total > 0:
            out[i] = (seen + strength * out[i]) / (total + strength)
    return out


MODEL_KEY = 0  # a draft model's rounds; prompt lookup's keys are its match lengths (>= 1)


def step_rate(alphas: Sequence[float], k: int, curve: Sequence[float], draft_step_s: float,
              situation: Situation = ALONE, pick_s: float = 0.0, round_scale: float = 1.0) -> float:
    """Expected tokens per second of a step in which this sequence verifies k drafts:
    (others' tokens + E) / ((verify(others' rows + k + 1) + k · draft step) · [k > 0: round_scale] + E · pick),
    E = E[tokens | k]. Alone, this is Leviathan's speedup model with a measured
    verify curve; in a shared step, extra rows buy fewer tokens than they cost
    everyone once the machine saturates. `pick_s`: the host's work to turn one
    row of logits into a sampled token (sampling only); the acceptance rule
    reads about E of the target's rows. `round_scale`: how much more a drafting
    round's verify and draft steps really take (a translated draft's re-tokenizing)."""
    s = situation
    e = expected_tokens(alphas[:k])
    return (s.others_tokens + e) / (
        (shaped_cost(curve, s.others_rows + k + 1, s.row_group if s.others_rows else 1) + k * draft_step_s)
        * (round_scale if k else 1.0) + e * pick_s
    )


class Policy:
    """The interface, with a plain acceptance tally for `expected_tokens`."""

    name = "policy"

    def __init__(self) -> None:
        self._drafted = self._accepted = 0
        self.pick_s, self.draft_picks = 0.0, False

    def choose(self, key: int, limit: int, situation: Situation = ALONE) -> int:
        raise NotImplementedError

    def choose_offer(self, key: int, offered: int, limit: int, situation: Situation = ALONE) -> tuple[int, bool]:
        """A free drafter offers `offered` tokens (its proposal's key `key`); a
        draft model could draft up to `limit`. Returns (k, take the offer).
        Here the offer goes first whenever there is one (llama.cpp's order of
        its speculative types); 0 for `limit` means no model to fall back on."""
        if offered > 0:
            return self.choose(key, offered, situation), True
        return (self.choose(MODEL_KEY, limit, situation) if limit > 0 else 0), False

    def update(self, key: int, k: int, accepted: int, verify_s: float | None = None, draft=None) -> None:
        """A round's outcome. verify_s: the target pass's time when it was this
        sequence's alone (None in a shared step); draft: the Draft verified
        (its own cost accounting), None when nothing was drafted."""
        self._drafted += k
        self._accepted += accepted

    def observe(self, key: int, reached: int, accepted: int) -> None:
        """Evidence about a free drafter's key from an offer this round did not
        verify (`unused_offer_outcome`); no time was spent on it."""

    def prefill_pays(self, lag: int, remaining: int) -> bool:
        """Should a draft model read `lag` tokens of prompt now, to draft over the
        `remaining` tokens? A policy without a cost model always drafts."""
        return True

    def target_top(self, top: float) -> None:
        """Sampling: the target's processed distribution, at a row a token was
        just emitted from, put `top` on its likeliest token."""

    def sampling(self, pick_s: float, draft_picks: bool) -> None:
        """The generation samples: picking a token from one row of logits costs
        `pick_s` seconds of host time, for the target's rows and, with
        `draft_picks`, for each drafted token (a cost model counts it)."""
        self.pick_s, self.draft_picks = pick_s, draft_picks

    def shape_tree(self, tree: DraftTree, k: int, width: int) -> DraftTree:
        """The nodes of `tree` (its main branch already cut to k) worth verifying:
        the main branch alone for a policy that keeps no verify curve."""
        return tree.keep(range(min(k, len(tree))))

    def expected_tokens(self, key: int, k: int) -> float:
        """Tokens a round of k drafts is expected to emit (for planning a shared step)."""
        alpha = self._accepted / self._drafted if self._drafted else 0.5
        return expected_tokens_per_round(alpha, k)


class FixedK(Policy):
    name = "fixed"

    def choose(self, key: int, limit: int, situation: Situation = ALONE) -> int:
        return limit


class Heuristic(Policy):
    name = "heuristic"

    def __init__(self, k_max: int, k_start: int = 4) -> None:
        super().__init__()
        self.k_max = k_max
        self.k = min(k_start, k_max)

    def choose(self, key: int, limit: int, situation: Situation = ALONE) -> int:
        return min(self.k, limit)

    def update(self, key: int, k: int, accepted: int, verify_s: float | None = None, draft=None) -> None:
        super().update(key, k, accepted)
        if k:
            self.k = min(self.k + 2, self.k_max) if accepted == k else max(self.k - 1, 1)


