"""Drafting with a feature-level layer (specgen.drafters.layer): on a fake engine with layers
whose weights are set by hand (what it reads, where, its cache across rounds and rollbacks),
sampled losslessness by chi-square with a negative control, the file, and on the real model:
greedy output equals plain under the near-tie rule, and `specgen run --heads` drafts with it."""

from dataclasses import replace

import numpy as np
import pytest
from fakes import HiddenFakeEngine, chain_table, squared_q
from helpers import specgen
from test_heads_drafter import SV, position_pvalues

from specgen.decode.generation import Generation
from specgen.drafters.base import Want
from specgen.drafters.layer import LayerDrafter
from specgen.heads.layer import FeatureLayer, init_params
from specgen.policy.base import FixedK
from specgen.rules.sampling import SamplingParams

V = 16


class OneHot(FeatureLayer):
    """A layer on the fake engine (n_embd = n_vocab): tokens embed as one-hot rows."""

    def embed(self, tokens):
        return np.eye(self.n_embd, dtype=np.float32)[np.asarray(tokens, dtype=np.int64).reshape(-1)]


def hand_layer(table, reads: str, n_heads=4, rng=None, ids=None) -> OneHot:
    """A layer whose feature is the input it `reads` ("token": the embedding of the token
    it is given; "hidden": the hidden row) and whose readout is the fake target's table,
    so it drafts the target's own greedy text ("token") or the token it was given
    ("hidden"); with `rng`, every weight random instead (a valid, poor drafter)."""
    n = table.shape[0]
    ids = np.arange(n) if ids is None else np.asarray(ids)
    p = init_params(n, 8, 8, rng or np.random.default_rng(0))
    if rng is None:
        p["w_in"] = np.zeros((2 * n, n), np.float32)
        half = slice(n, 2 * n) if reads == "token" else slice(0, n)
        p["w_in"][half] = np.eye(n, dtype=np.float32)
        p["wo"][:] = 0.0
        p["w2"][:] = 0.0
    return OneHot(p, ids, table[:, ids].T.copy(), n, "fake", head_dim=4, window=6, n_heads=n_heads)


def run(target, prompt, drafter, k, n=24, params=SamplingParams(), policy=None):
    gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, params=replace(params, ignore_eos=True),
                     policy=policy or FixedK())
    for _ in gen:
        pass
    return gen


class Recording(LayerDrafter):
    """The layer drafter, keeping each round's context and the positions its cache held after it."""

    def __init__(self, target, layer):
        super().__init__(target, layer)
        self.rounds = []  # (context, cached positions, tokens those positions read, draft)

    def propose(self, wants):
        out = super().propose(wants)
        for w, d in zip(wants, out):
            kv, read, _ = self._state.get(w.seq, (None, [], None))
            self.rounds.append((list(w.context), [] if kv is None else kv.pos.tolist(), list(read), d.tokens))
        return out


def test_a_layer_that_reads_the_token_drafts_the_targets_text_and_every_draft_is_accepted():
    eng = HiddenFakeEngine(chain_table(V))
    d = Recording(eng, hand_layer(chain_table(V), "token"))
    gen = run(eng, [5, 9, 3], d, k=6)
    assert gen.tokens == [(4 + i) % V for i in range(24)]
    st = gen.stats
    assert st.accepted == st.drafted > 0 and st.per_position[0] == 1.0
    assert all(len(dr) <= 4 for *_, dr in d.rounds)  # k capped at the layer's n_heads
    for context, pos, read, _ in d.rounds:
        n = len(context)
        assert pos[-1] == n - 2 and pos == list(range(pos[0], n - 1))  # caught up to n-2, no gap
        assert len(pos) <= 6  # its window
        assert read == [context[p + 1] for p in pos]  # position p read token p + 1


def test_the_first_draft_comes_from_the_row_at_n_minus_2():
    """A layer that reads only the hidden row drafts, first, the target's pick from the row
    at n-2: the context's last token (so it is rejected every round, and plain text results)."""
    eng = HiddenFakeEngine(chain_table(V))
    d = Recording(eng, hand_layer(chain_table(V), "hidden"))
    gen = run(eng, [5, 9, 3], d, k=3)
    assert gen.tokens == [(4 + i) % V for i in range(24)]
    assert d.rounds and all(dr[0] == c[-1] for c, _, _, dr in d.rounds)
    assert gen.stats.accepted == 0


def test_a_context_that_no_longer_extends_the_cache_cuts_it_where_they_part():
    eng = HiddenFakeEngine(chain_table(V))
    d = LayerDrafter(eng, hand_layer(chain_table(V), "token"))
    ctx = [1, 2, 3, 4, 5, 6]
    eng.sync(0, ctx[:-1])
    eng.decode(0, [ctx[-1]], 1)
    eng.truncate(0, 0)
    eng.decode(0, ctx, len(ctx))  # every row has its hidden state
    d.propose([Want(0, ctx + [7], 2)])
    kv, read, _ = d._state[0]
    assert kv.pos.tolist() == [0, 1, 2, 3, 4, 5] and read == [2, 3, 4, 5, 6, 7]
    eng.truncate(0, 4)  # the target rolls back: positions 4, 5 leave
    eng.decode(0, [9, 10], 2)
    out = d.propose([Want(0, [1, 2, 3, 4, 9, 10, 11], 2)])
    kv, read, _ = d._state[0]
    assert kv.pos.tolist() == [0, 1, 2, 3, 4, 5] and read == [2, 3, 4, 9, 10, 11]  # 3 on: read again
    assert out[0].tokens == [12, 13]
    d.hidden_history = eng.hidden_history = 0  # now without the rows of earlier decodes: a gap starts it over
    eng.decode(0, [11], 1)
    eng.decode(0, [12], 1)
    d.propose([Want(0, [1, 2, 3, 4, 9, 10, 11, 12, 13], 2)])
    kv, read, _ = d._state[0]
    assert kv.pos.tolist() == [7] and read == [13]


