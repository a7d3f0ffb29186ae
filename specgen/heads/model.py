"""Prediction heads over a frozen target's last hidden state (Medusa-1, Hydra), and their file.

Pure numpy. A head is a residual block over the target's final hidden state (after
the output norm), read out through the target's own output matrix restricted to
`ids`, the tokens that carry most of the label mass:

    medusa head i:  u_i = h + W2_i · SiLU(W1_i · h + b_i);            logits = E[ids] · u_i
    hydra head i:   s_{i+1} = s_i + W2_i · SiLU(W1_i · [s_i; e(p_i)] + b_i);   logits = E[ids] · s_{i+1}

with s_0 = h, p_0 = `last` (the context's last, still unscored token) and p_i the
token drafted at head i-1; e(t) is the token's row of E, scaled to unit RMS (the
output matrix is the input embedding in tied models), or a learned vector for a
token outside `ids`. Only W1, b, W2 (and hydra's vector) are trained; E is frozen.

Positions: `hidden` is the row that picked `last`; head 0 predicts the token right
after `last`, head i the one i + 1 places after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specgen.errors import SpecgenError
from specgen.rules.sampling import Support, draw, support

FORMAT_VERSION = 1
KINDS = ("medusa", "hydra")


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # never overflows, unlike 1 / (1 + exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


@dataclass
class Heads:
    """Trained heads for one target. `w1[i]` is (d_in, r), `b1[i]` (r,), `w2[i]` (r, d);
    d_in is d for medusa, 2d for hydra. `info` holds what training measured (for `show`)."""

    kind: str
    ids: np.ndarray  # int32 (V',): target token ids the logits range over
    n_vocab: int
    target: str
    out: np.ndarray  # float32 (V', d): the target's output matrix rows `ids`
    w1: list[np.ndarray]
    b1: list[np.ndarray]
    w2: list[np.ndarray]
    oov: np.ndarray | None = None  # hydra: (d,) the embedding of a token outside ids
    emb_scale: float = 1.0  # hydra: e(t) = out[slot(t)] * emb_scale
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecgenError(f"unknown heads kind {self.kind!r} (known: {', '.join(KINDS)})")
        self.ids = np.asarray(self.ids, dtype=np.int32)
        self.out = np.ascontiguousarray(self.out, dtype=np.float32)
        self.w1 = [np.ascontiguousarray(w, dtype=np.float32) for w in self.w1]
        self.b1 = [np.ascontiguousarray(b, dtype=np.float32) for b in self.b1]
        self.w2 = [np.ascontiguousarray(w, dtype=np.float32) for w in self.w2]
        if self.kind == "hydra" and self.oov is None:
            self.oov = np.zeros(self.n_embd, dtype=np.float32)
        self._slot = np.full(self.n_vocab, -1, dtype=np.int64)
        self._slot[self.ids] = np.arange(len(self.ids))

    @property
    def n_heads(self) -> int:
        return len(self.w1)

    @property
    def n_embd(self) -> int:
        return self.out.shape[1]

    @property
    def width(self) -> int:
        return self.w1[0].shape[1] if self.w1 else 0

    def slots(self, tokens: np.ndarray) -> np.ndarray:
        """Each token's index in `ids`, -1 for a token outside them (or outside the vocabulary)."""
        t = np.asarray(tokens, dtype=np.int64)
        ok = (t >= 0) & (t < self.n_vocab)
        return np.where(ok, self._slot[np.clip(t, 0, self.n_vocab - 1)], -1)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """Hydra's e(t): (B, d)."""
        s = self.slots(tokens)
        e = self.out[np.maximum(s, 0)] * np.float32(self.emb_scale)
        e[s < 0] = self.oov
        return e

    # -- drafting --------------------------------------------------------------
    def begin(self, hidden: np.ndarray, last: np.ndarray) -> object:
        h = np.asarray(hidden, dtype=np.float32).reshape(-1, self.n_embd)
        if self.kind == "medusa":
            return h
        return h, self.embed(np.asarray(last).reshape(-1))

    def step(self, state, i: int) -> tuple[np.ndarray, object]:
        if self.kind == "medusa":
            h = state
            u = h + silu(h @ self.w1[i] + self.b1[i]) @ self.w2[i]
            return u @ self.out.T, state
        s, e = state
        s = s + silu(np.concatenate([s, e], axis=1) @ self.w1[i] + self.b1[i]) @ self.w2[i]
        return s @ self.out.T, (s, None)

    def advance(self, state, chosen: np.ndarray) -> object:
        if self.kind == "medusa":
            return state
        return state[0], self.embed(np.asarray(chosen).reshape(-1))

    def draft(self, hidden: np.ndarray, last: np.ndarray, k: int) -> np.ndarray:
        """Greedy: (B, k) target ids, head by head (a convenience; the drafter drives step itself)."""
        state = self.begin(hidden, last)
        picks = []
        for i in range(min(k, self.n_heads)):
            if i:
                state = self.advance(state, picks[-1])
            logits, state = self.step(state, i)
            picks.append(self.ids[np.argmax(logits, axis=1)])
        return np.stack(picks, axis=1) if picks else np.zeros((len(np.atleast_1d(last)), 0), np.int32)


