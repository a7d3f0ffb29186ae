"""Drafters: cheap proposers of the next few tokens, for one or many sequences.

One interface serves the single-sequence loop and the concurrent server alike
(as llama.cpp's speculative API takes a vector of per-sequence requests):
`propose(wants)` gets one `Want` per sequence drafting this step (its accepted
context, the last token of which the target has not scored yet, a length k,
its sampling parameters and rng) and returns one `Draft` each.

`Draft.q` carries, for a drafter that samples, the distribution each token was
drawn from (rejection sampling needs it; a `Support` over the target's ids, or
a dense row); None means the drafter had no
distribution (a point mass on each proposed token). A draft model also says
what its proposal cost: the drafting steps proper, and apart from them any
bulk catch-up of its cache (its prompt prefill, the tokens settled while it sat
out), so a policy never books a prefill as a draft step.

To add a drafter, subclass `PerSequence` (independent per-sequence state) or
`Drafter`, and declare what it can do beyond `propose` (`Drafter`'s docstring
lists the capabilities). A costly drafter may also `offer`
free proposals of another drafter (`WithLookup`: a draft model with prompt
lookup alongside); the policy then chooses, per round, the offer or the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specgen.rules.sampling import SamplingParams, Support


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
    q: list[Support | np.ndarray] | None = None  # a Support per token (or a dense row over the target's vocabulary)
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


class Drafter:
    """What every drafter is. Beyond `propose`, a drafter DECLARES what it can do,
    and the loop and the scheduler read these declarations (never probe for methods):

    - free: proposing costs (next to) nothing, so the loop drafts first and then
      chooses k from the proposal (prompt lookup, the suffix index); a costly
      drafter (a draft model) drafts after k is chosen;
    - prefills: it can read the prompt alongside the target, before the first
      token (`prefill`);
    - offers: it offers another drafter's free proposals first (`offer`), and the
      policy takes the offer or asks it to `propose`; `model_max` caps the k it
      drafts itself;
    - trees: it drafts trees (`propose_tree`);
    - translated: its drafts come through text from another vocabulary (point
      masses; its cache holds its own token ids, not the target's);
    - draft_picks: sampling, each drafted token is a pick over the target's whole
      vocabulary that its step timings leave out (a draft model's: the policy
      prices it apart, `engine.costs.pick_cost`); a drafter whose picks are
      over a small vocabulary inside its measured time (prediction heads), or
      that drafts point masses, does not;
    - engine: the draft model's engine (its cache per sequence), None for none;
    - policy_stats: acceptance statistics it carries across generations (a global
      suffix index), shared by the policies of a server's requests; None: each
      generation learns its own.
    """

    name = "drafter"
    free = True
    prefills = False
    offers = False
    trees = False
    translated = False
    draft_picks = False
    engine = None
    model_max: int | None = None
    policy_stats: dict | None = None

    def begin(self, seq: int) -> None:
        """A new generation starts on sequence `seq` (its context may not extend the last one)."""

    def lag(self, seq: int, context: Sequence[int]) -> int:
        """Tokens the drafter must feed before it can draft for this context (0 when free)."""
        return 0

    def finish(self, seq: int, context: Sequence[int]) -> None:
        """The generation on `seq` is over with this whole context (prompt and every
        emitted token); the loop calls it once."""

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        raise NotImplementedError

    def prefill(self, seq: int, context: Sequence[int]) -> Draft | None:
        """(prefills) Read the context now; its cost is reported in `fed_s`. None: it
        reads the prompt on its first drafting round instead."""
        raise NotImplementedError

    def offer(self, wants: Sequence[Want]) -> list[Draft]:
        """(offers) The free proposals offered before the costly drafter is asked."""
        raise NotImplementedError

    def propose_tree(self, context: Sequence[int], k: int, width: int, seq: int = 0):
        """(trees) A DraftTree of up to `width` branches and depth k."""
        raise NotImplementedError


class PerSequence(Drafter):
    """A free drafter whose sequences are independent: implement `propose_one`."""

    name = "per-sequence"

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        return [self.propose_one(w.context, w.k, w.params, w.rng, w.seq) for w in wants]

    def propose_one(self, context, k, params=None, rng=None, seq=0) -> Draft:
        raise NotImplementedError


