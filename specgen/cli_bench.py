"""`specgen bench`: the command and its rendering (bench.py holds the logic).

stderr: progress (a bar with ETA on a terminal, one line per request
otherwise), the per-request table, the summary table and a bar chart of
per-request speedup. stdout: nothing, or the summary as one JSON object
with --json. `--report FILE.html` (and `specgen report RECORDS.jsonl`) writes
the charts as one self-contained page (specgen.report).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from typing_extensions import Annotated

from specgen.errors import SpecgenError

ReportOpt = Annotated[Optional[Path], typer.Option("--report", metavar="FILE.html", help="Also write the charts and tables as one self-contained HTML page (opens offline; needs specgen[report]).")]

CONFIG_HELP = (
    "A speculative configuration to compare with plain decoding (repeatable): "
    "lookup[:k=N,ngram=N,ngram_min=N,policy=P], draft=MODEL[:k=N,policy=P] or pair=NAME[:k=N,policy=P], P = fixed (default), cost or heuristic; with an adaptive policy k is the ceiling. Default: lookup:k=8."
)


def bench(
    requests: Annotated[Optional[Path], typer.Argument(help="Requests: JSONL (prompt or messages; optional id, category, max_tokens, temperature, seed) or text, one prompt a line. Default: the bundled set.")] = None,
    config: Annotated[Optional[List[str]], typer.Option("-C", "--config", metavar="CFG", help=CONFIG_HELP)] = None,
    repeats: Annotated[int, typer.Option("-r", "--repeats", help="Runs of each request in each configuration (order alternates).")] = 1,
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="Append records (JSONL) here as each request finishes.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue --out: skip requests it already records.")] = False,
    csv_out: Annotated[Optional[Path], typer.Option("--csv", help="Also write one CSV row per run here.")] = None,
    model: Annotated[Optional[str], typer.Option("-m", "--model", help="Target model (path, models.toml name or hf: reference). Default: the embedded Gemma 3 270M.")] = None,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", help="Tokens per request, unless the request sets max_tokens.")] = 64,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Always generate max_tokens (fixed-length comparisons).")] = False,
    temp: Annotated[float, typer.Option("--temp", help="Temperature for requests that set none; 0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Top-k for sampled requests (0 = off).")] = 40,
    top_p: Annotated[float, typer.Option("--top-p", help="Top-p for sampled requests.")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p", help="Min-p for sampled requests.")] = 0.05,
    seed: Annotated[int, typer.Option("--seed", help="Seed for requests that set none (same for every configuration).")] = 0,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Only the first N requests.")] = None,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="One short untimed run per configuration first.")] = True,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="Context size in tokens.")] = 4096,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: all cores).")] = None,
    gpu_layers: Annotated[int, typer.Option("-ngl", "--gpu-layers", help="Layers to offload on a Metal/CUDA build.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object on stdout.")] = False,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", metavar="LEVELS", help="Serve the whole set at once at each level, e.g. 1,2,4,8 (requests share one context, continuous batching): throughput and latency against concurrency, plain vs speculative.")] = None,
    report: ReportOpt = None,
) -> None:
    """Serve a batch of requests plain and speculative, side by side; per-request latency change and speedup."""
    from specgen import __version__, bench as B

    settings = B.Settings(max_tokens, repeats, ignore_eos, temp, top_k, top_p, min_p, seed, warmup)
    settings.validate()
    if report is not None:
        from specgen.report import require_plotly

        require_plotly()
    if concurrency is not None:
        for flag, on in (("--resume", resume), ("--csv", csv_out is not None)):
            if on:
                raise SpecgenError(f"{flag} is not supported with --concurrency")
        levels = B.parse_concurrency(concurrency)
        return _sweep(requests, config, levels, settings, out, model, limit, ctx_size, threads, gpu_layers, json_out, temp, seed, report)
    if limit is not None and limit < 1:
        raise SpecgenError(f"--limit must be >= 1 (got {limit})")
    if resume and out is None:
        raise SpecgenError("--resume needs --out (the record file to continue)")
    if threads is not None and threads < 1:
        raise SpecgenError(f"-t/--threads must be >= 1 (got {threads})")
    configs = B.parse_configs(config)
    reqs = B.load_requests(requests)[:limit]
    for path, flag in ((out, "--out"), (csv_out, "--csv"), (report, "--report")):
        if path is not None:
            _check_writable(path, flag)

    setup = B.open_bench(model, configs, ctx_size=ctx_size, threads=threads, gpu_layers=gpu_layers)
    sink = None
    try:
        names = [c.name for c in setup.configs]
        meta = {
            "specgen": __version__,
            "model": str(setup.target_path),
            "configs": names,
            **settings.meta(),
            "temperature": temp,
            "threads": setup.target.n_threads,
            "requests": str(requests) if requests else "<bundled>",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        sink = B.RecordFile(out, meta, resume=resume) if out else _MemorySink()
        done = sink.done_ids()
        pending = [r for r in reqs if r.id not in done]
        con = _console()
        runs_total = len(pending) * len(names) * repeats
        con.print(
            f"bench: {len(pending)} requests × {len(names)} configurations × {repeats} repeat{'s' * (repeats > 1)}"
            f" = {runs_total} runs · {setup.target_path.name} · {setup.target.n_threads} threads · max_tokens {max_tokens}"
            + (f" · {len(reqs) - len(pending)} already recorded" if done else "")
        )
        runner = B.Runner(setup, settings)
        prepared = runner.prepare(pending)
        interrupted = False
        progress = _Progress(con, runs_total, names)
        try:
            if prepared and warmup:
                progress.note("warming up")
                runner.warm_up(prepared)
            with progress:
                runner.run(prepared, sink.append, on_run=progress.on_run, on_request=progress.on_request)
        except KeyboardInterrupt:
            interrupted = True
        records = [r for r in sink.records]
        summary = B.summarize(records, names)
        if records:
            render(con, records, setup.configs, summary)
        t = runner.timing.to_dict()
        con.print(
            f"bench overhead: {1000 * t['overhead_s']:.0f} ms of {t['measured_s']:.1f} s measured "
            f"({100 * t['overhead_share']:.2f}%, {t['overhead_per_run_ms']:.1f} ms a run); "
            f"warm-up {t['warmup_s']:.1f} s" + (f" · records: {out}" if out else "")
        )
        if interrupted:
            con.print(f"interrupted: {len(records)} requests recorded" + (f" in {out} (--resume continues)" if out else ""))
        if csv_out is not None:
            B.write_csv(csv_out, records)
        if report is not None:
            _write_report(con, report, meta, records)
        if json_out:
            obj = {
                "model": str(setup.target_path),
                "configs": names,
                "settings": {**settings.meta(), "temperature": temp, "seed": seed, "threads": setup.target.n_threads},
                "requests": {"total": len(reqs), "recorded": len(records), "this_run": runner.timing.runs // max(len(names) * repeats, 1)},
                "interrupted": interrupted,
                "summary": summary,
                "per_request": [
                    {"id": r["id"], "category": r["category"], "speedup": r["speedup"], "latency_change_ms": r["latency_change_ms"]}
                    for r in records
                ],
                "overhead": t,
                "out": str(out) if out else None,
                "csv": str(csv_out) if csv_out else None,
            }
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()
        if interrupted:
            raise typer.Exit(130)
    finally:
        if sink is not None:
            sink.close()
        setup.close()


def _sweep(requests, config, levels, settings, out, model, limit, ctx_size, threads, gpu_layers, json_out, temp, seed, report=None) -> None:
    """`specgen bench --concurrency`: the set served at once at each level."""
    from specgen import __version__, bench as B

    if limit is not None and limit < 1:
        raise SpecgenError(f"--limit must be >= 1 (got {limit})")
    if threads is not None and threads < 1:
        raise SpecgenError(f"-t/--threads must be >= 1 (got {threads})")
    configs = B.parse_configs(config)
    reqs = B.load_requests(requests)[:limit]
    for path, flag in ((out, "--out"), (report, "--report")):
        if path is not None:
            _check_writable(path, flag)
    setup = B.open_bench(model, configs, ctx_size=ctx_size, threads=threads, gpu_layers=gpu_layers, n_seq_max=max(levels))
    sink = None
    try:
        names = [c.name for c in setup.configs]
        prepared = B.Runner(setup, settings).prepare(reqs)
        B.check_concurrency(levels, prepared, setup.target.n_ctx, max((c.k or 0) for c in setup.configs), setup.target.n_batch)
        meta = {
            "specgen": __version__, "model": str(setup.target_path), "configs": names, "concurrency": levels,
            **settings.meta(), "temperature": temp, "threads": setup.target.n_threads,
            "requests": str(requests) if requests else "<bundled>", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        sink = B.RecordFile(out, meta, resume=False) if out else _MemorySink()
        con = _console()
        total = len(levels) * len(names) * settings.repeats
        con.print(
            f"bench: {len(prepared)} requests served at once at concurrency {', '.join(map(str, levels))} × "
            f"{len(names)} configurations × {settings.repeats} repeat{'s' * (settings.repeats > 1)} = {total} batches · "
            f"{setup.target_path.name} · {setup.target.n_threads} threads · max_tokens {settings.max_tokens} · "
            f"one context of {setup.target.n_ctx} tokens"
        )
        runner = B.SweepRunner(setup, settings, levels)
        interrupted = False
        try:
            if settings.warmup:
                runner.warm_up(prepared)

            def on_run(done, total, level, c):
                con.print(f"[dim][{done + 1}/{total}] concurrency {level} · {c.label}[/dim]")

            runner.run(prepared, sink.append, on_run=on_run)
        except KeyboardInterrupt:
            interrupted = True
        records = list(sink.records)
        summary = B.summarize_sweep(records, names)
        if records:
            render_sweep(con, summary, setup.configs)
        if interrupted:
            con.print(f"interrupted: {len(records)} batches recorded" + (f" in {out}" if out else ""))
        if report is not None:
            _write_report(con, report, meta, records)
        if json_out:
            obj = {
                "model": str(setup.target_path), "configs": names, "concurrency": levels,
                "settings": {**settings.meta(), "temperature": temp, "seed": seed, "threads": setup.target.n_threads},
                "n_ctx": setup.target.n_ctx, "interrupted": interrupted, "summary": summary,
                "runs": [{k: v for k, v in r.items() if k != "requests"} for r in records],
                "out": str(out) if out else None,
            }
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()
        if interrupted:
            raise typer.Exit(130)
    finally:
        if sink is not None:
            sink.close()
        setup.close()


def report(
    records: Annotated[Path, typer.Argument(help="A records file written by `specgen bench --out`.")],
    out: Annotated[Optional[Path], typer.Option("-o", "--out", metavar="FILE.html", help="Where to write the page. Default: RECORDS with .html.")] = None,
) -> None:
    """Rebuild the HTML report (charts and tables, one self-contained page) from a bench records file."""
    from specgen.report import report_file

    out = out if out is not None else records.with_suffix(".html")
    if out.resolve() == records.resolve():
        raise SpecgenError(f"-o/--out {out} is the records file itself")
    _check_writable(out, "-o/--out")
    report_file(records, out)
    _console().print(f"report: {out}")


def _write_report(con, path: Path, meta: dict, records: list) -> None:
    """The page for --report, after the run (nothing recorded: nothing written)."""
    from specgen.report import write_report

    if not records:
        con.print(f"report: nothing recorded, {path} not written")
        return
    write_report(path, meta, records)
    con.print(f"report: {path}")


class _MemorySink:
    """Records kept in memory when there is no --out."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def done_ids(self) -> set[str]:
        return set()

    def append(self, record: dict) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


