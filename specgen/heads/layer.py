"""A feature-level draft layer (EAGLE-style) over a frozen target: its math, by hand in numpy.

At position t the layer reads the target's final hidden state h_t (after the
output norm, the row that picked token x_{t+1}) and the embedding of x_{t+1},
and predicts the target's next hidden state h_{t+1}; the target's own output
matrix, frozen and restricted to `ids`, reads a token out of that prediction:

    x    = [h_t ; e(x_{t+1})] · W_in + b_in                        (2d -> d)
    x'   = x + Attn(RMSNorm(x; g1))      causal, RoPE, over the layer's own earlier positions
    f    = x' + W2 · SiLU(W1 · RMSNorm(x'; g2))                    (d -> r -> d)
    logits = E[ids] · f

Drafting is autoregressive: f stands in for h_{t+1} at the next position, with
the drafted token's embedding. Training minimises cross-entropy against the
target's argmax at t+1 (or a mix of it and the target's distribution there)
plus `feature_weight` x smooth-L1(f - h_{t+1}), the feature regression EAGLE
found carries the later positions.

`forward` keeps what `backward` needs; `loss_and_grads` is the two together.
Shapes: a batch of B sequences of T positions; attention heads of `head_dim`.
`extend` is the same layer over one sequence a few positions at a time, over its
attention cache (`Kv`): what drafting runs. `FeatureLayer` is a trained layer for
one target, kept in a heads file of kind "layer" (specgen.heads.model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from specgen.heads.model import sigmoid, silu

EPS = 1e-6
PARAMS = ("w_in", "b_in", "g1", "wq", "wk", "wv", "wo", "g2", "w1", "w2")


def init_params(d: int, attn: int, mlp: int, rng: np.random.Generator, dtype=np.float32) -> dict[str, np.ndarray]:
    """Small random weights (the residual branches start near zero, so the layer
    starts as the fused input alone), unit norm gains."""
    def w(n_in, n_out, scale=1.0):
        return (rng.standard_normal((n_in, n_out)) * scale / np.sqrt(n_in)).astype(dtype)

    return {"w_in": w(2 * d, d), "b_in": np.zeros(d, dtype), "g1": np.ones(d, dtype),
            "wq": w(d, attn), "wk": w(d, attn), "wv": w(d, attn), "wo": w(attn, d, 0.1),
            "g2": np.ones(d, dtype), "w1": w(d, mlp), "w2": w(mlp, d, 0.1)}


def rms_norm(x: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)
    xhat = x / s
    return xhat * g, xhat, s


def rms_norm_back(dn: np.ndarray, xhat: np.ndarray, s: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """d loss / d x and d loss / d g of n = g · x / rms(x)."""
    dg = np.sum(dn * xhat, axis=tuple(range(dn.ndim - 1)))
    dxhat = dn * g
    return (dxhat - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True)) / s, dg


def rope_angles(pos: np.ndarray, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of shape pos.shape + (head_dim // 2,)."""
    inv = base ** (-np.arange(0, head_dim // 2, dtype=np.float64) * 2.0 / head_dim)
    ang = pos[..., None].astype(np.float64) * inv
    return np.cos(ang), np.sin(ang)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Rotate the two halves of the last axis; `inverse` (the transpose) is its gradient."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    if inverse:
        sin = -sin
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).astype(x.dtype, copy=False)


def causal_mask(t: int, window: int | None = None) -> np.ndarray:
    """0 where position j may be attended from i (j <= i, within `window`), -inf elsewhere."""
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    ok = j <= i
    if window:
        ok &= i - j < window
    return np.where(ok, 0.0, -np.inf)


@dataclass
class Cache:
    """What the forward pass keeps for the backward one."""

    u: np.ndarray
    x: np.ndarray
    n1: tuple
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    p: np.ndarray
    att: np.ndarray
    x2: np.ndarray
    n2: tuple
    z: np.ndarray
    a: np.ndarray  # SiLU(z)
    cos: np.ndarray
    sin: np.ndarray


def _heads(x: np.ndarray, head_dim: int) -> np.ndarray:
    b, t, a = x.shape
    return x.reshape(b, t, a // head_dim, head_dim).transpose(0, 2, 1, 3)


def _merge(x: np.ndarray) -> np.ndarray:
    b, n, t, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, n * h)


def forward(params: dict, hidden: np.ndarray, emb: np.ndarray, pos: np.ndarray, head_dim: int,
            mask: np.ndarray) -> tuple[np.ndarray, Cache]:
    """The layer's predicted features f (B, T, d) for inputs h (B, T, d), e (B, T, d)
    at positions `pos` (B, T), attention limited by `mask` (T, T)."""
    p = params
    u = np.concatenate([hidden, emb], axis=-1)
    x = u @ p["w_in"] + p["b_in"]
    n1, xhat1, s1 = rms_norm(x, p["g1"])
    cos, sin = rope_angles(pos, head_dim)
    cos, sin = cos[:, None], sin[:, None]  # over heads
    q = rope(_heads(n1 @ p["wq"], head_dim), cos, sin)
    k = rope(_heads(n1 @ p["wk"], head_dim), cos, sin)
    v = _heads(n1 @ p["wv"], head_dim)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + mask.astype(q.dtype, copy=False)
    scores -= scores.max(axis=-1, keepdims=True)
    w = np.exp(scores)
    w /= w.sum(axis=-1, keepdims=True)
    att = _merge(w @ v)
    x2 = x + att @ p["wo"]
    n2, xhat2, s2 = rms_norm(x2, p["g2"])
    z = n2 @ p["w1"]
    a = silu(z)
    f = x2 + a @ p["w2"]
    return f, Cache(u, x, (n1, xhat1, s1), q, k, v, w, att, x2, (n2, xhat2, s2), z, a, cos, sin)


def backward(params: dict, c: Cache, df: np.ndarray, head_dim: int) -> dict[str, np.ndarray]:
    """Gradients of the loss with respect to every parameter, from d loss / d f."""
    p, g = params, {}
    red = tuple(range(df.ndim - 1))

    def lin(x, dy):  # d loss / d W of y = x · W, summed over every row
        return x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])

    g["w2"] = lin(c.a, df)
    sz = sigmoid(c.z)
    dz = (df @ p["w2"].T) * sz * (1.0 + c.z * (1.0 - sz))
    n2, xhat2, s2 = c.n2
    g["w1"] = lin(n2, dz)
    dx2, g["g2"] = rms_norm_back(dz @ p["w1"].T, xhat2, s2, p["g2"])
    dx2 = dx2 + df
    g["wo"] = lin(c.att, dx2)
    datt = _heads(dx2 @ p["wo"].T, head_dim)
    dw = datt @ c.v.transpose(0, 1, 3, 2)
    dv = c.p.transpose(0, 1, 3, 2) @ datt
    ds = c.p * (dw - np.sum(dw * c.p, axis=-1, keepdims=True)) / math.sqrt(head_dim)
    dq = _merge(rope(ds @ c.k, c.cos, c.sin, inverse=True))
    dk = _merge(rope(ds.transpose(0, 1, 3, 2) @ c.q, c.cos, c.sin, inverse=True))
    dv = _merge(dv)
    n1, xhat1, s1 = c.n1
    g["wq"], g["wk"], g["wv"] = lin(n1, dq), lin(n1, dk), lin(n1, dv)
    dn1 = dq @ p["wq"].T + dk @ p["wk"].T + dv @ p["wv"].T
    dx, g["g1"] = rms_norm_back(dn1, xhat1, s1, p["g1"])
    dx = dx + dx2
    g["w_in"] = lin(c.u, dx)
    g["b_in"] = np.sum(dx, axis=red)
    return g


