"""The feature-level draft layer's hand-written gradients against finite differences."""

import numpy as np
import pytest

from specgen.heads.layer import PARAMS, causal_mask, forward, init_params, loss_and_grads, readout_loss, rope, rope_angles


def tiny(seed=0, d=8, attn=8, mlp=6, b=2, t=5, v=7):
    rng = np.random.default_rng(seed)
    params = {k: x.astype(np.float64) for k, x in init_params(d, attn, mlp, rng, np.float64).items()}
    for k in ("wo", "w2"):  # full-size residual branches, so their gradients are not negligible
        params[k] = params[k] * 10.0
    params["g1"] += rng.standard_normal(d) * 0.3
    params["g2"] += rng.standard_normal(d) * 0.3
    batch = dict(hidden=rng.standard_normal((b, t, d)), emb=rng.standard_normal((b, t, d)),
                 pos=np.arange(t)[None].repeat(b, 0) + np.array([[0], [3]]),
                 target=rng.standard_normal((b, t, d)) * 0.5, labels=rng.integers(0, v, (b, t)),
                 out=rng.standard_normal((v, d)))
    batch["labels"][0, 1] = -1  # a row without a label
    return params, batch


@pytest.mark.parametrize("window, soft", [(None, 0.0), (3, 0.0), (3, 0.6)])
def test_every_gradient_matches_finite_differences(window, soft):
    params, batch = tiny()
    mask = causal_mask(5, window)
    kw = dict(head_dim=4, mask=mask, feature_weight=0.7, soft=soft)
    _, grads, _ = loss_and_grads(params, **batch, **kw)
    rng = np.random.default_rng(1)
    eps = 1e-6
    for name in PARAMS:
        assert grads[name].shape == params[name].shape, name
        flat = params[name].reshape(-1)
        for i in rng.choice(flat.size, size=min(6, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + eps
            up = loss_and_grads(params, **batch, **kw)[0]
            flat[i] = old - eps
            down = loss_and_grads(params, **batch, **kw)[0]
            flat[i] = old
            numeric = (up - down) / (2 * eps)
            assert grads[name].reshape(-1)[i] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, i)


def test_attention_is_causal_and_within_its_window():
    """A change at a later position never moves an earlier prediction; beyond the
    window, none moves at all."""
    params, batch = tiny()
    mask = causal_mask(5, 2)
    f, _ = forward(params, batch["hidden"], batch["emb"], batch["pos"], 4, mask)
    moved = batch["hidden"].copy()
    moved[:, 2] += 1.0
    g, _ = forward(params, moved, batch["emb"], batch["pos"], 4, mask)
    changed = np.abs(g - f).max(axis=(0, 2)) > 1e-12
    assert changed.tolist() == [False, False, True, True, False]


def test_rope_inverse_undoes_it_and_keeps_norms():
    x = np.random.default_rng(2).standard_normal((3, 4, 8))
    cos, sin = rope_angles(np.arange(4)[None].repeat(3, 0), 8)
    y = rope(x, cos, sin)
    assert np.allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))
    assert np.allclose(rope(y, cos, sin, inverse=True), x)
    assert not np.allclose(y[:, 1:], x[:, 1:])  # position 0 alone is unrotated


def test_the_readout_loss_is_cross_entropy_where_labels_are_and_nothing_elsewhere():
    rng = np.random.default_rng(3)
    f, out = rng.standard_normal((1, 2, 4)), rng.standard_normal((5, 4))
    logits = f @ out.T
    ce = -np.log(np.exp(logits[0, 0, 3]) / np.exp(logits[0, 0]).sum())
    loss, df, top = readout_loss(f, out, np.array([[3, -1]]), f.copy(), feature_weight=5.0)
    assert loss == pytest.approx(ce)  # the feature term is zero where f is the target
    assert np.allclose(df[0, 1], 0.0)  # no label, no feature error: no gradient
    assert top.tolist() == [logits[0].argmax(-1).tolist()]


