"""benchmarks/: every script answers --help, keeps to the rules, and runs on a tiny budget.

The --help check is parametrised over the directory listing, so a new script
is covered at once; a new script also needs an entry in SMOKE (its tiny run,
or the one line it prints when llama.cpp's binaries are absent) and a line in
benchmarks/README.md. The folders beside the scripts (replaylib/, suffixlib/)
hold the modules of one command each: not scripts, so the --help, SMOKE and
README checks skip them (their command answers for them), while the rules (no
private names, no tests, no machine paths, no file over 600 lines, every
drafter through build_drafter) hold for every file. The tiny runs use the embedded Gemma 3 270M at one
thread (two threads on a shared 2-core machine stall llama.cpp's barrier),
greedy, a few tokens, plain or fixed-k configurations only (no cost profile
is measured), servers on 127.0.0.1.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.iterdir() if p.is_file() and p.suffix in (".py", ".sh"))
# the modules of one command, in a folder of its own (benchmarks/replaylib/ for replay.py, ...)
HELPERS = sorted(str(p.relative_to(BENCH)) for p in BENCH.glob("*/*.py"))
SOURCES = SCRIPTS + HELPERS
MISSING = "/nonexistent/llama.cpp/build/bin"  # no llama.cpp binaries there, whatever the machine has


def run(args: list[str], tmp_path: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = ["bash", *args] if args[0].endswith(".sh") else [sys.executable, *args]
    cmd[1] = str(BENCH / cmd[1])
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    return p


def one_line_failure(p: subprocess.CompletedProcess, *words: str) -> None:
    """Exit non-zero with a single line on stderr that names what is missing (no traceback)."""
    err = p.stderr.strip()
    assert p.returncode != 0, p.stdout[-2000:]
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-3000:]
    for w in words:
        assert w in err, err


# =========================================================== every script: --help and the rules


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_answers_help(name, tmp_path):
    p = ok(run([name, "--help"], tmp_path, timeout=60))
    assert "usage" in p.stdout.lower()


@pytest.mark.parametrize("mode", ["suffix", "policy", "translate", "lookup", "model"])
def test_every_replay_mode_answers_help(mode, tmp_path):
    assert f"replay.py {mode}" in ok(run(["replay.py", mode, "--help"], tmp_path, timeout=60)).stdout


PRIVATE_IMPORT = re.compile(r"^\s*from specgen[\w.]* import (.*)$", re.M)
MACHINE_PATH = re.compile(r"(?<![\w.])/(tmp|work|root|home|Users|mnt|opt|srv)/")
TESTS_IMPORT = re.compile(r"^\s*(?:from|import) (?:conftest|fakes|faketok|ggufs|helpers|registry_helpers|openai_stub|test_\w+)\b"
                          r"|sys\.path.*[\"']tests[\"']", re.M)
OWNED_ELSEWHERE: dict[str, str] = {}  # scripts another engineer owns: the rules' exceptions, with the reason


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=OWNED_ELSEWHERE[n] + " (fixed: drop it "
                                                  "from OWNED_ELSEWHERE)", strict=True)) if n in OWNED_ELSEWHERE else n
                                  for n in SOURCES])
def test_scripts_import_no_private_names_nor_tests_and_name_no_machine_paths(name):
    text = (BENCH / name).read_text()
    private = [m for m in PRIVATE_IMPORT.findall(text) if re.search(r"(^|[\s,(])_\w", m)]
    assert not private, f"{name} imports private names of specgen: {private}"
    if name.endswith(".py"):  # of any module: specgen's, or another benchmark module's (imports over lines too)
        private = [f"{node.module}.{a.name}" for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ImportFrom)
                   for a in node.names if a.name.startswith("_") and node.module != "__future__"]
        assert not private, f"{name} imports private names: {private}"
    assert not TESTS_IMPORT.search(text), f"{name} imports from tests/"
    assert not MACHINE_PATH.search(text), f"{name} names a machine path: {MACHINE_PATH.search(text).group(0)}"


def test_helper_modules_are_found_and_no_file_is_over_600_lines():
    assert {"replaylib/common.py", "replaylib/suffix.py", "suffixlib/stats.py"} <= set(HELPERS)
    files = [p for p in BENCH.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    big = {str(p.relative_to(BENCH)): n for p in files if (n := len(p.read_text().splitlines())) > 600}
    assert not big, big


DRAFTERS = ("PromptLookup", "SuffixDrafter", "DraftModel", "WithLookup", "TranslatedDraftModel")


def _called(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


@pytest.mark.parametrize("name", [n for n in SOURCES if n.endswith(".py")])
def test_every_drafter_is_built_by_build_drafter(name):
    """specgen.drafters.build.build_drafter builds every drafter a benchmark runs, as it does every command's."""
    calls = [f"{_called(n)} (line {n.lineno})" for n in ast.walk(ast.parse((BENCH / name).read_text()))
             if isinstance(n, ast.Call) and _called(n) in DRAFTERS]
    assert not calls, f"{name} builds a drafter itself: {calls}"