def sampled_pick(logits: np.ndarray, ids: np.ndarray, params, rng, n_vocab: int):
    """One head's sampled pick from its logits over `ids`: (the target id drawn, q as a
    `Support` by target id, zero outside `ids`), under the same transforms as a draft
    model's (temperature, top-k, top-p, min-p)."""
    kept = support(logits, params)  # over positions in `ids`
    token = int(ids[draw(kept.ids, kept.probs, rng, len(ids))])
    tid = ids[kept.ids]
    order = np.argsort(tid)  # a Support keeps its ids ascending
    return token, Support(tid[order], kept.probs[order], n_vocab)


def time_heads(heads, n_embd: int, k: int | None = None, repeats: int = 5, params=None) -> float:
    """Seconds of one head's step (a round of k heads over one sequence ÷ k, the
    fastest of `repeats`), timed on a random hidden row, each pick an argmax, or
    with sampling `params` a `sampled_pick`: the cost policy's figure for a heads'
    draft step before it has timed real rounds."""
    k = min(k or heads.n_heads, heads.n_heads)
    if k <= 0:
        return 0.0
    rng = np.random.default_rng(0)
    h = rng.standard_normal((1, n_embd)).astype(np.float32)
    ids = np.asarray(heads.ids, dtype=np.int64)
    last = ids[:1]
    sampled = params is not None and not params.greedy
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        state = heads.begin(h, last)
        for j in range(k):
            logits, state = heads.step(state, j)
            tok = ids[np.argmax(logits, axis=1)]
            if sampled:
                tok[0] = sampled_pick(logits[0], ids, params, rng, heads.n_vocab)[0]
            if j + 1 < k:
                state = heads.advance(state, tok)
        best = min(best, time.perf_counter() - t)
    return best / k


# -- the file ------------------------------------------------------------------
def target_identity(path) -> str:
    """A short name for a target: its GGUF's name and file type, and a hash of its tokenizer,
    architecture, shape and file size (header only, no weights)."""
    from specgen.models.gguf import read_header, tokenizer_digest

    path = Path(path)
    digest, meta = tokenizer_digest(path)
    header = read_header(path)
    arch = str(meta.get("general.architecture", "unknown"))
    keys = [arch, str(meta.get("general.file_type", "")), str(meta.get(f"{arch}.embedding_length", "")),
            str(meta.get(f"{arch}.block_count", "")), str(header.n_tensors), str(header.file_size), digest]
    h = hashlib.blake2b("\0".join(keys).encode(), digest_size=6).hexdigest()
    name = str(meta.get("general.name") or path.stem)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.").lower()[:40] or "model"
    return f"{slug}-ft{meta.get('general.file_type', 'x')}-{h}"


