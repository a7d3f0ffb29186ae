"""`specgen bench`: the command (specgen.bench holds the logic, render the tables and charts).

stderr: progress (a bar with ETA on a terminal, one line per request
otherwise), the per-request table, the summary table and a bar chart of
per-request speedup. stdout: nothing, or the summary as one JSON object
with --json.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from typing_extensions import Annotated

import specgen.cli.render as render
import specgen.cli.render_bench as render_bench
from specgen.cli.options import MACHINE, SAMPLING, OnOff, Told, takes
from specgen.cli.bench_out import MemorySink, check_writable, write_report
from specgen.errors import SpecgenError

ReportOpt = Annotated[Optional[Path], typer.Option("--report", metavar="FILE.html", help="Also write the charts and tables as one self-contained HTML page (opens offline; needs specgen[report]).")]

CONFIG_HELP = (
    "A speculative configuration to compare with plain decoding (repeatable): "
    "lookup[:k=N,ngram=N,ngram_min=N,policy=P], suffix[:k=N,ngram_min=N,policy=P,global=on|off], draft=MODEL[:k=N,policy=P], pair=NAME[:k=N,policy=P] (pair=auto: the best local draft, `specgen pair`), heads[=FILE|auto][:k=N,policy=P], P = fixed (default), cost or heuristic; with an adaptive policy k is the ceiling. Default: lookup:k=8."
)
# The shared options, told as a bench sees them: per request, and the same for every configuration.
BENCH_TOLD = dict(
    model=Told("Target model (path, models.toml name or hf: reference). Default: the embedded SmolLM2 135M Instruct; the benchmarks use -m gemma3-270m."),
    max_tokens=Told("Tokens per request, unless the request sets max_tokens.", 64),
    ignore_eos=Told("Always generate max_tokens (fixed-length comparisons)."),
    temp=Told("Temperature for requests that set none; 0 = greedy."),
    top_k=Told("Top-k for sampled requests (0 = off)."),
    top_p=Told("Top-p for sampled requests."),
    min_p=Told("Min-p for sampled requests."),
    seed=Told("Seed for requests that set none (same for every configuration).", 0, int),
    json_out=Told("Print the summary as one JSON object on stdout."),
    heads=Told("Also measure prediction heads (a heads file, or auto: those trained for the target) under the cost "
               "policy, with prompt lookup alongside: the configuration heads=FILE:policy=cost (beside any -C; "
               "without -C, instead of the default)."),
    global_cache=Told(
        "on: every suffix configuration also drafts from the earlier requests of its repeat (global=on), "
        "one index per repeat and configuration (per batch with --concurrency), so no request drafts from its own earlier output.",
    ),
)


@takes("requests", "config", "repeats", "out", "resume", "csv_out", "model", "heads", "max_tokens", "ignore_eos", *SAMPLING, "limit",
       "warmup", *MACHINE, "json_out", "concurrency", "report", "endpoint", "endpoint_model", "endpoint_key_env", "endpoint_body",
       "baseline", "rate", "count", "duration", "timeout", "global_cache", **BENCH_TOLD)
def bench(
    requests: Annotated[Optional[Path], typer.Argument(help="Requests: JSONL (prompt or messages; optional id, category, max_tokens, temperature, seed) or text, one prompt a line. Default: the bundled set.")] = None,
    config: Annotated[Optional[List[str]], typer.Option("-C", "--config", metavar="CFG", help=CONFIG_HELP)] = None,
    repeats: Annotated[int, typer.Option("-r", "--repeats", help="Runs of each request in each configuration (order alternates).")] = 1,
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="Append records (JSONL) here as each request finishes.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue --out: skip requests it already records.")] = False,
    csv_out: Annotated[Optional[Path], typer.Option("--csv", help="Also write one CSV row per run here.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Only the first N requests.")] = None,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="One short untimed run per configuration first.")] = True,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", metavar="LEVELS", help="Serve the whole set at once at each level, e.g. 1,2,4,8 (requests share one context, continuous batching): throughput and latency against concurrency, plain vs speculative. With --endpoint: closed loop, that many requests in flight.")] = None,
    report: ReportOpt = None,
    endpoint: Annotated[Optional[List[str]], typer.Option("--endpoint", metavar="NAME=URL", help="Measure an OpenAI-compatible server instead (repeatable, at least two; each is a configuration, the first or --baseline is the baseline), e.g. spec=http://127.0.0.1:8080.")] = None,
    endpoint_model: Annotated[Optional[List[str]], typer.Option("--endpoint-model", metavar="NAME=MODEL", help="The model name to ask endpoint NAME for (default: the first its /v1/models lists).")] = None,
    endpoint_key_env: Annotated[Optional[List[str]], typer.Option("--endpoint-key-env", metavar="NAME=VAR", help="Send endpoint NAME the API key held in environment variable VAR.")] = None,
    endpoint_body: Annotated[Optional[List[str]], typer.Option("--endpoint-body", metavar="NAME=JSON", help="A JSON object merged into every request body sent to endpoint NAME, e.g. 'plain={\"speculative\": {\"mode\": \"none\"}}'.")] = None,
    baseline: Annotated[Optional[str], typer.Option("--baseline", metavar="NAME", help="The endpoint the others are compared with (default: the first).")] = None,
    rate: Annotated[Optional[str], typer.Option("--rate", metavar="RATES", help="With --endpoint: open loop, Poisson arrivals at each rate per second, e.g. 2,5.")] = None,
    count: Annotated[Optional[int], typer.Option("--count", help="With --endpoint and --concurrency/--rate: requests per level (the set, cycled; default: its size).")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration", metavar="S", help="With --rate: arrivals stop after S seconds per level.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", metavar="S", help="With --endpoint: seconds allowed per request (a slower one is recorded as failed).")] = 300.0,
    *, model, heads, max_tokens, ignore_eos, temp, top_k, top_p, min_p, seed, ctx_size, threads, gpu_layers, json_out, global_cache,
) -> None:
    """Serve a batch of requests plain and speculative, side by side; per-request latency change and speedup.

    With --endpoint: the same measurements against OpenAI-compatible servers over HTTP (streamed).
    """
    from specgen import __version__, bench as B

    if endpoint:
        from specgen.cli.bench_http import http_bench

        given = [f for f, v in (("-C/--config", config), ("-m/--model", model), ("--heads", heads), ("-t/--threads", threads),
                                ("--global-cache on", global_cache == OnOff.on)) if v]
        if given:
            raise SpecgenError(f"{given[0]} configures the in-process bench; with --endpoint the servers are configured")
        return http_bench(
            requests, endpoint=endpoint, endpoint_model=endpoint_model, endpoint_key_env=endpoint_key_env,
            endpoint_body=endpoint_body, baseline=baseline, concurrency=concurrency, rate=rate, count=count,
            duration=duration, timeout=timeout, max_tokens=max_tokens, repeats=repeats, ignore_eos=ignore_eos,
            temp=temp, seed=seed, warmup=warmup, limit=limit, out=out, resume=resume, csv_out=csv_out,
            json_out=json_out, report=report,
        )
    http_only = [f for f, v in (("--endpoint-model", endpoint_model), ("--endpoint-key-env", endpoint_key_env),
                                ("--endpoint-body", endpoint_body), ("--baseline", baseline), ("--rate", rate),
                                ("--count", count), ("--duration", duration)) if v is not None]
    if http_only:
        raise SpecgenError(f"{http_only[0]} needs --endpoint")

    if heads is not None:
        if not heads.strip():
            raise SpecgenError("--heads needs a heads file or auto")
        config = [*(config or []), f"heads={heads.strip()}:policy=cost"]
    settings = B.Settings(max_tokens, repeats, ignore_eos, temp, top_k, top_p, min_p, seed, warmup)
    settings.validate()
    if report is not None:
        from specgen.bench.report import require_plotly

        require_plotly()
    if concurrency is not None:
        for flag, on in (("--resume", resume), ("--csv", csv_out is not None)):
            if on:
                raise SpecgenError(f"{flag} is not supported with --concurrency")
        levels = B.parse_concurrency(concurrency)
        return _sweep(requests, _configs(config, global_cache), levels, settings, out, model, limit, ctx_size, threads, gpu_layers, json_out, temp, seed, report)
    if limit is not None and limit < 1:
        raise SpecgenError(f"--limit must be >= 1 (got {limit})")
    if resume and out is None:
        raise SpecgenError("--resume needs --out (the record file to continue)")
    if threads is not None and threads < 1:
        raise SpecgenError(f"-t/--threads must be >= 1 (got {threads})")
    configs = _configs(config, global_cache)
    reqs = B.load_requests(requests)[:limit]
    for path, flag in ((out, "--out"), (csv_out, "--csv"), (report, "--report")):
        if path is not None:
            check_writable(path, flag)

    setup = B.open_bench(model, configs, ctx_size=ctx_size, threads=threads, gpu_layers=gpu_layers)
    render.note_translated(any(d is not None and d.translated for d in setup.drafters.values()))
    with contextlib.ExitStack() as stack:
        stack.callback(setup.close)
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
            "global_cache": _global_cache_kind(setup.configs, "per-repeat"),
        }
        sink = B.RecordFile(out, meta, resume=resume) if out else MemorySink()
        stack.callback(sink.close)
        done = sink.done_ids()
        pending = [r for r in reqs if r.id not in done]
        con = render.stderr_console(width_when_piped=True)
        runs_total = len(pending) * len(names) * repeats
        con.print(
            f"bench: {len(pending)} requests × {len(names)} configurations × {repeats} repeat{'s' * (repeats > 1)}"
            f" = {runs_total} runs · {setup.target_path.name} · {setup.target.n_threads} threads · max_tokens {max_tokens}"
            + (f" · {len(reqs) - len(pending)} already recorded" if done else "")
            + _global_cache_note(meta["global_cache"])
        )
        runner = B.Runner(setup, settings)
        prepared = runner.prepare(pending)
        interrupted = False
        progress = render_bench.BenchProgress(con, runs_total, names)
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
            render_bench.print_bench(con, records, setup.configs, summary)
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
            write_report(con, report, meta, records)
        if json_out:
            obj = {
                "model": str(setup.target_path),
                "configs": names,
                "settings": {**settings.meta(), "temperature": temp, "seed": seed, "threads": setup.target.n_threads,
                             "global_cache": meta["global_cache"]},
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
            _write_json(obj)
    if interrupted:
        raise typer.Exit(130)


def _sweep(requests, configs, levels, settings, out, model, limit, ctx_size, threads, gpu_layers, json_out, temp, seed, report=None) -> None:
    """`specgen bench --concurrency`: the set served at once at each level."""
    from specgen import __version__, bench as B

    if limit is not None and limit < 1:
        raise SpecgenError(f"--limit must be >= 1 (got {limit})")
    if threads is not None and threads < 1:
        raise SpecgenError(f"-t/--threads must be >= 1 (got {threads})")
    reqs = B.load_requests(requests)[:limit]
    for path, flag in ((out, "--out"), (report, "--report")):
        if path is not None:
            check_writable(path, flag)
    setup = B.open_bench(model, configs, ctx_size=ctx_size, threads=threads, gpu_layers=gpu_layers, n_seq_max=max(levels))
    render.note_translated(any(d is not None and d.translated for d in setup.drafters.values()))
    with contextlib.ExitStack() as stack:
        stack.callback(setup.close)
        names = [c.name for c in setup.configs]
        prepared = B.Runner(setup, settings).prepare(reqs)
        B.check_concurrency(levels, prepared, setup.target.n_ctx, max((c.k or 0) for c in setup.configs), setup.target.n_batch)
        meta = {
            "specgen": __version__, "model": str(setup.target_path), "configs": names, "concurrency": levels,
            **settings.meta(), "temperature": temp, "threads": setup.target.n_threads,
            "requests": str(requests) if requests else "<bundled>", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "global_cache": _global_cache_kind(setup.configs, "per-batch"),
        }
        sink = B.RecordFile(out, meta, resume=False) if out else MemorySink()
        stack.callback(sink.close)
        con = render.stderr_console(width_when_piped=True)
        total = len(levels) * len(names) * settings.repeats
        con.print(
            f"bench: {len(prepared)} requests served at once at concurrency {', '.join(map(str, levels))} × "
            f"{len(names)} configurations × {settings.repeats} repeat{'s' * (settings.repeats > 1)} = {total} batches · "
            f"{setup.target_path.name} · {setup.target.n_threads} threads · max_tokens {settings.max_tokens} · "
            f"one context of {setup.target.n_ctx} tokens" + _global_cache_note(meta["global_cache"])
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
            render_bench.print_sweep(con, summary, setup.configs)
        if interrupted:
            con.print(f"interrupted: {len(records)} batches recorded" + (f" in {out}" if out else ""))
        if report is not None:
            write_report(con, report, meta, records)
        if json_out:
            obj = {
                "model": str(setup.target_path), "configs": names, "concurrency": levels,
                "settings": {**settings.meta(), "temperature": temp, "seed": seed, "threads": setup.target.n_threads,
                             "global_cache": meta["global_cache"]},
                "n_ctx": setup.target.n_ctx, "interrupted": interrupted, "summary": summary,
                "runs": [{k: v for k, v in r.items() if k != "requests"} for r in records],
                "out": str(out) if out else None,
            }
            _write_json(obj)
    if interrupted:
        raise typer.Exit(130)


def _write_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _configs(texts, global_cache: OnOff):
    """The -C configurations; --global-cache on turns global=on for every suffix one."""
    from dataclasses import replace

    from specgen import bench as B
    from specgen.cli.options import global_cache_on

    configs = B.parse_configs(texts)
    if global_cache_on(global_cache, any(c.kind == "suffix" for c in configs), "a suffix configuration (-C suffix)"):
        configs = [replace(c, global_cache=True) if c.kind == "suffix" else c for c in configs]
        names = [c.name for c in configs]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice:
            raise SpecgenError(f"--global-cache on makes two configurations {twice} (drop one -C)")
    return configs


def _global_cache_kind(configs, kind: str) -> str:
    """What the records say of global suffix indexes: none, or one per repeat (per batch in a sweep)."""
    return kind if any(c.global_cache for c in configs) else "none"


def _global_cache_note(kind: str) -> str:
    if kind == "none":
        return ""
    unit = "repeat" if kind == "per-repeat" else "batch"
    return f" · global suffix index: one per {unit} and configuration (no request drafts from its own earlier output)"


def report(
    records: Annotated[Path, typer.Argument(help="A records file written by `specgen bench --out`.")],
    out: Annotated[Optional[Path], typer.Option("-o", "--out", metavar="FILE.html", help="Where to write the page. Default: RECORDS with .html.")] = None,
) -> None:
    """Rebuild the HTML report (charts and tables, one self-contained page) from a bench records file."""
    from specgen.bench.report import report_file

    out = out if out is not None else records.with_suffix(".html")
    if out.resolve() == records.resolve():
        raise SpecgenError(f"-o/--out {out} is the records file itself")
    check_writable(out, "-o/--out")
    report_file(records, out)
    render.stderr_console(width_when_piped=True).print(f"report: {out}")