def readout_loss(f: np.ndarray, out: np.ndarray, labels: np.ndarray, target: np.ndarray,
                 feature_weight: float, soft: float = 0.0) -> tuple[float, np.ndarray, np.ndarray]:
    """Cross-entropy of logits f · outᵀ against `labels` (slots into out's rows;
    -1: no label), plus feature_weight x the mean smooth-L1 of f - target.
    `soft`: the share of the label that is the target's own distribution over
    out's rows, softmax(target · outᵀ), instead of its argmax (EAGLE's soft labels;
    the rest stays one-hot). Returns (loss, d loss / d f, the argmax slots)."""
    logits = f @ out.T
    top = logits.argmax(axis=-1)
    prob = _softmax(logits)
    has = labels >= 0
    n = max(int(has.sum()), 1)
    safe = np.where(has, labels, 0)
    want = np.zeros_like(prob)
    np.put_along_axis(want, safe[..., None], 1.0 - soft, axis=-1)
    if soft:
        want += soft * _softmax(target @ out.T)
    logp = np.log(np.maximum(prob, 1e-30))
    ce = float(-np.sum(np.sum(want * logp, axis=-1) * has) / n)
    dlog = (prob - want) * (has[..., None] / n)
    df = dlog @ out
    diff = f - target
    ad = np.abs(diff)
    m = diff.size
    feat = float(np.sum(np.where(ad < 1.0, 0.5 * diff * diff, ad - 0.5)) / m)
    df += feature_weight * np.clip(diff, -1.0, 1.0) / m
    return ce + feature_weight * feat, df.astype(f.dtype, copy=False), top


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def loss_and_grads(params: dict, hidden, emb, pos, target, labels, out, *, head_dim: int, mask,
                   feature_weight: float = 1.0, soft: float = 0.0) -> tuple[float, dict[str, np.ndarray], np.ndarray]:
    """One batch: the loss, every parameter's gradient, and the argmax slots."""
    f, cache = forward(params, hidden, emb, pos, head_dim, mask)
    loss, df, top = readout_loss(f, out, labels, target, feature_weight, soft)
    return loss, backward(params, cache, df, head_dim), top


