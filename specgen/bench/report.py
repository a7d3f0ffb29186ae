"""The HTML report of a bench run: records in, one self-contained page out.

`build_report(meta, records)` is pure: the records of `specgen bench --out`
(sequential "request" records or `--concurrency` "serve" records) in, one
HTML string out. The charts are plotly figures with plotly.js inlined once,
so the page opens offline; plotly is the optional extra `specgen[report]`.
`load_records` reads a records file and `write_report` writes the page, each
failure one SpecgenError line.

Sequential runs: per-request latency plain vs each configuration (dumbbells
sorted by speedup), speedup per category with the bootstrap intervals,
acceptance by draft position, draft lengths chosen. Sweeps: p50 latency
against total throughput per configuration with the crossover marked, the
ratios to plain per level, draft lengths per level. The summary tables sit
beside the charts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

from specgen.bench.records import record_line
from specgen.bench.stats import NOISE_BAND, latency_summary, summarize, summarize_sweep
from specgen.errors import SpecgenError, read_text_file
from specgen.bench.report_tables import (
    _crossover_list, _e, _latency_table, _lv, _median_ms, _request_table, _summary_table, _sweep_table, _what,
)

PLAIN_COLOR = "#8c8c8c"
FASTER, SLOWER = "#2ca02c", "#d62728"
PALETTE = ("#1f77b4", "#ff7f0e", "#9467bd", "#17becf", "#bcbd22", "#e377c2", "#8c564b")

# What summarize / summarize_sweep and the charts read from each record.
_REQUEST_KEYS = ("id", "category", "runs", "speedup", "latency_change_ms")
_RUN_KEYS = (
    "config", "total_s", "decode_s", "generated_tokens", "rounds", "drafted", "accepted",
    "per_position", "k_hist", "draft_max", "draft_kind", "verify_by_k", "draft_steady", "matches_plain",
)
_SERVE_KEYS = ("concurrency", "config", "throughput_tokens_per_s", "k_hist", "mean_rows_per_step", "requests")
_SERVED_KEYS = ("id", "latency_s", "ttft_s", "service_s", "queue_s", "tokens_per_s", "drafted", "accepted")


# =============================================================== records


def load_records(path: Path) -> tuple[dict, list[dict]]:
    """A records file (`specgen bench --out`) → (meta, records); one SpecgenError line if it is not one.

    A torn last line (a bench killed mid-write) is left out, as `--resume` does.
    """
    text = read_text_file(path, "records file")
    lines = text.split("\n")
    torn = lines.pop() if lines else ""  # text after the last newline: "" for a whole file
    meta: dict = {}
    records: list[dict] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        obj = _record(path, n, line)
        if obj.get("type") == "meta":
            meta = obj
        else:
            records.append(obj)
    if torn.strip() and not (meta or records):  # a lone unterminated line is no bench's torn write
        records.append(_record(path, len(lines) + 1, torn))
    if not records:
        raise SpecgenError(f"{path}: no bench records (expected the output of `specgen bench --out`)")
    if len({r["type"] for r in records}) > 1:
        raise SpecgenError(f"{path}: mixes sequential and --concurrency records")
    return meta, records


def _record(path: Path, n: int, line: str) -> dict:
    where = f"{path}:{n}: not a bench record"
    kind, obj = record_line(path, n, line)
    if kind == "meta":
        return obj
    if kind == "request":
        _require(obj, _REQUEST_KEYS, where)
        runs = obj["runs"] if obj.get("failed") and obj["runs"] == [] else _list(obj["runs"], "runs", where)
        for run in runs:  # (no runs: every request of an HTTP bench failed; its failures are counted)
            _require(run, _RUN_KEYS, where + " (in runs)")
        return obj
    if kind == "serve":
        _require(obj, _SERVE_KEYS, where)
        for req in _list(obj["requests"], "requests", where):
            _require(req, _SERVED_KEYS, where + " (in requests)")
        return obj
    raise SpecgenError(f"{where} (type is {kind!r}, not meta, request or serve)")


def _list(value, key: str, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise SpecgenError(f"{where} ({key} must be a non-empty list)")
    return value


def _require(obj, keys: Sequence[str], where: str) -> None:
    if not isinstance(obj, dict):
        raise SpecgenError(f"{where} (expected an object)")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise SpecgenError(f"{where} (no {', '.join(missing)})")


def baseline_name(meta: dict) -> str:
    """What the others are compared with: plain decoding in process, the baseline endpoint over HTTP."""
    return str(meta.get("baseline", "plain"))


def config_names(meta: dict, records: Sequence[dict]) -> list[str]:
    """Configurations in the bench's order: the meta line's, then any others the records hold."""
    names = [n for n in meta.get("configs", []) if isinstance(n, str)]
    found = [x["config"] for r in records for x in r.get("runs", [])] + [r["config"] for r in records if "config" in r]
    for n in [baseline_name(meta), *found]:
        if n not in names:
            names.append(n)
    return names


# =============================================================== the page


def build_report(meta: dict, records: Sequence[dict]) -> str:
    """One self-contained HTML page (plotly.js inlined, nothing fetched) for the records."""
    if not records:
        raise SpecgenError("no bench records to report")
    go = _plotly()
    names = config_names(meta, records)
    base = baseline_name(meta)
    specs = [n for n in names if n != base]
    colors = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(specs)}
    if records[0]["type"] == "serve":
        charts, tables, kinds = [], [], []
        for load in ("concurrency", "rate"):
            if not any(r.get("load", "concurrency") == load for r in records):
                continue
            summary = summarize_sweep(records, names, base, load)
            charts += _sweep_charts(go, summary, specs, colors)
            tables += [_sweep_table(summary, names), _crossover_list(summary, specs)]
            unit = "/s" if load == "rate" else ""
            kinds.append(f"{'Poisson arrivals' if load == 'rate' else 'concurrency sweep'} · levels "
                         f"{', '.join(f'{lv}{unit}' for lv in summary['levels'])}")
        kind = " · ".join(kinds)
    else:
        summary = summarize(records, names, base)
        timed = [r for r in records if r["runs"]]
        charts = _sequential_charts(go, timed, summary, specs, colors, base)
        tables = [_summary_table(summary, n, base) for n in specs] + [_request_table(timed, specs, base)]
        if meta.get("mode") == "http":
            tables.insert(len(specs), _latency_table(latency_summary(records, names), names))
        kind = f"{len(records)} requests"
    return _page(meta, kind, charts, _speculation_warnings(meta, records) + tables)


def _speculation_warnings(meta: dict, records: Sequence[dict]) -> list[str]:
    """The console's "speculation did not engage" lines (records.speculation_lines), for an HTTP
    bench's endpoints named as speculative, as the page's first section; none otherwise."""
    if meta.get("mode") != "http":
        return []
    from specgen.bench.endpoint.measure import Endpoint
    from specgen.bench.records import speculation_check, speculation_lines

    eps = []
    for e in meta.get("endpoints") or ():
        if isinstance(e, dict) and isinstance(e.get("name"), str):
            body = e.get("body") if isinstance(e.get("body"), dict) else {}
            eps.append(Endpoint(e["name"], str(e.get("url", "")), body=body, kind="plain" if e.get("baseline") else "http"))
    lines = speculation_lines(speculation_check(records, eps))
    if not lines:
        return []
    items = "".join(f'<li class="{"warning" if ln.startswith("warning") else "note"}">{_e(ln)}</li>' for ln in lines)
    return [f'<section id="speculation" class="warnings"><h2>speculation</h2><ul>{items}</ul></section>']


def write_report(out: Path, meta: dict, records: Sequence[dict]) -> None:
    """Build the page and write it to `out` (whole or not at all)."""
    page = build_report(meta, records)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise SpecgenError(f"cannot write report {out}: {e.strerror or e}") from None


def report_file(records_path: Path, out: Path) -> None:
    """`specgen report RECORDS.jsonl -o FILE.html`."""
    meta, records = load_records(records_path)
    write_report(out, meta, records)


def require_plotly() -> None:
    """Refuse early (before an hour of benchmarking) when the report could not be drawn."""
    _plotly()


def _plotly():
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise SpecgenError("the HTML report needs plotly: pip install 'specgen[report]' (or pip install plotly)") from None
    return go


# =============================================================== sequential charts


def _sequential_charts(go, records, summary, specs, colors, base: str = "plain") -> list[tuple[str, str, object]]:
    charts = []
    for name in specs:
        charts.append((f"latency-{_slug(name)}", f"Per-request latency: {base} vs {name}", _dumbbell(go, records, name, colors[name], base)))
    for name in specs:
        charts.append((f"speedup-{_slug(name)}", f"Speedup by category: {name}", _speedup_by_category(go, records, summary[name], name, colors[name], base)))
    charts.append(("acceptance", "Acceptance by draft position", _acceptance_by_position(go, records, specs, colors)))
    runs = {n: [x for r in records for x in r["runs"] if x["config"] == n] for n in specs}
    charts.append(("k-chosen", "Draft length chosen per round", _k_histogram(go, {n: _k_counts(runs[n]) for n in specs}, colors)))
    return charts


def _dumbbell(go, records, name: str, color: str, base: str = "plain"):
    """One row per request, plain (baseline) and speculative latency joined; sorted by speedup (fastest on top)."""
    rows = [(r, r["speedup"][name]) for r in records if name in r["speedup"] and _median_ms(r, base) is not None]
    rows.sort(key=lambda rs: rs[1])
    fig = go.Figure()
    for label, keep, line in (("faster", lambda s: s >= 1, FASTER), ("slower", lambda s: s < 1, SLOWER)):
        xs, ys = [], []
        for r, s in rows:
            if keep(s):
                xs += [_median_ms(r, base), _median_ms(r, name), None]
                ys += [r["id"], r["id"], None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": line, "width": 3}, name=label, hoverinfo="skip"))
    hover = [
        f"{r['id']} ({r['category']})<br>{base} {_median_ms(r, base):.0f} ms → {_median_ms(r, name):.0f} ms<br>speedup {s:.2f}×"
        for r, s in rows
    ]
    ids = [r["id"] for r, _ in rows]
    fig.add_trace(go.Scatter(x=[_median_ms(r, base) for r, _ in rows], y=ids, mode="markers", name=base,
                             marker={"color": PLAIN_COLOR, "size": 9}, text=hover, hoverinfo="text"))
    fig.add_trace(go.Scatter(x=[_median_ms(r, name) for r, _ in rows], y=ids, mode="markers", name=name,
                             marker={"color": color, "size": 9, "symbol": "diamond"}, text=hover, hoverinfo="text"))
    # 22 px a request; big sets get thinner rows (plotly then thins out the labels).
    fig.update_layout(height=140 + min(22 * len(rows), max(1320, 6 * len(rows))), xaxis_title="latency, ms (median over repeats)")
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=ids, automargin=True)
    return fig


def _speedup_by_category(go, records, summary: dict, name: str, color: str, base: str = "plain"):
    """Every request's speedup per category, and the median with its bootstrap 95% interval."""
    groups = [(c, g, [r for r in records if r["category"] == c]) for c, g in summary["categories"].items()]
    groups.append(("overall", summary["overall"], list(records)))
    groups = [(c, g, rs) for c, g, rs in groups if g.get("requests")]
    fig = go.Figure()
    xs, ys, text = [], [], []
    for cat, _, rs in groups:
        for r in rs:
            if name in r["speedup"]:
                xs.append(cat)
                ys.append(r["speedup"][name])
                text.append(f"{r['id']}: {r['speedup'][name]:.2f}×")
    fig.add_trace(go.Box(x=xs, y=ys, name="requests", boxpoints="all", jitter=0.35, pointpos=0, text=text, hoverinfo="text",
                         marker={"color": color, "size": 6, "opacity": 0.7}, line={"color": "rgba(0,0,0,0)"},
                         fillcolor="rgba(0,0,0,0)"))
    med = [g["median_speedup"] for _, g, _ in groups]
    lo = [m - g["median_ci95"][0] for m, (_, g, _) in zip(med, groups)]
    hi = [g["median_ci95"][1] - m for m, (_, g, _) in zip(med, groups)]
    fig.add_trace(go.Scatter(
        x=[c for c, _, _ in groups], y=med, mode="markers", name="median, bootstrap 95% interval",
        marker={"color": "black", "size": 11, "symbol": "line-ew-open", "line": {"width": 3}},
        error_y={"type": "data", "array": hi, "arrayminus": lo, "color": "black", "thickness": 1.5, "width": 10},
        text=[f"{c}: median {m:.2f}× [{g['median_ci95'][0]:.2f}–{g['median_ci95'][1]:.2f}], n = {g['requests']}"
              for m, (c, g, _) in zip(med, groups)],
        hoverinfo="text",
    ))
    fig.add_hline(y=1.0, line={"color": PLAIN_COLOR, "dash": "dash"})
    # On a log axis an annotation's y is log10 of the value: 0 is 1×.
    fig.add_annotation(x=0, xref="paper", xanchor="left", y=0, yanchor="bottom", text=f"as fast as {base}", showarrow=False,
                       font={"color": PLAIN_COLOR})
    fig.update_layout(height=380, yaxis_title=f"speedup ({base} ÷ {name} latency)", boxmode="overlay")
    fig.update_yaxes(type="log")
    return fig


