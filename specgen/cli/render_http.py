"""Printing for `specgen bench --endpoint`: the tables render.py does not already draw.

Sequential runs reuse render_bench.print_bench (per-request table, speedup per
category, bar chart) and add the latency table (TTFT, TPOT, chunk gaps,
end-to-end) and the failures. Load levels reuse render's chart and crossover
lines, with their own table per level (TTFT / TPOT percentiles, failures,
per-request speedup against the baseline).
"""

from __future__ import annotations

from specgen.cli import render_bench
from specgen.cli.render import pct
from specgen.cli.render_bench import level_label, num_text, ratio_text
from specgen.bench.records import speculation_lines  # noqa: F401  (the bench's warnings, as before)


def _ms(v) -> str:
    return num_text(None if v is None else 1000 * v, "{:.0f}" if v is None or v >= 0.01 else "{:.1f}")


def endpoint_lines(endpoints, models: dict) -> list[str]:
    out = []
    for e in endpoints:
        extra = [f"model {e.model}" if e.model else "", f"key ${e.key_env}" if e.key_env else "",
                 f"body {e.body}" if e.body else "", f"spec counters: /metrics ({e.counters})" if e.counters and not e.per_request else ""]
        role = "baseline" if e.kind == "plain" else "compared"
        out.append(f"  {e.name} ({role}): {e.url}" + "".join(f" · {x}" for x in extra if x))
    return out


def latency_table(lat: dict, endpoints):
    from rich.table import Table

    t = Table(title="per endpoint, over every successful run (ms)", title_justify="left")
    for col in ("endpoint", "runs", "failed", "ttft p50", "ttft p95", "tpot p50", "tpot p95", "chunk gap p50",
                "e2e p50", "e2e p95", "tok/s"):
        t.add_column(col, justify="left" if col == "endpoint" else "right")
    for e in endpoints:
        s = lat[e.name]
        t.add_row(e.label, str(s["runs"]), f"[red]{s['failed']}[/red]" if s["failed"] else "0",
                  _ms(s["p50_ttft_s"]), _ms(s["p95_ttft_s"]), _ms(s["p50_tpot_s"]), _ms(s["p95_tpot_s"]),
                  _ms(s["p50_itl_s"]), _ms(s["p50_e2e_s"]), _ms(s["p95_e2e_s"]), num_text(s["tokens_per_s"]))
    return t


def error_lines(lat: dict) -> list[str]:
    return [f"{name}: {n} × {err}" for name, s in lat.items() for err, n in s["errors"]]


def print_http_bench(con, records, endpoints, summary: dict, lat: dict) -> None:
    if any(r["runs"] for r in records):
        render_bench.print_bench(con, [r for r in records if r["runs"]], endpoints, summary)
    con.print(latency_table(lat, endpoints))
    for line in error_lines(lat):
        con.print(f"[red]failed[/red] {line}", soft_wrap=True)
    con.print("ttft = to the first chunk with text; tpot = (e2e − ttft) ÷ (tokens − 1); chunk gap = time between "
              "chunks (a speculative server may send several tokens in one); acceptance comes from the server's own "
              "figures when it reports them (each run's spec_source in the records says which).", soft_wrap=True)


def sweep_table(summary: dict, endpoints):
    from rich.table import Table

    what = "Poisson arrivals per second" if summary["load"] == "rate" else "requests in flight"
    t = Table(title=f"per level ({what}; latency: sent → last token, ms)", title_justify="left")
    for col in ("level", "endpoint", "served", "failed", "tok/s total", "e2e p50", "e2e p95", "ttft p50", "ttft p95",
                "tpot p50", "tpot p95", "accept", f"speedup vs {summary['baseline']} [95% CI]", "slower", "same"):
        t.add_column(col, justify="left" if col == "endpoint" else "right")
    for lv in summary["levels"]:
        row = summary["per_level"][str(lv)]
        shown = [e for e in endpoints if e.name in row]
        for i, e in enumerate(shown):
            s = row[e.name]
            head = [level_label(summary, lv) if i == 0 else "", e.label, str(s.get("served", 0)),
                    f"[red]{s['failed']}[/red]" if s.get("failed") else "0"]
            if not s.get("served"):
                t.add_row(*head, *["-"] * 11, end_section=i == len(shown) - 1)
                continue
            sp, m = s["request_speedup"], s["matches_plain"]
            t.add_row(
                *head, f"{s['throughput_tokens_per_s']:.1f}", _ms(s["p50_latency_s"]), _ms(s["p95_latency_s"]),
                _ms(s["p50_ttft_s"]), _ms(s["p95_ttft_s"]), _ms(s["p50_tpot_s"]), _ms(s["p95_tpot_s"]),
                pct(s["acceptance_rate"]),
                "-" if not sp else f"{ratio_text(sp['median'])} [{sp['median_ci95'][0]:.2f}–{sp['median_ci95'][1]:.2f}]",
                "-" if not sp else pct(sp["slower_share"]),
                "-" if not m["compared"] else f"{m['equal']}/{m['compared']}",
                end_section=i == len(shown) - 1,
            )
    return t


def print_http_sweep(con, summaries: list[dict], endpoints) -> None:
    for summary in summaries:
        con.print(sweep_table(summary, endpoints))
        for line in render_bench.sweep_chart(summary, endpoints):
            con.print(line, soft_wrap=True)
        for line in render_bench.crossover_lines(summary, endpoints):
            con.print(line, soft_wrap=True)
    con.print("speedup = per request, baseline latency ÷ its latency at the same level (median over requests, "
              "bootstrap 95% interval); tok/s total = tokens generated ÷ the level's wall time; same = greedy "
              "outputs equal to the baseline's.", soft_wrap=True)


def client_line(t: dict) -> str:
    return (f"client: {t['cpu_per_request_ms']:.2f} ms CPU a request ({100 * t['cpu_share_of_request_time']:.2f}% of "
            f"the requests' time), {t['requests']} requests in {t['wall_s']:.1f} s")
