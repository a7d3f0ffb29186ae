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

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from specgen.engine import common_prefix
from specgen.sampling import SamplingParams, draw, support


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

NGRAM_MAX = 4  # as llama.cpp's lookup: measured better than 3 on copy-heavy prompts
# Beside a draft model, lookup offers matches of two tokens or more: a
# one-token match (a quote, a comma) is a guess the model makes better, and
# its rejected offers leave the model's cache lagging. Replayed on the bundled
# requests (benchmarks/policy_replay.py), reformat went from 1.03 to 1.06 of
# its best fixed k (worst seed 0.92 -> 0.97), the other categories 2-4 % lower.
ALONGSIDE_NGRAM_MIN = 2


def lookup_draft(tokens: Sequence[int], k: int, ngram_max: int = NGRAM_MAX, ngram_min: int = 1) -> list[int]:
    """Reference n-gram lookup (linear scan), the specification of PromptLookup.

    For n from ngram_max down to ngram_min: find the latest earlier occurrence
    of the last n tokens and propose the (up to k) tokens that followed it.
    """
    size = len(tokens)
    for n in range(ngram_max, ngram_min - 1, -1):
        if size <= n:
            continue
        suffix = list(tokens[size - n :])
        for start in range(size - n - 1, -1, -1):
            if list(tokens[start : start + n]) == suffix:
                return list(tokens[start + n : start + n + k])
    return []