def test_the_readme_has_a_line_for_every_script():
    readme = (BENCH / "README.md").read_text()
    assert [n for n in SCRIPTS if f"`{n}`" not in readme] == []


def test_every_script_has_a_smoke_test():
    assert sorted(SMOKE) == SCRIPTS


# =========================================================== tiny runs


def smoke_core(tmp_path):
    one_line_failure(run(["core.py", "--tools", MISSING], tmp_path), "llama-lookup", MISSING)


def smoke_concurrency(tmp_path):
    one_line_failure(run(["concurrency.py", "--tool", MISSING + "/llama-batched-bench"], tmp_path), "llama-batched-bench")
    p = ok(run(["concurrency.py", "--sequential-check", "--requests", "1", "--ntg", "2", "--repeats", "1",
                "--npl", "1", "-t", "1", "-C", "lookup:k=4"], tmp_path))
    assert "lookup:k=4" in p.stdout and "ratio" in p.stdout


def smoke_serve_http(tmp_path):
    one_line_failure(run(["serve_http.py", "--llama-server", MISSING + "/llama-server"], tmp_path), "llama-server")
    rows = tmp_path / "rows.jsonl"
    p = ok(run(["serve_http.py", "-t", "1", "-n", "2", "--limit", "1", "--concurrency", "1", "--no-bench", "-np", "1",
                "-c", "1024", "--specgen", "lookup:k=4::--lookup -k 4", "--rows", str(rows)], tmp_path))
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["summary"] and summary["c1_checks"]["count_mismatches"] == []
    assert [json.loads(x)["tokens"] for x in rows.read_text().splitlines()] == [2]


def smoke_http_llama(tmp_path):
    one_line_failure(run(["http_llama.py", "--llama-server", MISSING + "/llama-server"], tmp_path), "llama-server")


def smoke_http_client(tmp_path):
    p = ok(run(["http_client.py", "--requests", "2", "--tokens", "2", "--streams", "2", "--block", "1",
                "--delay-ms", "0", "--readers", "specgen"], tmp_path))
    assert "specgen" in p.stdout


def smoke_heads(tmp_path):
    """Untrained heads (each head the target's own readout) for the embedded model, a tiny fixed-k run."""
    import numpy as np

    from specgen.heads.collect import output_rows
    from specgen.heads.model import save_heads, target_identity
    from specgen.heads.train import init_heads
    from specgen.models.registry import resolve_model

    target = resolve_model("gemma3-270m")
    ids = np.arange(512, dtype=np.int32)
    out = output_rows(target, ids)
    heads = init_heads("hydra", 2, ids, out, 262144, target_identity(target), 16, 1.0)
    save_heads(heads, tmp_path / "h.npz")
    p = ok(run(["heads.py", "--targets", "q4km", "--heads-q4km", str(tmp_path / "h.npz"), "--requests", "1",
                "--categories", "open-ended,code-edit", "--tokens", "6", "--repeats", "1", "--temps", "0", "0.8", "--seeds", "2", "--policy", "fixed", "-k", "2",
                "--threads", "1"], tmp_path, timeout=600))
    assert "open-ended" in p.stdout and "code-edit" in p.stdout and "reformat" not in p.stdout
    assert "% of a pass" in p.stdout and "head-1 acceptance" in p.stdout and "lookup alone" in p.stdout
    assert "temperature 0 · 1 repeats · 6 tokens" in p.stdout  # greedy: one seed
    assert "temperature 0.8 · 1 repeats · 2 seeds a request · 6 tokens" in p.stdout


