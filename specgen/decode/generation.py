"""The draft–verify loop. It yields one `Round` per target pass and never prints.

Each round: the drafter proposes up to k tokens; the target scores
`[last, d1 … dk]` in one batch with logits on all k+1 rows; the acceptance
rule keeps a prefix of the draft and adds one token of the target's; the
target's cache drops the rejected tail. Plain decoding is the same loop with
k = 0, so both paths are measured by the same code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from specgen.rules.acceptance import accept_greedy, accept_sampled
from specgen.decode.stats import Round, Stats
from specgen.drafters.base import Draft, Drafter, Want
from specgen.errors import SpecgenError
from specgen.plan import NORMAL_FEED
from specgen.policy.base import MODEL_KEY, FixedK, Situation, unused_offer_outcome
from specgen.rules.sampling import SamplingParams, sample, support


# Prompt tokens a target pass reads at a time while progress is reported
# (Generation.read_prompt): a few seconds' worth on a CPU, a small share of a pass's work.
PREFILL_CHUNK = 256


class LazyRows:
    """rows[i] transformed on first use: the rule stops at the first rejection."""

    def __init__(self, rows: np.ndarray, fn) -> None:
        self._rows, self._fn, self._done = rows, fn, {}

    def __getitem__(self, i: int):
        if i not in self._done:
            self._done[i] = self._fn(self._rows[i])
        return self._done[i]


def argmax(row: np.ndarray) -> int:
    return int(row.argmax())


@dataclass(frozen=True)
class Planned:
    """One sequence's round as planned (`Generation.plan`), for `Generation.settle`."""

    draft: Draft  # what the round verifies
    rows: list[int]  # the tokens of its verify rows: [last, d1 … dk]
    base: int  # positions cached when it was planned
    draft_s: float  # drafting time (a shared step's: all its sequences')
    unused: Draft | None  # a free offer passed over: its key learns from what the round emits
    t: float  # when it was planned: verify time counts from here


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
            raise SpecgenError(f"draft length must be >= 0 (got {draft_max})")
        self.target = target
        self.prompt = list(prompt)
        self.drafter = drafter if draft_max > 0 else None
        self.draft_max = draft_max if drafter is not None else 0
        self.max_tokens = max_tokens
        self.params = params
        self.seq = seq
        self.policy = policy or FixedK()
        # told (tokens read, prompt tokens) while a long prompt is read: set it before
        # iterating (Session.generate(on_prefill=...) does)
        self.on_prefill: Callable[[int, int], None] | None = None
        if self.drafter is not None and not params.greedy:
            from specgen.engine.costs import pick_cost

            # a full-vocabulary pick per drafted token where the drafter declares one (a draft model)
            self.policy.sampling(pick_cost(target.n_vocab, params), draft_picks=self.drafter.draft_picks)
        self.tokens: list[int] = []
        self.context: list[int] | None = None  # prompt + emitted tokens, from begin()
        self._start: float | None = None
        self._finished = False
        self.stats = Stats(prompt_tokens=len(prompt))
        # The target's picks draw one uniform per emitted token from `rng` (plain, and
        # point-mass drafts by sample-and-compare), so a seed gives the same text with
        # or without such drafts; a drafter that samples draws from its own stream.
        seeds = np.random.SeedSequence(params.seed)
        self.rng = np.random.default_rng(seeds)  # the stream of default_rng(seed)
        self.draft_rng = np.random.default_rng(seeds.spawn(1)[0])

    # The target's processed row: a token id (greedy) or a distribution.
    def _pick(self, row: np.ndarray) -> int:
        if self.params.greedy:
            return argmax(row)
        return sample(support(row, self.params), self.rng)

    def _stop_after(self, tok: int) -> str:
        if not self.params.ignore_eos and self.target.is_eog(tok):
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

    # -- the loop, as steps: the single-sequence iterator below and the
    # -- concurrent server drive the same per-sequence state machine
    # -- (begin → first → [limit → plan → settle]*), drafting through plan_step.
    def begin(self) -> None:
        """Start the clock; a fresh drafter state for this generation."""
        self._start = time.perf_counter()
        if self.drafter is not None:
            self.drafter.begin(self.seq)
        self.context = list(self.prompt)

    def prefill_draft(self) -> None:
        """A draft model reads the prompt alongside the target, before the first
        token (as llama.cpp's speculative examples do), when the policy expects
        drafting to pay that back over this generation; otherwise it catches up
        later, if ever, under the same rule."""
        d = self.drafter
        if d is None or not d.prefills:
            return
        lag = d.lag(self.seq, self.context)
        if lag <= NORMAL_FEED or not self.policy.prefill_pays(lag, self.max_tokens):
            return
        draft = d.prefill(self.seq, self.context)
        if draft is None:  # this drafter reads the prompt on its first drafting round
            return
        self.policy.update(draft.key, 0, 0, None, draft)  # learns the cost of a bulk feed
        self.stats.draft_fed += draft.fed
        self.stats.draft_prefill_s += draft.fed_s + (draft.extra_s or 0.0)  # a translated draft's re-tokenizing too

    def read_prompt(self) -> np.ndarray:
        """The target reads the prompt (what its cache already holds is kept); the
        last token's row. With `on_prefill`, a long prompt is read in chunks of
        PREFILL_CHUNK tokens and each is reported, so a caller can show progress."""
        total = len(self.prompt)
        if self.on_prefill is None or total <= PREFILL_CHUNK:
            return self.target.sync(self.seq, self.prompt)
        from specgen.engine.llama import common_prefix

        done = common_prefix(self.target.kv_tokens(self.seq), self.prompt)
        for end in range(done + PREFILL_CHUNK, total, PREFILL_CHUNK):
            self.target.sync(self.seq, self.prompt[:end])
            self.on_prefill(end, total)
        row = self.target.sync(self.seq, self.prompt)
        self.on_prefill(total, total)
        return row

    @property
    def text(self) -> str:
        """What has been generated so far, as text."""
        return self.target.detokenize(self.tokens)

    @property
    def done(self) -> bool:
        return bool(self.stats.stop_reason)

    def first(self, row: np.ndarray) -> Round:
        """Round 1: the prompt's last row gives the first token."""
        st = self.stats
        if self.params.greedy or self.drafter is None:
            tok = self._pick(row)
        else:
            p = support(row, self.params)
            tok = sample(p, self.rng)
            self.policy.target_top(p.max())
        st.prefill_s = time.perf_counter() - self._start
        r = Round(self._emit([tok]), 0, 0, 0.0, st.prefill_s)
        self.context.extend(r.tokens)
        return self._account(r)

    def limit(self) -> int | None:
        """The longest draft this round may verify; None when the generation is over."""
        if self.done:
            return None
        base = len(self.context) - 1  # cached positions; context[-1] is unscored
        if base + 1 > self.target.n_ctx:
            self.stats.stop_reason = "context_full"
            return None
        if self.drafter is None:
            return 0
        return max(0, min(self.draft_max, self.max_tokens - len(self.tokens) - 1, self.target.n_ctx - base - 1))

    def situation(self, others_rows: int = 0, others_tokens: float = 0.0, counts=(), row_group: int = 1) -> Situation:
        lag = self.drafter.lag(self.seq, self.context) if self.drafter is not None else 0
        return Situation(lag, self.max_tokens - len(self.tokens), others_rows, others_tokens, tuple(counts), row_group)

    def choose(self, offer: Draft, lim: int, situation: Situation) -> tuple[int, bool]:
        """This round's k within `lim`, and whether the free `offer` is taken (else
        the draft model drafts k): the policy's choice (`Policy.choose_offer`)."""
        if lim <= 0:
            return 0, True
        d = self.drafter
        offered = min(len(offer.tokens), lim)
        model_limit = 0 if d.free else min(lim, d.model_max or lim)
        return self.policy.choose_offer(offer.key, offered, model_limit,
                                        replace(situation, counts=tuple(offer.counts[:offered])))

    def plan(self, draft: Draft, draft_s: float = 0.0, unused: Draft | None = None) -> Planned:
        """This round's draft, planned: its verify rows `[last, d1 … dk]` and what
        `settle` reads. `unused`: a free offer the round passed over (its key
        learns from what the round emits, `Policy.observe`)."""
        return Planned(draft, [self.context[-1], *draft.tokens], len(self.context) - 1, draft_s, unused,
                       time.perf_counter())

    def settle(self, planned: Planned, rows: np.ndarray, shared: bool = False) -> Round:
        """Apply the acceptance rule to the verify rows; roll back the rejected tail.

        shared: the target pass held other sequences too, so its time is not
        this round's verify cost."""
        draft, d = planned.draft, planned.draft.tokens
        if self.params.greedy:
            n_acc, nxt = accept_greedy(d, LazyRows(rows, argmax))
        else:
            # the target's rows by the tokens they keep: a dense row is never built
            p = LazyRows(rows, lambda x: support(x, self.params))
            n_acc, nxt = accept_sampled(d, p, draft.q, self.rng)
            for i in range(n_acc + 1):  # the rows the rule emitted from (it computed them)
                self.policy.target_top(float(p[i].max()))
        if n_acc < len(d):
            self.target.truncate(self.seq, planned.base + 1 + n_acc)
        emitted = self._emit(d[:n_acc] + [nxt])
        self.context.extend(emitted)
        verify_s = time.perf_counter() - planned.t
        self.policy.update(draft.key, len(d), n_acc, None if shared else verify_s, draft if draft.steps or draft.fed else None)
        if planned.unused is not None:
            self.policy.observe(planned.unused.key, *unused_offer_outcome(planned.unused.tokens, emitted))
        self.stats.draft_fed += draft.fed
        self.stats.draft_prefill_s += draft.fed_s
        return self._account(Round(emitted, len(d), n_acc, planned.draft_s, verify_s))

    def _account(self, r: Round) -> Round:
        self.stats.add(r)
        self.stats.total_s = time.perf_counter() - self._start
        if self.done:
            self._finish()
        return r

    def _finish(self) -> None:
        """Tell the drafter the whole context once the generation is over (a global
        suffix index remembers it, final round included)."""
        if self.drafter is not None and not self._finished:
            self._finished = True
            self.drafter.finish(self.seq, self.context)

    def want(self, k: int) -> Want:
        return Want(self.seq, self.context, k, self.params, self.draft_rng)

    def interrupt(self) -> None:
        """Mark the generation as cut short by the caller (e.g. Ctrl-C while printing)."""
        if not self.stats.stop_reason:
            self.stats.stop_reason = "interrupted"
        if self._start is not None:
            self.stats.total_s = time.perf_counter() - self._start
        if self.context is not None:
            self._finish()

    def next_round(self) -> Planned | None:
        """One sequence's round, planned top to bottom: a free offer first (prompt
        lookup, alone or beside a model), then k, then the model's draft if the
        policy asked for it. None when the generation is over. (Many sequences
        sharing a pass plan through `plan_step`, with the same steps.)"""
        lim = self.limit()
        if lim is None:
            return None
        t0 = time.perf_counter()
        d, offer = self.drafter, Draft()
        if lim > 0 and (d.free or d.offers):
            offer = (d.propose if d.free else d.offer)([self.want(lim)])[0]
        k, take = self.choose(offer, lim, self.situation()) if lim > 0 else (0, True)
        draft = offer.cut(k) if take else d.propose([self.want(k)])[0].cut(k) if k > 0 else Draft()
        return self.plan(draft, time.perf_counter() - t0, passed_over(offer, k, take))

    def __iter__(self) -> Iterator[Round]:
        self.begin()
        try:
            row = self.read_prompt()
            self.prefill_draft()
            yield self.first(row)
            while (planned := self.next_round()) is not None:
                rows = self.target.decode(self.seq, planned.rows, len(planned.rows))
                yield self.settle(planned, rows)
        except KeyboardInterrupt:
            self.interrupt()
            raise


