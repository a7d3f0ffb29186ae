"""Training heads in numpy: cross-entropy over the restricted vocabulary, Adam, minibatches.

The training set is `Samples`: per example the target's hidden row h_t, and
tokens [x_{t+1}, x_{t+2}, ..., x_{t+1+K}] where x_{t+1} is `last` (what row t
picked) and head i is labelled x_{t+2+i} (-1: no label, dropped from the loss).
Hydra is taught with teacher forcing: head i reads the true x_{t+1+i}.

Training runs in a normalized space (hidden rows divided by their RMS, output
rows multiplied by it: the same logits), so that one learning rate suits every
model; `to_heads` folds the scale back into the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specgen.errors import SpecgenError
from specgen.heads.model import Heads, sigmoid as _sigmoid


@dataclass
class Samples:
    hidden: np.ndarray  # (N, d) float32
    tokens: np.ndarray  # (N, K + 1) int32: last, then each head's label (-1: none)
    group: np.ndarray  # (N,) int32: which category (index into `groups`) the example's prompt came from
    groups: list[str]

    def __len__(self) -> int:
        return len(self.hidden)

    def take(self, rows: np.ndarray) -> Samples:
        return Samples(self.hidden[rows], self.tokens[rows], self.group[rows], self.groups)


def save_samples(train: Samples, held: Samples, path, target: str) -> None:
    """The collected data beside the heads file (hidden rows as float16), atomically, so that `--resume`
    trains on all of it; a failure to write is one SpecgenError line."""
    import json
    import os
    from pathlib import Path

    path = Path(path)
    meta = json.dumps({"target": target, "groups": train.groups, "n_train": len(train)}).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, meta=np.frombuffer(meta, np.uint8),
                     hidden=np.concatenate([train.hidden, held.hidden]).astype(np.float16),
                     tokens=np.concatenate([train.tokens, held.tokens]), group=np.concatenate([train.group, held.group]))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SpecgenError(f"cannot write training data {path}: {e.strerror or e}") from None


def load_samples(path, target: str, n_heads: int, groups: list[str]) -> tuple[Samples, Samples] | None:
    """What `save_samples` wrote for this target, as (training, held-out) under `groups`' numbering;
    None when there is none, or it is damaged, of another target or another head count (data is
    collected again then)."""
    import json

    try:
        z = np.load(path, allow_pickle=False)
        meta = json.loads(bytes(z["meta"]).decode())
        hidden, tokens, group = z["hidden"].astype(np.float32), z["tokens"], z["group"]
    except Exception:  # noqa: BLE001 - any damage: collect afresh
        return None
    if meta.get("target") != target or tokens.shape[1] != n_heads + 1:
        return None
    names = meta.get("groups", [])
    remap = np.array([groups.index(g) if g in groups else -1 for g in names] or [-1], dtype=np.int32)
    group = remap[group]
    keep = group >= 0
    data = Samples(hidden[keep], tokens[keep], group[keep], groups)
    cut = int(keep[: int(meta.get("n_train", 0))].sum())
    return data.take(np.arange(cut)), data.take(np.arange(cut, len(data)))


def choose_vocab(labels: np.ndarray, cap: int, always: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """The (at most `cap`) most frequent label tokens, sorted, and the share of labels they cover."""
    lab = labels[labels >= 0].ravel()
    if not len(lab):
        return np.zeros(0, np.int32), 0.0
    toks, counts = np.unique(lab, return_counts=True)
    order = np.argsort(-counts, kind="stable")[:cap]
    ids = toks[order]
    if always is not None:
        ids = np.unique(np.concatenate([ids, always]))[: max(cap, len(ids))]
    covered = float(np.isin(lab, ids).mean())
    return np.sort(ids).astype(np.int32), covered


class Trainer:
    """Adam over one set of heads' blocks; `step` takes a minibatch, returns (loss, top-1 per head)."""

    def __init__(self, heads: Heads, h_rms: float, *, lr: float = 1e-3, decay: float = 0.8,
                 weight_decay: float = 0.0) -> None:
        self.kind, self.n_heads, d = heads.kind, heads.n_heads, heads.n_embd
        self.h_rms = float(h_rms)
        self.template = heads
        self.out = heads.out * self.h_rms  # normalized space: logits = out_n · (h / h_rms)
        self.emb = heads.out * np.float32(heads.emb_scale)
        self.slot = heads.slots
        w1 = [w.copy() for w in heads.w1]
        w2 = [w / self.h_rms for w in heads.w2]
        for w in w1:
            w[:d] *= self.h_rms
        self.params: dict[str, np.ndarray] = {}
        for i in range(self.n_heads):
            self.params[f"w1_{i}"], self.params[f"b1_{i}"], self.params[f"w2_{i}"] = w1[i], heads.b1[i].copy(), w2[i]
        if heads.kind == "hydra":
            self.params["oov"] = heads.oov.copy()
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.t = 0  # Adam's moments start afresh (a resumed run too); info["adam_steps"] keeps the total
        self.steps_before = int(heads.info.get("adam_steps", 0))
        self.lr, self.weights = lr, [decay**i for i in range(self.n_heads)]
        self.weight_decay = weight_decay  # decoupled (AdamW), on the matrices only

    def snapshot(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.params.items()}

    def restore(self, params: dict[str, np.ndarray]) -> None:
        self.params = {k: v.copy() for k, v in params.items()}

    # -- forward and backward --------------------------------------------------
    def _inputs(self, tokens: np.ndarray) -> list[np.ndarray]:
        """Hydra: e(x_{t+1+i}) for each head i, (B, d), and where it is the learned vector."""
        out = []
        for i in range(self.n_heads):
            s = self.slot(tokens[:, i])
            e = self.emb[np.maximum(s, 0)]
            e[s < 0] = self.params["oov"]
            out.append((e, s < 0))
        return out

    def loss_and_grads(self, hidden: np.ndarray, tokens: np.ndarray, *, grads: bool = True):
        p = self.params
        h = hidden / np.float32(self.h_rms)
        labels = [self.slot(tokens[:, i + 1]) for i in range(self.n_heads)]
        labels = [np.where(tokens[:, i + 1] < 0, -1, lab) for i, lab in enumerate(labels)]
        inputs = self._inputs(tokens) if self.kind == "hydra" else None
        cache, loss, top1 = [], 0.0, []
        s = h
        for i in range(self.n_heads):
            x = np.concatenate([s, inputs[i][0]], axis=1) if inputs else h
            a = x @ p[f"w1_{i}"] + p[f"b1_{i}"]
            g = a * _sigmoid(a)
            u = (s if inputs else h) + g @ p[f"w2_{i}"]
            z = u @ self.out.T
            z -= z.max(axis=1, keepdims=True)
            pr = np.exp(z)
            total = pr.sum(axis=1, keepdims=True)
            pr /= total
            lab = labels[i]
            ok = lab >= 0
            n_ok = max(int(ok.sum()), 1)
            rows = np.nonzero(ok)[0]
            nll = np.log(total[rows, 0]) - z[rows, lab[rows]]
            loss += self.weights[i] * float(nll.sum() / n_ok)
            top1.append((int((np.argmax(z[rows], axis=1) == lab[rows]).sum()), int(ok.sum())))
            cache.append((x, a, g, pr, lab, rows, n_ok))
            if inputs:
                s = u
        if not grads:
            return loss, top1, None
        gr = {k: np.zeros_like(v) for k, v in p.items()}
        ds = np.zeros_like(h)
        for i in reversed(range(self.n_heads)):
            x, a, g, pr, lab, rows, n_ok = cache[i]
            dz = pr
            dz[rows, lab[rows]] -= 1.0
            dz[lab < 0] = 0.0
            dz *= self.weights[i] / n_ok
            du = dz @ self.out + (ds if inputs else 0.0)
            gr[f"w2_{i}"] += g.T @ du
            sg = _sigmoid(a)
            da = (du @ p[f"w2_{i}"].T) * (sg * (1.0 + a * (1.0 - sg)))
            gr[f"w1_{i}"] += x.T @ da
            gr[f"b1_{i}"] += da.sum(axis=0)
            if inputs:
                dx = da @ p[f"w1_{i}"].T
                d = h.shape[1]
                ds = du + dx[:, :d]
                oov = inputs[i][1]
                if oov.any():
                    gr["oov"] += dx[oov, d:].sum(axis=0)
        return loss, top1, gr

    def step(self, hidden: np.ndarray, tokens: np.ndarray) -> tuple[float, list[tuple[int, int]]]:
        loss, top1, gr = self.loss_and_grads(hidden, tokens)
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        corr = np.sqrt(1 - b2**self.t) / (1 - b1**self.t)
        for k, g in gr.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            if self.weight_decay and k[:2] in ("w1", "w2"):
                self.params[k] *= 1.0 - self.lr * self.weight_decay
            self.params[k] -= self.lr * corr * self.m[k] / (np.sqrt(self.v[k]) + eps)
        return loss, top1

    def to_heads(self, info: dict) -> Heads:
        """The trained heads, the normalization folded back in."""
        d, p, t = self.template.n_embd, self.params, self.template
        w1 = [p[f"w1_{i}"].copy() for i in range(self.n_heads)]
        for w in w1:
            w[:d] /= self.h_rms
        return Heads(kind=t.kind, ids=t.ids, n_vocab=t.n_vocab, target=t.target, out=t.out, w1=w1,
                     b1=[p[f"b1_{i}"].copy() for i in range(self.n_heads)],
                     w2=[p[f"w2_{i}"] * self.h_rms for i in range(self.n_heads)],
                     oov=p["oov"].copy() if "oov" in p else None, emb_scale=t.emb_scale,
                     info={**t.info, **info, "h_rms": self.h_rms, "adam_steps": self.steps_before + self.t})