def smoke_sampling(tmp_path):
    """A small vocabulary: every operation timed, the dense and support rows agreeing first."""
    p = ok(run(["sampling.py", "--rows", "6", "--vocab", "4096", "--repeats", "1"], tmp_path))
    assert p.stdout.count("(dense ÷ support)") == 3, p.stdout


def smoke_pairing(tmp_path):
    p = ok(run(["pairing.py", "--scan-only", "--files", "4"], tmp_path))
    scan = json.loads(p.stdout.splitlines()[-1])["scan"]
    assert scan["listed"] == scan["files"] == 4 and scan["warm_scan_s"] > 0
    assert p.stdout.startswith("scan: 4/4 GGUF files")


def smoke_policy(tmp_path):
    one_line_failure(run(["policy.py", "--tools", MISSING], tmp_path), "llama-speculative-simple")


def smoke_suffix(tmp_path):
    one_line_failure(run(["suffix.py", "--tools", MISSING], tmp_path), "llama-speculative-simple", MISSING)
    out = tmp_path / "agent.json"
    p = ok(run(["suffix.py", "--workload", "agent", "--limit", "2", "-n", "6", "--configs", "plain", "--tools", "",
                "--threads", "1", "--out", str(out)], tmp_path))
    assert "| plain |" in p.stdout
    report = json.loads(out.read_text())
    assert list(report["workloads"]["agent"]["results"]) == ["ticket-00", "ticket-01"]
    return out


def smoke_replay(tmp_path):
    records = smoke_suffix(tmp_path)  # plain's tokens of two agent requests, then replayed on a given curve
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps([0.0] + [0.02 + 0.01 * n for n in range(1, 33)]))
    dump = tmp_path / "replay.json"
    ok(run(["replay.py", "suffix", str(records), "--configs", "lookup", "current", "current@w2", "--no-host",
            "--costs", str(curve), "--json", str(dump)], tmp_path))
    rows = json.loads(dump.read_text())["agent"]
    assert set(rows["ticket-01"]) >= {"measured", "lookup", "current", "current@w2", "oracle", "oracle-local"}
    assert all(r[c]["vs_plain"] > 0 for r in rows.values() for c in ("lookup", "current", "oracle"))
    one_line_failure(run(["replay.py", "suffix", str(records), "--costs", str(tmp_path / "none.json")], tmp_path),
                     "--costs")
    one_line_failure(run(["replay.py", "translate", "--configs", "default:nothing=1"], tmp_path), "nothing=1")


def smoke_serve_steps(tmp_path):
    p = ok(run(["serve_steps.py", "--config", "plain=--no-spec", "--config", "rows=--no-spec --row-group 1",
                "-n", "2", "--concurrency", "2", "--repeats", "1", "--limit", "2", "-t", "1"], tmp_path))
    totals = [json.loads(x) for x in p.stdout.splitlines() if '"total"' in x]
    assert [t["config"] for t in totals] == ["plain", "rows"] and all(t["tokens"] == 4 for t in totals)


def smoke_workloads(tmp_path):
    p = ok(run(["workloads.py", "agent", "--jsonl"], tmp_path))
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(lines) == 24 and lines[0]["id"] == "ticket-00"


def smoke_ab_versions(tmp_path):
    p = run(["ab_versions.sh", str(ROOT)], tmp_path)
    assert p.returncode == 2 and "usage" in p.stderr
    p = ok(run(["ab_versions.sh", str(ROOT), str(ROOT)], tmp_path, env={"N": "2", "REPEATS": "1", "MODES": "--no-spec", "THREADS": "1"}))
    assert len(p.stdout.splitlines()) == 2 and all("--no-spec" in x for x in p.stdout.splitlines())


