"""Figures from repeated timed runs, treated alike for every side.

`benchmarks/suffix.py --repeats R` runs every config (specgen's and each of
llama.cpp's types) R times per request. A side's figure for a request is the
median of its runs; llama.cpp's "best type" is the type with the highest such
median. That is still a maximum over noisy medians, so beside it come:

- `cross_validated_best`: for each repeat r, the type chosen by the median of
  the *other* repeats, read at repeat r (the best type as one would pick it
  without seeing the run it is judged on), the median of those;
- `single_run_best`: what one run per config gave (repeat r alone, the best
  type the maximum over single runs) -- the figures measured before repeats;
- `spread` and `outliers`: how far a config's runs of one request lie
  apart, and how many runs sit more than OUTLIER from their request's median.
"""

from __future__ import annotations

import statistics

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


def same_count_rate(r, n, spec_type):
    """llama.cpp's decode speed over as many tokens as specgen's figure counts. Its tools
    run on past -n: a round's accepted draft is not cut at the limit (llama-lookup), and
    some types draft past it (ngram-simple, -map-k, -mod decoded 144-192 tokens for 128
    asked), and they print decoded / seconds, so the tokens past n, copied in a few long
    passes, raised their figure. Here: the tokens up to n over the whole time (what it
    took to have them; the last pass's extra rows are counted against it, so this is
    the lower bound, the printed figure the upper). llama-lookup's first token is
    sampled from the prompt's logits inside its clock: not counted, as specgen's is not."""
    counted = min(r["generated"], n) - (1 if spec_type == "lookup" else 0)
    secs = r.get("decode_s") or r["generated"] / r["tokens_per_s_raw"]
    return counted / secs if secs > 0 else float("nan")


def same_counts(results, n):
    """Records taken before `same_count_rate` (llama.cpp's printed figure as tokens_per_s):
    the printed one kept as tokens_per_s_raw, tokens_per_s over the same count."""
    for per in results.values():
        for c, rs in per.items():
            for r in rs:
                if "tokens_per_s" not in r or "tokens_per_s_raw" in r:
                    continue
                r["tokens_per_s_raw"] = r["tokens_per_s"]  # specgen's: the same count already
                if c.startswith("llama:"):
                    r["tokens_per_s"] = same_count_rate(r, n, c.split(":", 1)[1])
