"""Training a feature-level draft layer (specgen.heads.layer_fit, `specgen heads train --kind layer`):
the trainer learns, the whole run on the real model writes a layer file that drafts, and bad
options are one line."""

import subprocess

import numpy as np
import pytest
from helpers import specgen

from specgen.drafters.base import Want
from specgen.heads.layer_fit import LayerOptions, LayerTrainer, fit_layer

TINY = dict(chunk=16, attn=16, head_dim=8, mlp=16, batch=2, reply_tokens=24, writers=2, check_every=5, lr=3e-3)


def test_the_trainer_learns_a_rule_the_features_carry():
    """Labels are a fixed function of the token a position reads: the held-out loss and
    top-1 must move from chance towards it (they cannot without working gradients)."""
    rng = np.random.default_rng(0)
    n, t, d, v = 40, 16, 16, 12
    tokens = rng.integers(0, v, (n, t)).astype(np.int32)
    picks = ((tokens * 5 + 3) % v).astype(np.int32)  # the target's pick after token x: (5x + 3) mod v
    hidden = rng.standard_normal((n, t, d)).astype(np.float16)
    keep = np.ones((n, t), bool)
    table = rng.standard_normal((v, d)).astype(np.float32)
    ids = np.arange(v)
    trainer = LayerTrainer((tokens, picks, hidden, keep), table.copy(), ids, lambda x: table[np.asarray(x)],
                           LayerOptions(**{**TINY, "max_steps": 150}))
    held = np.arange(30, 40)
    before = np.mean([x for c in held for x in trainer.hits(int(c), step2=False)[0]])
    params, score, interrupted = fit_layer(trainer, np.arange(30), held, deadline=float("inf"))
    trainer.p = params
    after = np.mean([x for c in held for x in trainer.hits(int(c), step2=False)[0]])
    assert not interrupted and trainer.steps == 150
    assert before < 0.3 and after > 0.8, (before, after)


@pytest.mark.parametrize("prompt_labels", [True, False])
def test_prompt_positions_are_trained_on_only_when_asked_and_never_checked(prompt_labels):
    """A step's loss moves with the labels of the prompt's positions (keep False) only under
    prompt_labels; the held-out check reads reply positions either way."""
    rng = np.random.default_rng(1)
    n, t, d, v = 4, 16, 16, 12
    tokens = rng.integers(0, v, (n, t)).astype(np.int32)
    picks = rng.integers(0, v, (n, t)).astype(np.int32)
    hidden = rng.standard_normal((n, t, d)).astype(np.float16)
    keep = np.arange(t)[None].repeat(n, 0) >= 8  # the first 8 positions are the prompt's
    table = rng.standard_normal((v, d)).astype(np.float32)
    other = picks.copy()
    other[~keep] = (other[~keep] + 1) % v  # other labels on the prompt's positions only

    def first_step(labels):
        tr = LayerTrainer((tokens, labels, hidden, keep), table.copy(), np.arange(v), lambda x: table[np.asarray(x)],
                          LayerOptions(**{**TINY, "prompt_labels": prompt_labels}))
        return tr.step(np.arange(2)), len(tr.hits(0, step2=False)[0])

    (a, rows_a), (b, rows_b) = first_step(picks), first_step(other)
    assert rows_a == rows_b == int(keep[0, 1:-1].sum())
    assert (a != b) if prompt_labels else (a == b), (a, b)


@pytest.mark.model
def test_training_on_the_real_model_writes_a_layer_that_drafts(gemma_path, tmp_path):
    from specgen.drafters.layer import LayerDrafter
    from specgen.engine.llama import Engine
    from specgen.heads.layer_fit import train_layer
    from specgen.session import open_heads

    out = tmp_path / "layer.npz"
    seen = []  # a budget of 3 s, which the replies and their reading overrun: training still gets its floor
    with Engine(gemma_path, n_ctx=512, n_threads=2, hidden=True) as eng:
        s = train_layer(eng, gemma_path, LayerOptions(**{**TINY, "minutes": 0.05, "max_steps": 6, "min_chunks": 4}), out=out,
                        seeds=["Write a haiku about rain.", "List three fruits."], on_progress=seen.append)
        assert s["kind"] == "layer" and s["steps"] == 6 and s["positions"] > 0 and s["replies"] >= 1
        assert {p.phase for p in seen} >= {"replies", "reading", "train"}
        layer = open_heads(str(out), gemma_path)
        assert layer.kind == "layer" and layer.window == 15 and layer.info["heldout"]["positions"] >= 0
        toks = eng.tokenize("The capital of France is")
        eng.truncate(0, 0)
        eng.decode(0, toks[:-1], len(toks) - 1)
        d = LayerDrafter(eng, layer).propose([Want(0, toks, 3)])
        assert len(d[0].tokens) == 3 and all(0 <= t < eng.n_vocab for t in d[0].tokens)


