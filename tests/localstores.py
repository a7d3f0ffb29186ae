"""Fake local model stores for tests: a Hugging Face cache tree, an Ollama store (manifest +
blob), an LM Studio folder and a SPECGEN_MODEL_DIRS folder, holding tiny GGUFs with
real vocabularies (tests/ggufs.py) and tensors of chosen sizes, plus a mismatched
vocabulary, a broken file, a split part and a non-GGUF blob."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
from ggufs import spm_vocab, write_spm_gguf

OTHER_WORDS = "▁zebra ▁yak ▁xylophone ▁walrus ▁vole ▁umbrella q w e r t y u i o p"


def tiny_model(path: Path, n_params: int, words: str | None = None, arch: str = "llama", name: str = "tiny") -> Path:
    """A GGUF with a tiny SentencePiece vocabulary and one F32 tensor of n_params elements."""
    tokens, scores, types = spm_vocab(words) if words else spm_vocab()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_spm_gguf(path, tokens, scores, types, arch=arch, name=name,
                          tensors={"weights": np.arange(n_params, dtype=np.float32)})


def hf_file(cache: Path, repo: str, file: str, data: bytes, commit: str = "a" * 40) -> Path:
    """One file in a hub cache as huggingface_hub lays it out: blob, ref, snapshot symlink."""
    root = cache / f"models--{repo.replace('/', '--')}"
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / digest).write_bytes(data)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    snap = root / "snapshots" / commit / file
    snap.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(root / "blobs" / digest, snap.parent), snap)
    return snap


def ollama_model(store: Path, name: str, tag: str, data: bytes, media: str = "application/vnd.ollama.image.model") -> Path:
    digest = hashlib.sha256(data).hexdigest()
    (store / "blobs").mkdir(parents=True, exist_ok=True)
    blob = store / "blobs" / f"sha256-{digest}"
    blob.write_bytes(data)
    m = store / "manifests" / "registry.ollama.ai" / "library" / name / tag
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:" + "0" * 64, "size": 1},
        {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}]}))
    return blob


def isolate(monkeypatch, root: Path) -> dict[str, Path]:
    """Every store under `root`, and specgen's cache and config there too."""
    dirs = {k: root / k for k in ("home", "hf", "ollama", "dirs", "cache", "config")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HOME", str(dirs["home"]))
    monkeypatch.setenv("HF_HUB_CACHE", str(dirs["hf"]))
    monkeypatch.setenv("OLLAMA_MODELS", str(dirs["ollama"]))
    monkeypatch.setenv("SPECGEN_MODEL_DIRS", str(dirs["dirs"]))
    monkeypatch.setenv("SPECGEN_CACHE", str(dirs["cache"]))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(dirs["config"]))
    for k in ("HF_HOME", "SPECGEN_MODELS", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(k, raising=False)
    return dirs


def build_stores(monkeypatch, root: Path) -> dict[str, Path]:
    """The fake machine: a target and drafts of several sizes across the four stores.

    target.gguf (dirs, 40k params) · hf:org/tiny-GGUF/tiny-q4.gguf (10k, same vocabulary) ·
    ollama tiny:latest (5k, same) · ollama big:latest (30k, same: too big) · ollama weights:latest
    (not GGUF) · lmstudio other/zoo.gguf (8k, another vocabulary) · dirs broken.gguf, split part."""
    d = isolate(monkeypatch, root)
    scratch = root / "scratch"
    target = tiny_model(d["dirs"] / "target.gguf", 40_000, name="target")
    hf_file(d["hf"], "org/tiny-GGUF", "tiny-q4.gguf", tiny_model(scratch / "a.gguf", 10_000).read_bytes())
    ollama_model(d["ollama"], "tiny", "latest", tiny_model(scratch / "b.gguf", 5_000).read_bytes())
    ollama_model(d["ollama"], "big", "latest", tiny_model(scratch / "c.gguf", 30_000).read_bytes())
    ollama_model(d["ollama"], "weights", "latest", b"\x00" * 64 + b"safetensors-ish")
    tiny_model(d["home"] / ".lmstudio" / "models" / "other" / "zoo.gguf", 8_000, words=OTHER_WORDS, name="zoo")
    good = target.read_bytes()
    (d["dirs"] / "broken.gguf").write_bytes(good[: len(good) // 2])
    tiny_model(d["dirs"] / "sharded-00001-of-00002.gguf", 1_000)
    shutil.rmtree(scratch)
    return {**d, "target": target}
