"""The draft–verify loop. It yields one `Round` per target pass and never prints.

Each round: the drafter proposes up to k tokens; the target scores
`[last, d1 … dk]` in one batch with logits on all k+1 rows; the acceptance
rule keeps a prefix of the draft and adds one token of the target's; the
target's cache drops the rejected tail. Plain decoding is the same loop with
k = 0, so both paths are measured by the same code.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from specgen.acceptance import accept_greedy, accept_sampled
from specgen.drafters import Draft, Drafter
from specgen.errors import SpecgenError
from specgen.policy import FixedK
from specgen.sampling import SamplingParams, probs, sample


@dataclass
class Round:
    """What one target pass settled."""

    tokens: list[int]  # emitted: accepted drafts first, then the target's own
    drafted: int  # tokens proposed this round
    accepted: int  # drafts kept by the acceptance rule
    draft_s: float  # time spent drafting
    verify_s: float  # time of the target pass and the acceptance rule


@dataclass
class Stats:
    """Counters and timings, as defined in DESIGN.md (vLLM / llama.cpp names)."""

    prompt_tokens: int = 0
    generated: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # rounds that drafted >= i+1
    accepted_at: list[int] = field(default_factory=list)  # drafts accepted at position i+1
    k_chosen: Counter = field(default_factory=Counter)  # draft length per round
    prefill_s: float = 0.0
    total_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    stop_reason: str = ""

    def add(self, r: Round) -> None:
        self.rounds += 1
        self.generated += len(r.tokens)
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.draft_s += r.draft_s
        self.verify_s += r.verify_s
        self.k_chosen[r.drafted] += 1
        while len(self.drafted_at) < r.drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(r.drafted):
            self.drafted_at[i] += 1
        for i in range(r.accepted):
            self.accepted_at[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return self.generated / self.rounds if self.rounds else 0.0

    @property
    def per_position(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.prefill_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first over the time after the first."""
        return (self.generated - 1) / self.decode_s if self.generated > 1 and self.decode_s > 0 else 0.0

    def timings(self) -> dict:
        return {
            "prefill_s": self.prefill_s,
            "ttft_s": self.prefill_s,
            "decode_s": self.decode_s,
            "total_s": self.total_s,
            "tokens_per_s": self.tokens_per_s,
        }

    def spec(self, draft_max: int) -> dict:
        return {
            "draft_max": draft_max,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_len": self.mean_accepted_len,
            "per_position": self.per_position,
            "k_hist": {str(k): n for k, n in sorted(self.k_chosen.items())},
        }


class _LazyRows:
    """rows[i] transformed on first use: the rule stops at the first rejection."""

    def __init__(self, rows: np.ndarray, fn) -> None:
        self._rows, self._fn, self._done = rows, fn, {}

    def __getitem__(self, i: int):
        if i not in self._done:
            self._done[i] = self._fn(self._rows[i])
        return self._done[i]


def _argmax(row: np.ndarray) -> int:
    return int(row.argmax())