def _pooled_positions(runs: Sequence[dict]) -> tuple[list[int], list[int]]:
    """(accepted, drafted) at each draft position, pooled over runs.

    A run stores rates; the rounds that drafted at position i are the rounds
    whose draft length exceeds i, which its k histogram gives exactly.
    """
    accepted: list[int] = []
    drafted: list[int] = []
    for x in runs:
        k_hist = {int(k): n for k, n in x["k_hist"].items()}
        for i, rate in enumerate(x["per_position"]):
            d = sum(n for k, n in k_hist.items() if k > i)
            while len(drafted) <= i:
                drafted.append(0)
                accepted.append(0)
            drafted[i] += d
            accepted[i] += round(rate * d)
    return accepted, drafted


def _acceptance_by_position(go, records, specs, colors):
    fig = go.Figure()
    for name in specs:
        acc, dr = _pooled_positions([x for r in records for x in r["runs"] if x["config"] == name])
        pos = [i + 1 for i, d in enumerate(dr) if d]
        fig.add_trace(go.Scatter(
            x=pos, y=[acc[p - 1] / dr[p - 1] for p in pos], mode="lines+markers", name=name,
            marker={"color": colors[name]}, line={"color": colors[name]},
            text=[f"{name} position {p}: {acc[p - 1]} of {dr[p - 1]} drafts accepted" for p in pos], hoverinfo="text",
        ))
    fig.update_layout(height=360, xaxis_title="draft position", yaxis_title="accepted ÷ rounds that drafted there",
                      yaxis_range=[0, 1.05])
    fig.update_xaxes(dtick=1)
    return fig


