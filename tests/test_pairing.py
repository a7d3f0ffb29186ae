"""`specgen pair` and `--pair auto`: the local drafts for a target, ranked (vocabulary, size margin,
predicted speedup from stored cost profiles), chosen deterministically, saved into the user's
models file; and the HTML report's "speculation did not engage" warning."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import error_of
from localstores import build_stores, isolate, tiny_model
from typer.testing import CliRunner

from specgen import notes
from specgen.cli import app
from specgen.drafters import candidates as judge
from specgen.engine import costs
from specgen.models import pairing
from specgen.models.catalog import load_catalog, user_models_file
from specgen.models.local import scan


@pytest.fixture
def stores(monkeypatch, tmp_path):
    return build_stores(monkeypatch, tmp_path)


def _profile(path: Path, verify_ms: float, slope_ms: float, threads: int = 2) -> None:
    """A measured cost profile for the file at `path`, as a run would have cached it."""
    engine = SimpleNamespace(path=Path(path), n_threads=threads)
    f = costs.profile_file(engine)
    f.parent.mkdir(parents=True, exist_ok=True)
    curve = [0.0] + [(verify_ms + slope_ms * (n - 1)) / 1000 for n in range(1, 33)]
    f.write_text(json.dumps({"model": str(path), "threads": threads, "version": costs.PROFILE_VERSION,
                             "verify_s": curve, "feed_s": verify_ms / 1000 / 8, "measured_at": 0}))


def test_pair_ranks_same_vocabulary_first_and_keeps_the_margin(stores):
    p = judge.pair(stores["target"], threads=2)
    assert [c.model.name for c in p.candidates] == ["tiny:latest", "hf:org/tiny-GGUF/tiny-q4.gguf", "other/zoo.gguf"]
    assert [c.vocabulary for c in p.candidates] == ["same", "same", "translated"]
    assert all(c.speedup is None and c.basis.startswith("unmeasured") for c in p.candidates)
    why = {r.model.name: r.reason for r in p.rejected}
    assert why["target.gguf"] == "the target itself"
    assert why["big:latest"].startswith("not small enough: 76% of the target's size")
    assert all(c.size_ratio <= pairing.SIZE_MARGIN for c in p.candidates)
    assert p.chosen.model.name == "tiny:latest"  # unmeasured: the smaller file of the target's architecture


def test_measured_costs_order_the_drafts_and_a_draft_that_cannot_pay_is_not_chosen(stores):
    by = {m.name: m for m in scan().models}
    _profile(stores["target"], 10.0, 1.0)
    _profile(by["hf:org/tiny-GGUF/tiny-q4.gguf"].path, 1.0, 0.1)  # measured, cheap: ranks above the unmeasured one
    p = judge.pair(stores["target"], threads=2)
    assert [c.model.name for c in p.candidates][:2] == ["hf:org/tiny-GGUF/tiny-q4.gguf", "tiny:latest"]
    top = p.candidates[0]
    assert top.speedup == pytest.approx(judge.predicted_speedup(
        costs.stored_profile(stores["target"], 2), costs.stored_profile(top.model.path, 2), 0.7))
    assert top.speedup > 1.5 and "assumed acceptance 0.70" in top.basis and "2 threads" in top.basis
    assert judge.pair(stores["target"], threads=3).candidates[0].speedup is None  # other threads: not measured
    # a draft as costly as the target cannot pay: measured below 1x it goes last among the same vocabulary
    _profile(by["hf:org/tiny-GGUF/tiny-q4.gguf"].path, 10.0, 1.0)
    p = judge.pair(stores["target"], threads=2)
    assert p.candidates[0].model.name == "tiny:latest" and p.candidates[1].speedup < 1.0


def test_predicted_speedup_is_the_policy_model_and_never_invented():
    flat = [0.0] + [0.01] * 32
    assert judge.predicted_speedup(None, {"verify_s": flat}, 0.7) is None
    assert judge.predicted_speedup({"verify_s": flat}, None, 0.7) is None
    # a free draft on a flat curve: E[tokens] of k = 8 at alpha 0.7
    free = judge.predicted_speedup({"verify_s": flat}, {"verify_s": [0.0, 0.0]}, 0.7)
    assert free == pytest.approx((1 - 0.7 ** 9) / 0.3)
    assert judge.predicted_speedup({"verify_s": flat}, {"verify_s": [0.0, 0.01]}, 0.7) < 1.0  # as costly as the target


def test_the_choice_is_deterministic_and_a_tie_goes_by_name(monkeypatch, tmp_path):
    d = isolate(monkeypatch, tmp_path)
    target = tiny_model(d["dirs"] / "t.gguf", 20_000)
    for name in ("b.gguf", "a.gguf", "c.gguf"):
        tiny_model(d["dirs"] / name, 2_000)
    first = [c.model.name for c in judge.pair(target).candidates]
    assert first == ["a.gguf", "b.gguf", "c.gguf"] == [c.model.name for c in judge.pair(target).candidates]
    path, line = judge.choose(target)
    assert path == d["dirs"] / "a.gguf"
    pct = round(100 * path.stat().st_size / target.stat().st_size)
    assert line == f"--pair auto: drafting with a.gguf (dirs): same vocabulary, {pct}% of the target's size, speedup unmeasured"


def test_pair_auto_in_a_session_says_which_draft_and_falls_back_to_lookup(stores, monkeypatch, tmp_path):
    from specgen.session import ModelOptions, auto_draft

    said: list[str] = []
    before = notes.to(said.append)
    try:
        opts = ModelOptions(model=str(stores["target"]), pair="auto")
        chosen = auto_draft(opts, load_catalog())
        assert chosen == str(stores["ollama"] / "blobs" / Path(chosen).name) and Path(chosen).name.startswith("sha256-")
        assert len(said) == 1 and said[0].startswith("--pair auto: drafting with tiny:latest (ollama)")
        assert auto_draft(replace(opts, lookup=True), load_catalog()) is None and len(said) == 1  # lookup asked: no choice
        lone = tiny_model(tmp_path / "alone" / "x.gguf", 1_000)
        monkeypatch.setenv("SPECGEN_MODEL_DIRS", str(tmp_path / "alone"))
        monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "none"))
        monkeypatch.setenv("HOME", str(tmp_path / "none"))  # no LM Studio folder either
        assert auto_draft(replace(opts, model=str(lone)), load_catalog()) is None
        assert said[-1] == "--pair auto: no local model can draft for x.gguf (1 found; `specgen pair` says why): " \
                           "drafting by prompt lookup"
    finally:
        notes.to(before)


def test_pair_command_json_and_exit_status(stores, tmp_path):
    res = CliRunner().invoke(app, ["pair", str(stores["target"]), "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["chosen"]["name"] == "tiny:latest" and obj["chosen"]["vocabulary"] == "same"
    assert [c["name"] for c in obj["candidates"]] == ["tiny:latest", "hf:org/tiny-GGUF/tiny-q4.gguf", "other/zoo.gguf"]
    assert obj["candidates"][0]["predicted_speedup"] is None and obj["saved"] is None
    assert {r["name"] for r in obj["rejected"]} == {"target.gguf", "big:latest"}
    table = CliRunner().invoke(app, ["pair", str(stores["target"])])
    assert "tiny:latest" in table.stdout and "unmeasured" in table.stdout
    assert table.stderr.startswith("chosen: tiny:latest — same vocabulary")
    lone = tiny_model(tmp_path / "lone" / "big.gguf", 50)
    none = CliRunner().invoke(app, ["pair", str(lone)])
    assert none.exit_code == 1 and "no local model can draft for big.gguf" in none.stderr


def test_save_writes_the_pair_into_the_user_file_and_keeps_what_is_there(stores):
    f = user_models_file()
    assert f == stores["config"] / "specgen" / "models.toml"
    f.parent.mkdir(parents=True)
    f.write_text('# my models\n[models.mine]\npath = "/nowhere/mine.gguf"\n')
    res = CliRunner().invoke(app, ["pair", str(stores["target"]), "--save", "fast"])
    assert res.exit_code == 0, res.output
    text = f.read_text()
    assert text.startswith('# my models\n[models.mine]\npath = "/nowhere/mine.gguf"\n')
    cat = load_catalog()  # the user file is read by default now
    assert cat.pairs["fast"].target == "target" and "mine" in cat.models
    assert Path(cat.models[cat.pairs["fast"].draft].path).name.startswith("sha256-")
    assert not [p for p in f.parent.iterdir() if p.name != "models.toml"]  # no temp file left
    again = CliRunner().invoke(app, ["pair", str(stores["target"]), "--save", "fast"])
    assert again.exit_code != 0 and f.read_text() == text
    assert "already has [pairs.fast]" in error_of(
        pairing.save_pair, f, "fast", ("target", stores["target"]), ("d", stores["target"]))
    f.write_text("[models\n")
    assert "invalid TOML" in error_of(pairing.save_pair, f, "x", ("a", stores["target"]), ("b", stores["target"]))
    assert f.read_text() == "[models\n"


def test_save_honours_specgen_models(stores, monkeypatch, tmp_path):
    named = tmp_path / "named.toml"
    monkeypatch.setenv("SPECGEN_MODELS", str(named))
    res = CliRunner().invoke(app, ["pair", str(stores["target"]), "--save", "-"])
    assert res.exit_code == 0, res.output
    cat = load_catalog()
    assert named.is_file() and cat.pairs["target"].draft == "tiny-latest" and cat.pairs["target"].target == "target"
    assert Path(cat.models["tiny-latest"].path).parent == stores["ollama"] / "blobs"


def test_auto_is_not_a_pair_name(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text('[models.a]\npath = "a.gguf"\n[pairs.auto]\ntarget = "a"\ndraft = "a"\n')
    assert "'auto' is reserved" in error_of(load_catalog, f)


# =========================================================== the report's warning


def _http_records(drafted: dict[str, int]):
    from specgen.bench.report import load_records

    meta, records = load_records(Path(__file__).parent / "data" / "bench-records.jsonl")
    names = meta["configs"]
    meta = {**meta, "mode": "http", "endpoints": [{"name": n, "url": "http://x", "body": {}, "baseline": n == "plain"}
                                                  for n in names]}
    out = []
    for r in records:
        runs = [{**x, "spec_source": "llama-server", "drafted": drafted.get(x["config"], 0)} for x in r["runs"]]
        out.append({**r, "runs": runs})
    return meta, out


def test_the_report_warns_when_a_speculative_endpoint_never_drafted():
    from specgen.bench.report import build_report

    meta, records = _http_records({"lookup:k=8": 0, "lookup:k=8,policy=cost": 5})
    page = build_report(meta, records)
    assert '<section id="speculation"' in page
    assert "warning: endpoint lookup:k=8: speculation did not engage: none of its" in page
    assert "endpoint lookup:k=8,policy=cost: speculation did not engage" not in page
    meta, records = _http_records({"lookup:k=8": 3, "lookup:k=8,policy=cost": 5})
    assert '<section id="speculation"' not in build_report(meta, records)


# =========================================================== the real models


@pytest.fixture
def gemma_folder(f32_path, draft_path, monkeypatch, tmp_path):
    """The F32 target and its Q4_0 draft in a folder of SPECGEN_MODEL_DIRS, no other store, and a cache of
    its own: no cost profile is measured yet (the machine's own, taken under whatever load, would decide
    the choice; the ranking by measured costs is tested on stored profiles above)."""
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "gguf"
    folder.mkdir()
    os.symlink(f32_path, folder / f32_path.name)
    os.symlink(draft_path, folder / draft_path.name)
    for var in ("HF_HUB_CACHE", "OLLAMA_MODELS", "HOME"):
        monkeypatch.setenv(var, str(tmp_path / "none"))
    monkeypatch.setenv("SPECGEN_MODEL_DIRS", str(folder))
    return folder


def test_pair_picks_the_q4_0_draft_for_the_f32_target(gemma_folder, f32_path, draft_path):
    p = judge.pair(gemma_folder / f32_path.name)
    assert [c.model.path for c in p.candidates] == [gemma_folder / draft_path.name]
    assert p.chosen.vocabulary == "same" and p.chosen.size_ratio < 0.5
    assert {r.reason for r in p.rejected} == {"the target itself"}


def test_run_pair_auto_drafts_with_it(gemma_folder, f32_path, draft_path):
    from helpers import specgen

    env = {k: os.environ[k] for k in ("SPECGEN_CACHE", "HF_HUB_CACHE", "OLLAMA_MODELS", "HOME", "SPECGEN_MODEL_DIRS")}
    res = specgen("run", "The capital of France is", "-m", str(gemma_folder / f32_path.name), "--pair", "auto",
                  "-n", "8", "--json", "-c", "256", env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["mode"] == "draft"
    assert f"--pair auto: drafting with {draft_path.name} (dirs): same vocabulary" in res.stderr.decode()


def test_bench_pair_auto_becomes_the_chosen_draft_or_lookup(stores, monkeypatch, tmp_path):
    from specgen.bench.configs import Config, parse_configs
    from specgen.bench.setup import _resolve_pairs

    said: list[str] = []
    before = notes.to(said.append)
    try:
        [auto] = parse_configs(["pair=auto:k=3"])
        _, [c] = _resolve_pairs(str(stores["target"]), [auto], load_catalog())
        assert (c.kind, c.k, Path(c.draft).parent) == ("draft", 3, stores["ollama"] / "blobs")
        assert said == [said[0]] and said[0].startswith("--pair auto: drafting with tiny:latest")
        lone = tiny_model(tmp_path / "alone" / "x.gguf", 1_000)
        _, got = _resolve_pairs(str(lone), [auto, Config("lookup", 3)], load_catalog())
        assert [g.name for g in got] == ["lookup:k=3"]  # no draft: prompt lookup, listed once
    finally:
        notes.to(before)