@pytest.mark.model
def test_resuming_a_layer_continues_it_on_its_kept_data_and_new_replies(gemma_path, tmp_path):
    """--resume: the layer's own shapes win over the options, its parameters are where
    training starts, and the data of the first run is kept beside the file and trained
    on again, first (so the same chunks stay held out), with the new replies after it."""
    from dataclasses import replace

    from specgen.engine.llama import Engine
    from specgen.heads.layer_fit import data_path, train_layer
    from specgen.session import open_heads

    out = tmp_path / "layer.npz"
    opts = LayerOptions(**{**TINY, "minutes": 0.05, "max_steps": 4, "min_chunks": 4})
    seeds = ["Write a haiku about rain.", "List three fruits."]
    with Engine(gemma_path, n_ctx=512, n_threads=2, hidden=True) as eng:
        a = train_layer(eng, gemma_path, opts, out=out, seeds=seeds)
        with np.load(data_path(out)) as z:
            first_tokens = z["tokens"]
        before = open_heads(str(out), gemma_path)
        b = train_layer(eng, gemma_path, replace(opts, mlp=8, chunk=32), out=out, seeds=seeds, resume=True)
    after = open_heads(str(out), gemma_path)
    assert not a.get("resumed") and b["resumed"] and b["runs"] == 2 and b["steps"] == 4 and b["total_steps"] == 8
    assert after.width == before.width == 16 and after.window == 15  # the file's shapes, not the options'
    np.testing.assert_array_equal(after.ids, before.ids)
    moved = max(float(np.abs(after.params[k] - before.params[k]).max()) for k in after.params)
    assert 0 < moved < 0.02  # 4 warm-up steps on from the first run's weights, not a fresh start
    with np.load(data_path(out)) as z:
        assert len(z["tokens"]) > len(first_tokens)
        np.testing.assert_array_equal(z["tokens"][:len(first_tokens)], first_tokens)
    assert b["positions"] > a["positions"]


def test_a_resumed_run_samples_new_replies():
    from specgen.heads.layer import FeatureLayer, init_params
    from specgen.heads.layer_fit import resumed_options

    p = init_params(8, 16, 12, np.random.default_rng(0))
    old = FeatureLayer(p, np.arange(4), np.zeros((4, 8)), 10, "t", head_dim=8, window=31, n_heads=3, info={"runs": 2})
    o = resumed_options(old, LayerOptions(chunk=256, mlp=2048, attn=256, seed=5))
    assert (o.chunk, o.attn, o.mlp, o.head_dim, o.n_heads) == (32, 16, 12, 8, 3) and o.seed == 7


@pytest.mark.model
@pytest.mark.parametrize("args, says", [
    (["--kind", "layer", "--resume"], "heads file not found"),
    (["--kind", "hydra", "--writer", "x.gguf"], "--writer writes the replies of --kind layer only"),
    (["--kind", "layer", "--n-heads", "0"], "--n-heads between 1 and 8"),
])
def test_bad_layer_options_are_one_line(gemma_path, tmp_path, args, says):
    res = specgen("heads", "train", "-m", str(gemma_path), "-o", str(tmp_path / "x.npz"), *args, text=True,
                  stdin=subprocess.DEVNULL)
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert says in lines[0]
    assert not (tmp_path / "x.npz").exists()