def test_a_missing_row_at_n_minus_2_drafts_nothing():
    eng = HiddenFakeEngine(chain_table(V))
    d = LayerDrafter(eng, hand_layer(chain_table(V), "token"))
    eng.sync(0, [1, 2, 3])  # a prefill: only its last row (position 2) has a hidden state
    assert d.propose([Want(0, [1, 2, 3, 4, 5], 3)])[0].tokens == []  # the row at 3 is not there
    assert d.propose([Want(0, [1, 2, 3, 4], 3)])[0].tokens == [5, 6, 7]


# -- sampled losslessness ---------------------------------------------------------------


SquaredQ = squared_q(LayerDrafter)


def _positions(cls):
    rng = np.random.default_rng(3)
    table = (1.5 * rng.standard_normal((SV, SV))).astype(np.float32)
    layer = hand_layer(table, "", n_heads=3, rng=np.random.default_rng(4), ids=[0, 1, 2, 4, 5])  # 3 never drafted
    return position_pvalues(table, lambda eng: cls(eng, layer), 3)


def test_sampled_layer_drafts_emit_the_targets_distribution_at_positions_1_to_5():
    pvalues = _positions(LayerDrafter)
    assert min(pvalues) > 1e-4, pvalues


def test_chi_square_catches_a_layer_reporting_the_wrong_q():
    pvalues = _positions(SquaredQ)
    assert min(pvalues) < 1e-6, pvalues


# -- the file and the real model -------------------------------------------------------------


def real_layer(path, n_ids=4096, extra=()):
    """An untrained layer for the real target (random weights over its output rows): valid, poor."""
    from specgen.heads.collect import output_rows
    from specgen.heads.model import target_identity

    ids = np.unique(np.concatenate([np.arange(n_ids), np.asarray(list(extra), np.int64)])).astype(np.int32)
    out = output_rows(path, ids)
    from test_heads_drafter import gguf_n_vocab

    layer = FeatureLayer(init_params(out.shape[1], 64, 64, np.random.default_rng(0)), ids, out, gguf_n_vocab(path),
                         target_identity(path), head_dim=32, window=64, n_heads=3, info={"heldout": {"top1": [0.3]}})
    layer.model_path = str(path)
    return layer


@pytest.mark.model
def test_a_layer_file_round_trips_through_open_heads(gemma_path, tmp_path):
    from specgen.session import open_heads

    layer = real_layer(gemma_path, n_ids=64)
    f = tmp_path / "layer.npz"
    layer.save(f)
    back = open_heads(str(f), gemma_path)
    assert back.kind == "layer" and back.model_path == str(gemma_path) and back.n_heads == 3 and back.window == 64
    assert np.array_equal(back.ids, layer.ids) and back.info == layer.info
    for k, v in layer.params.items():
        np.testing.assert_allclose(back.params[k], v, rtol=1e-3, atol=1e-4)  # kept as float16
    np.testing.assert_allclose(back.embed([5, 70000]), layer.embed([5, 70000]), rtol=1e-6)


@pytest.mark.model
def test_layer_greedy_equals_plain(gemma_path):
    from test_heads_drafter import N_REAL
    from test_model import PROMPTS, assert_equal_or_near_tie, plain_run

    from specgen.engine.llama import Engine

    with Engine(gemma_path, n_ctx=1024, n_threads=2, hidden=True) as eng:
        prompts = [eng.tokenize(p) for p in PROMPTS[:2]]
        layer = real_layer(gemma_path, extra=[t for p in prompts for t in p])
        drafted = 0
        for prompt in prompts:
            plain, top2 = plain_run(eng, prompt, n=N_REAL)
            spec = Generation(eng, prompt, LayerDrafter(eng, layer), draft_max=3, max_tokens=N_REAL, policy=FixedK(),
                              params=SamplingParams(ignore_eos=True))
            rounds = list(spec)
            assert_equal_or_near_tie(plain, top2, spec.tokens)
            assert all(r.drafted > 0 for r in rounds[1:-1])  # every round found its rows
            drafted += spec.stats.drafted
        assert drafted > 0


@pytest.mark.model
def test_run_with_a_layer_file_drafts_with_it(gemma_path, tmp_path):
    import json
    import subprocess

    f = tmp_path / "layer.npz"
    real_layer(gemma_path, n_ids=2048).save(f)
    res = specgen("run", "-m", str(gemma_path), "--heads", str(f), "-k", "3", "-n", "24", "--ignore-eos",
                  "--json", "Once upon a time", text=True, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["mode"] == "heads" and out["generated_tokens"] == 24
    assert out["spec"]["drafted"] > 0 and len(out["spec"]["per_position"]) == 3
