"""`specgen bench --endpoint`: the bench against OpenAI-compatible servers over HTTP.

specgen.bench.endpoint.measure / load hold the logic, render / render_http the
printing. stderr: the endpoints, progress, the tables; stdout: nothing, or
the summary as one JSON object with --json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer

import specgen.cli.render as render
import specgen.cli.render_bench as render_bench
import specgen.cli.render_http as rh
from specgen.errors import SpecgenError


def http_bench(requests: Path | None, *, endpoint, endpoint_model, endpoint_key_env, endpoint_body, baseline,
               concurrency: str | None, rate: str | None, count, duration, timeout, max_tokens, repeats, ignore_eos,
               temp, seed, warmup, limit, out, resume, csv_out, json_out, report) -> None:
    from specgen import __version__, bench as B
    from specgen.bench.endpoint.measure import Sampling, parse_endpoints
    from specgen.bench.endpoint.load import HttpBench, LoadSettings, parse_levels, run
    from specgen.bench.records import speculation_check
    from specgen.cli.bench_out import MemorySink, check_writable, write_report

    eps = parse_endpoints(endpoint, endpoint_model, endpoint_key_env, endpoint_body, baseline)
    levels = parse_levels(concurrency, "--concurrency", integer=True) if concurrency is not None else []
    rates = parse_levels(rate, "--rate", integer=False) if rate is not None else []
    sweep = bool(levels or rates)
    if limit is not None and limit < 1:
        raise SpecgenError(f"--limit must be >= 1 (got {limit})")
    if resume and out is None:
        raise SpecgenError("--resume needs --out (the record file to continue)")
    if sweep and csv_out is not None:
        raise SpecgenError("--csv is not supported with --concurrency / --rate (it lists sequential runs)")
    if not sweep and (count is not None or duration is not None):
        raise SpecgenError("--count and --duration size a load level: give --concurrency or --rate")
    if duration is not None and not rates:
        raise SpecgenError("--duration bounds Poisson arrivals: give --rate")
    settings = LoadSettings(Sampling(max_tokens, temp, seed, ignore_eos), repeats, warmup, timeout, count, duration, seed)
    settings.validate()
    if temp < 0:
        raise SpecgenError(f"--temp must be >= 0 (got {temp:g})")
    if report is not None:
        from specgen.bench.report import require_plotly

        require_plotly()
    reqs = B.load_requests(requests)[:limit]
    for path, flag in ((out, "--out"), (csv_out, "--csv"), (report, "--report")):
        if path is not None:
            check_writable(path, flag)

    bench = HttpBench(eps, reqs, settings)
    names = bench.names
    con = render.stderr_console(width_when_piped=True)
    state: dict = {"sink": None, "meta": None}

    def meta() -> dict:
        return {
            "specgen": __version__, "mode": "http", "model": eps[0].model or eps[0].url, "configs": names,
            "baseline": names[0], "endpoints": [e.meta() for e in eps],
            "loads": {"concurrency": levels, "rate": rates} if sweep else None,
            "max_tokens": max_tokens, "repeats": repeats, "ignore_eos": ignore_eos, "temperature": temp, "seed": seed,
            "count": count, "duration": duration, "timeout": timeout,
            "requests": str(requests) if requests else "<bundled>", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    async def main():
        async with bench.client() as client:
            await bench.prepare(client)
            state["meta"] = meta()
            sink = state["sink"] = B.RecordFile(out, state["meta"], resume=resume) if out else MemorySink()
            done = sink.done_ids()
            con.print("bench over HTTP, baseline first:")
            for line in rh.endpoint_lines(eps, bench.models):
                con.print(line, soft_wrap=True)
            if sweep:
                shape = ", ".join([f"concurrency {', '.join(map(str, levels))}"] * bool(levels)
                                  + [f"Poisson {', '.join(f'{r}/s' for r in rates)}"] * bool(rates))
                con.print(f"bench: {len(bench.jobs())} requests a level · {shape} × {len(eps)} endpoints × {repeats} "
                          f"repeat{'s' * (repeats > 1)} · max_tokens {max_tokens}"
                          + (f" · arrivals for at most {duration:g} s" if duration else "")
                          + (f" · {len(done)} batches already recorded" if done else ""))

                def on_batch(i, total, load, level, ep):
                    label = f"{level}/s" if load == "rate" else f"concurrency {level}"
                    con.print(f"[dim][{i}/{total}] {label} · {ep.label}[/dim]")

                await bench.sweep(client, levels, rates, sink.append, done=done, on_batch=on_batch)
            else:
                pending = [r for r in reqs if r.id not in done]
                total = len(pending) * len(eps) * repeats
                con.print(f"bench: {len(pending)} requests × {len(eps)} endpoints × {repeats} repeat{'s' * (repeats > 1)}"
                          f" = {total} requests, one at a time · max_tokens {max_tokens}"
                          + (f" · {len(reqs) - len(pending)} already recorded" if done else ""))
                progress = render_bench.BenchProgress(con, total, names)
                with progress:
                    await bench.sequential(client, pending, sink.append, on_request=progress.on_request)

    interrupted = False
    try:
        run(main())
    except KeyboardInterrupt:
        interrupted = True
    sink = state["sink"]
    if sink is None:  # interrupted before the first request
        raise typer.Exit(130)
    try:
        records = list(sink.records)
        if sweep:
            summaries = [B.summarize_sweep(records, names, names[0], load) for load in ("concurrency", "rate")
                         if any(r.get("load") == load for r in records)]
            if records:
                rh.print_http_sweep(con, summaries, eps)
            lat = None
        else:
            summaries = B.summarize(records, names, names[0])
            lat = B.latency_summary(records, names)
            if records:
                rh.print_http_bench(con, records, eps, summaries, lat)
        checks = speculation_check(records, eps)
        warnings = rh.speculation_lines(checks)
        for line in warnings:  # stderr, under the tables: the report's last word on each endpoint
            con.print(line, soft_wrap=True, markup=False, highlight=False)
        timing = bench.timing.to_dict()
        con.print(rh.client_line(timing) + (f" · records: {out}" if out else ""), soft_wrap=True)
        if interrupted:
            unit = "batches" if sweep else "requests"
            con.print(f"interrupted: {len(records)} {unit} recorded" + (f" in {out} (--resume continues)" if out else ""))
        if csv_out is not None:
            B.write_csv(csv_out, records)
        if report is not None:
            write_report(con, report, state["meta"], records)
        if json_out:
            obj = {
                "endpoints": state["meta"]["endpoints"], "baseline": names[0], "configs": names,
                "settings": {k: state["meta"][k] for k in ("max_tokens", "repeats", "ignore_eos", "temperature", "seed",
                                                           "count", "duration", "timeout", "loads")},
                "interrupted": interrupted, "records": len(records), "client": timing,
                "speculation": checks, "warnings": warnings,
                "out": str(out) if out else None,
            }
            if sweep:
                obj["summary"] = {s["load"]: s for s in summaries}
                obj["batches"] = [{k: v for k, v in r.items() if k != "requests"} for r in records]
            else:
                obj["summary"], obj["latency"] = summaries, lat
                obj["per_request"] = [{"id": r["id"], "category": r["category"], "speedup": r["speedup"],
                                       "latency_change_ms": r["latency_change_ms"], "failed": len(r["failed"])}
                                      for r in records]
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()
    finally:
        sink.close()
    if interrupted:
        raise typer.Exit(130)