def test_the_second_step_in_training_sees_what_a_drafting_round_sees():
    """Training-time test: position t + j of the doubled sequence (reading the layer's own
    feature from j - 1) is computed exactly as a drafting round's second position: over
    the cache of the true positions before j, and itself."""
    from test_layer import tiny

    from specgen.heads.layer import Kv, causal_mask, extend, forward
    from specgen.heads.layer_fit import second_step_mask

    params, batch = tiny(t=7)
    h, e, pos = batch["hidden"][:1], batch["emb"][:1], batch["pos"][:1]
    t = h.shape[1]
    f, _ = forward(params, h, e, pos, 4, causal_mask(t))
    h2 = np.concatenate([h, np.concatenate([h[:, :1], f[:, :-1]], axis=1)], axis=1)
    g, _ = forward(params, h2, np.concatenate([e, e], 1), np.tile(pos, 2), 4, second_step_mask(t))
    np.testing.assert_allclose(g[0, :t], f[0], rtol=1e-10, atol=1e-12)  # the true half is untouched
    for j in (1, 3, 6):
        _, kv = extend(params, Kv.empty(params, 4), h[0, :j], e[0, :j], pos[0, :j], 4)
        step2, _ = extend(params, kv, f[0, j - 1:j], e[0, j:j + 1], pos[0, j:j + 1], 4)
        np.testing.assert_allclose(g[0, t + j], step2[0], rtol=1e-10, atol=1e-12)


def test_step_two_hits_are_those_of_the_layer_run_on_over_each_prefix():
    """layer_hits scores every step-2 row in one pass; each is the layer run over the true
    prefix up to j and then one position on from its own feature at j (as drafting runs it)."""
    from test_layer import tiny

    from specgen.heads.layer import causal_mask, forward
    from specgen.heads.layer_fit import layer_hits

    params, batch = tiny(t=12, v=3)  # three ids: step 1 hits often, so step 2 has rows to score
    out, ids = batch["out"], np.arange(3)
    hidden, embs = batch["hidden"][0], batch["emb"][0]
    t = len(hidden) - 1
    f, _ = forward(params, hidden[None, :-1], embs[None, 1:], np.arange(t)[None], 4, causal_mask(t))
    first = (f[0] @ out.T).argmax(-1)
    picks = np.concatenate([[0], first])  # step 1 right everywhere
    tokens = np.concatenate([[0], picks[:-1]])  # greedy text: token j + 2 is the pick at j + 1, step 1's token
    rows = np.arange(t)
    hits1, hits2 = layer_hits(params, out, ids, 4, hidden, embs, picks, rows, tokens)
    assert all(hits1)
    want = []
    for j in range(t - 1):  # the reference: one forward over each prefix and the step-2 row
        h2 = np.concatenate([hidden[None, :j + 1], f[:, j:j + 1]], 1)
        g, _ = forward(params, h2, embs[None, 1:j + 3], np.arange(j + 2)[None], 4, causal_mask(j + 2))
        want.append(int((g[0, j + 1] @ out.T).argmax()))
    assert len(hits2) == t - 1
    assert hits2 == [w == picks[j + 2] for j, w in enumerate(want)]
    assert 0 < sum(hits2) < len(hits2)  # both outcomes occur, so a wrong row would show
    _, none = layer_hits(params, out, ids, 4, hidden, embs, picks, rows, tokens + 1)  # the text went elsewhere
    assert none == []


def test_the_trainer_with_the_training_time_test_learns_too():
    rng = np.random.default_rng(1)
    n, t, d, v = 30, 12, 16, 10
    tokens = rng.integers(0, v, (n, t)).astype(np.int32)
    picks = ((tokens * 3 + 1) % v).astype(np.int32)
    hidden = rng.standard_normal((n, t, d)).astype(np.float16)
    table = rng.standard_normal((v, d)).astype(np.float32)
    trainer = LayerTrainer((tokens, picks, hidden, np.ones((n, t), bool)), table.copy(), np.arange(v),
                           lambda x: table[np.asarray(x)], LayerOptions(**{**TINY, "chunk": t, "max_steps": 120, "ttt": True}))
    params, _, _ = fit_layer(trainer, np.arange(24), np.arange(24, 30), deadline=float("inf"))
    trainer.p = params
    assert np.mean([x for c in range(24, 30) for x in trainer.hits(c, step2=False)[0]]) > 0.8


