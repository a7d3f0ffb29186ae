"""A draft model: a second, smaller GGUF with its own context, and prompt lookup alongside it."""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specgen.drafters.base import Draft, Drafter, Want
from specgen.drafters.lookup import PromptLookup
from specgen.engine.llama import common_prefix
from specgen.plan import NORMAL_FEED
from specgen.rules.sampling import Support, draw, support


class DraftModel(Drafter):
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
    prefills = True
    draft_picks = True

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
                    kept = support(logits, w.params)  # over the shared ids; zero beyond them
                    tok = draw(kept.ids, kept.probs, w.rng, self.n_target_vocab)  # sample(q), without its zeros
                    d.q.append(Support(kept.ids, kept.probs, self.n_target_vocab))
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


class WithLookup(Drafter):
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
    offers = True

    def __init__(self, model: Drafter, lookup: PromptLookup, model_max: int | None = None) -> None:
        self.model, self.lookup = model, lookup
        # the model's own ceiling on k: a copied run of text pays for longer
        # drafts than a model's steps do, so offers may reach further
        self.model_max = model_max
        self.name = f"{model.name}+lookup"
        self.prefills = model.prefills
        self.translated = model.translated
        self.draft_picks = model.draft_picks
        self.engine = model.engine

    @property
    def steps(self) -> int:
        return self.model.steps

    def begin(self, seq: int = 0) -> None:
        self.model.begin(seq)
        self.lookup.begin(seq)

    def lag(self, seq: int, context: Sequence[int]) -> int:
        return self.model.lag(seq, context)

    def prefill(self, seq: int, context: Sequence[int]) -> Draft | None:
        return self.model.prefill(seq, context)

    def finish(self, seq: int, context: Sequence[int]) -> None:
        self.model.finish(seq, context)
        self.lookup.finish(seq, context)

    def offer(self, wants: Sequence[Want]) -> list[Draft]:
        return self.lookup.propose(wants)

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        return self.model.propose(wants)
