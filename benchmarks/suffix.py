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
mean of per-request ratios, and the noise over repeats (`benchmarks/repeats.py`:
spread, outlier runs, the best type cross-validated and each repeat alone).
llama.cpp's tools decode past -n (up to 192 tokens for 128 asked): their speed
is taken over the tokens specgen counts (`same_count_rate`; the printed figure
stays in `tokens_per_s_raw`, the upper bound, summarised beside it).
The CPU is shared: read ratios, not absolute speeds.

    PYTHONPATH=$PWD python benchmarks/suffix.py --workload both -n 80 --repeats 1 \\
        [--tools /tmp/lcbuild/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin] --out suffix.json

Workloads: `bundled` (specgen's request set), `agent` (a ticket-triage agent:
one instruction template that describes a JSON answer in words, 24 tickets; the
answer's shape is in earlier outputs, never in a prompt) and `agent-example`
(the same with a worked example in every prompt: the shape is in the prompt).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import resource
import statistics
from collections import Counter
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workloads import AGENT_EXAMPLE_TEMPLATE, AGENT_TEMPLATE, TICKETS, agent_example_requests, agent_requests, bundled_requests  # noqa: F401,E402


# -- specgen configs -----------------------------------------------------------

# suffix+global:old -- as before draft cuts at varying fields and carried acceptance
# statistics: no `cut_at_split`, a fresh policy per request (before and after, one run).
# suffix+global:counts -- the cost policy reads the index's counts along each draft
# (`SuffixDrafter(counts=True)`, `policy.with_counts`)
# suffix+global:sparse -- its cost policy priced by the verify curve as profiles
# were before 2026-12-01: measured at SPARSE_ROWS only, interpolated, made
# non-decreasing (`sparse_curve`; specgen.engine.costs.ROW_POINTS says why that was wrong)
CONFIGS = ("plain", "lookup", "suffix", "suffix+global", "suffix+global:frequent", "suffix+global:old",
           "suffix+global:counts", "suffix+global:sparse")
SPARSE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def sparse_curve(curve):
    """A verify curve (index 0 unused) as a profile of SPARSE_ROWS priced it: those
    row counts as measured, the rest interpolated between them, then clamped to be
    non-decreasing (a point above a later one was taken for a disturbed one)."""
    pts = [n for n in SPARSE_ROWS if n < len(curve)]
    at = {n: curve[n] for n in pts}
    for a, b in reversed(list(zip(pts, pts[1:]))):
        at[a] = min(at[a], at[b])
    out = [0.0]
    for n in range(1, len(curve)):
        lo = max(p for p in pts if p <= n)
        hi = min((p for p in pts if p >= n), default=lo)
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        out.append(at[lo] * (1 - w) + at[hi] * w)
    return out


def make_cost_policy(name: str, k: int, target, shared=None):
    """The cost policy of a config: as the CLI's (`make_policy`), or with `:sparse`
    its verify curve priced as before every row count was measured."""
    from specgen.session import make_policy

    if not name.endswith(":sparse"):
        return make_policy("cost", k, target, shared=shared)
    from specgen.engine.costs import cost_profile
    from specgen.policy.cost import CostAware

    return CostAware(k, sparse_curve(cost_profile(target)["verify_s"]), shared=shared)


def make_drafter(name: str):
    from specgen.drafters.lookup import PromptLookup
    from specgen.drafters.automaton import FREQUENT, LATEST
    from specgen.drafters.suffix import SuffixDrafter

    if name == "plain":
        return None
    if name == "lookup":
        return PromptLookup()
    choice = FREQUENT if name.endswith(":frequent") else LATEST
    d = SuffixDrafter(global_cache="+global" in name, choice=choice, cut_at_split=not name.endswith(":old"),
                      counts=name.endswith(":counts"))
    if name.endswith(":old"):
        d.policy_stats = None
    return d


def run_one(target, prompt, drafter, n, k_max, tree_width=1, name=""):
    from specgen.decode.generation import Generation

    k = k_max if drafter is not None else 0
    policy = make_cost_policy(name, k, target, shared=getattr(drafter, "policy_stats", None)) if k else None
    if tree_width > 1:
        from specgen.decode.tree import TreeGeneration

        gen = TreeGeneration(target, prompt, drafter, draft_max=k, max_tokens=n, ignore_eos=True, policy=policy,
                             tree_width=tree_width)
    else:
        gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, ignore_eos=True, policy=policy)
    rounds = iter(gen)
    next(rounds)  # the prefill round: decode speed counts what comes after it
    cpu0, c0 = _cpu_s(), _IN_LLAMA[0]
    for _ in rounds:
        pass
    cpu, in_llama = _cpu_s() - cpu0, _IN_LLAMA[0] - c0
    st = gen.stats
    extra = {"tree_rounds": gen.tree_rounds, "tree_accepts": gen.tree_accepts} if tree_width > 1 else {}
    return {**extra, "tokens_per_s": st.tokens_per_s, "tokens_per_s_raw": st.tokens_per_s, "cpu_tokens_per_s": (st.generated - 1) / cpu if cpu > 0 else float("nan"), "generated": st.generated, "rounds": st.rounds,
            "drafted": st.drafted, "accepted": st.accepted, "draft_s": st.draft_s, "decode_s": st.decode_s,
            "python_share": max(st.decode_s - in_llama, 0.0) / st.decode_s if st.decode_s > 0 else float("nan"),
            "prompt_tokens": len(prompt), "k_hist": st.k_hist, "tokens": gen.tokens}


