"""Whether a step that several sequences share drafts at all: measured, not modelled.

Each request's policy chooses its k from a cost model of one sequence's
verify pass. In a step that several sequences share, that model is weakest:
on a CPU the step's rows already use the arithmetic, and the others' rows
change what one more row costs. So the server lets the evidence decide, per
bucket of step sizes (2, 3–4, 5–8, 9+ sequences): it keeps decayed tallies of
the tokens settled and the wall time (planning, the target pass, settling) of
shared steps that drafted as the policies chose, and of shared steps that
drafted nothing, and gives each new shared step to the arm whose throughput,
drawn from its posterior, is higher (Thompson sampling; a normal approximation
of the ratio of sums). Drafting that loses is switched off within a few dozen
steps and then only probed now and then (the losing arm's tallies fade, its
spread grows back), so a change of workload is found again; drafting that
pays keeps its steps. A sequence alone in its step is not gated: its policy
measures its own passes.

`drafts(n, prefill=True)` says no: a server that plans a step with a prompt
beside as a plain one asks so (SchedulerSettings.prefill_drafts off); by default
it asks as for a shared step without the prompt and prices the drafts without
the prompt's rows. Pure bookkeeping: the scheduler (specgen.serve.scheduler) asks `drafts`
before it plans a step and reports a shared step without prefill with
`observe`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BUCKETS = (2, 3, 5, 9)  # lower bounds of the step-size buckets: 2, 3–4, 5–8, 9+


def bucket(sequences: int) -> int:
    """The bucket of a step with `sequences` generating sequences (-1: alone, not gated)."""
    found = -1
    for i, low in enumerate(BUCKETS):
        if sequences >= low:
            found = i
    return found


@dataclass
class Tally:
    """Decayed sums over steps: how many, tokens, seconds, and their second moments."""

    n: float = 0.0
    tok: float = 0.0
    sec: float = 0.0
    tok2: float = 0.0
    sec2: float = 0.0
    toksec: float = 0.0
    seen: int = 0  # steps observed, undecayed (the warm-up count)

    def add(self, tokens: float, seconds: float) -> None:
        self.n += 1.0
        self.tok += tokens
        self.sec += seconds
        self.tok2 += tokens * tokens
        self.sec2 += seconds * seconds
        self.toksec += tokens * seconds
        self.seen += 1

    def fade(self, decay: float) -> None:
        self.n *= decay
        self.tok *= decay
        self.sec *= decay
        self.tok2 *= decay
        self.sec2 *= decay
        self.toksec *= decay

    @property
    def rate(self) -> float:
        """Tokens per second over the tallied steps (ratio of sums: the throughput)."""
        return self.tok / self.sec if self.sec > 0 else 0.0

    def spread(self) -> float:
        """Standard deviation of `rate` (delta method: the residual t − R·s over the
        steps, divided by √n and the mean step time)."""
        if self.n <= 0 or self.sec <= 0:
            return math.inf
        r = self.rate
        resid = max(self.tok2 - 2.0 * r * self.toksec + r * r * self.sec2, 0.0) / self.n
        return math.sqrt(resid / self.n) / (self.sec / self.n)


class StepGate:
    """Per step-size bucket, two arms, "draft" (as the policies say) and "plain"
    (nothing drafted); Thompson sampling over their measured tokens per second.

    warmup: steps each arm gets in a bucket before the draws decide (drafting
    first). decay: how much a bucket's tallies keep at each step observed in it
    (both arms: the unplayed arm's evidence fades, so it is probed again).
    floor: the least relative spread a draw keeps (the machine's load moves
    every step's time; a long run of steps never makes an arm certain).
    """

    def __init__(self, *, warmup: int = 3, decay: float = 0.98, floor: float = 0.02, seed: int = 0) -> None:
        self.warmup = warmup
        self.decay = decay
        self.floor = floor
        self.rng = np.random.default_rng(seed)
        self.tallies = [(Tally(), Tally()) for _ in BUCKETS]  # (draft, plain) per bucket
        self.steps = [[0, 0] for _ in BUCKETS]  # shared steps given to (draft, plain), per bucket

    def drafts(self, sequences: int, prefill: bool = False) -> bool:
        """May a step of `sequences` generating sequences draft? Alone: yes, unless
        the step also prefills a prompt. A step that prefills drafts nothing: its
        prefill rows cost the step's time either way, so the policies' view of
        the step (its tokens per second) sees drafts as nearly free there, while
        each verify row costs an LM-head pass that prefill rows skip (measured:
        docs/notes/2026-11-drafting-and-policy.md)."""
        if prefill:
            return False
        b = bucket(sequences)
        if b < 0:
            return True
        draft, plain = self.tallies[b]
        if draft.seen < self.warmup or plain.seen < self.warmup:
            choice = draft.seen <= plain.seen
        else:
            choice = self._draw(draft) > self._draw(plain)
        self.steps[b][0 if choice else 1] += 1
        return choice

    def _draw(self, t: Tally) -> float:
        sd = max(t.spread(), self.floor * t.rate)
        return t.rate + sd * float(self.rng.standard_normal())

    def observe(self, sequences: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A shared step's outcome: did it draft, tokens settled over all its sequences, wall time."""
        b = bucket(sequences)
        if b < 0 or seconds <= 0:
            return
        draft, plain = self.tallies[b]
        draft.fade(self.decay)
        plain.fade(self.decay)
        (draft if drafted else plain).add(tokens, seconds)

    def summary(self) -> dict:
        """Per bucket with any steps: steps given to each arm and each arm's current rate."""
        out = {}
        for low, (draft, plain), (nd, npl) in zip(BUCKETS, self.tallies, self.steps):
            if nd or npl:
                out[str(low)] = {"draft_steps": nd, "plain_steps": npl,
                                 "draft_tok_s": draft.rate, "plain_tok_s": plain.rate}
        return out
