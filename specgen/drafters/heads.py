"""Prediction heads (Medusa, Hydra): small networks over the target's own final
hidden state that draft the next few tokens, for every sequence at once.

With a context of n tokens the target has scored positions 0 … n-2, and
context[n-1] was picked from row n-2: so a round reads that row's hidden
state (`target.hidden_at(seq, n - 2)`, kept by an Engine opened with
hidden=True) and the token picked from it, and head i drafts the token at
position n + i. All sequences drafting in a step go through the heads as one
(B, n_embd) batch: one `begin`, then one `step` (and `advance`) per head.

The heads' logits range over a restricted vocabulary (`heads.ids`, target
ids). Greedy: each head's argmax. Sampling: the same transforms as a draft
model's (temperature, top-k, top-p, min-p) over those logits give q, zero
outside `ids`, which rides with the draft to rejection sampling (as a
`Support`: the ids it keeps), so the output stays distributed exactly as the
target's.

The picks are over the small `ids` and their time is inside the round's
measured time (`Draft.step_s`, `steps` = heads run), so the loop charges no
full-vocabulary pick per drafted token for them (`draft_picks` is False).
Trees are not drafted: a tree's branches keep no hidden rows.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specgen.drafters.base import Draft, Drafter, Want
from specgen.heads.model import sampled_pick


class HeadsDrafter(Drafter):
    """Drafts with prediction heads over the target's hidden state (see the module)."""

    name = "heads"
    free = False
    draft_picks = False

    def __init__(self, target, heads) -> None:
        self.target = target  # an Engine opened with hidden=True (hidden_at)
        self.heads = heads  # specgen.heads.model.Heads (kind, n_heads, ids, n_vocab, begin/step/advance)
        self.model_max = int(heads.n_heads)  # no more tokens a round than it has heads
        self.ids = np.asarray(heads.ids, dtype=np.int64)
        self.n_vocab = int(target.n_vocab)  # q is as long as the target's p
        self.steps = 0  # head evaluations, for accounting and tests

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        wants = list(wants)
        out = [Draft([], None if w.params.greedy else []) for w in wants]
        live, rows = [], []
        for i, w in enumerate(wants):
            if min(w.k, self.model_max) <= 0 or len(w.context) < 2:
                continue
            h = self.target.hidden_at(w.seq, len(w.context) - 2)
            if h is None:  # no hidden row for this context (not scored by the last pass): no draft
                continue
            live.append(i)
            rows.append(h)
        if not live:
            return out
        t = time.perf_counter()
        ks = [min(wants[i].k, self.model_max) for i in live]
        last = np.array([wants[i].context[-1] for i in live], dtype=np.int64)
        state = self.heads.begin(np.stack(rows).astype(np.float32, copy=False), last)
        for j in range(max(ks)):
            logits, state = self.heads.step(state, j)
            self.steps += 1
            chosen = self.ids[np.argmax(logits, axis=1)]
            for b, i in enumerate(live):
                if j >= ks[b]:
                    continue
                w, d = wants[i], out[i]
                if not w.params.greedy:
                    chosen[b], q = sampled_pick(logits[b], self.ids, w.params, w.rng, self.n_vocab)
                    d.q.append(q)
                d.tokens.append(int(chosen[b]))
            if j + 1 < max(ks):
                state = self.heads.advance(state, chosen)
        dt = time.perf_counter() - t
        for b, i in enumerate(live):
            # the round's whole time, per head run: the policy prices a head's step from it
            out[i].steps, out[i].step_s = ks[b], dt
        return out