def test_weight_decay_shrinks_the_matrices_alone_by_its_share_of_the_step():
    """AdamW's decoupled decay: beside the same Adam step, each matrix loses lr x decay x
    itself; gains and biases are not decayed."""
    rng = np.random.default_rng(2)
    n, t, d, v = 6, 10, 16, 8
    data = (rng.integers(0, v, (n, t)).astype(np.int32), rng.integers(0, v, (n, t)).astype(np.int32),
            rng.standard_normal((n, t, d)).astype(np.float16), np.ones((n, t), bool))
    table = rng.standard_normal((v, d)).astype(np.float32)

    def trained(decay):
        tr = LayerTrainer(data, table.copy(), np.arange(v), lambda x: table[np.asarray(x)],
                          LayerOptions(**{**TINY, "chunk": t, "weight_decay": decay}))
        before = {k: x.copy() for k, x in tr.p.items()}
        tr.step(np.array([0, 1]))
        return before, tr.p

    p0, plain = trained(0.0)
    _, decayed = trained(0.5)
    lr = TINY["lr"] / 50  # the first step of the warm-up
    for k in plain:
        want = plain[k] - (lr * 0.5 * p0[k] if p0[k].ndim == 2 else 0.0)
        np.testing.assert_allclose(decayed[k], want, rtol=1e-5, atol=1e-7, err_msg=k)
    assert not np.allclose(decayed["w1"], plain["w1"])


class _ChainWriter:
    """A fake writer: the token after x is (3x + 1) mod V, sure enough that a draw at 0.8
    always takes it; EOG is token 0. Counts its decodes and the rows of each."""

    n_batch, V = 64, 50

    def __init__(self, n_seq_max: int) -> None:
        self.n_seq_max, self.kv, self.rows = n_seq_max, [[] for _ in range(n_seq_max)], []

    def truncate(self, seq, n):
        del self.kv[seq][n:]

    def is_eog(self, tok):
        return tok == 0

    def decode_batch(self, parts):
        self.rows.append(sum(len(t) for _, t, _ in parts))
        out = []
        for seq, toks, n in parts:
            self.kv[seq] += list(toks)
            rows = np.zeros((n, self.V), np.float32)
            for j, x in enumerate(self.kv[seq][len(self.kv[seq]) - n:]):
                rows[j, (3 * x + 1) % self.V] = 60.0
            out.append(rows)
        return out


@pytest.mark.parametrize("n_batch", [64, 4])  # the next prompts in a step's decode, or (too many rows) a prefill of their own
def test_replies_are_written_several_at_once_each_on_its_own_prompt(n_batch):
    """write_replies: every reply continues its own prompt (the chain from the prompt's last
    token), stops at EOG or reply_tokens, finished sequences take the next prompts, and
    the steps hold several sequences' rows (the point: a decode a step, not a reply)."""
    from specgen.heads.layer_fit import write_replies

    def chain(x, n):
        out = []
        while len(out) < n and (x := (3 * x + 1) % 50) != 0:
            out.append(x)
        return out

    prompts = [[5, s] for s in (2, 7, 11, 13, 16, 23, 31, 40, 44)]
    w = _ChainWriter(n_seq_max=4)
    w.n_batch = n_batch
    got = write_replies(w, prompts, LayerOptions(reply_tokens=12, writers=4), np.random.default_rng(0))
    for prompt, (tokens, start) in zip(prompts, got):
        assert start == len(prompt) and tokens[:start] == prompt
        assert tokens[start:] == chain(prompt[-1], 12), (prompt, tokens)
    written = sum(len(t) - s for t, s in got)
    assert written > 0 and max(w.rows) > 1
    assert len(w.rows) < written / 2  # a step serves several replies
    assert all(len(kv) == 0 for kv in w.kv)  # the writer's sequences are left empty


