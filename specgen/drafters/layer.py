"""A feature-level draft layer (EAGLE-style, specgen.heads.layer) over the target's
own hidden rows: one small decoder layer, autoregressive over its own features.

Layer position p reads the target's hidden row h_p (the row that picked token
p + 1) and the embedding of context[p + 1], and predicts h_{p+1}; the target's
output matrix, restricted to the layer's `ids`, reads the next token out of it.
With a context of n tokens the target has scored positions 0 … n-2, so a round:

1. catches up: positions the layer has not read yet, up to n-2, from the
   target's true rows (`hidden_at`; the Engine keeps `hidden_history` rows of
   the steps the layer sat out), appended to the sequence's attention cache
   (`Kv`, the last `window` positions);
2. drafts: the feature at n-2 gives the first token; each further token runs the
   layer one position on, its input the predicted feature and the token just
   drafted, over a copy of the cache that is thrown away after the round.

The cache keeps only positions read from true rows, so a rejected draft leaves
nothing to roll back; a rollback of the target (a context that no longer
extends the one the layer read) cuts the cache to the positions that still
agree, and a gap in the rows (no hidden row for a position it needs) starts it
over from the rows there are.

Greedy: each step's argmax. Sampling: the heads' transforms over the layer's
logits give q over `ids` (a `Support`), so rejection sampling keeps the output
distributed as the target's. The round's time, catch-up included, is reported
as its steps' time (`Draft.step_s`, `steps` = tokens drafted), as the heads'.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specgen.drafters.base import Draft, Drafter, Want
from specgen.heads.layer import Kv
from specgen.heads.model import sampled_pick


class LayerDrafter(Drafter):
    """Drafts with a trained FeatureLayer over the target's hidden rows (see the module)."""

    name = "layer"
    free = False
    draft_picks = False

    def __init__(self, target, layer) -> None:
        self.target = target  # an Engine opened with hidden=True
        self.layer = layer  # specgen.heads.layer.FeatureLayer
        self.model_max = int(layer.n_heads)
        self.ids = np.asarray(layer.ids, dtype=np.int64)
        self.n_vocab = int(target.n_vocab)
        target.hidden_history = max(target.hidden_history, int(layer.window))
        # per sequence: its cache, the token each cached position read, the feature at the last
        self._state: dict[int, tuple[Kv, list[int], np.ndarray]] = {}
        self.steps = 0  # layer positions run while drafting, for accounting and tests

    def begin(self, seq: int) -> None:
        self._state.pop(seq, None)

    def finish(self, seq: int, context: Sequence[int]) -> None:
        self._state.pop(seq, None)

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        out = []
        for w in wants:
            t = time.perf_counter()
            k = min(w.k, self.model_max)
            f = self._catch_up(w.seq, w.context) if k > 0 and len(w.context) >= 2 else None
            if f is None:
                out.append(Draft([], None if w.params.greedy else []))
                continue
            d = self._draft(w, f, k)
            d.steps, d.step_s = k, time.perf_counter() - t
            out.append(d)
        return out

    def _catch_up(self, seq: int, context: Sequence[int]) -> np.ndarray | None:
        """The layer's feature at position n-2 of the context, its cache brought up to it
        from the target's rows; None when the target has no row at n-2."""
        last, window = len(context) - 2, int(self.layer.window)
        kv, read, f = self._state.get(seq, (Kv.empty(self.layer.params, self.layer.head_dim), [], None))
        agree = 0  # cached positions whose token the context still has, up to `last`
        while agree < len(kv) and kv.pos[agree] <= last and read[agree] == context[kv.pos[agree] + 1]:
            agree += 1
        if agree < len(kv):
            kv, read, f = kv.keep(agree), read[:agree], None
        if len(kv) and f is None and kv.pos[-1] == last:  # cut right after the last: run it again
            kv, read = kv.keep(len(kv) - 1), read[:-1]
        start = int(kv.pos[-1]) + 1 if len(kv) else max(0, last - window + 1)
        if start > last:
            return f
        rows, p = [], last
        while p >= start and (h := self.target.hidden_at(seq, p)) is not None:
            rows.append(h)
            p -= 1
        if not rows:
            return None
        if p >= start:  # a gap: start over from the rows there are
            kv, read = Kv.empty(self.layer.params, self.layer.head_dim), []
        pos = np.arange(p + 1, last + 1)
        toks = [int(context[q + 1]) for q in pos]
        f, kv = self.layer.run(kv, np.stack(rows[::-1]), toks, pos)
        self.steps += len(pos)
        read = read + toks
        if len(kv) > window:
            kv, read = kv.last(window), read[-window:]
        self._state[seq] = (kv, read, f)
        return f

    def _draft(self, w: Want, f: np.ndarray, k: int) -> Draft:
        """k tokens from the feature at n-2, the layer run on over a throwaway copy of the cache."""
        layer = self.layer
        kv = self._state[w.seq][0]
        d = Draft([], None if w.params.greedy else [])
        pos = len(w.context) - 1
        for j in range(k):
            logits = (f @ layer.out.T)[0]
            if w.params.greedy:
                tok = int(self.ids[int(np.argmax(logits))])
            else:
                tok, q = sampled_pick(logits, self.ids, w.params, w.rng, self.n_vocab)
                d.q.append(q)
            d.tokens.append(tok)
            if j + 1 < k:
                f, kv = layer.run(kv, f, [tok], [pos + j])
                self.steps += 1
        return d