def plain_rows(target, prompt, n, plain):
    """Plain greedy again (one row per decode), with the top candidates of each row."""
    from divergence import generate

    tokens, at, _ = generate(target, prompt, None, n, 0)
    return tokens, [at[len(prompt) - 1 + i] for i in range(len(tokens))]


def _first_difference(a, b):
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def parting(plain, mine, again):
    """Where a speculative output first parts from plain, and the row of plain run
    again (one row per decode) there: the single-row truth for the same context.
    Its top-2 margin, and how far below its best the speculative token sits (None:
    not among its top 8). When plain run again parts from plain itself earlier
    (llama.cpp's sums depend on where the cache put earlier cells), the record
    says so ("plain_again_at") and reads the margin where the two plain runs part."""
    from divergence import TIE_MARGIN

    tokens, rows = again
    i = _first_difference(plain, mine)
    j = _first_difference(plain, tokens)
    out = {"at": i}
    if j < i:
        out["plain_again_at"] = j
        i, mine = j, tokens
    if i >= len(rows):
        return {**out, "length_differs": True}
    ids, vals = rows[i]
    gap = vals[0] - vals[ids.index(mine[i])] if mine[i] in ids else None
    margin = vals[0] - vals[1]
    return {**out, "margin": margin, "gap": gap,
            "near_tie": gap is not None and margin < TIE_MARGIN and gap < TIE_MARGIN}


_IN_LLAMA = [0.0]  # seconds inside llama_decode / llama_get_logits (the rest of a round is Python's)


def _time_llama() -> None:
    """Wrap llama.cpp's decode and logits calls with a clock: Python time per round is
    the decode time outside them (drafting, acceptance, argmax, bookkeeping)."""
    import llama_cpp

    for name in ("llama_decode", "llama_get_logits"):
        fn = getattr(llama_cpp, name)
        if getattr(fn, "_timed", False):
            continue

        def timed(*a, _fn=fn):
            t = time.perf_counter()
            try:
                return _fn(*a)
            finally:
                _IN_LLAMA[0] += time.perf_counter() - t
        timed._timed = True
        setattr(llama_cpp, name, timed)


def _cpu_s() -> float:
    """CPU seconds of this process, all threads: the work done, much less sensitive than
    wall time to other processes on a shared CPU (a stalled thread's spin still counts)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def modelled_tokens_per_s(r, curve):
    """Decode tok/s had each target pass cost what the quiet machine's verify curve says
    (rounds after the first, k + 1 rows each) plus the measured drafting time: the
    work a config did, priced without the shared CPU's noise."""
    from specgen.policy.base import verify_cost

    hist = dict(r["k_hist"])
    hist["0"] = hist.get("0", 0) - 1  # the prefill round gave the first token
    t = sum(n * verify_cost(curve, int(k) + 1) for k, n in hist.items()) + r["draft_s"]
    return (r["generated"] - 1) / t if t > 0 else float("nan")