def passed_over(offer: Draft, k: int, take: bool) -> Draft | None:
    """A free offer the round did not verify (the model drafted, or k = 0): it still
    teaches its key."""
    return offer if offer.tokens and (k == 0 or not take) else None


def plan_step(gens: Sequence[Generation], drafter: Drafter | None, busy_rows: int = 0,
              row_group: int = 1, max_rows: int | None = None) -> list[Planned | None]:
    """Plan one target pass for generations that share `drafter` (a server's step):
    each one's `Planned` round, or None for one that is over. Each sequence takes
    the steps of `Generation.next_round`; here they are interleaved so a costly
    drafter drafts every sequence together.

    A free drafter (prompt lookup) proposes first, so a policy sees the
    proposal and its key before it cuts k; a costly one (a draft model) drafts
    after every k is chosen, all sequences together. A draft model with free
    offers alongside (`WithLookup`) does both: the offers first, then each
    policy takes its offer or asks the model (`Policy.choose_offer`). Each
    policy is told the rest of the step: `busy_rows` already spoken for
    (prefill chunks), the rows and expected tokens of the sequences planned
    before it, one row and one token for each after it.

    row_group > 1, in a shared step (several sequences, or prefill rows
    beside): the step's rows are brought to a multiple of it where the drafts
    allow (`fit_rows`). max_rows: the step's rows stay within it (each sequence
    keeps one row; a policy's limit is what the sequences before it left).
    """
    limits = [g.limit() for g in gens]
    if drafter is None:  # a step without drafting (the gate kept it plain): one row each
        limits = [None if lim is None else 0 for lim in limits]
    live = [(g, lim) for g, lim in zip(gens, limits) if lim is not None]
    offers: list[Draft] = [Draft() for _ in live]
    t0 = time.perf_counter()
    free = drafter is not None and drafter.free
    if free or (drafter is not None and drafter.offers):
        asks = [i for i, (g, lim) in enumerate(live) if lim > 0]
        wants = [live[i][0].want(live[i][1]) for i in asks]
        for i, d in zip(asks, drafter.propose(wants) if free else drafter.offer(wants)):
            offers[i] = d
    rows, tokens = busy_rows, 0.0
    picks: list[tuple[int, bool]] = []
    group = row_group if len(live) + (busy_rows > 0) > 1 else 1  # fit_rows shapes shared steps only
    for i, (g, lim) in enumerate(live):
        later = len(live) - i - 1
        if max_rows is not None:
            lim = max(0, min(lim, max_rows - rows - 1 - later))
            live[i] = (g, lim)
        k, take = g.choose(offers[i], lim, g.situation(rows + later, tokens + later, row_group=group))
        picks.append((k, take))
        rows += k + 1
        tokens += g.policy.expected_tokens(offers[i].key if take else MODEL_KEY, k)
    if row_group > 1 and len(live) + (busy_rows > 0) > 1:
        picks = fit_rows(live, offers, picks, busy_rows, row_group)
    drafts = [d.cut(k) if take else Draft() for d, (k, take) in zip(offers, picks)]
    asks = [i for i, (k, take) in enumerate(picks) if k > 0 and not take]
    if asks:
        for i, d in zip(asks, drafter.propose([live[i][0].want(picks[i][0]) for i in asks])):
            drafts[i] = d.cut(picks[i][0])
    draft_s = time.perf_counter() - t0
    unused = [passed_over(o, k, take) for o, (k, take) in zip(offers, picks)]
    planned = iter(g.plan(d, draft_s, u) for (g, _), d, u in zip(live, drafts, unused))
    return [next(planned) if lim is not None else None for lim in limits]


