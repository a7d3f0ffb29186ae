"""specgen.heads.model: the heads' shapes and positions, the file's round trip and its refusals."""

import numpy as np
import pytest

from specgen.errors import SpecgenError
from specgen.heads.model import (
    Heads,
    heads_path,
    load_heads,
    save_heads,
    target_identity,
)

D, V, R = 16, 50, 8


def synthetic(kind: str, n_heads: int = 3, seed: int = 0, zero: bool = False) -> Heads:
    rng = np.random.default_rng(seed)
    d_in = D if kind == "medusa" else 2 * D
    ids = np.sort(rng.choice(V, 20, replace=False)).astype(np.int32)
    w2 = [np.zeros((R, D)) if zero else rng.normal(size=(R, D)) * 0.3 for _ in range(n_heads)]
    return Heads(kind=kind, ids=ids, n_vocab=V, target="tiny-ft0-abc", out=rng.normal(size=(len(ids), D)),
                 w1=[rng.normal(size=(d_in, R)) * 0.3 for _ in range(n_heads)],
                 b1=[rng.normal(size=R) * 0.1 for _ in range(n_heads)], w2=w2, info={"note": "synthetic"})


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_begin_step_advance_shapes(kind):
    h = synthetic(kind)
    rng = np.random.default_rng(1)
    hidden, last = rng.normal(size=(4, D)).astype(np.float32), np.array([1, 2, 3, 49])
    state = h.begin(hidden, last)
    for i in range(h.n_heads):
        if i:
            state = h.advance(state, np.array([5, 6, 7, 8]))
        logits, state = h.step(state, i)
        assert logits.shape == (4, len(h.ids)) and logits.dtype == np.float32
    assert h.draft(hidden, last, 5).shape == (4, 3)
    assert set(h.draft(hidden, last, 2).ravel()) <= set(h.ids.tolist())


def test_medusa_with_zero_blocks_reads_the_hidden_state_through_the_output_rows():
    h = synthetic("medusa", zero=True)
    hidden = np.random.default_rng(2).normal(size=(3, D)).astype(np.float32)
    logits, _ = h.step(h.begin(hidden, np.array([0, 1, 2])), 1)
    assert np.allclose(logits, hidden @ h.out.T, atol=1e-5)


def test_hydra_depends_on_the_tokens_it_is_told_medusa_does_not():
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(1, D)).astype(np.float32)
    for kind, differs in (("hydra", True), ("medusa", False)):
        h = synthetic(kind)
        in_ids, outside = int(h.ids[0]), next(t for t in range(V) if t not in set(h.ids.tolist()))
        outs = []
        for tok in (in_ids, int(h.ids[1]), outside):
            s = h.advance(h.step(h.begin(hidden, np.array([in_ids])), 0)[1], np.array([tok]))
            outs.append(h.step(s, 1)[0])
        assert (not np.allclose(outs[0], outs[1])) == differs
        assert (not np.allclose(outs[0], outs[2])) == differs  # outside ids: the learned vector
    a = synthetic("hydra")
    first = [a.step(a.begin(hidden, np.array([t])), 0)[0] for t in (int(a.ids[0]), int(a.ids[1]))]
    assert not np.allclose(*first)  # head 0 reads `last`


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_save_load_round_trip(tmp_path, kind):
    h = synthetic(kind)
    path = tmp_path / "h.npz"
    save_heads(h, path)
    assert not [p for p in tmp_path.iterdir() if p.name != "h.npz"]  # no temp file left
    g = load_heads(path, "tiny-ft0-abc")
    assert (g.kind, g.n_heads, g.n_vocab, g.target, g.info) == (h.kind, 3, V, h.target, h.info)
    assert np.array_equal(g.ids, h.ids)
    hidden = np.random.default_rng(4).normal(size=(2, D)).astype(np.float32)
    last = np.array([int(h.ids[0]), 3])
    sg, sh = g.begin(hidden, last), h.begin(hidden, last)
    for i in range(3):  # the output rows are stored as float16: equal to that precision
        if i:
            sg, sh = g.advance(sg, last), h.advance(sh, last)
        (lg, sg), (lh, sh) = g.step(sg, i), h.step(sh, i)
        assert np.allclose(lg, lh, atol=0.05) and not np.allclose(lg, 0)


def test_another_models_heads_are_refused(tmp_path):
    path = tmp_path / "h.npz"
    save_heads(synthetic("medusa"), path)
    with pytest.raises(SpecgenError, match="another model") as e:
        load_heads(path, "other-ft1-123")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "missing", "version"])
def test_damaged_or_missing_files_are_refused_in_one_line(tmp_path, damage):
    path = tmp_path / "h.npz"
    h = synthetic("hydra")
    if damage == "version":
        import specgen.heads.model as m

        old, m.FORMAT_VERSION = m.FORMAT_VERSION, 99
        try:
            save_heads(h, path)
        finally:
            m.FORMAT_VERSION = old
    else:
        save_heads(h, path)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "missing":
        path.unlink()
    with pytest.raises(SpecgenError) as e:
        load_heads(path, h.target)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_target_identity_is_cheap_stable_and_tells_files_apart(tmp_path):
    from ggufs import spm_vocab, write_spm_gguf

    a = write_spm_gguf(tmp_path / "a.gguf")
    b = write_spm_gguf(tmp_path / "b.gguf")
    toks, scores, types = spm_vocab("▁hello ▁world ▁other")
    c = write_spm_gguf(tmp_path / "c.gguf", toks, scores, types)
    assert target_identity(a) == target_identity(b)
    assert target_identity(a) != target_identity(c)
    assert heads_path(target_identity(a)).name == target_identity(a) + ".npz"
    with pytest.raises(SpecgenError):
        target_identity(tmp_path / "nope.gguf")


def test_the_f32_copy_and_the_q4_k_m_have_different_identities(gemma_path, f32_path):
    assert target_identity(gemma_path) != target_identity(f32_path)