class Generation:
    """One request through the loop. Iterate it for `Round`s; read `stats`.

    `tokens` holds what has been generated so far. If iteration is cut short
    (Ctrl-C), `stats.stop_reason` says "interrupted" and everything counted
    up to that point stays valid.
    """

    def __init__(
        self,
        target,
        prompt: Sequence[int],
        drafter: Drafter | None = None,
        *,
        draft_max: int = 8,
        max_tokens: int = 256,
        params: SamplingParams = SamplingParams(),
        ignore_eos: bool = False,
        seq: int = 0,
        policy=None,
    ) -> None:
        if not prompt:
            raise SpecgenError("empty prompt")
        if len(prompt) >= target.n_ctx:
            raise SpecgenError(
                f"prompt has {len(prompt)} tokens but the context holds {target.n_ctx} (raise -c/--ctx-size)"
            )
        if draft_max < 0:
            raise SpecgenError(f"draft length must be >= 1 (got {draft_max})")
        self.target = target
        self.prompt = list(prompt)
        self.drafter = drafter if draft_max > 0 else None
        self.draft_max = draft_max if drafter is not None else 0
        self.max_tokens = max_tokens
        self.params = params
        self.ignore_eos = ignore_eos
        self.seq = seq
        self.policy = policy or FixedK()
        self.tokens: list[int] = []
        self.stats = Stats(prompt_tokens=len(prompt))
        self.rng = np.random.default_rng(params.seed)

    # The target's processed row: a token id (greedy) or a distribution.
    def _pick(self, row: np.ndarray) -> int:
        if self.params.greedy:
            return _argmax(row)
        return sample(probs(row, self.params), self.rng)

    def _stop_after(self, tok: int) -> str:
        if not self.ignore_eos and self.target.is_eog(tok):
            return "eos"
        if len(self.tokens) >= self.max_tokens:
            return "max_tokens"
        return ""

    def _emit(self, emitted: list[int]) -> list[int]:
        """Append emitted tokens up to a stop; return those kept."""
        kept = []
        for tok in emitted:
            self.tokens.append(tok)
            kept.append(tok)
            reason = self._stop_after(tok)
            if reason:
                self.stats.stop_reason = reason
                break
        return kept

    # -- the loop, as steps: the single-sequence iterator below and a
    # -- multi-sequence server drive the same per-sequence state machine.
    def begin(self) -> None:
        """Start the clock; a fresh drafter state for this generation."""
        self._start = time.perf_counter()
        if self.drafter is not None:
            self.drafter.begin()
        self._context = list(self.prompt)

    @property
    def done(self) -> bool:
        return bool(self.stats.stop_reason)

    def first(self, row: np.ndarray) -> Round:
        """Round 1: the prompt's last row gives the first token."""
        st = self.stats
        tok = self._pick(row)
        st.prefill_s = time.perf_counter() - self._start
        r = Round(self._emit([tok]), 0, 0, 0.0, st.prefill_s)
        self._context.extend(r.tokens)
        return self._account(r)

    def plan(self) -> list[int] | None:
        """Draft this round; the tokens to verify, `[last, d1 … dk]`, or None when done."""
        if self.done:
            return None
        context, target = self._context, self.target
        base = len(context) - 1  # cached positions; context[-1] is unscored
        if base + 1 > target.n_ctx:
            self.stats.stop_reason = "context_full"
            return None
        limit = min(self.draft_max, self.max_tokens - len(self.tokens) - 1, target.n_ctx - base - 1)
        t0 = time.perf_counter()
        draft = Draft()
        if limit > 0:
            if self.drafter.free:  # see the proposal (and its key) before choosing k
                draft = self.drafter.propose(context, limit, self.params, self.rng)
                draft = draft.cut(self.policy.choose(draft.key, min(len(draft.tokens), limit)))
            else:
                k = self.policy.choose(0, limit)
                if k:
                    draft = self.drafter.propose(context, k, self.params, self.rng).cut(k)
        self._draft, self._base = draft, base
        self._t_planned = time.perf_counter()
        self._draft_s = self._t_planned - t0
        return [context[-1], *draft.tokens]

    def settle(self, rows: np.ndarray) -> Round:
        """Apply the acceptance rule to the verify rows; roll back the rejected tail."""
        draft, d = self._draft, self._draft.tokens
        if self.params.greedy:
            n_acc, nxt = accept_greedy(d, _LazyRows(rows, _argmax))
        else:
            p = _LazyRows(rows, lambda x: probs(x, self.params))
            n_acc, nxt = accept_sampled(d, p, draft.q, self.rng)
        if n_acc < len(d):
            self.target.truncate(self.seq, self._base + 1 + n_acc)
        emitted = self._emit(d[:n_acc] + [nxt])
        self._context.extend(emitted)
        verify_s = time.perf_counter() - self._t_planned
        self.policy.update(draft.key, len(d), n_acc, verify_s, self._draft_s)
        return self._account(Round(emitted, len(d), n_acc, self._draft_s, verify_s))

    def _account(self, r: Round) -> Round:
        self.stats.add(r)
        self.stats.total_s = time.perf_counter() - self._start
        return r

    def interrupt(self) -> None:
        """Mark the generation as cut short by the caller (e.g. Ctrl-C while printing)."""
        if not self.stats.stop_reason:
            self.stats.stop_reason = "interrupted"
        if hasattr(self, "_start"):
            self.stats.total_s = time.perf_counter() - self._start

    def __iter__(self) -> Iterator[Round]:
        self.begin()
        try:
            yield self.first(self.target.sync(self.seq, self.prompt))
            while (batch := self.plan()) is not None:
                yield self.settle(self.target.decode(self.seq, batch, len(batch)))
        except KeyboardInterrupt:
            self.interrupt()
            raise
