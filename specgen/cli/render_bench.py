"""What `specgen bench` shows: its progress bar, the per-request and speedup tables, the
per-request chart, and the concurrency sweep's tables, chart and crossover lines
(stderr; the HTTP bench reuses them through render_http)."""

from __future__ import annotations

import math

from specgen.cli.render import pct


# -- bench: progress ------------------------------------------------------------------------


class BenchProgress:
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
        base = self.names[0]  # plain, or the baseline endpoint
        parts = [f"{base} {num_text(_median_ms(r, base), '{:.0f}')} ms"]
        for name, s in r["speedup"].items():
            parts.append(f"{name} {_median_ms(r, name):.0f} ms ({s:.2f}×)")
        if r.get("failed"):
            parts.append(f"[red]{len(r['failed'])} failed: {r['failed'][0]['error']}[/red]")
        self.con.print(f"[{self._count}] {r['id']} ({r['category']}): " + " · ".join(parts), soft_wrap=True)


def _median_ms(r: dict, name: str) -> float | None:
    from statistics import median

    lat = [x["total_s"] for x in r["runs"] if x["config"] == name]
    return 1000 * median(lat) if lat else None


def ratio_text(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def num_text(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


# -- bench: sequential runs --------------------------------------------------------------------


def request_table(records, configs):
    from rich.table import Table

    t = Table(title="per request (latency = median over repeats)", title_justify="left")
    base = next(c for c in configs if c.kind == "plain")  # plain decoding, or the baseline endpoint
    for col in ("id", "category", "prompt", f"{base.label} ms"):
        t.add_column(col, justify="left" if col in ("id", "category") else "right")
    specs = [c for c in configs if c.kind != "plain"]
    for c in specs:
        for col in ("ms", "Δ ms", "speedup", "acc", "same"):
            t.add_column(f"{c.label} {col}" if col == "ms" else col, justify="right")
    for r in records:
        row = [r["id"], r["category"], num_text(r["prompt_tokens"], "{}"), num_text(_median_ms(r, base.name), "{:.0f}")]
        for c in specs:
            runs = [x for x in r["runs"] if x["config"] == c.name]
            if not runs or c.name not in r["speedup"]:
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
                pct(acc),
                "-" if same == {None} else ("yes" if same == {True} else "NO"),
            ]
        t.add_row(*row)
    return t


def speedup_table(summary: dict, config, base: str = "plain"):
    """Plain (or the baseline endpoint) vs one configuration, per category and overall."""
    from rich.table import Table

    s = summary[config.name]
    t = Table(title=f"{base} vs {config.label}", title_justify="left")
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
            f"{ratio_text(g['median_speedup'])} [{g['median_ci95'][0]:.2f}–{g['median_ci95'][1]:.2f}]",
            f"{ratio_text(g['geomean_speedup'])} [{g['geomean_ci95'][0]:.2f}–{g['geomean_ci95'][1]:.2f}]",
            pct(g["slower_share"]),
            f"{num_text(tp['plain_tokens_per_s'])}→{num_text(tp['spec_tokens_per_s'])}",
            pct(g["acceptance_rate"]),
            num_text(g["mean_accepted_len"], "{:.2f}"),
            ratio_text(g["decode_speedup"]),
            ratio_text(pred["speedup"]) if pred else "-",
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
        f"{ratio_text(p['speedup'])}; with the measured draft lengths {ratio_text(p['speedup_by_k'])}; "
        f"with the measured tokens per round instead of i.i.d. acceptance {ratio_text(p['speedup_measured_tokens'])}"
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


def print_bench(con, records, configs, summary) -> None:
    con.print(request_table(records, configs))
    base = next(c for c in configs if c.kind == "plain").label
    for c in configs:
        if c.kind == "plain":
            continue
        con.print(speedup_table(summary, c, base))
        if c.kind != "http":  # a server reports acceptance, not its costs: nothing to predict from
            con.print(prediction_line(summary, c), soft_wrap=True)
        con.print(f"speedup per request, {base} vs {c.label}:")
        for line in bar_chart([(r["id"], r["speedup"][c.name]) for r in records if c.name in r["speedup"]]):
            con.print(line, soft_wrap=True)
    con.print(
        "speedup = plain latency ÷ speculative latency (> 1 is faster); decode speedup excludes the prefill; "
        "predicted = Leviathan's formula from the measured α and costs (decode phase).",
        soft_wrap=True,
    )


# -- bench: concurrency sweep ------------------------------------------------------------------


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
                f"{1000 * s['mean_queue_s']:.0f}", f"{1000 * s['p50_service_s']:.0f}", f"{s['median_request_tokens_per_s']:.1f}", pct(s["acceptance_rate"]),
                num_text(s["mean_k"], "{:.2f}"), f"{s['mean_rows_per_step']:.1f}",
                "-" if not m["compared"] else f"{m['equal']}/{m['compared']}",
                end_section=i == len(configs) - 1,
            )
    return t


