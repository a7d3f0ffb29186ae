"""Where a real run's decode time goes, round by round, against the verify curve.

`benchmarks/suffix_replay.py` prices each target pass by the cached verify
curve (taken a few dozen tokens into a context); the wall clock of
`benchmarks/suffix.py` runs the same loop for real. This runs a few agent
requests for real (the global indexes warmed by the requests before them,
untimed, as `suffix.py` does) and records per round: the context position,
k, llama_decode's time, llama_get_logits', llama_memory_seq_rm's, and the
rest of the round (drafting, acceptance, bookkeeping: the host). Each round is
then priced by the cached curve, and (`--at`) by a curve measured here at the
rounds' own context positions, so measured / priced says which part of a
round the replay misses, per config and per k.

    export PYTHONPATH=$PWD
    flock /tmp/specgen-bench.lock nice -n -5 python benchmarks/round_costs.py --start 8 --limit 2 \\
        --configs plain lookup suffix+global --at 40 200 400 600 --out rounds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

_IN = {"llama_decode": 0.0, "llama_get_logits": 0.0, "llama_memory_seq_rm": 0.0}


def _wrap_llama() -> None:
    """Clock llama.cpp's decode, logits and rollback calls (seconds summed in _IN)."""
    import llama_cpp

    for name in _IN:
        fn = getattr(llama_cpp, name)
        if getattr(fn, "_clocked", False):
            continue

        def clocked(*a, _fn=fn, _name=name):
            t = time.perf_counter()
            try:
                return _fn(*a)
            finally:
                _IN[_name] += time.perf_counter() - t
        clocked._clocked = True
        setattr(llama_cpp, name, clocked)


def trace_one(target, prompt, drafter, n, k_max, name="") -> list[dict]:
    """One generation; per round after the prefill: position, k, accepted, and seconds
    in decode, logits, rollback and the host (the round's wall time less those three).
    name: the config (`suffix.py`'s), for its cost policy (`:sparse`)."""
    from suffix import make_cost_policy

    from specgen.decode.generation import Generation

    k = k_max if drafter is not None else 0
    policy = make_cost_policy(name, k, target, shared=getattr(drafter, "policy_stats", None)) if k else None
    gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, ignore_eos=True, policy=policy)
    rounds = iter(gen)
    next(rounds)
    out = []
    while True:
        pos = len(gen.context)
        before = dict(_IN)
        t = time.perf_counter()
        try:
            r = next(rounds)
        except StopIteration:
            break
        wall = time.perf_counter() - t
        d = {name: _IN[name] - before[name] for name in _IN}
        out.append({"pos": pos, "k": r.drafted, "acc": r.accepted, "wall": wall, "decode": d["llama_decode"],
                    "logits": d["llama_get_logits"], "rm": d["llama_memory_seq_rm"],
                    "host": wall - sum(d.values())})
    return out


def _time_switched(engine, tokens, rows, base, repeats) -> float:
    """As costs._time_pass, but each timed pass follows one of another row count (as a
    real run's rounds do: llama.cpp reuses a graph only for the same shape)."""
    times = []
    for _ in range(repeats):
        engine.truncate(0, base)
        engine.decode(0, tokens[: 2 if rows == 1 else 1], 1)
        engine.truncate(0, base)
        t = time.perf_counter()
        engine.decode(0, tokens[:rows], rows)
        times.append(time.perf_counter() - t)
    engine.truncate(0, base)
    return min(times)


def curve_at(engine, positions, rows, repeats=5) -> dict[str, dict[int, dict[int, float]]]:
    """Seconds of a verify pass of each row count after a context of each length (the
    least disturbed of `repeats`), on filler text as the cached profile's: `same`, each
    pass after one of the same shape (as the profile is taken); `switched`, after one
    of another."""
    from specgen.engine.costs import _time_pass

    text = engine.tokenize("Measuring the cost of a verify pass at a longer context. " * 80)
    out = {"same": {}, "switched": {}}
    for p in positions:
        engine.sync(0, text[:p])
        _time_pass(engine, text[p:], max(rows), p, 1)  # warm-up
        out["same"][p] = {r: _time_pass(engine, text[p:], r, p, repeats) for r in rows}
        out["switched"][p] = {r: _time_switched(engine, text[p:], r, p, repeats) for r in rows}
    engine.truncate(0, 0)
    return out