def fit_rows(live, offers: list[Draft], picks: list[tuple[int, bool]], busy_rows: int,
             group: int) -> list[tuple[int, bool]]:
    """A shared step's draft lengths moved so its rows are a multiple of `group`.

    llama.cpp's CPU matmuls on repacked weights take a batch's rows in gemm
    blocks of 4 and send the 1-3 left over through gemv one row at a time,
    each about as dear as a whole block (measured:
    docs/notes/2026-11-serving-knobs.md). So a step of 4m + r rows gets up
    to 4 - r more drafted tokens where free offers hold them (cheaper and
    more tokens), else drops r drafted tokens: those each adds the fewest
    expected tokens. Steps under one group, and draft-model drafts (not yet
    drawn), are only cut.
    """
    ks = [k for k, _ in picks]
    total = busy_rows + sum(k + 1 for k in ks)
    r = total % group
    if r == 0 or total < group:
        return picks

    def key(i: int) -> int:
        return offers[i].key if picks[i][1] else MODEL_KEY

    def more(i: int, k: int) -> float:  # expected tokens the k-th drafted token adds
        pol = live[i][0].policy
        return pol.expected_tokens(key(i), k) - pol.expected_tokens(key(i), k - 1)

    room = [min(len(offers[i].tokens), lim) - ks[i] if picks[i][1] else 0 for i, (_, lim) in enumerate(live)]
    if sum(max(x, 0) for x in room) >= group - r:
        for _ in range(group - r):
            i = max((i for i in range(len(ks)) if room[i] > 0), key=lambda i: more(i, ks[i] + 1))
            ks[i] += 1
            room[i] -= 1
    elif sum(ks) >= r:
        for _ in range(r):
            i = min((i for i in range(len(ks)) if ks[i] > 0), key=lambda i: more(i, ks[i]))
            ks[i] -= 1
    return [(k, take) for k, (_, take) in zip(ks, picks)]
