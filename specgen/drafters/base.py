"""Drafters: cheap proposers of the next few tokens, for one or many sequences.

One interface serves the single-sequence loop and the concurrent server alike
(as llama.cpp's speculative API takes a vector of per-sequence requests):
`propose(wants)` gets one `Want` per sequence drafting this step (its accepted
context, the last token of which the target has not scored yet, a length k,
its sampling parameters and rng) and returns one `Draft` each.

`Draft.q` carries, for a drafter that samples, the distribution each token was
drawn from (rejection sampling needs it); None means the drafter had no
distribution (a point mass on each proposed token). A draft model also says
what its proposal cost: the drafting steps proper, and apart from them any
bulk catch-up of its cache (its prompt prefill, the tokens settled while it sat
out), so a policy never books a prefill as a draft step.

To add a drafter, subclass `PerSequence` (independent per-sequence state) or
implement the four members of `Drafter`. A costly drafter may also `offer`
free proposals of another drafter (`WithLookup`: a draft model with prompt
lookup alongside); the policy then chooses, per round, the offer or the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from specgen.rules.sampling import SamplingParams


@dataclass
class Want:
    """One sequence's request for a draft."""

    seq: int
    context: Sequence[int]  # accepted tokens; the last is not scored by the target yet
    k: int
    params: SamplingParams = SamplingParams()
    rng: np.random.Generator | None = None


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] | None = None
    key: int = 0  # groups rounds of alike acceptance for a policy (lookup: match length)
    steps: int = 0  # draft-model passes that produced these tokens
    step_s: float = 0.0  # their time
    fed: int = 0  # tokens fed in bulk to bring the drafter's cache up to the context first
    fed_s: float = 0.0  # that catch-up's time (the draft's prompt prefill on the first round)
    # a drafter that reports it: this round's work outside model passes (a
    # translated draft's re-tokenizing); a cost policy then learns what its
    # drafting rounds really cost against its estimates. None: not reported.
    extra_s: float | None = None
    # a free drafter's evidence per token: (seen, total), how often its index saw the
    # match so far go on with this token, of all the ways it went on (policy.with_counts)
    counts: tuple[tuple[int, int], ...] = ()

    def cut(self, k: int) -> "Draft":
        d = Draft(self.tokens[:k], None if self.q is None else self.q[:k], self.key)
        d.steps, d.step_s, d.fed, d.fed_s, d.extra_s = self.steps, self.step_s, self.fed, self.fed_s, self.extra_s
        d.counts = self.counts[:k]
        return d


class Drafter(Protocol):
    name: str
    free: bool  # proposing costs (next to) nothing: draft first, then choose k

    def begin(self, seq: int) -> None:
        """A new generation starts on sequence `seq` (its context may not extend the last one)."""

    def lag(self, seq: int, context: Sequence[int]) -> int:
        """Tokens the drafter must feed before it can draft for this context (0 when free)."""

    # optional: finish(seq, context) -- the generation on `seq` is over with this
    # whole context (prompt and every emitted token); the loop calls it once

    def propose(self, wants: Sequence[Want]) -> list[Draft]: ...


class PerSequence:
    """A drafter whose sequences are independent: implement `propose_one`."""

    name = "per-sequence"
    free = True

    def begin(self, seq: int) -> None:
        pass

    def finish(self, seq: int, context: Sequence[int]) -> None:
        pass

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return 0

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        return [self.propose_one(w.context, w.k, w.params, w.rng, w.seq) for w in wants]

    def propose_one(self, context, k, params=None, rng=None, seq=0) -> Draft:
        raise NotImplementedError


# -- prompt lookup -----------------------------------------------------------


# -- draft model -------------------------------------------------------------


# -- a draft model with prompt lookup alongside -------------------------------