def test_soft_labels_mix_the_target_distribution_into_the_one_hot_label():
    """With soft = s the label is (1 - s) x one-hot + s x softmax(target · outᵀ): the
    loss is that cross-entropy, and it is least (its gradient zero, with no feature
    term) where the layer's distribution is the label itself."""
    rng = np.random.default_rng(4)
    f, out, target = rng.standard_normal((1, 1, 4)), rng.standard_normal((5, 4)), rng.standard_normal((1, 1, 4))

    def sm(x):
        return np.exp(x) / np.exp(x).sum()

    q, p = sm((target @ out.T)[0, 0]), sm((f @ out.T)[0, 0])
    want = 0.3 * q
    want[2] += 0.7
    loss, _, _ = readout_loss(f, out, np.array([[2]]), target, feature_weight=0.0, soft=0.3)
    assert loss == pytest.approx(-np.sum(want * np.log(p)))
    _, df_full, _ = readout_loss(target, out, np.array([[2]]), target, feature_weight=0.0, soft=1.0)
    assert np.allclose(df_full, 0.0)  # the target's own distribution: nothing left to learn
    _, df_hard, _ = readout_loss(target, out, np.array([[2]]), target, feature_weight=0.0, soft=0.0)
    assert not np.allclose(df_hard, 0.0)


@pytest.mark.parametrize("window", [None, 3])
def test_extending_position_by_position_is_the_forward_pass_over_the_whole(window):
    """Drafting runs the layer a few positions at a time over its cache; the features
    are those of one forward pass over the whole sequence (the same mask), and a
    thrown-away draft leaves the cache as it was."""
    from specgen.heads.layer import Kv, extend

    params, batch = tiny(t=9)
    h, e, pos = batch["hidden"][1:], batch["emb"][1:], batch["pos"][1:]
    t = h.shape[1]
    whole, _ = forward(params, h, e, pos, 4, causal_mask(t, window))
    kv, parts = Kv.empty(params, 4), []
    for a, b in [(0, 4), (4, 5), (5, 7), (7, 9)]:
        f, kv2 = extend(params, kv, h[0, a:b], e[0, a:b], pos[0, a:b], 4, window)
        if b < t:  # a draft of the next positions, thrown away
            extend(params, kv2, h[0, b:b + 2] + 5.0, e[0, b:b + 2], pos[0, b:b + 2], 4, window)
        assert len(kv2) == b and len(kv) == a
        parts.append(f)
        kv = kv2
    np.testing.assert_allclose(np.concatenate(parts), whole[0], rtol=1e-10, atol=1e-12)
    f, kv3 = extend(params, Kv.empty(params, 4), h[0, :6], e[0, :6], pos[0, :6], 4, window, last_only=True)
    np.testing.assert_allclose(f, whole[0, 5:6], rtol=1e-10, atol=1e-12)  # the last alone, the cache whole
    np.testing.assert_allclose(extend(params, kv3, h[0, 6:9], e[0, 6:9], pos[0, 6:9], 4, window)[0], whole[0, 6:9],
                               rtol=1e-10, atol=1e-12)
    if window:  # the window's own cache holds enough
        f, _ = extend(params, kv.keep(8).last(window - 1), h[0, 8:9], e[0, 8:9], pos[0, 8:9], 4, window)
        np.testing.assert_allclose(f, whole[0, 8:9], rtol=1e-10, atol=1e-12)


def test_float32_inputs_stay_float32_through_every_pass():
    """The layer trains and drafts in float32: a float64 mask or scalar mixed into the
    attention scores would carry every later matrix product into float64 (numpy 2
    promotes an array by its scalar's dtype), and then each product first converts its
    float32 weights to float64: twice the memory read, a copy of each matrix per call."""
    from specgen.heads.layer import Kv, extend

    params, batch = tiny(t=6)
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    b32 = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in batch.items()}
    f, cache = forward(p32, b32["hidden"], b32["emb"], b32["pos"], 4, causal_mask(6))
    assert f.dtype == np.float32 and cache.p.dtype == np.float32 and cache.x2.dtype == np.float32
    loss, grads, _ = loss_and_grads(p32, **b32, head_dim=4, mask=causal_mask(6, 3))
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}
    f2, kv = extend(p32, Kv.empty(p32, 4), b32["hidden"][0], b32["emb"][0], b32["pos"][0], 4, window=3)
    assert f2.dtype == np.float32 and kv.k.dtype == np.float32 and kv.v.dtype == np.float32
    # float32 still computes the same layer
    np.testing.assert_allclose(f2, forward(params, batch["hidden"][:1], batch["emb"][:1], batch["pos"][:1], 4,
                                           causal_mask(6, 3))[0][0], rtol=1e-3, atol=1e-4)