# -- llama.cpp ------------------------------------------------------------------

# every model-free type of llama.cpp: `lookup` is the llama-lookup tool (n-gram caches
# over the prompt and output), the rest llama-speculative-simple --spec-type TYPE
LLAMA_TYPES = ("lookup", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def llama_tools_ok(tools) -> bool:
    return bool(tools) and all((Path(tools) / t).exists() for t in ("llama-speculative-simple", "llama-lookup"))


def llama_spec(tools, model, text, spec_type, n, threads, ctx, k_max):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text + "\n")  # llama.cpp's -f drops one trailing newline: the same tokens as specgen's
    if spec_type == "lookup":
        cmd = [str(Path(tools) / "llama-lookup")]
    else:
        cmd = [str(Path(tools) / "llama-speculative-simple"), "--spec-type", spec_type]
    out = subprocess.run(
        # -n n - 1: llama.cpp counts the prompt's first sampled token apart ("decoded n + 1")
        cmd + ["-m", str(model), "-f", f.name, "-n", str(n - 1), "-t", str(threads), "-c", str(ctx),
               "--temp", "0", "--ignore-eos", "--spec-draft-n-max", str(k_max)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )
    Path(f.name).unlink()
    log = out.stderr + out.stdout
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
    if out.returncode != 0 or not m:
        return {"error": (log.strip().splitlines() or ["no output"])[-1]}
    acc = re.search(r"accept\s+=\s+([\d.]+)%", log)
    enc = re.search(r"encoded\s+(\d+) tokens", log)
    r = {"tokens_per_s_raw": float(m.group(3)), "generated": int(m.group(1)), "decode_s": float(m.group(2)),
         "prompt_tokens": int(enc.group(1)) if enc else None,
         "acceptance": float(acc.group(1)) / 100 if acc else None}
    from repeats import same_count_rate

    return {**r, "tokens_per_s": same_count_rate(r, n, spec_type), "text": generated_text(out.stdout, text)}


def generated_text(stdout: str, prompt: str) -> str:
    """What a llama.cpp tool wrote after echoing the prompt (its stdout holds both; the
    first occurrence: a model that writes another request after its answer repeats the
    prompt's end in its own text)."""
    at = stdout.find(prompt)
    if at >= 0:
        return stdout[at + len(prompt):]
    tail = prompt[-40:]
    at = stdout.find(tail)
    return stdout[at + len(tail):] if at >= 0 else stdout


def follows(text: str, plain_text: str) -> int | None:
    """None where llama.cpp's greedy text is plain's (as far as both go; it decodes past
    n), else the character where it parts (a near-tie: its speed is of another text)."""
    m = min(len(text.rstrip()), len(plain_text.rstrip()))
    return next((i for i in range(m) if text[i] != plain_text[i]), None if m else 0)


# -- the run -----------------------------------------------------------------------

def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def config_drafter_width(c) -> int:
    return int(c.partition("@w")[2] or 1)


def config_drafter(c):
    """(drafter, tree width) of a specgen config; `NAME@wW` drafts trees of width W."""
    base, _, w = c.partition("@w")
    return make_drafter(base), int(w or 1)


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
    tools = args.tools if llama_tools_ok(args.tools) else None
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


def summarise(name, rids, results, names, curve=None, key="tokens_per_s"):
    """Per config: medians and geometric means of per-request ratios (of measured decode
    tok/s, or with key="model_tokens_per_s" of the work priced by the verify curve).
    Every config alike: a request's figure is the median of its runs (failed runs left
    out); beside it the spread of those runs and how many were outliers
    (`benchmarks/repeats.py`), and against llama.cpp's best type also the best type
    chosen without the judged run (cross-validated) and each repeat alone (one run)."""
    from repeats import OUTLIER, best_type, cross_validated_best, median, outliers, runner_up_gap, single_run_best, \
        spread, values

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
    ap.add_argument("--tools", default="/tmp/lcbuild/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin",
                    help="llama.cpp's build/bin: llama-speculative-simple runs beside when it exists")
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
    _time_llama()

    from specgen.engine.llama import Engine
    from specgen.models.registry import resolve_model

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
    from repeats import same_counts

    from specgen.engine.costs import cost_profile
    from specgen.engine.llama import Engine

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
