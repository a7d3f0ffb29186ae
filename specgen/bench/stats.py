"""Bench statistics: every number the summaries report, from the records alone.

Per category and overall: median and geometric-mean speedup with bootstrap
95% intervals, the share of requests that got slower, batch throughput, and
Leviathan's predicted speedup from the measured acceptance and costs, next to
the measured one. For the concurrency sweep: throughput and latency
percentiles per level, and where speculation stops paying. The same
functions summarize `specgen bench --endpoint` (HTTP) records: there the
baseline is an endpoint, not plain decoding, and levels are concurrency or
Poisson arrival rates; `latency_summary` adds TTFT / TPOT percentiles.
"""

from __future__ import annotations

from statistics import median
from typing import Sequence

import numpy as np

from specgen.bench.records import by_k, sum_by_k
from specgen.policy.base import expected_tokens_per_round

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


def geomean(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=np.float64)))))


def bootstrap_ci(
    values: Sequence[float],
    stat: str = "median",
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median or geometric mean (requests resampled)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap of no values")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    draws = x[rng.integers(0, x.size, size=(samples, x.size))]
    if stat == "median":
        est = np.median(draws, axis=1)
    elif stat == "geomean":
        est = np.exp(np.log(draws).mean(axis=1))
    else:
        raise ValueError(f"unknown statistic {stat}")
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(est, [tail, 100 - tail])
    return float(lo), float(hi)


def predicted_speedup(alpha: float, k: int, t_plain_step: float, t_draft_round: float, t_verify: float) -> float:
    """E[tokens/round] × t_plain_step / (t_draft_round + t_verify(k+1)).

    t_draft_round is k × the cost of one draft-model step, or a lookup's cost
    per round; t_verify is the measured target pass over k+1 rows.
    """
    return expected_tokens_per_round(alpha, k) * t_plain_step / (t_draft_round + t_verify)


# =============================================================== summaries


def _group_summary(records: Sequence[dict], name: str, baseline: str = "plain") -> dict:
    """Speedups and the prediction for one configuration over some requests."""
    speedups = [r["speedup"][name] for r in records if name in r["speedup"]]
    failed = sum(1 for r in records for x in r.get("failed", ()) if x["config"] == name)
    if not speedups:
        return {"requests": 0, "failed_runs": failed}
    spec_runs = [x for r in records for x in r["runs"] if x["config"] == name]
    plain_runs = [x for r in records for x in r["runs"] if x["config"] == baseline]
    med, gm = float(median(speedups)), geomean(speedups)
    greedy = [x["matches_plain"] for x in spec_runs if x["matches_plain"] is not None]
    out = {
        "requests": len(speedups),
        "median_speedup": med,
        "median_ci95": list(bootstrap_ci(speedups, "median")),
        "geomean_speedup": gm,
        "geomean_ci95": list(bootstrap_ci(speedups, "geomean")),
        "slower_share": sum(s < 1.0 for s in speedups) / len(speedups),
        "median_latency_change_ms": float(median(r["latency_change_ms"][name] for r in records if name in r["latency_change_ms"])),
        "throughput": {"plain_tokens_per_s": _throughput(plain_runs), "spec_tokens_per_s": _throughput(spec_runs)},
        "decode_speedup": _median_decode_speedup(records, name, baseline),
        "acceptance_rate": _ratio(sum(x["accepted"] for x in spec_runs), sum(x["drafted"] for x in spec_runs)),
        "mean_accepted_len": _ratio(sum(x["generated_tokens"] for x in spec_runs), sum(x["rounds"] for x in spec_runs)),
        "matches_plain": {"equal": sum(greedy), "compared": len(greedy)},
        "prediction": predict(spec_runs, plain_runs),
        "failed_runs": failed,
    }
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _throughput(runs: Sequence[dict]) -> float | None:
    """Batch throughput: all tokens generated over all the time taken (prefill included)."""
    return _ratio(sum(x["generated_tokens"] for x in runs), sum(x["total_s"] for x in runs))


def _decode_rate(runs: Sequence[dict]) -> float | None:
    """Tokens after the first per second after the first, median over runs."""
    rates = [(x["generated_tokens"] - 1) / x["decode_s"] for x in runs if x["generated_tokens"] > 1 and x["decode_s"] > 0]
    return float(median(rates)) if rates else None


def _median_decode_speedup(records: Sequence[dict], name: str, baseline: str = "plain") -> float | None:
    """Decode phase only (what Leviathan's formula predicts): median over requests."""
    ratios = []
    for r in records:
        plain = _decode_rate([x for x in r["runs"] if x["config"] == baseline])
        spec = _decode_rate([x for x in r["runs"] if x["config"] == name])
        if plain and spec:
            ratios.append(spec / plain)
    return float(median(ratios)) if ratios else None


def predict(spec_runs: Sequence[dict], plain_runs: Sequence[dict]) -> dict | None:
    """Leviathan's predicted decode-phase speedup from the measurements.

    α = accepted / drafted (pooled counts). Costs are medians over runs of
    each run's mean, so a burst of load on a shared machine does not set them:
    t_plain_step = a plain verify pass; t_verify = a verify pass of the rounds
    that drafted the full k; t_draft_step = steady-state drafting time per
    token drafted (a draft model: one forward pass a token) or per round
    (prompt lookup, which drafts all k at once). `speedup_by_k` uses the
    measured distribution of draft lengths instead of a fixed k (prompt lookup
    often finds fewer than k tokens, or none). Both assume each draft token is
    accepted independently with probability α; `speedup_measured_tokens`
    replaces that assumption with the measured tokens per round, which checks
    the cost model alone (prompt lookup's acceptance comes in runs: a
    matching span is accepted whole or not at all).
    """
    if not spec_runs or not plain_runs:
        return None
    k = max(x["draft_max"] for x in spec_runs)
    drafted = sum(x["drafted"] for x in spec_runs)
    if k == 0 or drafted == 0:
        return None
    alpha = sum(x["accepted"] for x in spec_runs) / drafted
    t_plain, t_verify = _median_step(plain_runs, "0"), _median_step(spec_runs, str(k))
    if t_plain is None or t_verify is None:
        return None
    model = spec_runs[0]["draft_kind"] == "model"
    per = "drafted" if model else "rounds"
    steps = [x["draft_steady"]["s"] / x["draft_steady"][per] for x in spec_runs if x["draft_steady"][per]]
    t_step = float(median(steps)) if steps else 0.0
    t_draft_round = k * t_step if model else t_step
    by_k, by_tokens = _predict_by_k(spec_runs, alpha, t_plain, t_step, model)
    return {
        "alpha": alpha,
        "k": k,
        "expected_tokens_per_round": expected_tokens_per_round(alpha, k),
        "t_plain_step_ms": 1000 * t_plain,
        "t_verify_ms": 1000 * t_verify,
        "t_draft_step_ms": 1000 * t_step,
        "draft_step": "token" if model else "round",
        "speedup": predicted_speedup(alpha, k, t_plain, t_draft_round, t_verify),
        "speedup_by_k": by_k,
        "speedup_measured_tokens": by_tokens,
    }


def _median_step(runs: Sequence[dict], k: str) -> float | None:
    """Median over runs of the mean verify time of the rounds that drafted k tokens."""
    means = [v[1] / v[0] for x in runs if (v := x["verify_by_k"].get(k)) and v[0]]
    return float(median(means)) if means else None


def _predict_by_k(spec_runs, alpha: float, t_plain: float, t_step: float, model: bool) -> tuple[float | None, float | None]:
    """(i.i.d. tokens per round at each measured draft length, measured tokens per round) × t_plain / cost per round."""
    rounds = tokens = cost = 0.0
    for kk in {j for x in spec_runs for j in x["verify_by_k"]}:
        n = sum(x["verify_by_k"][kk][0] for x in spec_runs if kk in x["verify_by_k"])
        k = int(kk)
        draft = k * t_step if model else t_step
        rounds += n
        tokens += n * expected_tokens_per_round(alpha, k)
        cost += n * (_median_step(spec_runs, kk) + draft)
    if not cost:
        return None, None
    measured = sum(x["generated_tokens"] - 1 for x in spec_runs) / rounds  # decode rounds only
    return tokens * t_plain / cost, measured * rounds * t_plain / cost


def summarize(records: Sequence[dict], config_names: Sequence[str], baseline: str = "plain") -> dict:
    """Per configuration (each against the baseline: plain decoding in process): overall and per category."""
    cats = sorted({r["category"] for r in records})
    out = {}
    for name in config_names:
        if name == baseline:
            continue
        out[name] = {
            "overall": _group_summary(records, name, baseline),
            "categories": {c: _group_summary([r for r in records if r["category"] == c], name, baseline) for c in cats},
        }
    return out


def latency_summary(records: Sequence[dict], config_names: Sequence[str]) -> dict:
    """Per configuration, over every successful run: TTFT, TPOT, chunk gaps and end-to-end latency
    percentiles (seconds), tokens per second, and the failures (count and the commonest errors)."""
    out = {}
    for name in config_names:
        runs = [x for r in records for x in r["runs"] if x["config"] == name]
        failed = [x for r in records for x in r.get("failed", ()) if x["config"] == name]
        out[name] = {
            "runs": len(runs),
            **_latency_percentiles(runs, "total_s"),
            "tokens_per_s": _throughput(runs),
            "failed": len(failed),
            "errors": _commonest([x["error"] for x in failed]),
        }
    return out


def _latency_percentiles(runs: Sequence[dict], total_key: str) -> dict:
    """p50 / p95 of TTFT, TPOT, the median chunk gap, and end-to-end latency over some runs."""
    out = {}
    for key, values in (
        ("ttft", [x["ttft_s"] for x in runs if x.get("ttft_s") is not None]),
        ("tpot", [x["tpot_s"] for x in runs if x.get("tpot_s") is not None]),
        ("itl", [x["itl_p50_s"] for x in runs if x.get("itl_p50_s") is not None]),
        ("e2e", [x[total_key] for x in runs]),
    ):
        out[f"p50_{key}_s"], out[f"p95_{key}_s"] = _percentile(values, 50), _percentile(values, 95)
    return out


def _commonest(errors: Sequence[str], n: int = 3) -> list[list]:
    counts: dict[str, int] = {}
    for e in errors:
        counts[e] = counts.get(e, 0) + 1
    return [[e, c] for e, c in sorted(counts.items(), key=lambda ec: -ec[1])[:n]]

def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


# A ratio within this band of 1 reads as "no change": two runs that decode identically
# differ by about this much on a shared machine (docs/notes/2026-11-drafting-and-policy.md).
NOISE_BAND = 0.05


def summarize_sweep(records: Sequence[dict], config_names: Sequence[str], baseline: str = "plain",
                    load: str = "concurrency") -> dict:
    """Per level and configuration: throughput, latency percentiles, policy choices; the crossovers.

    `load`: the records' level key, "concurrency" (requests served at once)
    or "rate" (Poisson arrivals per second, `bench --endpoint --rate`).
    Requests that failed (`error`) are counted, never timed.
    """
    records = [r for r in records if r.get("load", "concurrency") == load]
    levels = sorted({r[load] for r in records})
    per_level: dict = {}
    for level in levels:
        row = {}
        base_lat = _request_latencies([r for r in records if r[load] == level and r["config"] == baseline])
        for name in config_names:
            runs = [r for r in records if r[load] == level and r["config"] == name]
            if not runs:
                continue
            every = [x for r in runs for x in r["requests"]]
            reqs = [x for x in every if x.get("error") is None]
            if not reqs:
                row[name] = {"runs": len(runs), "failed": len(every), "served": 0}
                continue
            lat = [x["latency_s"] for x in reqs]
            drafted = sum(x["drafted"] for x in reqs)
            k_hist = sum_by_k(r["k_hist"] for r in runs)
            compared = [x["matches_plain"] for x in reqs if x.get("matches_plain") is not None]
            rows_per_step = [r["mean_rows_per_step"] for r in runs if r.get("mean_rows_per_step") is not None]
            row[name] = {
                "runs": len(runs),
                "served": len(reqs),
                "failed": len(every) - len(reqs),
                "throughput_tokens_per_s": float(median(r["throughput_tokens_per_s"] for r in runs)),
                "p50_latency_s": _percentile(lat, 50),
                "p95_latency_s": _percentile(lat, 95),
                "p50_ttft_s": _percentile([x["ttft_s"] for x in reqs], 50),
                "p95_ttft_s": _percentile([x["ttft_s"] for x in reqs], 95),
                "p50_tpot_s": _percentile([x["tpot_s"] for x in reqs if x.get("tpot_s") is not None], 50),
                "p95_tpot_s": _percentile([x["tpot_s"] for x in reqs if x.get("tpot_s") is not None], 95),
                "p50_service_s": _percentile([x["service_s"] for x in reqs], 50),
                "mean_queue_s": float(np.mean([x["queue_s"] for x in reqs])),
                "median_request_tokens_per_s": float(median(x["tokens_per_s"] for x in reqs)),
                "acceptance_rate": _ratio(sum(x["accepted"] for x in reqs), drafted),
                "mean_rows_per_step": float(np.mean(rows_per_step)) if rows_per_step else None,
                "k_hist": by_k(k_hist),
                "mean_k": _ratio(sum(k * n for k, n in k_hist.items()), sum(k_hist.values())),
                "matches_plain": {"equal": sum(compared), "compared": len(compared)},
                "request_speedup": _paired_speedup(base_lat, _request_latencies(runs)) if name != baseline else None,
            }
        per_level[str(level)] = row
    crossover = {}
    for name in config_names:
        if name == baseline:
            continue
        lat_speedup, tput_ratio = {}, {}
        for level in levels:
            row = per_level[str(level)]
            if row.get(name, {}).get("served") and row.get(baseline, {}).get("served"):
                p, s = row[baseline], row[name]
                lat_speedup[str(level)] = p["p50_latency_s"] / s["p50_latency_s"] if s["p50_latency_s"] else None
                tput_ratio[str(level)] = s["throughput_tokens_per_s"] / p["throughput_tokens_per_s"] if p["throughput_tokens_per_s"] else None
        cuts = [int(k) for k, v in lat_speedup.items() if v and v > 1.0 + NOISE_BAND]
        costs = [int(k) for k, v in tput_ratio.items() if v and v < 1.0 - NOISE_BAND]
        measured = [int(k) for k in lat_speedup]
        not_cutting = [lv for lv in measured if lv not in cuts]
        crossover[name] = {
            "latency_speedup": lat_speedup,
            "throughput_ratio": tput_ratio,
            "noise_band": NOISE_BAND,
            "cuts_latency_at": cuts,
            "stops_cutting_latency_at": min(not_cutting) if not_cutting else None,
            "cuts_again_at": [lv for lv in cuts if not_cutting and lv > min(not_cutting)],
            "costs_throughput_at": costs,
            "costs_throughput_from": min(costs) if costs else None,
            "recovers_at": [int(k) for k in tput_ratio if costs and int(k) > min(costs) and int(k) not in costs],
        }
    return {"load": load, "baseline": baseline, "levels": levels, "per_level": per_level, "crossover": crossover}


def _request_latencies(runs: Sequence[dict]) -> dict:
    """Each request's latencies over some batches, keyed by its place in the batch (or its id)."""
    out: dict = {}
    for r in runs:
        for x in r["requests"]:
            key = x.get("n", x.get("id"))
            if x.get("error") is None and key is not None:
                out.setdefault(key, []).append(x["latency_s"])
    return out


def _paired_speedup(base: dict, spec: dict) -> dict | None:
    """Per request: median baseline latency ÷ median latency; their median and geomean with bootstrap 95% CIs."""
    ratios = [median(base[k]) / median(v) for k, v in spec.items() if k in base and median(v) > 0]
    if not ratios:
        return None
    return {"requests": len(ratios), "median": float(median(ratios)), "median_ci95": list(bootstrap_ci(ratios, "median")),
            "geomean": geomean(ratios), "geomean_ci95": list(bootstrap_ci(ratios, "geomean")),
            "slower_share": sum(x < 1.0 for x in ratios) / len(ratios)}
