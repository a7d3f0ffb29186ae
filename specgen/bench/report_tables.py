"""The report's HTML tables and the small formatters they and the charts share:
the summary per configuration, the per-request table, the sweep and latency
tables, the crossover list (specgen.bench.report builds the page around them)."""

from __future__ import annotations

import html
import math
from statistics import median
from typing import Sequence

from specgen.bench.stats import NOISE_BAND


def _median_ms(record: dict, name: str) -> float | None:
    lat = [x["total_s"] for x in record["runs"] if x["config"] == name]
    return 1000 * median(lat) if lat else None


def _lv(summary: dict, level) -> str:
    return f"{level}/s" if summary.get("load") == "rate" else f"c={level}"


def _what(summary: dict) -> str:
    return "arrival rate" if summary.get("load") == "rate" else "concurrency"


def _e(v) -> str:
    return html.escape(str(v))


def _x(v) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.2f}×"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _num(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _cell(c) -> str:
    """A value, or (value, detail) with the detail in small type below it."""
    if isinstance(c, tuple):
        return f'<td>{_e(c[0])}<br><span class="sub">{_e(c[1])}</span></td>'
    return f"<td>{_e(c)}</td>"


def _table(caption: str, head: Sequence[str], rows: Sequence[Sequence], cls: str = "") -> str:
    """Cells are escaped here; a row whose first cell is 'overall' is set in bold."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        ('<tr class="total">' if row and row[0] == "overall" else "<tr>") + "".join(_cell(c) for c in row) + "</tr>"
        for row in rows
    )
    return f'<table class="{cls}"><caption>{_e(caption)}</caption><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _summary_table(summary: dict, name: str, base: str = "plain") -> str:
    s = summary[name]
    rows = []
    for cat, g in [*s["categories"].items(), ("overall", s["overall"])]:
        if not g.get("requests"):
            continue
        tp = g["throughput"]
        rows.append([
            cat, str(g["requests"]),
            (_x(g["median_speedup"]), f"{g['median_ci95'][0]:.2f}–{g['median_ci95'][1]:.2f}"),
            (_x(g["geomean_speedup"]), f"{g['geomean_ci95'][0]:.2f}–{g['geomean_ci95'][1]:.2f}"),
            _pct(g["slower_share"]), (_num(tp["spec_tokens_per_s"]), f"{base} {_num(tp['plain_tokens_per_s'])}"),
            _pct(g["acceptance_rate"]), _num(g["mean_accepted_len"], "{:.2f}"), _x(g["decode_speedup"]),
            _x(g["prediction"]["speedup"]) if g["prediction"] else "-",
        ])
    head = ("category", "n", "median speedup, 95% CI", "geomean, 95% CI", "slower", "tok/s",
            "accept", "len", "decode speedup", "predicted")
    return _table(f"{base} vs {name}", head, rows, "summary")


def _request_table(records, specs, base: str = "plain") -> str:
    head = ["id", "category", f"{base} ms"] + [h for n in specs for h in (f"{n} ms", "speedup")]
    rows = []
    for r in records:
        row = [r["id"], r["category"], _num(_median_ms(r, base), "{:.0f}")]
        for n in specs:
            row += [_num(_median_ms(r, n), "{:.0f}"), _x(r["speedup"].get(n))]
        rows.append(row)
    return "<details><summary>Per request</summary>" + _table("median latency over repeats", head, rows, "requests") + "</details>"


def _sweep_table(summary: dict, names: Sequence[str]) -> str:
    base = summary.get("baseline", "plain")
    http = any("p50_tpot_s" in s and s.get("p50_tpot_s") is not None for r in summary["per_level"].values() for s in r.values())
    head = ["rate" if summary.get("load") == "rate" else "conc", "config", "tok/s total", "p50 ms", "p95 ms", "p50 ttft ms"] + (["p50 tpot ms", "failed"] if http else []) + [
        "accept", "mean k", f"same as {base}"]
    rows = []
    for lv in summary["levels"]:
        for n in names:
            s = summary["per_level"][str(lv)].get(n)
            if s is None:
                continue
            if not s.get("served", 1):
                rows.append([_cell_lv(summary, lv), n] + ["-"] * (len(head) - 2))
                continue
            m = s["matches_plain"]
            rows.append([
                _cell_lv(summary, lv), n, f"{s['throughput_tokens_per_s']:.1f}", f"{1000 * s['p50_latency_s']:.0f}",
                f"{1000 * s['p95_latency_s']:.0f}", f"{1000 * s['p50_ttft_s']:.0f}",
                *([_num(s["p50_tpot_s"] and 1000 * s["p50_tpot_s"]), str(s.get("failed", 0))] if http else []),
                _pct(s["acceptance_rate"]), _num(s["mean_k"], "{:.2f}"),
                "-" if not m["compared"] else f"{m['equal']}/{m['compared']}",
            ])
    return _table(f"per {_what(summary)} level", head, rows, "summary sweep")


def _cell_lv(summary: dict, level) -> str:
    return f"{level}/s" if summary.get("load") == "rate" else str(level)


def _crossover_list(summary: dict, specs: Sequence[str]) -> str:
    items = []
    what = _what(summary)
    for n in specs:
        x = summary["crossover"].get(n)
        if x is None:
            continue
        if not x["cuts_latency_at"]:
            verdict = "never cut p50 latency at the levels measured"
        elif x["stops_cutting_latency_at"] is None:
            verdict = "cut p50 latency at every level"
        else:
            verdict = f"stops cutting p50 latency at {what} {x['stops_cutting_latency_at']}"
        cost = x["costs_throughput_from"]
        verdict += "; never cost total throughput" if cost is None else f"; costs total throughput from {what} {cost}"
        items.append(f"<li><b>{_e(n)}</b>: {_e(verdict)}</li>")
    note = f"Within ±{100 * NOISE_BAND:.0f}% of {summary.get('baseline', 'plain')} counts as no change."
    return f'<div class="crossover"><h3>Crossover ({_e(what)})</h3><ul>{"".join(items)}</ul><p class="note">{_e(note)}</p></div>'


def _latency_table(lat: dict, names: Sequence[str]) -> str:
    """HTTP runs: TTFT, TPOT, end-to-end percentiles and failures per endpoint."""
    head = ("endpoint", "runs", "failed", "ttft p50", "ttft p95", "tpot p50", "tpot p95", "e2e p50", "e2e p95", "tok/s")
    ms = lambda v: _num(None if v is None else 1000 * v)  # noqa: E731
    rows = [[n, str(s["runs"]), str(s["failed"]), ms(s["p50_ttft_s"]), ms(s["p95_ttft_s"]), ms(s["p50_tpot_s"]),
             ms(s["p95_tpot_s"]), ms(s["p50_e2e_s"]), ms(s["p95_e2e_s"]), _num(s["tokens_per_s"])]
            for n, s in ((n, lat[n]) for n in names)]
    return _table("per endpoint (ms), every successful run", head, rows, "summary")
