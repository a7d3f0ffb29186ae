"""Suffix-index drafting side by side: plain, prompt lookup, suffix index with the
global cache off and on (and llama.cpp's model-free speculative types, when
its tools are built).

All specgen configs run in this process on one engine (same model, threads,
prompt tokens, token count; greedy, end-of-generation ignored), interleaved:
for each request every config (llama.cpp's types too) runs once per repeat, in an
order rotated per request and per repeat (`run_order`).
Requests go in sequence, as an agent would send them; a config with the global
cache keeps one drafter across the requests of a pass, so request i may draft
from requests 0 … i-1, never from its own output: each repeat pass starts from
an empty global index. Reported: per request the median decode tok/s over
repeats, for every config alike (llama.cpp's best type per request is the type
with the highest median); per config the median over requests, the geometric
mean of per-request ratios, and the noise over repeats ("repeated runs" below:
spread, outlier runs, the best type cross-validated and each repeat alone).
llama.cpp's tools decode past -n (up to 192 tokens for 128 asked): their speed
is taken over the tokens specgen counts (`same_count_rate`; the printed figure
stays in `tokens_per_s_raw`, the upper bound, summarised beside it).
The CPU is shared: read ratios, not absolute speeds.

    python benchmarks/suffix.py --workload both -n 80 --repeats 1 [--tools LLAMA_CPP_BUILD/bin] --out suffix.json

--tools: llama.cpp's build/bin, with llama-speculative-simple and llama-lookup
(default: their folder when both are on PATH; '' leaves llama.cpp out).

Workloads: `bundled` (specgen's request set), `agent` (a ticket-triage agent:
one instruction template that describes a JSON answer in words, 24 tickets; the
answer's shape is in earlier outputs, never in a prompt) and `agent-example`
(the same with a worked example in every prompt: the shape is in the prompt).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's specgen (and benchmarks/), never an installed copy

# after the path: the modules of this command (benchmarks/suffixlib/), the workloads, specgen
from suffixlib.llama import LLAMA_TYPES, find_tools, follows, llama_spec, same_counts  # noqa: E402
from suffixlib.runs import (  # noqa: E402
    CONFIGS, config_drafter, config_drafter_width, parting, plain_rows, run_one, time_llama,
)
from suffixlib.stats import print_table, summarise  # noqa: E402
from workloads import agent_example_requests, agent_requests, bundled_requests  # noqa: E402

from specgen.engine.costs import cost_profile  # noqa: E402
from specgen.engine.llama import Engine  # noqa: E402
from specgen.models.registry import resolve_model  # noqa: E402


def run_order(names, i, rep, repeats=1):
    """The configs' order for request i in repeat rep of `repeats`: rotated by the
    request, and by an even share of the list per repeat, so each repeat runs every
    config in another place (before: reversed on odd repeats, so repeats 0 and 2 ran
    in the same order and a config could keep its place in all three)."""
    at = (i + rep * len(names) // max(repeats, 1)) % len(names)
    return names[at:] + names[:at]


def bench_workload(name, requests, target, model_path, args, save=None, start=0):
    """Requests[start:] timed; requests[:start] only warm the global indexes (generated
    untimed through each global config's drafter, as the earlier part of the sequence)."""
    configs = list(args.configs)
    tools = args.tools  # checked by find_tools
    names = configs + ([f"llama:{t}" for t in LLAMA_TYPES] if tools else [])
    prompts = [(rid, text, target.tokenize(text)) for rid, text in requests]
    results = {rid: {c: [] for c in names} for rid, _, _ in prompts[start:]}
    run_one(target, prompts[0][2], None, 8, 0)  # untimed: the first timed run finds warm caches, as llama.cpp's do
    warmed = {c: config_drafter(c) for c in configs}  # global caches start empty every pass
    for rid, text, toks in prompts[:start]:  # ... then hold requests 0 … start-1 (warmed once, copied per pass)
        for c in configs:
            if "+global" in c:
                run_one(target, toks, warmed[c][0], args.n, args.k_max, warmed[c][1], c)
    for rep in range(args.repeats):
        drafters = copy.deepcopy(warmed)
        for i, (rid, text, toks) in enumerate(prompts[start:], start):
            order = run_order(names, i, rep, args.repeats)
            for c in order:
                if c.startswith("llama:"):
                    r = llama_spec(tools, model_path, text, c.split(":", 1)[1], args.n, args.threads, args.ctx, args.k_max)
                    if r.get("prompt_tokens") not in (None, len(toks)):
                        r["error"] = f"llama.cpp saw {r['prompt_tokens']} prompt tokens, specgen {len(toks)}"
                        print(f"warning: {rid} {c}: {r['error']}", file=sys.stderr)
                else:
                    d, w = drafters[c]
                    r = run_one(target, toks, d, args.n, args.k_max, w, c)
                results[rid][c].append(r)
            plain = results[rid]["plain"][-1]["tokens"]
            rows = None
            for c in configs:  # greedy: a draft changes the output only at a near-tie of batched rows
                r = results[rid][c][-1]
                mine = r["tokens"] if c == "plain" else r.pop("tokens")  # plain's: for the oracle
                r["same_as_plain"] = mine == plain
                if not r["same_as_plain"]:  # untimed: plain again, its top candidates at every position
                    rows = rows or plain_rows(target, toks, args.n, plain)
                    r["parting"] = parting(plain, mine, rows)
            plain_text = target.detokenize(plain)
            for c in names:  # llama.cpp's greedy text: plain's, or another one (a near-tie parted it)
                r = results[rid][c][-1]
                if "text" in r:
                    r["parts_at_char"] = follows(r.pop("text"), plain_text)
                    r["same_as_plain"] = r["parts_at_char"] is None
            line = " ".join(f"{c}={statistics.median(x['tokens_per_s'] for x in results[rid][c] if 'tokens_per_s' in x) if any('tokens_per_s' in x for x in results[rid][c]) else float('nan'):.1f}"
                            for c in names)
            print(f"[{name} rep {rep + 1}/{args.repeats}] {rid} ({len(toks)} prompt tokens): {line}", file=sys.stderr, flush=True)
            if save:  # partial results survive an interrupted run
                save(results)
    rids = [rid for rid, _, _ in prompts[start:]]
    return summarise(name, rids, results, names), results


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("bundled", "agent", "agent-example", "both"), default="both",
                    help="both: bundled and agent")
    ap.add_argument("-m", "--model", default="gemma3-270m", help="default: gemma3-270m (Gemma 3 270M base)")
    ap.add_argument("-n", type=int, default=80, help="tokens per request (end-of-generation ignored)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--k-max", type=int, default=16, help="ceiling of the cost policy's k (and llama.cpp's --spec-draft-n-max)")
    ap.add_argument("--limit", type=int, default=0, help="first N requests of each workload only")
    ap.add_argument("--stride", type=int, default=1, help="every Nth request only (all categories, fewer runs)")
    ap.add_argument("--start", type=int, default=0,
                    help="time requests from the Nth on (after --stride); the earlier ones only warm the global indexes")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS),
                    help=f"of {', '.join(CONFIGS)}; NAME@wW: draft trees of width W")
    ap.add_argument("--tools", default=None,
                    help="llama.cpp's build/bin, with llama-speculative-simple and llama-lookup (default: their "
                         "folder on PATH, if there; '': leave llama.cpp out)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--summarise", type=Path, nargs="+", default=None,
                    help="print the tables of saved (possibly partial) runs instead of running")
    args = ap.parse_args(argv)
    if args.summarise:
        return summarise_files(args.summarise)
    bad = [c for c in args.configs if c.partition("@w")[0] not in CONFIGS]
    if bad:
        ap.error(f"unknown config {bad[0]} (choose from {', '.join(CONFIGS)}, optionally NAME@wW)")
    if "plain" not in args.configs:
        args.configs.insert(0, "plain")
    args.tools = find_tools(args.tools)
    time_llama()

    model_path = resolve_model(args.model)
    workloads = {"bundled": bundled_requests, "agent": agent_requests, "agent-example": agent_example_requests}
    chosen = ["bundled", "agent"] if args.workload == "both" else [args.workload]
    report = {"command": " ".join(sys.argv), "start": args.start, "model": str(model_path), "threads": args.threads, "n": args.n,
              "repeats": args.repeats, "k_max": args.k_max, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "workloads": {}}
    width = max(config_drafter_width(c) for c in args.configs)
    # trees need sequences for their branches in one unified cache: then every config runs on it
    kw = {"n_seq_max": width, "kv_unified": True} if width > 1 else {}
    report["engine"] = kw
    with Engine(model_path, n_ctx=args.ctx, n_threads=args.threads, **kw) as target:
        for w in chosen:
            reqs = workloads[w]()
            reqs = reqs[:: args.stride]
            if args.limit:
                reqs = reqs[: args.limit]
            def save(results, w=w):
                if args.out:
                    report["workloads"][w] = {"partial": True, "results": results}
                    args.out.write_text(json.dumps(report, indent=1))

            summary, results = bench_workload(w, reqs, target, model_path, args, save, args.start)
            report["workloads"][w] = {"summary": summary, "results": results}
            print_table(summary)
            if args.out:
                args.out.write_text(json.dumps(report, indent=1))


def summarise_files(paths) -> None:
    """Tables from saved runs (chunks of one run merge per workload): the requests every
    config finished, measured and modelled."""
    merged: dict[str, dict] = {}
    for path in paths:
        report = json.loads(Path(path).read_text())
        print(f"# {path}: {report['command']}")
        for w, data in report["workloads"].items():
            same_counts(data["results"], report["n"])
            merged.setdefault(w, {}).update(data["results"])
    with Engine(Path(report["model"]), n_ctx=512, n_threads=report["threads"]) as e:
        curve = cost_profile(e)["verify_s"]  # the cached profile, measured on a quiet machine
    for w, results in merged.items():
        names = list(next(iter(results.values())))
        rids = [rid for rid, per in results.items() if all(per.get(c) for c in names)]
        for key in ("tokens_per_s", "tokens_per_s_raw", "cpu_tokens_per_s", "model_tokens_per_s"):
            print_table(summarise(w, rids, results, names, curve, key))


if __name__ == "__main__":
    main()