def _k_counts(runs: Sequence[dict]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for x in runs:
        for k, n in x["k_hist"].items():
            counts[int(k)] = counts.get(int(k), 0) + n
    return counts


def _k_histogram(go, counts: dict[str, dict[int, int]], colors: dict[str, str], title: str = "share of rounds"):
    fig = go.Figure()
    for name, c in counts.items():
        total = sum(c.values()) or 1
        ks = sorted(c)
        fig.add_trace(go.Bar(
            x=ks, y=[c[k] / total for k in ks], name=name, marker={"color": colors.get(name)},
            text=[f"{name}: k = {k} in {c[k]} of {total} rounds" for k in ks], hoverinfo="text", textposition="none",
        ))
    fig.update_layout(height=360, barmode="group", xaxis_title="draft length (tokens drafted in the round)",
                      yaxis_title=title, yaxis_tickformat=".0%")
    fig.update_xaxes(dtick=1)
    return fig


# =============================================================== sweep charts


def _sweep_charts(go, summary, specs, colors) -> list[tuple[str, str, object]]:
    levels, what, pre = summary["levels"], _what(summary), "rate-" if summary.get("load") == "rate" else ""
    base = summary.get("baseline", "plain")
    charts = [
        (f"{pre}latency-throughput", f"p50 latency against total throughput (one point per {what} level)",
         _latency_throughput(go, summary, specs, colors)),
        (f"{pre}crossover", f"{'Speculative' if base == 'plain' else 'Each endpoint'} ÷ {base}, per {what} level",
         _ratios(go, summary, specs, colors)),
    ]
    level_colors = {_lv(summary, lv): PALETTE[i % len(PALETTE)] for i, lv in enumerate(levels)}
    for name in specs:
        counts = {_lv(summary, lv): {int(k): n for k, n in summary["per_level"][str(lv)][name].get("k_hist", {}).items()}
                  for lv in levels if name in summary["per_level"][str(lv)]}
        if any(counts.values()):
            charts.append((f"{pre}k-chosen-{_slug(name)}", f"Draft length chosen per round: {name}", _k_histogram(go, counts, level_colors)))
    return charts


def _latency_throughput(go, summary, specs, colors):
    fig = go.Figure()
    for name in [summary.get("baseline", "plain"), *specs]:
        pts = [(lv, summary["per_level"][str(lv)].get(name)) for lv in summary["levels"]]
        pts = [(lv, s) for lv, s in pts if s and s.get("served", 1)]
        color = colors.get(name, PLAIN_COLOR)
        fig.add_trace(go.Scatter(
            x=[s["throughput_tokens_per_s"] for _, s in pts], y=[1000 * s["p50_latency_s"] for _, s in pts],
            mode="lines+markers+text", name=name, text=[_lv(summary, lv) for lv, _ in pts], textposition="top center",
            marker={"color": color, "size": 9}, line={"color": color},
            hovertext=[f"{name} at {_lv(summary, lv)}: {s['throughput_tokens_per_s']:.1f} tok/s, p50 {1000 * s['p50_latency_s']:.0f} ms, "
                       f"p95 {1000 * s['p95_latency_s']:.0f} ms" for lv, s in pts],
            hoverinfo="text",
        ))
        x = summary["crossover"].get(name)
        stop = x and x["stops_cutting_latency_at"]
        if stop is not None and x["cuts_latency_at"] and str(stop) in summary["per_level"]:
            s = summary["per_level"][str(stop)][name]
            fig.add_trace(go.Scatter(
                x=[s["throughput_tokens_per_s"]], y=[1000 * s["p50_latency_s"]], mode="markers",
                name=f"{name}: crossover ({_lv(summary, stop)})", marker={"color": "rgba(0,0,0,0)", "size": 22, "symbol": "circle",
                                                             "line": {"color": "black", "width": 2}},
                hovertext=f"{name} stops cutting p50 latency at {_what(summary)} {stop}", hoverinfo="text",
            ))
            fig.add_annotation(x=s["throughput_tokens_per_s"], y=1000 * s["p50_latency_s"], text=f"crossover {_lv(summary, stop)}",
                               showarrow=True, arrowhead=2, ax=50, ay=40, bgcolor="rgba(255,255,255,0.85)")
    fig.update_layout(height=440, xaxis_title="total throughput, tokens/s (higher is better)",
                      yaxis_title="p50 latency, ms (lower is better)")
    return fig


def _ratios(go, summary, specs, colors):
    fig = go.Figure()
    for name in specs:
        x = summary["crossover"][name]
        for key, label, dash in (("latency_speedup", "p50 latency speedup", "solid"), ("throughput_ratio", "throughput ratio", "dot")):
            pts = [(float(lv), v) for lv, v in x[key].items() if v is not None]
            fig.add_trace(go.Scatter(
                x=[lv for lv, _ in pts], y=[v for _, v in pts], mode="lines+markers", name=f"{name}: {label}",
                line={"color": colors[name], "dash": dash}, marker={"color": colors[name]},
                hovertext=[f"{name} at {_lv(summary, f'{lv:g}')}: {label} {v:.2f}×" for lv, v in pts], hoverinfo="text",
            ))
        stop = x["stops_cutting_latency_at"]
        if stop is not None and x["cuts_latency_at"]:
            # A trace, not a shape: shapes and annotations take log10 positions on a log axis.
            values = [v for key in ("latency_speedup", "throughput_ratio") for v in x[key].values() if v is not None]
            fig.add_trace(go.Scatter(
                x=[stop, stop], y=[min(values + [1 - NOISE_BAND]), max(values + [1 + NOISE_BAND])], mode="lines",
                name=f"{name}: crossover at {_lv(summary, stop)}", line={"color": colors[name], "dash": "dash", "width": 1},
                hovertext=f"{name} stops cutting p50 latency at {_what(summary)} {stop}", hoverinfo="text",
            ))
    fig.add_hrect(y0=1 - NOISE_BAND, y1=1 + NOISE_BAND, fillcolor=PLAIN_COLOR, opacity=0.15, line_width=0,
                  annotation_text=f"±{100 * NOISE_BAND:.0f}%: no change", annotation_position="bottom left")
    axis = "Poisson arrivals per second" if summary.get("load") == "rate" else "concurrency (requests served at once)"
    fig.update_layout(height=400, xaxis_title=axis, yaxis_title=f"÷ {summary.get('baseline', 'plain')} (> 1 is better)")
    fig.update_xaxes(type="log", tickvals=summary["levels"], ticktext=[str(lv) for lv in summary["levels"]])
    return fig


# =============================================================== tables


# =============================================================== assembly


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "config"


_CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #222; background: #f6f6f4; }
header { padding: 16px 24px; background: #fff; border-bottom: 1px solid #ddd; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header p { margin: 2px 0; color: #555; }
.layout { display: flex; flex-wrap: wrap; gap: 16px; padding: 16px 24px; align-items: flex-start; }
main { order: 1; flex: 1 1 600px; min-width: 0; }
aside { order: 2; flex: 0 1 620px; min-width: 0; position: sticky; top: 8px; max-height: calc(100vh - 16px); overflow: auto; }
section, aside > * { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; margin-bottom: 16px; }
section h2 { font-size: 15px; margin: 4px 0 8px; }
table { border-collapse: collapse; width: 100%; font-size: 12px; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { padding: 3px 5px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th { white-space: normal; vertical-align: bottom; font-weight: 600; }
th:first-child, td:first-child, .requests td:nth-child(2), .sweep td:nth-child(2) { text-align: left; }
.sweep td:nth-child(2) { white-space: normal; }
.sub { color: #777; font-size: 11px; }
tr.total td { font-weight: 600; border-top: 1px solid #999; }
summary { cursor: pointer; font-weight: 600; }
.note, footer { color: #666; font-size: 12px; }
.warnings li.warning { color: #a40000; font-weight: 600; }
footer { padding: 0 24px 24px; }
"""


def _page(meta: dict, kind: str, charts, tables: Sequence[str]) -> str:
    from plotly.offline import get_plotlyjs

    sections = []
    for div_id, title, fig in charts:
        fig.update_layout(template="plotly_white", margin={"l": 10, "r": 40, "t": 40, "b": 40},
                          legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0},
                          modebar={"orientation": "v"})  # on the right edge, clear of the legend
        body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{div_id}",
                           config={"displaylogo": False, "responsive": True})
        sections.append(f'<section id="{_e(div_id)}"><h2>{_e(title)}</h2>{body}</section>')
    model = Path(str(meta.get("model", "?"))).name
    facts = [f"{kind}", f"model {model}"]
    for key, label in (("max_tokens", "max_tokens"), ("repeats", "repeats"), ("temperature", "temperature"), ("threads", "threads")):
        if key in meta:
            facts.append(f"{label} {meta[key]}")
    when = f"recorded {meta['started']}" if "started" in meta else ""
    version = f"specgen {meta['specgen']}" if "specgen" in meta else "specgen"
    # The tables come first in the page (CSS puts them on the right): a chart sizes
    # itself when its script runs, so the column beside it must exist by then.
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>specgen bench report · {_e(model)}</title>
<style>{_CSS}</style>
<script>{get_plotlyjs()}</script>
</head>
<body>
<header>
<h1>specgen bench: {_e(baseline_name(meta))} vs {"speculative" if baseline_name(meta) == "plain" else "the other endpoints"}</h1>
<p>{_e(" · ".join(facts))}</p>
<p>{_e(" · ".join(x for x in (when, version, "configurations: " + ", ".join(meta.get("configs", []))) if x))}</p>
</header>
<div class="layout">
<aside>
{"".join(tables)}
<p class="note">speedup = plain latency ÷ speculative latency (&gt; 1 is faster); intervals are bootstrap 95% over requests;
tok/s = all tokens ÷ all time, prefill included; decode speedup leaves out the prefill;
predicted = Leviathan's formula from the measured acceptance and costs.</p>
</aside>
<main>
{"".join(sections)}
</main>
</div>
<footer>Made by specgen from the bench records; the charts are plotly, inlined: this page needs no network.</footer>
</body>
</html>
"""