def sweep_chart(summary: dict, configs, width: int = 36) -> list:
    """p50 latency and total throughput against concurrency, one bar per configuration."""
    from rich.text import Text

    styles = ["white", "cyan", "magenta", "yellow", "green", "blue"]
    rows = [(lv, c, summary["per_level"][str(lv)].get(c.name)) for lv in summary["levels"] for c in configs]
    rows = [(lv, c, s) for lv, c, s in rows if s and s.get("served", 1)]
    if not rows:
        return []
    lat_max = max(s["p50_latency_s"] for _, _, s in rows) or 1.0
    tp_max = max(s["throughput_tokens_per_s"] for _, _, s in rows) or 1.0
    label_w = min(max(len(c.label) for c in configs), 24)
    lines = [Text(f"{'':6}{'':<{label_w}} {'p50 latency (shorter is better)':<{width + 9}} total throughput (longer is better)")]
    last = None
    for lv, c, s in rows:
        style = styles[configs.index(c) % len(styles)]
        head = f"{level_label(summary, lv):<6}" if lv != last else " " * 6
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


def level_label(summary: dict, level) -> str:
    """c=4 (concurrency) or 2/s (Poisson arrival rate)."""
    return f"{level}/s" if summary.get("load") == "rate" else f"c={level}"


def crossover_lines(summary: dict, configs) -> list[str]:
    out = []
    for c in configs:
        x = summary["crossover"].get(c.name)
        if x is None:
            continue
        lat = " · ".join(f"{level_label(summary, k)} {ratio_text(v)}" for k, v in x["latency_speedup"].items())
        tp = " · ".join(f"{level_label(summary, k)} {ratio_text(v)}" for k, v in x["throughput_ratio"].items())
        what = "arrival rate" if summary.get("load") == "rate" else "concurrency"
        stop, cost = x["stops_cutting_latency_at"], x["costs_throughput_from"]
        if not x["cuts_latency_at"]:
            verdict = "never cut p50 latency at the levels measured"
        elif stop is None:
            verdict = "cut p50 latency at every level"
        else:
            verdict = f"stops cutting p50 latency at {what} {stop}"
            if x["cuts_again_at"]:
                verdict += f" (yet cuts it again at {', '.join(map(str, x['cuts_again_at']))})"
        if cost is None:
            verdict += "; never cost total throughput"
        else:
            verdict += "; costs total throughput " + ("at every level" if len(x["costs_throughput_at"]) == len(x["throughput_ratio"]) else f"from {what} {cost}")
            if x["recovers_at"]:
                verdict += f" (not at {', '.join(map(str, x['recovers_at']))})"
        out.append(f"{c.label}: {verdict}. p50 latency speedup {lat}; throughput vs {summary.get('baseline', 'plain')} {tp}")
    return out


def print_sweep(con, summary: dict, configs) -> None:
    from specgen.bench.stats import NOISE_BAND

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
