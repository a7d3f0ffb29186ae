"""The HTML report: built from recorded bench files (sequential and sweep) and
from small fake records; the records file's errors; `specgen report` and
`specgen bench --report`.

The fixtures in tests/data were written by real runs:
`specgen bench REQS -n 32 -C lookup:k=8 -C lookup:k=8,policy=cost --out`
(6 requests, 3 categories) and `... -n 24 -C lookup:k=8,policy=cost
--concurrency 1,2,4 --out` (4 requests), Gemma 3 270M, 1 thread.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specgen.errors import SpecgenError
from specgen.bench.report import _dumbbell, _pooled_positions, build_report, config_names, load_records, write_report

DATA = Path(__file__).parent / "data"
SEQUENTIAL = DATA / "bench-records.jsonl"
SWEEP = DATA / "bench-sweep-records.jsonl"


class _Checker(HTMLParser):
    """Every element closed in order (void elements aside): what a browser needs no guessing for."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr", "source", "area", "base", "embed", "param", "track"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.ids: list[str] = []
        self.external: list[str] = []
        self.doctype = False

    def handle_decl(self, decl):
        self.doctype = self.doctype or decl.lower() == "doctype html"

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k == "id":
                self.ids.append(v)
            if k in ("src", "href", "action", "data") and v and re.match(r"\s*(https?:)?//", v):
                self.external.append(v)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()


def check_page(page: str) -> _Checker:
    """Well-formed HTML that loads nothing from elsewhere."""
    c = _Checker()
    c.feed(page)
    c.close()
    assert c.doctype and c.stack == [], c.stack
    assert c.tags.count("html") == 1 and c.tags.count("body") == 1
    assert c.external == []
    assert "<link" not in page.split("<script>", 1)[0]  # no stylesheet from anywhere
    assert re.search(r"<script[^>]+src=", page) is None  # every script inline
    assert "Plotly.newPlot" in page and len(page) > 1_000_000  # plotly.js itself is in the page
    return c