def _check_writable(path: Path, flag: str) -> None:
    """Fail before loading models, not after the first hour of runs."""
    if path.is_dir():
        raise SpecgenError(f"cannot write {flag} {path}: it is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SpecgenError(f"cannot write {flag} {path}: no directory {parent}")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise SpecgenError(f"cannot write {flag} {path}: permission denied")


def _console():
    from rich.console import Console

    tty = sys.stderr.isatty()
    return Console(
        stderr=True, no_color=bool(os.environ.get("NO_COLOR")), highlight=False,
        width=None if tty else int(os.environ.get("COLUMNS", 0)) or 200,
    )


# -------------------------------------------------------------------- progress


class _Progress:
    """A bar with ETA on a terminal; one line per finished request otherwise."""

    def __init__(self, con, total: int, names: list[str]) -> None:
        self.con, self.total, self.names = con, total, names
        self.live = con.is_terminal
        self._bar = None
        self._task = None
        self._count = 0

    def note(self, text: str) -> None:
        if self.live:
            self.con.print(f"[dim]{text}…[/dim]")

    def __enter__(self):
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.con, transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("bench", total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def on_run(self, done: int, total: int, p, config) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, description=f"{p.req.id} · {config.label}")

    def on_request(self, r: dict) -> None:
        self._count += 1
        runs = len(r["runs"])
        if self._bar is not None:
            self._bar.update(self._task, completed=self._count * runs)
            return
        plain = _median_ms(r, "plain")
        parts = [f"plain {plain:.0f} ms"]
        for name, s in r["speedup"].items():
            parts.append(f"{name} {_median_ms(r, name):.0f} ms ({s:.2f}×)")
        self.con.print(f"[{self._count}] {r['id']} ({r['category']}): " + " · ".join(parts), soft_wrap=True)


def _median_ms(r: dict, name: str) -> float:
    from statistics import median

    return 1000 * median(x["total_s"] for x in r["runs"] if x["config"] == name)


# -------------------------------------------------------------------- tables


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def request_table(records, configs):
    from rich.table import Table

    t = Table(title="per request (latency = median over repeats)", title_justify="left")
    for col in ("id", "category", "prompt", "plain ms"):
        t.add_column(col, justify="right" if col in ("prompt", "plain ms") else "left")
    specs = [c for c in configs if c.kind != "plain"]
    for c in specs:
        for col in ("ms", "Δ ms", "speedup", "acc", "same"):
            t.add_column(f"{c.label} {col}" if col == "ms" else col, justify="right")
    for r in records:
        row = [r["id"], r["category"], str(r["prompt_tokens"]), f"{_median_ms(r, 'plain'):.0f}"]
        for c in specs:
            runs = [x for x in r["runs"] if x["config"] == c.name]
            if not runs:
                row += ["-"] * 5
                continue
            s = r["speedup"][c.name]
            drafted = sum(x["drafted"] for x in runs)
            acc = sum(x["accepted"] for x in runs) / drafted if drafted else None
            same = {x["matches_plain"] for x in runs}
            style = "green" if s >= 1 else "red"
            row += [
                f"{_median_ms(r, c.name):.0f}",
                f"{r['latency_change_ms'][c.name]:+.0f}",
                f"[{style}]{s:.2f}×[/{style}]",
                _pct(acc),
                "-" if same == {None} else ("yes" if same == {True} else "NO"),
            ]
        t.add_row(*row)
    return t


def summary_table(summary: dict, config) -> object:
    from rich.table import Table

    s = summary[config.name]
    t = Table(title=f"plain vs {config.label}", title_justify="left")
    cols = (
        "category", "n", "median speedup [95% CI]", "geomean [95% CI]", "slower", "tok/s plain→spec",
        "accept", "len", "decode speedup", "predicted",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "category" else "right")
    rows = list(s["categories"].items()) + [("overall", s["overall"])]
    for cat, g in rows:
        if not g.get("requests"):
            continue
        pred = g["prediction"]
        tp = g["throughput"]
        t.add_row(
            f"[bold]{cat}[/bold]" if cat == "overall" else cat,
            str(g["requests"]),
            f"{_x(g['median_speedup'])} [{g['median_ci95'][0]:.2f}–{g['median_ci95'][1]:.2f}]",
            f"{_x(g['geomean_speedup'])} [{g['geomean_ci95'][0]:.2f}–{g['geomean_ci95'][1]:.2f}]",
            _pct(g["slower_share"]),
            f"{_num(tp['plain_tokens_per_s'])}→{_num(tp['spec_tokens_per_s'])}",
            _pct(g["acceptance_rate"]),
            _num(g["mean_accepted_len"], "{:.2f}"),
            _x(g["decode_speedup"]),
            _x(pred["speedup"]) if pred else "-",
            end_section=cat == rows[-2][0] if len(rows) > 1 else False,
        )
    return t


def prediction_line(summary: dict, config) -> str:
    p = summary[config.name]["overall"].get("prediction")
    if not p:
        return f"{config.label}: no prediction (nothing drafted at full k, or no plain steps)"
    unit = "a token" if p["draft_step"] == "token" else "a round"
    return (
        f"{config.label}: Leviathan prediction uses α = {p['alpha']:.2f}, k = {p['k']}, "
        f"E[tokens/round] = {p['expected_tokens_per_round']:.2f}, plain step {p['t_plain_step_ms']:.1f} ms, "
        f"verify of k+1 rows {p['t_verify_ms']:.1f} ms, drafting {p['t_draft_step_ms']:.2f} ms {unit} → "
        f"{_x(p['speedup'])}; with the measured draft lengths {_x(p['speedup_by_k'])}; "
        f"with the measured tokens per round instead of i.i.d. acceptance {_x(p['speedup_measured_tokens'])}"
    )


def bar_chart(items: list[tuple[str, float]], width: int = 48) -> list:
    """Per-request speedup on a log scale around 1×: slower to the left, faster to the right."""
    from rich.text import Text

    if not items:
        return []
    items = sorted(items, key=lambda kv: kv[1], reverse=True)
    half = width // 2
    span = max(abs(math.log(v)) for _, v in items if v > 0) or 1.0
    label_w = min(max(len(k) for k, _ in items), 28)
    lines = []
    for label, v in items:
        n = min(half, round(abs(math.log(v)) / span * half)) if v > 0 else half
        line = Text(f"{label[:label_w]:<{label_w}} ")
        if v >= 1:
            line.append(" " * half + "│")
            line.append("█" * n, style="green")
            line.append(" " * (half - n))
        else:
            line.append(" " * (half - n))
            line.append("█" * n, style="red")
            line.append("│" + " " * half)
        line.append(f" {v:.2f}×")
        lines.append(line)
    scale = math.exp(span)
    lines.append(Text(f"{'':<{label_w}} {'◀ slower':<{half}}│{'faster ▶':>{half}}  (log scale, full bar = {scale:.2f}× / {1 / scale:.2f}×)"))
    return lines


def render(con, records, configs, summary) -> None:
    con.print(request_table(records, configs))
    for c in configs:
        if c.kind == "plain":
            continue
        con.print(summary_table(summary, c))
        con.print(prediction_line(summary, c), soft_wrap=True)
        con.print(f"speedup per request, plain vs {c.label}:")
        for line in bar_chart([(r["id"], r["speedup"][c.name]) for r in records if c.name in r["speedup"]]):
            con.print(line, soft_wrap=True)
    con.print(
        "speedup = plain latency ÷ speculative latency (> 1 is faster); decode speedup excludes the prefill; "
        "predicted = Leviathan's formula from the measured α and costs (decode phase).",
        soft_wrap=True,
    )


# -------------------------------------------------------------------- concurrency sweep


def sweep_table(summary: dict, configs):
    from rich.table import Table

    t = Table(title="served at once, per concurrency level (latency: submission → last token)", title_justify="left")
    for col in ("conc", "config", "tok/s total", "p50 ms", "p95 ms", "p50 ttft ms", "queue ms", "p50 service ms", "req tok/s",
                "accept", "mean k", "rows/step", "same as plain"):
        t.add_column(col, justify="left" if col == "config" else "right")
    for level in summary["levels"]:
        row = summary["per_level"][str(level)]
        for i, c in enumerate(configs):
            s = row.get(c.name)
            if s is None:
                continue
            m = s["matches_plain"]
            t.add_row(
                str(level) if i == 0 else "", c.label, f"{s['throughput_tokens_per_s']:.1f}",
                f"{1000 * s['p50_latency_s']:.0f}", f"{1000 * s['p95_latency_s']:.0f}", f"{1000 * s['p50_ttft_s']:.0f}",
                f"{1000 * s['mean_queue_s']:.0f}", f"{1000 * s['p50_service_s']:.0f}", f"{s['median_request_tokens_per_s']:.1f}", _pct(s["acceptance_rate"]),
                _num(s["mean_k"], "{:.2f}"), f"{s['mean_rows_per_step']:.1f}",
                "-" if not m["compared"] else f"{m['equal']}/{m['compared']}",
                end_section=i == len(configs) - 1,
            )
    return t


def sweep_chart(summary: dict, configs, width: int = 36) -> list:
    """p50 latency and total throughput against concurrency, one bar per configuration."""
    from rich.text import Text

    styles = ["white", "cyan", "magenta", "yellow", "green", "blue"]
    rows = [(lv, c, summary["per_level"][str(lv)].get(c.name)) for lv in summary["levels"] for c in configs]
    rows = [(lv, c, s) for lv, c, s in rows if s]
    if not rows:
        return []
    lat_max = max(s["p50_latency_s"] for _, _, s in rows) or 1.0
    tp_max = max(s["throughput_tokens_per_s"] for _, _, s in rows) or 1.0
    label_w = min(max(len(c.label) for c in configs), 24)
    lines = [Text(f"{'':6}{'':<{label_w}} {'p50 latency (shorter is better)':<{width + 9}} total throughput (longer is better)")]
    last = None
    for lv, c, s in rows:
        style = styles[configs.index(c) % len(styles)]
        head = f"c={lv:<4}" if lv != last else " " * 6
        last = lv
        n_lat = max(1, round(s["p50_latency_s"] / lat_max * width))
        n_tp = max(1, round(s["throughput_tokens_per_s"] / tp_max * width))
        line = Text(f"{head}{c.label[:label_w]:<{label_w}} ")
        line.append("█" * n_lat, style=style)
        line.append(" " * (width - n_lat) + f" {1000 * s['p50_latency_s']:6.0f} ms  ")
        line.append("█" * n_tp, style=style)
        line.append(" " * (width - n_tp) + f" {s['throughput_tokens_per_s']:6.1f} tok/s")
        lines.append(line)
    return lines


def crossover_lines(summary: dict, configs) -> list[str]:
    out = []
    for c in configs:
        x = summary["crossover"].get(c.name)
        if x is None:
            continue
        lat = " · ".join(f"c={k} {_x(v)}" for k, v in x["latency_speedup"].items())
        tp = " · ".join(f"c={k} {_x(v)}" for k, v in x["throughput_ratio"].items())
        stop, cost = x["stops_cutting_latency_at"], x["costs_throughput_from"]
        if not x["cuts_latency_at"]:
            verdict = "never cut p50 latency at the levels measured"
        elif stop is None:
            verdict = "cut p50 latency at every level"
        else:
            verdict = f"stops cutting p50 latency at concurrency {stop}"
            if x["cuts_again_at"]:
                verdict += f" (yet cuts it again at {', '.join(map(str, x['cuts_again_at']))})"
        if cost is None:
            verdict += "; never cost total throughput"
        else:
            verdict += "; costs total throughput " + ("at every level" if len(x["costs_throughput_at"]) == len(x["throughput_ratio"]) else f"from concurrency {cost}")
            if x["recovers_at"]:
                verdict += f" (not at {', '.join(map(str, x['recovers_at']))})"
        out.append(f"{c.label}: {verdict}. p50 latency speedup {lat}; throughput vs plain {tp}")
    return out


def render_sweep(con, summary: dict, configs) -> None:
    from specgen.bench import NOISE_BAND

    con.print(sweep_table(summary, configs))
    for line in sweep_chart(summary, configs):
        con.print(line, soft_wrap=True)
    for line in crossover_lines(summary, configs):
        con.print(line, soft_wrap=True)
    con.print(
        "service = admission → last token (what the sequential bench calls latency); "
        f"latency speedup = plain p50 ÷ speculative p50 at the same level (> 1: speculation cuts latency; "
        f"within ±{100 * NOISE_BAND:.0f}% counts as no change: one batch per level is noisy, use --repeats); "
        "throughput = all tokens generated ÷ wall time of the batch. mean k = the draft length the policy chose "
        "per round (cost policy: sees the other rows in its step).",
        soft_wrap=True,
    )