def test_collecting_takes_turns_until_the_deadline_and_reads_every_reply():
    from specgen.heads.layer_fit import collect_replies

    class Reader:  # the target: picks and hidden rows of what it reads, one sample at a time
        n_embd = 3

        def __init__(self):
            self.kv, self.read = [], []

        def truncate(self, seq, n):
            del self.kv[n:]

        def decode_batch(self, parts):
            (seq, toks, n), = parts
            self.kv, self.read = list(toks), self.read + [len(toks)]
            return [np.eye(50, dtype=np.float32)[[(t + 1) % 50 for t in toks]]]

        def hidden_at(self, seq, p):
            return np.full(3, self.kv[p], np.float32)

    class Writer(_ChainWriter):
        def chat_template(self):
            return None

        def tokenize(self, text):
            return [5, len(text) % 49 + 1]

    clock = iter(range(100))
    data, replies = collect_replies(Reader(), Writer(2), ["ab", "abc", "abcd"], LayerOptions(chunk=8, writers=2, reply_tokens=6),
                                    deadline=2, least=0, clock=lambda: next(clock))
    tokens, picks, hidden, keep = data
    assert replies == 12  # 3 rounds of 2 x writers replies: the clock passes 2 after the third
    assert tokens.shape[1] == 8 and np.array_equal(picks, (tokens + 1) % 50)
    assert np.array_equal(hidden[..., 0], tokens.astype(np.float16)) and keep.any() and not keep.all()


def test_a_writer_with_a_chat_template_makes_up_requests_through_it(smollm_path):
    """invented_prompts: each prompt is one user turn of the writer's chat template whose text
    is the writer's own request (not the instruction that asked for it), on a drawn subject."""
    from specgen.apps.chat import format_for, one_turn
    from specgen.engine.llama import Engine
    from specgen.heads.layer_fit import invented_prompts
    from specgen.heads.seeds import INVENT

    with Engine(smollm_path, n_ctx=1024, n_seq_max=4, kv_unified=True, n_threads=2) as w:
        got = invented_prompts(w, 4, LayerOptions(writers=4), np.random.default_rng(0))
        fmt = format_for(w)
        empty = one_turn(fmt, w, "")
        assert 1 <= len(got) <= 4
        for toks in got:
            text = w.detokenize(toks)
            assert toks[:3] == empty[:3] and toks[-3:] == empty[-3:]  # the template around a user turn
            assert INVENT[:14] not in text and "user might send" not in text and len(toks) > len(empty) + 3
        assert len({tuple(t) for t in got}) == len(got)  # each its own request
        assert invented_prompts(w, 0, LayerOptions(), np.random.default_rng(0)) == []


def test_collecting_makes_up_its_share_of_each_rounds_prompts(monkeypatch):
    """collect_replies: `invent` of each round's 2 x writers prompts are the writer's own
    requests, the rest the seeds; at 0 the seeds alone."""
    import specgen.heads.layer_fit as lf

    asked, wrote = [], []
    monkeypatch.setattr(lf, "invented_prompts", lambda w, n, o, r: (asked.append(n), [[9, 9]] * n)[1])
    monkeypatch.setattr(lf, "seed_prompts", lambda w, s, r: iter(lambda: [1, 2], None))
    monkeypatch.setattr(lf, "write_replies", lambda w, ps, o, r, on_step=None: (wrote.append(ps), [(p + [3], len(p)) for p in ps])[1])
    monkeypatch.setattr(lf, "read_sample", lambda e, s, st: (np.asarray(s), np.asarray(s), np.zeros((len(s), 2)), np.ones(len(s), bool)))
    for invent, n_new in ((0.5, 4), (0.0, 0)):
        asked.clear(), wrote.clear()
        lf.collect_replies(None, None, ["x"], LayerOptions(chunk=2, writers=4, invent=invent), deadline=0, least=0)
        assert asked == [n_new] and len(wrote[0]) == 8 and wrote[0].count([9, 9]) == n_new


@pytest.mark.parametrize("seeds, invent", [([], 0.5), (["a passage of the user's own text"], 0.0)])
def test_requests_are_made_up_beside_the_built_in_seeds_only(gemma_path, tmp_path, monkeypatch, seeds, invent):
    """A layer trained on the user's own passages learns their text: no made-up requests
    on other subjects are mixed in."""
    import specgen.heads.layer_fit as lf

    seen = []

    def collect(engine, writer, seeds, opts, **kw):
        seen.append(opts.invent)
        raise KeyboardInterrupt  # enough: the options collecting gets

    monkeypatch.setattr(lf, "collect_replies", collect)
    with pytest.raises(KeyboardInterrupt):
        lf.train_layer(None, gemma_path, LayerOptions(**TINY), seeds=seeds, out=tmp_path / "l.npz")
    assert seen == [invent]