def figures(page: str) -> dict[str, list[dict]]:
    """div id → the figure's traces, as plotly wrote them into the page."""
    out = {}
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*(\[.*?\]),\s*\{', page):
        out[m.group(1)] = json.loads(m.group(2))
    return out


# =========================================================== recorded bench files


def test_sequential_report_holds_every_chart_and_request():
    meta, records = load_records(SEQUENTIAL)
    page = build_report(meta, records)
    c = check_page(page)
    specs = ["lookup:k=8", "lookup:k=8,policy=cost"]
    assert config_names(meta, records) == ["plain", *specs]
    sections = {"latency-lookup-k-8", "latency-lookup-k-8-policy-cost", "speedup-lookup-k-8",
                "speedup-lookup-k-8-policy-cost", "acceptance", "k-chosen"}
    assert sections <= set(c.ids)
    figs = figures(page)
    assert set(figs) == {f"chart-{s}" for s in sections}
    ids = [r["id"] for r in records]
    for s in specs:
        dumbbell = figs[f"chart-latency-{s.replace(':', '-').replace('=', '-').replace(',', '-')}"]
        assert [t["name"] for t in dumbbell] == ["faster", "slower", "plain", s]
        assert sorted(dumbbell[2]["y"]) == sorted(ids) == sorted(dumbbell[3]["y"])
    assert [t["name"] for t in figs["chart-acceptance"]] == specs
    assert [t["name"] for t in figs["chart-k-chosen"]] == specs
    speedup = figs["chart-speedup-lookup-k-8"]
    assert speedup[1]["x"] == ["code-edit", "reformat", "summarize", "overall"]  # medians with their intervals
    assert "error_y" in speedup[1]
    for i in ids:  # every request in the per-request table too
        assert f"<td>{i}</td>" in page
    for s in specs:
        assert f"<caption>plain vs {s}</caption>" in page


def test_sweep_report_marks_the_crossover():
    meta, records = load_records(SWEEP)
    page = build_report(meta, records)
    c = check_page(page)
    assert {"latency-throughput", "crossover", "k-chosen-lookup-k-8-policy-cost"} <= set(c.ids)
    figs = figures(page)
    curves = figs["chart-latency-throughput"]
    assert [t["name"] for t in curves] == ["plain", "lookup:k=8,policy=cost", "lookup:k=8,policy=cost: crossover (c=4)"]
    assert curves[0]["text"] == ["c=1", "c=2", "c=4"]
    assert "crossover c=4" in page  # the annotation on the curve
    assert "lookup:k=8,policy=cost: crossover at c=4" in page  # the line on the ratio chart
    assert [t["name"] for t in figs["chart-k-chosen-lookup-k-8-policy-cost"]] == ["c=1", "c=2", "c=4"]
    assert "stops cutting p50 latency at concurrency 4" in page
    assert page.count('<tr><td>1</td>') + page.count('<tr><td>2</td>') + page.count('<tr><td>4</td>') == 6


def test_report_is_deterministic(tmp_path):
    meta, records = load_records(SEQUENTIAL)
    write_report(tmp_path / "a.html", meta, records)
    write_report(tmp_path / "b.html", meta, records)
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes()
    assert {p.name for p in tmp_path.iterdir()} == {"a.html", "b.html"}  # no temporary file left


# =========================================================== fake records


def run(config: str, total_s: float, *, k_hist=None, per_position=(), drafted=0, accepted=0) -> dict:
    return {
        "config": config, "draft_max": 4 if config != "plain" else 0, "prompt_tokens": 10, "generated_tokens": 20,
        "ttft_s": 0.1, "decode_s": total_s - 0.1, "total_s": total_s, "tokens_per_s": 19 / (total_s - 0.1),
        "rounds": 10, "drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_len": 2.0, "per_position": list(per_position), "k_hist": k_hist or {"0": 20},
        "stop_reason": "max_tokens", "draft_s": 0.0, "draft_first_s": 0.0,
        "draft_steady": {"rounds": 8, "drafted": drafted, "s": 0.001}, "draft_kind": "lookup" if config != "plain" else "none",
        "verify_by_k": {"4": [8, 0.08]} if config != "plain" else {"0": [19, 0.19]}, "matches_plain": None, "first_diff": None,
        "tokens": [1, 2],
    }


def request(rid: str, category: str, plain_s: float, spec_s: float) -> dict:
    spec = run("lookup:k=4", spec_s, k_hist={"0": 2, "2": 4, "4": 4}, per_position=[0.75, 0.5, 0.5, 0.25], drafted=24, accepted=11)
    return {
        "type": "request", "id": rid, "category": category, "line": 1, "prompt_tokens": 10, "max_tokens": 20,
        "temperature": 0.0, "seed": 0, "runs": [run("plain", plain_s), spec],
        "speedup": {"lookup:k=4": plain_s / spec_s}, "latency_change_ms": {"lookup:k=4": 1000 * (spec_s - plain_s)},
    }


FAKE = [
    request("slow-one", "a", 1.0, 1.25),
    request("fast-one", "a", 1.0, 0.5),
    request("<b>odd & id</b>", "b", 1.0, 0.8),
]


def test_dumbbell_rows_are_sorted_by_speedup_fastest_on_top():
    import plotly.graph_objects as go

    fig = _dumbbell(go, FAKE, "lookup:k=4", "#000")
    assert list(fig.layout.yaxis.categoryarray) == ["slow-one", "<b>odd & id</b>", "fast-one"]  # plotly draws the last on top
    faster, slower = fig.data[0], fig.data[1]
    assert list(slower.y) == ["slow-one", "slow-one", None]
    assert list(faster.x) == [1000.0, 800.0, None, 1000.0, 500.0, None]


def test_acceptance_pools_counts_not_rates():
    # 10 rounds: 2 drafted nothing, 4 drafted 2, 4 drafted 4 → positions 1-2 were drafted 8 times, 3-4 four times.
    acc, dr = _pooled_positions([FAKE[0]["runs"][1], FAKE[1]["runs"][1]])
    assert dr == [16, 16, 8, 8]
    assert acc == [12, 8, 4, 2]


def test_fake_records_escape_ids_and_need_no_meta():
    hostile = request("</script><script>alert(1)</script>", "b", 1.0, 0.9)
    page = build_report({}, [*FAKE, hostile])
    check_page(page)  # the id closed no element
    assert "<td>&lt;b&gt;odd &amp; id&lt;/b&gt;</td>" in page
    assert "<script>alert(1)" not in page  # in the tables escaped, in the charts' JSON as \u003c


def test_missing_plotly_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.raises(SpecgenError) as e:
        build_report({}, FAKE)
    assert str(e.value) == "the HTML report needs plotly: pip install 'specgen[report]' (or pip install plotly)"


# =========================================================== records file errors


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "records.jsonl"
    p.write_text(text)
    return p


META = '{"type": "meta", "configs": ["plain", "lookup:k=4"]}\n'


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "PATH: no bench records (expected the output of `specgen bench --out`)"),
        (META, "PATH: no bench records (expected the output of `specgen bench --out`)"),
        ("hello world\n", "PATH:1: not a bench record (invalid JSON)"),
        ("hello world", "PATH:1: not a bench record (invalid JSON)"),
        (META + "[1, 2]\n", "PATH:2: not a bench record (type is None, not meta, request or serve)"),
        (META + '{"type": "request", "id": "x"}\n', "PATH:2: not a bench record (no category, runs, speedup, latency_change_ms)"),
        (META + '{"type": "request", "id": "x", "category": "c", "runs": [], "speedup": {}, "latency_change_ms": {}}\n',
         "PATH:2: not a bench record (runs must be a non-empty list)"),
        (META + '{"type": "request", "id": "x", "category": "c", "runs": [{"config": "plain"}], "speedup": {}, '
                '"latency_change_ms": {}}\n', "PATH:2: not a bench record (in runs) (no total_s, decode_s, generated_tokens"),
        (META + json.dumps(FAKE[0]) + "\n" + '{"type": "serve"}\n', "PATH:3: not a bench record (no concurrency"),
    ],
)
def test_malformed_records_are_one_line(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(SpecgenError) as e:
        load_records(path)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(message.replace("PATH", str(path))), str(e.value)


def test_missing_and_directory_records(tmp_path):
    for path, message in ((tmp_path / "nope.jsonl", "records file not found: "), (tmp_path, "records file is a directory: ")):
        with pytest.raises(SpecgenError) as e:
            load_records(path)
        assert str(e.value) == message + str(path)


def test_torn_last_line_is_left_out(tmp_path):
    path = _write(tmp_path, META + json.dumps(FAKE[0]) + "\n" + json.dumps(FAKE[1])[:40])
    meta, records = load_records(path)
    assert meta["configs"] == ["plain", "lookup:k=4"] and [r["id"] for r in records] == ["slow-one"]


def test_mixed_records_are_refused(tmp_path):
    _, sweep = load_records(SWEEP)
    path = _write(tmp_path, META + json.dumps(FAKE[0]) + "\n" + json.dumps(sweep[0]) + "\n")
    with pytest.raises(SpecgenError, match="mixes sequential and --concurrency records"):
        load_records(path)


def test_unwritable_report(tmp_path):
    with pytest.raises(SpecgenError) as e:
        write_report(tmp_path / "no-dir" / "r.html", {}, FAKE)
    assert str(e.value).startswith(f"cannot write report {tmp_path / 'no-dir' / 'r.html'}: ")


# =========================================================== the commands


def specgen(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "specgen", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_cli_report(tmp_path):
    out = tmp_path / "page.html"
    done = specgen("report", str(SEQUENTIAL), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr.splitlines() == [f"report: {out}"]
    check_page(out.read_text())
    # -o defaults to the records file's name with .html
    records = tmp_path / "sweep.jsonl"
    records.write_bytes(SWEEP.read_bytes())
    assert specgen("report", str(records)).returncode == 0
    assert (tmp_path / "sweep.html").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["MISSING", "-o", "OUT"], "specgen: error: records file not found: MISSING"),
        (["BAD", "-o", "OUT"], "specgen: error: BAD:1: not a bench record (invalid JSON)"),
        (["GOOD", "-o", "/nonexistent-dir/r.html"], "specgen: error: cannot write -o/--out /nonexistent-dir/r.html: no directory /nonexistent-dir"),
        (["SAME", "-o", "SAME"], "specgen: error: -o/--out SAME is the records file itself"),
    ],
)
def test_cli_report_errors_are_one_line(tmp_path, args, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    same = tmp_path / "same.html"
    same.write_bytes(SEQUENTIAL.read_bytes())
    subst = {"MISSING": str(tmp_path / "missing.jsonl"), "BAD": str(bad), "GOOD": str(SEQUENTIAL),
             "OUT": str(tmp_path / "out.html"), "SAME": str(same)}
    done = specgen("report", *[subst.get(a, a) for a in args])
    for k, v in subst.items():
        message = message.replace(k, v)
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.splitlines() == [message]
    assert not (tmp_path / "out.html").exists()


@pytest.mark.model
@pytest.mark.parametrize("sweep", [False, True], ids=["sequential", "sweep"])
def test_bench_report(tmp_path, sweep):
    from typer.testing import CliRunner

    from specgen.cli import app

    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text("".join(json.dumps({"id": i, "category": c, "prompt": p}) + "\n" for i, c, p in (
        ("copy", "copy", "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox"),
        ("open", "open", "Write one sentence about the sea."),
    )))
    page = tmp_path / "r.html"
    args = ["bench", str(reqs), "-n", "4", "--no-warmup", "-C", "lookup:k=4", "-c", "512", "--report", str(page)]
    result = CliRunner().invoke(app, args + (["--concurrency", "1,2"] if sweep else []))
    assert result.exit_code == 0, result.output
    assert f"report: {page}" in result.stderr
    text = page.read_text()
    c = check_page(text)
    if sweep:
        assert {"latency-throughput", "crossover"} <= set(c.ids)
    else:
        assert {"latency-lookup-k-4", "acceptance", "k-chosen"} <= set(c.ids)
        assert "<td>copy</td>" in text and "<td>open</td>" in text


def test_bench_report_without_plotly_fails_before_running(tmp_path, monkeypatch, capsys):
    from specgen.cli import main

    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    monkeypatch.setattr("specgen.bench.open_bench", lambda *a, **k: pytest.fail("models loaded"))
    with pytest.raises(SystemExit) as e:
        main(["bench", "--report", str(tmp_path / "r.html")])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "specgen: error: the HTML report needs plotly: pip install 'specgen[report]' (or pip install plotly)"
    ]