def summarise(traces, curve, at=None) -> dict:
    """Per config: measured seconds (decode + logits, rollback, host) against the cached
    curve's price of the same rounds (and the curve measured at `at`, interpolated by
    position); per k bucket the ratio of measured decode + logits to the cached price."""
    from specgen.policy.base import verify_cost

    def at_price(pos, rows):
        if not at:
            return float("nan")
        ps = sorted(at)
        lo = max((p for p in ps if p <= pos), default=ps[0])
        hi = min((p for p in ps if p >= pos), default=ps[-1])
        ks = sorted(at[lo])
        r = min((x for x in ks if x >= rows), default=ks[-1])
        w = 0.0 if hi == lo else (pos - lo) / (hi - lo)
        return at[lo][r] * (1 - w) + at[hi][r] * w

    out = {}
    for c, per in traces.items():
        rounds = [r for rs in per.values() for r in rs]
        model = sum(r["decode"] + r["logits"] for r in rounds)
        priced = sum(verify_cost(curve, r["k"] + 1) for r in rounds)
        buckets = {}
        for r in rounds:
            b = "0" if r["k"] == 0 else "1-3" if r["k"] <= 3 else "4-7" if r["k"] <= 7 else "8-16"
            m, p, n = buckets.get(b, (0.0, 0.0, 0))
            buckets[b] = (m + r["decode"] + r["logits"], p + verify_cost(curve, r["k"] + 1), n + 1)
        tokens = sum(r["acc"] + 1 for r in rounds)
        out[c] = {"rounds": len(rounds), "tokens": tokens, "wall_s": sum(r["wall"] for r in rounds),
                  "decode_s": sum(r["decode"] for r in rounds), "logits_s": sum(r["logits"] for r in rounds),
                  "rm_s": sum(r["rm"] for r in rounds), "host_s": sum(r["host"] for r in rounds),
                  "priced_s": priced, "model_over_priced": model / priced,
                  "priced_at_s": sum(at_price(r["pos"], r["k"] + 1) for r in rounds) if at else None,
                  "by_k": {b: {"rounds": n, "model_over_priced": m / p} for b, (m, p, n) in sorted(buckets.items())}}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("agent", "bundled"), default="agent")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--start", type=int, default=0, help="trace from the Nth request; earlier ones warm the global indexes")
    ap.add_argument("--limit", type=int, default=2, help="requests traced")
    ap.add_argument("--configs", nargs="+", default=["plain", "lookup", "suffix+global"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--k-max", type=int, default=16)
    ap.add_argument("--at", type=int, nargs="*", default=[], help="also measure the verify curve after these context lengths")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from suffix import CONFIGS, agent_requests, bundled_requests, make_drafter

    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown config {bad[0]} (choose from {', '.join(CONFIGS)})")
    if args.start < 0 or args.limit < 1:
        ap.error("--start must be >= 0 and --limit >= 1")
    _wrap_llama()
    from specgen.engine.costs import cost_profile
    from specgen.engine.llama import Engine
    from specgen.models.registry import resolve_model

    reqs = {"agent": agent_requests, "bundled": bundled_requests}[args.workload]()
    if args.start + args.limit > len(reqs):
        ap.error(f"the {args.workload} workload has {len(reqs)} requests")
    with Engine(resolve_model("gemma3-270m"), n_ctx=args.ctx, n_threads=args.threads) as e:
        curve = cost_profile(e)["verify_s"]
        prompts = [(rid, e.tokenize(text)) for rid, text in reqs[: args.start + args.limit]]
        drafters = {c: make_drafter(c) for c in args.configs}
        for _, toks in prompts[: args.start]:  # warm the global indexes, untimed
            for c, d in drafters.items():
                if d is not None and getattr(d, "global_index", None) is not None:
                    trace_one(e, toks, d, args.n, args.k_max, c)
        traces = {c: {} for c in args.configs}
        for i, (rid, toks) in enumerate(prompts[args.start:]):
            order = args.configs[i % len(args.configs):] + args.configs[: i % len(args.configs)]
            for c in order:
                traces[c][rid] = trace_one(e, toks, drafters[c], args.n, args.k_max, c)
            print(f"{rid}: " + " ".join(f"{c}={sum(r['acc'] + 1 for r in traces[c][rid]) / sum(r['wall'] for r in traces[c][rid]):.1f} tok/s"
                                        for c in args.configs), file=sys.stderr, flush=True)
        positions = sorted({p for p in args.at if 0 < p < args.ctx - 40})
        at = curve_at(e, positions, [1, 2, 3, 4, 5, 8, 12, 17]) if positions else None
    report = {"command": " ".join(sys.argv), "curve": curve, "at": at, "traces": traces}
    if args.out:  # before the summary: a measurement is never lost
        args.out.write_text(json.dumps(report, indent=1))
    summary = report["summary"] = summarise(traces, curve, at and at["switched"])
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({"summary": summary, "at": at}, indent=1))
    if "plain" in summary:
        base = summary["plain"]
        for c, s in summary.items():
            rate = lambda x, s=s: s["tokens"] / x  # noqa: E731
            b = lambda x: base["tokens"] / x  # noqa: E731
            print(f"{c}: vs plain wall {rate(s['wall_s']) / b(base['wall_s']):.3f}, decode+logits "
                  f"{rate(s['decode_s'] + s['logits_s']) / b(base['decode_s'] + base['logits_s']):.3f}, priced "
                  f"{rate(s['priced_s']) / b(base['priced_s']):.3f}"
                  + (f", priced at positions {rate(s['priced_at_s']) / b(base['priced_at_s']):.3f}" if at else "")
                  + f"; median round host {statistics.median(r['host'] for rs in traces[c].values() for r in rs) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
