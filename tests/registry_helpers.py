"""Shared pieces of the registry tests: private caches with the hub offline,
tiny GGUF files, catalogs and a faked Hugging Face cache on disk."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import gguf
import huggingface_hub.constants as hf_constants
import numpy as np
import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"

@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Private caches, the hub offline, no user catalog."""
    hf_home = tmp_path / "hf"
    hub = hf_home / "hub"
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "specgen-cache"))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SPECGEN_MODELS", raising=False)
    # huggingface_hub reads its environment once, at import time.
    monkeypatch.setattr(hf_constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return hub


def write_gguf(path: Path, name: str = "tiny", n: int = 64) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(128)
    w.add_token_list(["<s>", "</s>", "a", "b"])
    w.add_tensor("w", np.arange(n, dtype=np.float32))
    w.add_tensor("v", np.ones((4, 8), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_gguf(tmp_path / "tiny.gguf")


def write_toml(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def fake_hf_cache(hub: Path, repo: str, file: str, src: Path, commit: str = COMMIT, ref: str | None = "main") -> Path:
    folder = hub / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / commit / file
    snap.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, snap)
    if ref:
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snap