def heads_path(target_identity: str) -> Path:
    """Where the heads for a target live: specgen's cache, heads/<identity>.npz."""
    from specgen.models.cache import cache_dir

    return cache_dir() / "heads" / f"{target_identity}.npz"


def save_heads(heads: Heads, path) -> None:
    """Write `heads` to `path` (npz: float16 output rows and blocks, a JSON header), atomically."""
    path = Path(path)
    meta = {"format": "specgen-heads", "version": FORMAT_VERSION, "kind": heads.kind, "target": heads.target,
            "n_vocab": int(heads.n_vocab), "n_heads": heads.n_heads, "emb_scale": float(heads.emb_scale),
            "info": heads.info}
    arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
              "ids": heads.ids, "out": heads.out.astype(np.float16)}
    for i in range(heads.n_heads):
        arrays[f"w1_{i}"], arrays[f"w2_{i}"] = heads.w1[i].astype(np.float16), heads.w2[i].astype(np.float16)
        arrays[f"b1_{i}"] = heads.b1[i]
    if heads.oov is not None:
        arrays["oov"] = heads.oov
    write_npz(path, arrays)


def write_npz(path: Path, arrays: dict, meta: dict | None = None, what: str = "heads file") -> None:
    """Write `arrays` (and `meta` as the JSON header) to the npz at `path`, atomically; a failure
    is one SpecgenError line that names the file as `what`."""
    if meta is not None:
        arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SpecgenError(f"cannot write {what} {path}: {e.strerror or e}") from None


def read_meta(path) -> dict:
    """The JSON header of a heads file (target, kind, info), checked for format and version."""
    return open_file(Path(path))[0]


def load_heads(path, target_identity: str | None) -> Heads:
    """The heads in `path`, refused (one SpecgenError line) when missing, damaged, of another format
    version, or trained for another target than `target_identity` (None: any target)."""
    path = Path(path)
    meta, z = open_file(path)
    check_target(path, meta, target_identity)
    try:
        n = int(meta["n_heads"])
        return Heads(kind=meta["kind"], ids=z["ids"], n_vocab=int(meta["n_vocab"]), target=meta["target"],
                     out=z["out"], w1=[z[f"w1_{i}"] for i in range(n)], b1=[z[f"b1_{i}"] for i in range(n)],
                     w2=[z[f"w2_{i}"] for i in range(n)], oov=z.get("oov"),
                     emb_scale=float(meta.get("emb_scale", 1.0)), info=meta.get("info", {}))
    except SpecgenError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged member: bad zip data, wrong shapes, missing arrays
        raise SpecgenError(f"heads file {path} is damaged ({type(e).__name__}: {e})") from None


def check_target(path: Path, meta: dict, target_identity: str | None) -> None:
    """Refuse (one SpecgenError line) a file trained for another target than `target_identity` (None: any)."""
    if target_identity is not None and meta["target"] != target_identity:
        raise SpecgenError(f"heads file {path} was trained for another model ({meta['target']}, "
                           f"not {target_identity}): train heads for this one with `specgen heads train`")


def open_file(path: Path):
    """(the JSON header, the npz) of a heads file of this format version; one SpecgenError line otherwise."""
    if not path.is_file():
        raise SpecgenError(f"heads file not found: {path}")
    try:
        z = np.load(path, allow_pickle=False)
        meta = json.loads(bytes(z["meta"]).decode())
        if not isinstance(meta, dict) or meta.get("format") != "specgen-heads":
            raise ValueError("not a specgen heads file")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise SpecgenError(f"heads file {path} is damaged or not a heads file ({e})") from None
    if meta.get("version") != FORMAT_VERSION:
        raise SpecgenError(f"heads file {path} has format version {meta.get('version')}, this specgen reads "
                           f"{FORMAT_VERSION}: train them again with `specgen heads train`")
    return meta, z
