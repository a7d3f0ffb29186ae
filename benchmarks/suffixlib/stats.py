"""Figures from repeated timed runs, treated alike for every side (specgen's configs and
llama.cpp's types): per request the median of its runs, and their noise; the tables.

`--repeats R` runs every config (specgen's and each of llama.cpp's types) R
times per request. A side's figure for a request is the median of its runs;
llama.cpp's "best type" is the type with the highest such median. That is
still a maximum over noisy medians, so beside it come:

- `cross_validated_best`: for each repeat r, the type chosen by the median of
  the *other* repeats, read at repeat r (the best type as one would pick it
  without seeing the run it is judged on), the median of those;
- `single_run_best`: what one run per config gave (repeat r alone, the best
  type the maximum over single runs) -- the figures measured before repeats;
- `spread` and `outliers`: how far a config's runs of one request lie
  apart, and how many runs sit more than OUTLIER from their request's median.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

from suffixlib.runs import modelled_tokens_per_s


OUTLIER = 0.2  # a run more than 20 % off its request's median is an outlier


def values(runs, key: str = "tokens_per_s") -> list[float]:
    """The measured figures of a config's runs of one request (failed runs have none)."""
    return [r[key] for r in runs if key in r]


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs) -> float:
    """(max - min) / median of one request's runs: 0 for a single run."""
    if len(xs) < 2:
        return 0.0
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m > 0 else float("nan")


def outliers(xs, limit: float = OUTLIER) -> int:
    """How many runs lie more than `limit` (relative) from the median of all of them."""
    m = median(xs)
    return sum(abs(x / m - 1) > limit for x in xs) if m and m > 0 else 0


def best_type(per_type: dict[str, list[float]]) -> tuple[str, float]:
    """The type whose median is highest, and that median."""
    meds = {t: median(xs) for t, xs in per_type.items() if xs}
    t = max(meds, key=meds.get)
    return t, meds[t]


def runner_up_gap(per_type: dict[str, list[float]]) -> float:
    """best median / second-best median - 1: how clearly the best type won (inf: one type)."""
    meds = sorted((median(xs) for xs in per_type.values() if xs), reverse=True)
    return meds[0] / meds[1] - 1 if len(meds) > 1 and meds[1] > 0 else float("inf")


def cross_validated_best(per_type: dict[str, list[float]]) -> float:
    """Each repeat r judged by the type the other repeats chose (highest median without r);
    the median over r. With one repeat it is the single-run best."""
    reps = min(len(xs) for xs in per_type.values())
    if reps < 2:
        return max(xs[0] for xs in per_type.values())
    picks = []
    for r in range(reps):
        others = {t: xs[:r] + xs[r + 1:] for t, xs in per_type.items()}
        t, _ = best_type(others)
        picks.append(per_type[t][r])
    return statistics.median(picks)