def init_heads(kind: str, n_heads: int, ids: np.ndarray, out_rows: np.ndarray, n_vocab: int, target: str,
               width: int, h_rms: float, seed: int = 0) -> Heads:
    """Fresh heads: W1 random (unit-variance pre-activations on normalized inputs), W2 zero (each head
    starts as the target's own next-token readout), b zero."""
    rng = np.random.default_rng(seed)
    d = out_rows.shape[1]
    d_in = d if kind == "medusa" else 2 * d
    w1 = []
    for _ in range(n_heads):
        w = rng.normal(size=(d_in, width)).astype(np.float32) / np.sqrt(d_in)
        w[:d] /= h_rms
        w1.append(w)
    rms_out = float(np.sqrt(np.mean(out_rows.astype(np.float64) ** 2))) or 1.0
    return Heads(kind=kind, ids=ids, n_vocab=n_vocab, target=target, out=out_rows, w1=w1,
                 b1=[np.zeros(width, np.float32) for _ in range(n_heads)],
                 w2=[np.zeros((width, d), np.float32) for _ in range(n_heads)],
                 oov=np.zeros(d, np.float32) if kind == "hydra" else None, emb_scale=1.0 / rms_out,
                 info={"h_rms": h_rms})


def evaluate(trainer: Trainer, data: Samples, batch: int = 512) -> dict:
    """Top-1 per head on `data`, overall and per group: hits over every labelled example (a label
    outside ids is a miss); `top1_in_vocab` counts only labels inside ids."""
    k = trainer.n_heads
    hits, inside = np.zeros((len(data.groups), k)), np.zeros((len(data.groups), k))
    for lo in range(0, len(data), batch):
        part = data.take(np.arange(lo, min(lo + batch, len(data))))
        for g in np.unique(part.group):
            rows = part.group == g
            _, top1, _ = trainer.loss_and_grads(part.hidden[rows], part.tokens[rows], grads=False)
            for i, (hit, n) in enumerate(top1):
                hits[g, i] += hit
                inside[g, i] += n
    labelled = np.array([[(data.tokens[data.group == g, i + 1] >= 0).sum() for i in range(k)]
                         for g in range(len(data.groups))], dtype=float).reshape(len(data.groups), k)

    def ratio(a, b):
        return [round(float(x / y), 4) if y else None for x, y in zip(a, b)]

    return {"top1": ratio(hits.sum(0), labelled.sum(0)), "top1_in_vocab": ratio(hits.sum(0), inside.sum(0)),
            "per_group": {name: ratio(hits[g], labelled[g]) for g, name in enumerate(data.groups)
                          if labelled[g].sum()},
            "examples": len(data)}


def batches(n: int, size: int, rng: np.random.Generator):
    """Endless shuffled minibatches of row indices."""
    while True:
        order = rng.permutation(n)
        for lo in range(0, n - size + 1 if n >= size else 1, size):
            yield order[lo : lo + size]
