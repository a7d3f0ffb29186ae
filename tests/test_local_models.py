"""`specgen models --local`: the GGUF files of fake stores built here (a Hugging Face cache tree, an
Ollama manifest + blob, an LM Studio folder, SPECGEN_MODEL_DIRS), and `-m ollama:NAME[:TAG]`."""

from __future__ import annotations

import json
import os

import pytest
from helpers import error_of
from localstores import build_stores, isolate, ollama_model, tiny_model
from typer.testing import CliRunner

from specgen.cli import app
from specgen.models import local
from specgen.models.registry import resolve_model


@pytest.fixture
def stores(monkeypatch, tmp_path):
    return build_stores(monkeypatch, tmp_path)


def test_scan_finds_each_store_and_says_why_it_left_files_out(stores):
    found = local.scan()
    names = {(m.store, m.name) for m in found.models}
    assert names == {("hf", "hf:org/tiny-GGUF/tiny-q4.gguf"), ("ollama", "tiny:latest"), ("ollama", "big:latest"),
                     ("lmstudio", "other/zoo.gguf"), ("dirs", "target.gguf")}
    by = {m.name: m for m in found.models}
    assert by["target.gguf"].n_params == 40_000 and by["tiny:latest"].n_params == 5_000
    assert by["target.gguf"].architecture == "llama" and by["target.gguf"].title == "target"
    assert by["target.gguf"].size == os.path.getsize(stores["target"])
    # the same vocabulary has one fingerprint wherever it is stored; another vocabulary another
    assert by["tiny:latest"].fingerprint == by["target.gguf"].fingerprint == by["hf:org/tiny-GGUF/tiny-q4.gguf"].fingerprint
    assert by["other/zoo.gguf"].fingerprint not in (None, by["target.gguf"].fingerprint)
    assert by["tiny:latest"].ref == "ollama:tiny:latest" and by["target.gguf"].ref == str(stores["target"])
    skipped = {s.name: s.reason for s in found.skipped}
    assert set(skipped) == {"weights:latest", "broken.gguf", "sharded-00001-of-00002.gguf"}
    assert "not a GGUF file" in skipped["weights:latest"]
    assert "truncated or corrupt" in skipped["broken.gguf"]
    assert skipped["sharded-00001-of-00002.gguf"].startswith("split model (part 1 of 2)")
    assert [s for s, _ in found.searched] == ["hf", "ollama", "lmstudio", "dirs"]


def test_the_order_is_by_store_then_name_and_a_file_reached_twice_is_listed_once(stores):
    os.symlink(stores["target"], stores["dirs"] / "again.gguf")  # a second folder entry for one file
    found = local.scan()
    assert [m.name for m in found.models if m.store == "dirs"] == ["again.gguf"]  # the first by name
    assert sum(os.path.realpath(m.path) == os.path.realpath(stores["target"]) for m in found.models) == 1
    assert [m.store for m in found.models] == sorted((m.store for m in found.models), key=local.STORES.index)


def test_hf_home_lmstudio_settings_and_several_model_dirs(monkeypatch, tmp_path):
    d = isolate(monkeypatch, tmp_path)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert local.hf_hub_cache() == tmp_path / "hfhome" / "hub"
    custom = tmp_path / "lms-custom"
    (d["home"] / ".lmstudio").mkdir()
    (d["home"] / ".lmstudio" / "settings.json").write_text(json.dumps({"downloadsFolder": str(custom)}))
    tiny_model(custom / "pub" / "m.gguf", 100)
    second = tmp_path / "more"
    tiny_model(second / "x.gguf", 100)
    monkeypatch.setenv("SPECGEN_MODEL_DIRS", os.pathsep.join([str(d["dirs"]), str(second), ""]))
    found = local.scan()
    assert {(m.store, m.name) for m in found.models} == {("lmstudio", "pub/m.gguf"), ("dirs", "x.gguf")}


def test_models_local_json_and_table(stores):
    res = CliRunner().invoke(app, ["models", "--local", "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert len(obj["models"]) == 5 and len(obj["skipped"]) == 3
    assert {"name", "store", "path", "ref", "size", "architecture", "parameters", "fingerprint"} <= set(obj["models"][0])
    assert all(s["reason"] for s in obj["skipped"])
    table = CliRunner().invoke(app, ["models", "--local"])
    assert table.exit_code == 0 and "tiny:latest" in table.stdout and "zoo.gguf" in table.stdout
    assert "3 left out (--verbose says why)" in table.stderr
    verbose = CliRunner().invoke(app, ["models", "--local", "-v"])
    assert "left out: dirs broken.gguf:" in verbose.stderr and "split model" in verbose.stderr


def test_ollama_refs_resolve_to_their_blob(stores):
    blob = resolve_model("ollama:tiny")
    assert blob == resolve_model("ollama:tiny:latest")
    assert blob.parent == stores["ollama"] / "blobs" and blob.name.startswith("sha256-")
    assert resolve_model("ollama:library/big:latest").parent == blob.parent


def test_an_ollama_model_not_in_the_store_names_the_closest_ones(stores, tmp_path, monkeypatch):
    msg = error_of(resolve_model, "ollama:tinny")
    assert msg.startswith("ollama model 'tinny:latest' is not in Ollama's store") and "closest there: tiny:latest" in msg
    assert "not a GGUF file" in error_of(resolve_model, "ollama:weights")
    assert "bad model reference" in error_of(resolve_model, "ollama:a//b")
    empty = tmp_path / "empty-ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(empty))
    assert "holds no models" in error_of(resolve_model, "ollama:tiny")
    res = CliRunner().invoke(app, ["pair", "ollama:tinny"])
    assert res.exit_code != 0


def test_a_missing_model_layer_and_a_missing_blob_are_reasons(monkeypatch, tmp_path):
    d = isolate(monkeypatch, tmp_path)
    blob = ollama_model(d["ollama"], "gone", "latest", tiny_model(tmp_path / "g.gguf", 10).read_bytes())
    blob.unlink()
    ollama_model(d["ollama"], "adapter", "v1", b"x", media="application/vnd.ollama.image.adapter")
    found = local.scan()
    reasons = {s.name: s.reason for s in found.skipped}
    assert "missing" in reasons["gone:latest"] and "no model layer" in reasons["adapter:v1"]
    assert found.models == []