# -- drafting: the layer over one sequence, position after position ----------------------


@dataclass
class Kv:
    """One sequence's attention cache in the layer: keys (after RoPE) and values,
    (heads, n, head_dim), of the positions `pos` (n,), increasing."""

    k: np.ndarray
    v: np.ndarray
    pos: np.ndarray

    @classmethod
    def empty(cls, params: dict, head_dim: int) -> "Kv":
        heads, dtype = params["wk"].shape[1] // head_dim, params["wk"].dtype
        return cls(np.zeros((heads, 0, head_dim), dtype), np.zeros((heads, 0, head_dim), dtype), np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.pos)

    def keep(self, n: int) -> "Kv":
        """The cache of its first n positions."""
        return Kv(self.k[:, :n], self.v[:, :n], self.pos[:n])

    def last(self, n: int) -> "Kv":
        """The cache of its last n positions (a window's)."""
        return self if len(self) <= n else Kv(self.k[:, -n:], self.v[:, -n:], self.pos[-n:])


def extend(params: dict, kv: Kv, hidden: np.ndarray, emb: np.ndarray | None, pos: np.ndarray, head_dim: int,
           window: int | None = None, last_only: bool = False, token_part: np.ndarray | None = None
           ) -> tuple[np.ndarray, Kv]:
    """The features f (n, d) of n new positions `pos` (after every position of `kv`),
    each attending over the cache and the new positions up to itself (within
    `window` positions), and the cache with them appended; `kv` itself is left as
    it was, so a draft's positions are thrown away by keeping the old one. The
    same function as `forward` over the whole sequence. `last_only`: the feature
    of the last new position alone (1, d); the others only enter the cache (their
    keys and values need no attention, MLP or readout: a catch-up's). `token_part`:
    emb · W_in's lower half, computed before (a drafter keeps it per token), in the
    place of `emb`."""
    p = params
    pos = np.asarray(pos, np.int64)
    d = hidden.shape[-1]
    if token_part is None:
        token_part = emb @ p["w_in"][d:]
    x = hidden @ p["w_in"][:d] + token_part + p["b_in"]
    n1 = rms_norm(x, p["g1"])[0]
    cos, sin = rope_angles(pos, head_dim)
    k = np.concatenate([kv.k, rope(_heads(n1[None] @ p["wk"], head_dim)[0], cos, sin)], axis=1)
    v = np.concatenate([kv.v, _heads(n1[None] @ p["wv"], head_dim)[0]], axis=1)
    allpos = np.concatenate([kv.pos, pos])
    if last_only:
        x, n1, pos, cos, sin = x[-1:], n1[-1:], pos[-1:], cos[-1:], sin[-1:]
    q = rope(_heads(n1[None] @ p["wq"], head_dim)[0], cos, sin)
    ok = allpos[None, :] <= pos[:, None]
    if window:
        ok &= pos[:, None] - allpos[None, :] < window
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim) + np.where(ok, 0.0, -np.inf).astype(q.dtype)
    scores -= scores.max(axis=-1, keepdims=True)
    w = np.exp(scores)
    w /= w.sum(axis=-1, keepdims=True)
    x2 = x + (w @ v).transpose(1, 0, 2).reshape(len(x), p["wo"].shape[0]) @ p["wo"]
    f = x2 + silu(rms_norm(x2, p["g2"])[0] @ p["w1"]) @ p["w2"]
    return f.astype(x.dtype, copy=False), Kv(k, v, allpos)