def smoke_real_pair(tmp_path):
    p = ok(run(["real_pair.py", "--parts", "bench", "--limit", "1", "-n", "4", "--repeats", "1", "-t", "1",
                "--requests", str(ROOT / "benchmarks" / "prompts" / "open.jsonl"), "--temp", "0.8", "--seeds", "2"],
               tmp_path, timeout=300))
    assert "geomean" in p.stdout and "k chosen, -d 0.5B (cost)" in p.stdout and "temperature 0.8" in p.stdout
    assert [ln.split()[0] for ln in p.stdout.splitlines() if ln.startswith("code-0/")] == ["code-0/s0", "code-0/s1"]


def smoke_feature_layer(tmp_path):
    p = run(["feature_layer.py", "--attn", "60", "--head-dim", "8"], tmp_path)
    assert p.returncode != 0 and "multiple of --head-dim" in p.stderr
    small = ["--collect-minutes", "0", "--train-minutes", "0", "--chunk", "64", "--attn", "64", "--mlp", "64",
             "--limit", "1", "-n", "6", "-t", "1"]
    data = tmp_path / "d.npz"
    p = ok(run(["feature_layer.py", *small, "--source", "library", "--data", str(data)], tmp_path, timeout=300))
    assert "library, held out: step-1 top-1" in p.stdout and "on its first 12 training chunks" in p.stdout and data.exists()
    assert "layer step-1" in p.stdout and "0.5B draft" in p.stdout and "sampled 0.8" in p.stdout
    assert any(line.startswith("all ") for line in p.stdout.splitlines())
    assert re.search(r"a drafting round of the layer: k=1 [\d.]+ ms .*k=4 [\d.]+ ms", p.stdout)
    p = ok(run(["feature_layer.py", *small, "--data", str(data), "--soft", "1", "--steps", "1", "--train-minutes", "5"],
               tmp_path, timeout=300))  # the same data again, soft labels, one step
    assert re.search(rf"read \d+ positions from {re.escape(str(data))}", p.stdout) and "trained 1 steps" in p.stdout
    p = ok(run(["feature_layer.py", *small, "--reply-tokens", "48", "--writers", "2", "--save", str(tmp_path / "l.npz")], tmp_path,
               timeout=300))
    assert re.search(r"the draft replied to \d+ seed prompts", p.stdout) and "replies, held out: step-1" in p.stdout
    p = ok(run(["feature_layer.py", "--load", str(tmp_path / "l.npz"), "--limit", "1", "-n", "6", "-t", "1"], tmp_path,
               timeout=300))
    assert "loaded the layer of" in p.stdout and "a drafting round of the layer" in p.stdout


SMOKE = {
    "ab_versions.sh": smoke_ab_versions,
    "concurrency.py": smoke_concurrency,
    "core.py": smoke_core,
    "feature_layer.py": smoke_feature_layer,
    "http_client.py": smoke_http_client,
    "heads.py": smoke_heads,
    "http_llama.py": smoke_http_llama,
    "pairing.py": smoke_pairing,
    "policy.py": smoke_policy,
    "real_pair.py": smoke_real_pair,
    "replay.py": smoke_replay,
    "sampling.py": smoke_sampling,
    "serve_http.py": smoke_serve_http,
    "serve_steps.py": smoke_serve_steps,
    "suffix.py": smoke_suffix,
    "workloads.py": smoke_workloads,
}


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_smoke(name, tmp_path):
    SMOKE[name](tmp_path)


# =========================================================== the replay's model-free parts (fakes)