class _NgramIndex:
    """Each n-gram → the end of its latest occurrence that has a following token."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, ...], int] = {}
        self.tokens: list[int] = []


class PromptLookup(PerSequence):
    """Prompt-lookup decoding with an incremental n-gram index per sequence (O(k) a round).

    A lookup of the context's own suffix finds the previous occurrence, never
    itself, because an n-gram is indexed only once a token follows it.
    """

    name = "lookup"
    free = True

    def __init__(self, ngram_max: int = NGRAM_MAX, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self._seqs: dict[int, _NgramIndex] = {}

    def begin(self, seq: int = 0) -> None:
        self._seqs[seq] = _NgramIndex()

    def _extend(self, state: _NgramIndex, context: Sequence[int]) -> None:
        seen = len(state.tokens)
        if len(context) < seen:  # not an extension: index afresh
            state.index.clear()
            state.tokens.clear()
            seen = 0
        state.tokens.extend(context[seen:])
        toks, index = state.tokens, state.index
        # Index n-grams ending at positions seen-1 … len-1 (exclusive ends
        # `end` with a continuation token toks[end] now known).
        for end in range(max(seen, 1), len(toks)):
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                index[tuple(toks[end - n : end])] = end

    def propose_one(self, context, k, params=None, rng=None, seq=0) -> Draft:  # noqa: ARG002
        state = self._seqs.get(seq)
        if state is None:
            state = self._seqs[seq] = _NgramIndex()
        self._extend(state, context)
        toks = state.tokens
        size = len(toks)
        if k <= 0:
            return Draft()
        for n in range(min(self.ngram_max, size - 1), self.ngram_min - 1, -1):
            end = state.index.get(tuple(toks[size - n :]))
            if end is not None:
                return Draft(toks[end : end + k], key=n)
        return Draft()


# -- draft model -------------------------------------------------------------

NORMAL_FEED = 2  # tokens a draft cache lags after a drafting round: its first draft step feeds them


class DraftModel:
    """A second, smaller GGUF model with its own context: drafts every sequence together.

    Per call: each sequence's cache keeps the prefix that still agrees with its
    context (rejected drafts drop out) and takes what is new, several
    sequences per decode (chunked to n_batch); then one token is drafted for
    every sequence still drafting per decode. The last drafted token is never
    fed: nothing would read its logits. After a drafting round the cache lags
    1–2 tokens, and feeding them is the first draft step; a larger lag (the
    prompt, or tokens settled while drafting was off) is a bulk catch-up,
    reported apart (`Draft.fed`, `Draft.fed_s`).
    """

    name = "draft"
    free = False

    def __init__(self, engine, n_shared: int, n_target_vocab: int, p_min: float = 0.0) -> None:
        self.engine = engine
        self.n_shared = n_shared  # ids both vocabularies have; rows are cut to it
        self.n_target_vocab = n_target_vocab  # q is padded to the target's p
        self.p_min = p_min  # stop drafting once the draft's top probability falls below this
        self.steps = 0  # draft-model decodes, for accounting and tests

    def begin(self, seq: int = 0) -> None:
        """Nothing to do: the next proposal keeps whatever cached prefix still agrees."""

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return max(len(context) - len(self.engine.kv_tokens(seq)), 0)

    def prefill(self, seq: int, context: Sequence[int]) -> Draft:
        """Read the context now (with the target's prompt, before the first token),
        so drafting starts without a catch-up; its cost is reported in `fed_s`."""
        d = Draft()
        self._catch_up([Want(seq, context, 1)], [d])
        return d

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        wants = list(wants)
        out = [Draft([], None if w.params.greedy else []) for w in wants]
        live = [i for i, w in enumerate(wants) if w.k > 0]
        if not live:
            return out
        rows = self._catch_up([wants[i] for i in live], [out[i] for i in live])
        step = 0
        while live:
            # a step's time is its decode and the work of picking each token
            # (a sampled pick over a 262k vocabulary costs milliseconds)
            t = time.perf_counter()
            feed, still = [], []
            for i in live:
                w, d = wants[i], out[i]
                logits = rows[w.seq][: self.n_shared]
                if step > 0 and self.p_min > 0.0 and top_prob(logits) < self.p_min:
                    continue
                if w.params.greedy:
                    tok = int(np.argmax(logits))
                else:
                    kept = support(logits, w.params)
                    q = np.zeros(self.n_target_vocab)
                    q[kept.ids] = kept.probs  # probs(logits) over the shared ids, zeros beyond
                    tok = draw(kept.ids, kept.probs, w.rng, len(q))  # sample(q), without its zeros
                    d.q.append(q)
                d.tokens.append(tok)
                if len(d.tokens) < w.k:  # the last drafted token is never fed
                    feed.append((w.seq, [tok], 1))
                    still.append(i)
            if feed:
                views = self.engine.decode_batch(feed)
                self.steps += 1
                rows = {seq: v[0] for (seq, _, _), v in zip(feed, views)}
                for i in still:
                    out[i].steps += 1
            dt = time.perf_counter() - t
            for i in live:
                out[i].step_s += dt
            live, step = still, step + 1
        return out

    def _catch_up(self, wants: list[Want], drafts: list[Draft]) -> dict[int, np.ndarray]:
        """Bring each sequence's cache up to its context; the logits of each context's last token."""
        eng = self.engine
        items = [(w.seq, w.context) for w in wants]
        fed = [len(ctx) - min(common_prefix(eng.kv_tokens(seq), ctx), len(ctx) - 1) for seq, ctx in items]
        t = time.perf_counter()
        rows = eng.sync_many(items)
        dt = time.perf_counter() - t
        self.steps += 1
        total = sum(fed)
        for n, d in zip(fed, drafts):
            share = dt * n / total
            if n > NORMAL_FEED:
                d.fed, d.fed_s = n, share
            else:  # the usual 1-2 tokens: this pass is the first draft step
                d.steps, d.step_s = 1, share
        return rows


def top_prob(logits: np.ndarray) -> float:
    """Probability of the most likely token under plain softmax."""
    m = float(logits.max())
    return 1.0 / float(np.exp(logits - m, dtype=np.float32).sum())


# -- a draft model with prompt lookup alongside -------------------------------


class WithLookup:
    """A draft model, with prompt lookup offering its free proposals first.

    Where the output copies the prompt (an answer quoting its passage, a
    reformatted table, edited code) lookup's proposals cost nothing to make and
    are accepted as often as the model's; elsewhere it has none, or poor ones.
    `offer` returns lookup's proposals; `propose` drafts with the model. The
    policy compares the two per round (`Policy.choose_offer`); a round that
    takes the offer leaves the model's cache a few tokens behind, fed in bulk
    the next time it drafts. llama.cpp runs its n-gram types before its draft
    model in a fixed order (`--spec-type ngram-mod,draft-simple`); here the
    choice is by expected tokens per second.
    """

    free = False

    def __init__(self, model, lookup: PromptLookup, model_max: int | None = None) -> None:
        self.model, self.lookup = model, lookup
        # the model's own ceiling on k: a copied run of text pays for longer
        # drafts than a model's steps do, so offers may reach further
        self.model_max = model_max
        self.name = f"{model.name}+lookup"
        self.translated = bool(getattr(model, "translated", False))

    @property
    def engine(self):
        return self.model.engine

    @property
    def steps(self) -> int:
        return self.model.steps

    def begin(self, seq: int = 0) -> None:
        self.model.begin(seq)
        self.lookup.begin(seq)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return self.model.lag(seq, context)

    def prefill(self, seq: int, context: Sequence[int]) -> Draft | None:
        """The model's prompt prefill; None for a model that reads its prompt on its first round."""
        prefill = getattr(self.model, "prefill", None)
        return prefill(seq, context) if prefill is not None else None

    def finish(self, seq: int, context: Sequence[int]) -> None:
        for part in (self.model, self.lookup):
            finish = getattr(part, "finish", None)
            if finish is not None:
                finish(seq, context)

    def offer(self, wants: Sequence[Want]) -> list[Draft]:
        return self.lookup.propose(wants)

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        return self.model.propose(wants)