# -- a trained layer and its file ----------------------------------------------------------


def embed_rows(model_path, tokens, cache: dict) -> np.ndarray:
    """tokens.shape + (d,): each token's row of the target's output matrix (its input
    embedding where tied) at unit RMS, read from the GGUF at `model_path` once per
    token (kept in `cache`)."""
    from specgen.heads.collect import output_rows

    tokens = np.asarray(tokens)
    new = sorted({int(t) for t in np.unique(tokens)} - cache.keys())
    if new:
        rows = output_rows(model_path, np.asarray(new))
        rows /= np.sqrt(np.mean(rows ** 2, axis=1, keepdims=True)) + 1e-6
        cache.update(zip(new, rows))
    if tokens.size == 0:
        return np.zeros((*tokens.shape, 0), np.float32)
    return np.stack([cache[int(t)] for t in tokens.reshape(-1)]).reshape(*tokens.shape, -1)


@dataclass
class FeatureLayer:
    """A trained layer for one target: its parameters, the readout (the target's output
    matrix rows `ids`), its attention's head width and window, and the longest draft
    it makes (`n_heads`, as heads call it). `model_path`: the target's GGUF, whose
    output rows (unit RMS) embed the tokens it reads (set when opened for a target)."""

    kind: ClassVar[str] = "layer"
    params: dict
    ids: np.ndarray
    out: np.ndarray
    n_vocab: int
    target: str
    head_dim: int = 64
    window: int = 255
    n_heads: int = 6
    info: dict = field(default_factory=dict)
    model_path: str | None = None

    def __post_init__(self) -> None:
        self.params = {k: np.ascontiguousarray(self.params[k], dtype=np.float32) for k in PARAMS}
        self.ids = np.asarray(self.ids, dtype=np.int32)
        self.out = np.ascontiguousarray(self.out, dtype=np.float32)
        self._rows: dict[int, np.ndarray] = {}
        self._parts: dict[int, np.ndarray] = {}  # token -> e(token) · W_in[d:]

    @property
    def n_embd(self) -> int:
        return self.out.shape[1]

    def embed(self, tokens) -> np.ndarray:
        """(n, d): the tokens' embeddings (`embed_rows` of `model_path`)."""
        return embed_rows(self.model_path, tokens, self._rows).reshape(-1, self.n_embd)

    def run(self, kv: Kv, hidden: np.ndarray, tokens, pos) -> tuple[np.ndarray, Kv]:
        """`extend` with this layer's parameters: the feature of the last of the positions
        `pos` that read `hidden` and the embeddings of `tokens` (1, d), and the cache with
        them all."""
        return extend(self.params, kv, hidden, None, np.asarray(pos, np.int64), self.head_dim, self.window,
                      last_only=True, token_part=self.token_part(tokens))

    def token_part(self, tokens) -> np.ndarray:
        """(n, d): each token's embedding times W_in's lower half, kept per token: half the
        fusing matmul of a drafting step is the same for every visit of a token."""
        tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
        new = sorted(set(tokens) - self._parts.keys())
        if new:
            rows = self.embed(new) @ self.params["w_in"][self.n_embd:]
            self._parts.update(zip(new, rows))
        return np.stack([self._parts[t] for t in tokens]) if tokens else np.zeros((0, self.n_embd), np.float32)

    # one sequence without context, as heads step (specgen.heads.model.time_heads times a round so)
    def begin(self, hidden: np.ndarray, last) -> tuple:
        return Kv.empty(self.params, self.head_dim), np.asarray(hidden, np.float32)[:1], last, 0

    def step(self, state, i: int) -> tuple[np.ndarray, tuple]:
        kv, h, last, pos = state
        f, kv = self.run(kv, h, np.asarray(last).reshape(-1)[:1], [pos])
        return f @ self.out.T, (kv, f, None, pos + 1)

    def advance(self, state, chosen) -> tuple:
        kv, f, _, pos = state
        return kv, f, chosen, pos

    # -- the file (a heads file of kind "layer") --------------------------------------------
    def save(self, path) -> None:
        from pathlib import Path

        from specgen.heads.model import FORMAT_VERSION, write_npz

        meta = {"format": "specgen-heads", "version": FORMAT_VERSION, "kind": self.kind, "target": self.target,
                "n_vocab": int(self.n_vocab), "n_heads": int(self.n_heads), "head_dim": int(self.head_dim),
                "window": int(self.window), "info": self.info}
        arrays = {"ids": self.ids, "out": self.out.astype(np.float16),
                  **{f"p_{k}": self.params[k].astype(np.float16) for k in PARAMS}}
        write_npz(Path(path), arrays, meta)

    @property
    def width(self) -> int:
        """Its MLP's width (what `specgen heads show` calls a head's width)."""
        return self.params["w1"].shape[1]

    @classmethod
    def from_file(cls, meta: dict, z) -> "FeatureLayer":
        return cls({k: z[f"p_{k}"] for k in PARAMS}, z["ids"], z["out"], int(meta["n_vocab"]), meta["target"],
                   head_dim=int(meta["head_dim"]), window=int(meta["window"]), n_heads=int(meta["n_heads"]),
                   info=meta.get("info", {}))


def load_any(path, target_identity: str | None):
    """The heads (specgen.heads.model.Heads) or the layer a heads file holds, by its kind;
    refused in one SpecgenError line as `load_heads` refuses (missing, damaged, another
    format version, trained for another target)."""
    from pathlib import Path

    from specgen.errors import SpecgenError
    from specgen.heads.model import check_target, load_heads, open_file

    path = Path(path)
    meta, z = open_file(path)
    if meta.get("kind") != FeatureLayer.kind:
        return load_heads(path, target_identity)
    check_target(path, meta, target_identity)
    try:
        return FeatureLayer.from_file(meta, z)
    except Exception as e:  # noqa: BLE001 - a damaged member: bad zip data, wrong shapes, missing arrays
        raise SpecgenError(f"heads file {path} is damaged ({type(e).__name__}: {e})") from None