@pytest.fixture(scope="module")
def replay():
    """benchmarks/replay.py as its command loads it (benchmarks/ on the path); its modes are MODES[name]."""
    spec = importlib.util.spec_from_file_location("bench_replay", BENCH / "replay.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def policy_mode(replay):
    return replay.MODES["policy"]


@pytest.fixture(scope="module")
def translate(replay):
    return replay.MODES["translate"]


CURVE = [0.0] + [0.02 + 0.01 * n for n in range(1, 40)]
GPU_CURVE = [0.0] + [0.02 * (1 + 0.02 * (n - 1)) for n in range(1, 40)]  # extra rows nearly free


def test_the_command_runs_one_module_per_mode(replay):
    assert {name: mode.__name__ for name, mode in replay.MODES.items()} == {
        "suffix": "replaylib.suffix", "policy": "replaylib.policy", "translate": "replaylib.translate",
        "lookup": "replaylib.lookup", "model": "replaylib.model"}
    assert all(callable(mode.options) and callable(mode.run) and mode.__doc__ for mode in replay.MODES.values())


def test_lookup_replay_configs_name_the_cost_policys_variants(replay):
    lookup = replay.MODES["lookup"]
    p = lookup.variant("current", CURVE)()
    assert p.free_z == type(p).free_z and type(p).__name__ == "CostAware"
    assert lookup.variant("free_z=0", CURVE)().free_z == 0.0
    assert lookup.variant("free_z=-1", CURVE)().free_z == -1.0
    assert p.observe_fades_all is False
    both = lookup.variant("free_z=0,fade=all", CURVE)()
    assert both.observe_fades_all is True and both.free_z == 0.0
    assert p.pool_positions is True and lookup.variant("pool=off", CURVE)().pool_positions is False
    assert p.loss_budget is True and lookup.variant("budget=off", CURVE)().loss_budget is False
    for bad in ("free_z=high", "depth=3", "fade=some", "pool=maybe", "budget=maybe"):
        with pytest.raises(SystemExit, match=bad.split("=")[0]):
            lookup.variant(bad, CURVE)


@pytest.mark.parametrize("args, words", [
    (["--requests", "nope.jsonl"], ["nope.jsonl"]),
    (["--configs", "free_z=high"], ["free_z"]),
    (["-n", "1"], ["-n"]),
    (["--curve", "none.json"], ["none.json"]),
    (["--curve", "short.json"], ["short.json", "verify curve"]),
])
def test_lookup_replay_refuses_bad_input_in_one_line_before_loading_a_model(args, words, tmp_path):
    (tmp_path / "short.json").write_text("[0, 0.01, 0.02]")
    one_line_failure(run(["replay.py", "lookup", *args], tmp_path, timeout=60), *words)


@pytest.mark.parametrize("args, words", [
    (["--requests", "nope.jsonl"], ["nope.jsonl"]),
    (["--configs", "k=x"], ["k=x"]),
    (["--seeds", "0"], ["--seeds"]),
    (["--curve", "none.json"], ["none.json"]),
])
def test_model_replay_refuses_bad_input_in_one_line_before_loading_a_model(args, words, tmp_path):
    one_line_failure(run(["replay.py", "model", *args], tmp_path, timeout=60), *words)


def test_a_replay_prices_on_a_saved_verify_curve(replay, tmp_path):
    from replaylib.common import load_curve, save_curve

    f = tmp_path / "curve.json"
    save_curve(f, CURVE)
    assert load_curve(f, 17) == CURVE and [p.name for p in tmp_path.iterdir()] == ["curve.json"]
    with pytest.raises(SystemExit, match="cannot write"):
        save_curve(tmp_path / "no" / "such" / "curve.json", CURVE)
    f.write_text(json.dumps([0.0, 0.01, -0.02] + CURVE[3:]))
    with pytest.raises(SystemExit, match="not a verify curve"):
        load_curve(f, 17)


def test_model_replay_serves_the_drafts_recorded_along_the_text(replay):
    """The stand-in draft engine: after a prefix of the text its row's argmax is the
    recorded prediction there, after a drafted token the text lacks it is token 0; each
    pass costs the draft's curve (the bulk feed past its end)."""
    from replaylib.common import Clock

    model = replay.MODES["model"]
    truth, preds = [5, 6, 7, 8, 9], [6, 7, 3, 9, 1]
    clock = Clock(host=False)
    d = model.ReplayDraft(truth, preds, [0.0, 0.01, 0.015], 0.002, clock)
    rows = d.sync_many([(0, [5, 6])])
    assert int(rows[0].argmax()) == 7 and clock.offset == pytest.approx(0.015)
    (row,), = d.decode_batch([(0, [7], 1)])
    assert int(row.argmax()) == 3  # its own (wrong) prediction after the text's prefix 5 6 7
    (row,), = d.decode_batch([(0, [3], 1)])
    assert int(row.argmax()) == 0  # past a token the text does not have
    d.sync_many([(0, [5, 6, 7, 8])])  # back to the text: the wrong token is dropped, 8 fed
    assert d.kv_tokens() == [5, 6, 7, 8] and int(d._row().argmax()) == 9
    d.truncate(0, 0)
    clock.offset = 0.0
    d.sync_many([(0, truth)])
    assert clock.offset == pytest.approx(0.015 + 3 * 0.002)  # 5 rows: the curve's 2, then 3 fed in bulk


def test_model_replay_runs_the_real_loop_with_the_recorded_drafts(replay):
    """Where the recorded predictions follow the text the model's rounds are accepted
    whole, elsewhere they fail at once; every config leaves plain's text (checked inside)
    and a fixed k drafts every round."""
    model = replay.MODES["model"]
    prompt = [1, 2, 3, 4]
    reply = [(7 * i) % 23 + 10 for i in range(40)]
    truth = prompt + reply
    preds = [truth[p + 1] if p + 1 < len(truth) and (p // 8) % 2 == 0 else 0 for p in range(len(truth))]
    costs = {"target": GPU_CURVE, "draft": [0.0] + [0.001 + 0.0002 * r for r in range(1, 33)], "feed": 0.0002}
    fixed = model.replay_one("r", prompt, reply, preds, "k=3", 0, costs)
    assert fixed["ratio"] > 0 and fixed["k_hist"].get(3, 0) >= 5
    default = model.replay_one("r", prompt, reply, preds, "default", 0, costs)
    assert default["model_rounds"] > 0
    with pytest.raises(SystemExit, match="k=x"):
        model.configure("k=x")
    assert model.configure("default")[2] is True and model.configure("default,budget=off")[2] is False
    for bad in ("default,pool=off", "k=3,budget=off"):
        with pytest.raises(SystemExit, match=bad):
            model.configure(bad)


def test_policy_replay_of_recorded_drafts(policy_mode):
    """A recorded greedy run and a draft right on every other stretch: fixed k and the cost policy."""
    from specgen.policy.base import FixedK
    from specgen.policy.cost import CostAware, Costs, Priors

    n, depth = 24, policy_mode.DEPTH
    target = [(3 * i) % 17 for i in range(n + depth)]
    drafts = [[t if (m // 4) % 2 == 0 else -1 for t in target[m:m + depth]] for m in range(1, n + 1)]
    rec = {"target": target, "drafts": drafts, "prompt": [1, 2, 3]}
    costs = {"verify": CURVE, "draft": [0.0] + [0.005 + 0.001 * r for r in range(1, 40)], "feed": 0.001}
    plain = policy_mode.replay_policy(rec, FixedK(), n, costs)  # FixedK drafts as deep as allowed
    cost = policy_mode.replay_policy(rec, CostAware(policy_mode.OFFER_MAX, Costs(CURVE, costs["draft"][1], costs["feed"], draft_verify_s=costs["draft"]), seed=0), n, costs)
    assert plain["tps"] > 0 and cost["tps"] > 0 and sum(cost["k_hist"].values()) > 0


def _recorded(prompt, n, depth, target, drafts):
    return {"target": target, "ctx": [prompt + target[:m] for m in range(n + 1)], "drafts": drafts,
            "proposals": [[d[:k] for k in range(1, depth + 1)] for d in drafts], "translate_s": [0.0005] * n,
            "top": [0.9] * (n + depth)}


TRANSLATE_COSTS = {"verify": CURVE, "draft": [0.0] + [0.004] * 39, "feed": 0.0005}


def test_translate_replay_of_a_recorded_sampled_run(translate):
    """The recorded text is emitted whatever the configuration; only the priced time differs."""
    prompt, n, depth = [5, 6, 7], 12, translate.DEPTH
    target = [(2 * i + 1) % 13 for i in range(n + depth)]
    drafts = [target[m:m + depth] for m in range(1, n + 1)]  # a draft right every time
    rec = _recorded(prompt, n, depth, target, drafts)
    runs = {c: translate.replay_translated(rec, prompt, n, c, TRANSLATE_COSTS, (None, None), 0.001) for c in ("plain", "k=2")}
    assert set(runs["plain"]["k_hist"]) == {0} and runs["k=2"]["accepted"] == runs["k=2"]["drafted"] > 0
    assert runs["k=2"]["tps"] > runs["plain"]["tps"]


def test_translate_default_is_the_recorded_model_with_lookup_alongside_as_build_drafter_shapes_it(translate, monkeypatch):
    """`default`: lookup (built by build_drafter) offers first beside the recorded model, which
    declares what build_drafter's draft model with lookup alongside declares."""
    from types import SimpleNamespace

    from specgen.drafters.build import DrafterOptions, OpenedDraft, build_drafter
    from specgen.policy.cost import CostAware, Costs, Priors

    depth = translate.DEPTH
    real = build_drafter(DrafterOptions("draft", lookup_alongside=True, model_max=depth), SimpleNamespace(n_vocab=16),
                         OpenedDraft(None, same_vocab=True, n_shared=16))
    stand_in = translate.ReplayDraft({}, 0, CURVE, 0.0, None, lookup=build_drafter(translate.ALONGSIDE), model_max=depth)
    for capability in ("name", "free", "offers", "prefills", "trees", "model_max", "policy_stats"):
        assert getattr(stand_in, capability) == getattr(real, capability), capability
    assert (stand_in.lookup.ngram_max, stand_in.lookup.ngram_min) == (real.lookup.ngram_max, real.lookup.ngram_min)
    assert stand_in.translated and not translate.ReplayDraft({}, 0, CURVE, 0.0, None).offers

    monkeypatch.setattr(translate, "make_policy", lambda name, k, *engines, seed=0, build=CostAware: build(
        k, Costs(CURVE, 0.004, 0.0005, draft_verify_s=TRANSLATE_COSTS["draft"]), Priors(), seed=seed, shared=None))
    # a text that repeats its prompt ten tokens at a time: lookup has offers that pay
    prompt, n = [5, 6, 7, 5, 6, 7, 5, 6], 14
    target = [(i % 3) + 5 if i % 11 else 9 for i in range(n + depth)]
    drafts = [target[m:m + depth] if m % 3 else [1] * depth for m in range(1, n + 1)]
    got = translate.replay_translated(_recorded(prompt, n, depth, target, drafts), prompt, n, "default",
                                      TRANSLATE_COSTS, (None, None), 0.001)  # asserts the recorded tokens
    by_lookup = [r for r in got["trace"] if r[1] > 0 and not r[3]]  # drafted rounds the model did not draft
    assert by_lookup and got["model_rounds"] > 0


def test_translate_configs_are_cost_policy_arguments(translate):
    assert translate.parse_config("default:old") == ("default", {"explore_near": False})
    assert translate.parse_config("alone:flat") == ("alone", {"top_prior": False})
    assert translate.parse_config("default:explore_near=0+decay=0.9") == ("default", {"explore_near": False, "decay": 0.9})
    for bad in ("default:seed=3", "default:nothing=1", "default:decay=x", "default:decay"):
        with pytest.raises(SystemExit):
            translate.parse_config(bad)
    # a variant is a subclass with the rule off and its priors replaced; the product's class is untouched
    from specgen.policy.cost import CostAware, Costs, Priors

    p = translate.cost_variant({"explore_near": False, "decay": 0.9})(8, Costs([0.0, 0.01]), Priors(), seed=0,
                                                                      shared=None)
    assert isinstance(p, CostAware) and (p.explore_near, p.decay, p.top_prior) == (False, 0.9, True)
    assert CostAware.explore_near is True and CostAware(8, Costs([0.0, 0.01])).decay == Priors().decay