def single_run_best(per_type: dict[str, list[float]], r: int) -> float:
    """The best type as one run per config measured it: the maximum over types of repeat r."""
    return max(xs[r] for xs in per_type.values() if len(xs) > r)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summarise(name, rids, results, names, curve=None, key="tokens_per_s"):
    """Per config: medians and geometric means of per-request ratios (of measured decode
    tok/s, or with key="model_tokens_per_s" of the work priced by the verify curve).
    Every config alike: a request's figure is the median of its runs (failed runs left
    out); beside it the spread of those runs and how many were outliers
    ("repeated runs" below), and against llama.cpp's best type also the best type
    chosen without the judged run (cross-validated) and each repeat alone (one run)."""
    if key == "model_tokens_per_s":
        for per in results.values():
            for c, rs in per.items():
                for r in rs:
                    if "k_hist" in r:
                        r[key] = modelled_tokens_per_s(r, curve)
    names = [c for c in names if all(values(results[rid][c], key) for rid in rids)]
    vals = {rid: {c: values(results[rid][c], key) for c in names} for rid in rids}
    med = {rid: {c: median(vals[rid][c]) for c in names} for rid in rids}
    llama = [c for c in names if c.startswith("llama:")]
    per_type = {r: {c: vals[r][c] for c in llama} for r in rids}
    reps = min((len(x) for r in rids for x in per_type[r].values()), default=0)
    if llama:
        best = [best_type(per_type[r]) for r in rids]
        best_cv = [cross_validated_best(per_type[r]) for r in rids]
        best_single = [[single_run_best(per_type[r], i) for r in rids] for i in range(reps)]
    out = {"workload": name, "requests": len(rids), "measure": key, "configs": {}}
    for c in names:
        row = {"median_tokens_per_s": statistics.median(med[r][c] for r in rids)}
        ratio = [med[r][c] / med[r]["plain"] for r in rids]
        row["geomean_vs_plain"] = geomean(ratio)
        row["min_vs_plain"] = min(ratio)
        if "lookup" in names:
            ratio_l = [med[r][c] / med[r]["lookup"] for r in rids]
            row["geomean_vs_lookup"] = geomean(ratio_l)
            row["min_vs_lookup"] = min(ratio_l)
        row.update(_noise([vals[r][c] for r in rids], spread, outliers, OUTLIER))
        rs = [x for r in rids for x in results[r][c]]
        if any("same_as_plain" in x and "rounds" not in x for x in rs):  # llama.cpp's runs on another text
            row["differs_from_plain"] = sum(x.get("same_as_plain") is False for x in rs)
        if rs and "rounds" in rs[0]:
            drafted = sum(x["drafted"] for x in rs)
            row["acceptance"] = sum(x["accepted"] for x in rs) / drafted if drafted else 0.0
            row["mean_accepted_len"] = sum(x["generated"] for x in rs) / sum(x["rounds"] for x in rs)
            row["draft_share"] = sum(x["draft_s"] for x in rs) / max(sum(x["decode_s"] for x in rs), 1e-9)
            row["differs_from_plain"] = sum(not x["same_as_plain"] for x in rs)
            parts = [x["parting"] for x in rs if "parting" in x]
            if parts:
                row["not_near_tie"] = sum(not p.get("near_tie") for p in parts)
                row["max_parting_margin"] = max(p.get("margin", float("inf")) for p in parts)
            shares = [x["python_share"] for x in rs if "python_share" in x]
            if shares:
                row["python_share"] = statistics.mean(shares)
            if "tree_rounds" in rs[0]:  # rounds that verified several branches; of those, won off branch 0
                tr = sum(x["tree_rounds"] for x in rs)
                row["tree_rounds"] = tr / sum(x["rounds"] for x in rs)
                row["off_main"] = sum(x["tree_accepts"] for x in rs) / tr if tr else 0.0
        if llama and not c.startswith("llama:"):
            ratio_b = [med[r][c] / b for r, (_, b) in zip(rids, best)]
            row["geomean_vs_llama_best"] = geomean(ratio_b)
            row["min_vs_llama_best"] = min(ratio_b)
            row["worst_vs_llama_best"] = rids[ratio_b.index(min(ratio_b))]
            row["below_llama_best"] = sum(x < 1.0 for x in ratio_b)
            row["geomean_vs_llama_best_cv"] = geomean([med[r][c] / b for r, b in zip(rids, best_cv)])
            if reps > 1 and all(len(vals[r][c]) >= reps for r in rids):  # each repeat alone: one run per config
                row["single_runs_vs_llama_best"] = "/".join(
                    f"{geomean([vals[r][c][i] / b for r, b in zip(rids, best_single[i])]):.3g}" for i in range(reps))
        out["configs"][c] = row
    if llama:  # llama.cpp's best type per request, as a row: its winning type's runs
        won = [per_type[r][t] for r, (t, _) in zip(rids, best)]
        row = {"median_tokens_per_s": statistics.median(b for _, b in best),
               "geomean_vs_plain": geomean([b / med[r]["plain"] for r, (_, b) in zip(rids, best)]),
               **_noise(won, spread, outliers, OUTLIER),
               "runner_up_within_10pct": sum(runner_up_gap(per_type[r]) < 0.1 for r in rids)}
        won_runs = [x for r, (t, _) in zip(rids, best) for x in results[r][t]]
        if any("same_as_plain" in x for x in won_runs):
            row["differs_from_plain"] = sum(x.get("same_as_plain") is False for x in won_runs)
        out["configs"]["llama:best"] = row
        out["llama_best_type"] = dict(Counter(t for t, _ in best).most_common())
    return out


def _noise(runs_per_request, spread, outliers, limit):
    """A config's noise over repeats: the median spread of a request's runs, how many
    requests spread more than `limit`, and the share of runs off their median by more."""
    if max(len(x) for x in runs_per_request) < 2:
        return {}
    n = sum(len(x) for x in runs_per_request)
    return {"spread": statistics.median(spread(x) for x in runs_per_request),
            "noisy_requests": sum(spread(x) > limit for x in runs_per_request),
            "outlier_runs": sum(outliers(x, limit) for x in runs_per_request) / n}


def print_table(summary):
    print(f"\n## {summary['workload']} ({summary['requests']} requests; {summary['measure']})")
    cols = ["median_tokens_per_s", "geomean_vs_plain", "min_vs_plain", "geomean_vs_lookup", "min_vs_lookup",
            "geomean_vs_llama_best", "min_vs_llama_best", "worst_vs_llama_best", "below_llama_best",
            "geomean_vs_llama_best_cv", "single_runs_vs_llama_best", "spread", "noisy_requests", "outlier_runs",
            "runner_up_within_10pct", "acceptance", "mean_accepted_len",
            "draft_share", "python_share", "tree_rounds", "off_main", "differs_from_plain", "not_near_tie",
            "max_parting_margin"]
    cols = [c for c in cols if any(c in row for row in summary["configs"].values())]
    print("| config | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for c, row in summary["configs"].items():
        cells = [f"{row[k]:.3g}" if isinstance(row.get(k), float) else str(row.get(k, "")) for k in cols]
        print(f"| {c} | " + " | ".join(cells) + " |")
    if "llama_best_type" in summary:
        print(f"llama.cpp's best type per request: {summary['llama_best_type']}")
