"""Plain decoding at concurrency 1 and N through specgen's server vs llama-batched-bench.

Same llama.cpp build (the one llama-cpp-python binds), model, threads, prompt
length and generated length, run side by side in one invocation, alternating
(specgen, llama | llama, specgen) over repeats; medians reported.

    python benchmarks/concurrency.py --tool LLAMA_CPP_BUILD/bin/llama-batched-bench \\
        -t 2 --npp 64 --ntg 32 --npl 4 --repeats 3

--tool defaults to llama-batched-bench on PATH; -m to the embedded Gemma 3 270M.

With --sequential-check: concurrency 1 through the server against the
sequential bench runner on the bundled requests (plain and -C configurations).

Figures: S_TG (generation tokens/s over the generation phase) and S (all
tokens, prompt included, over the whole batch), at 1 and N sequences, and the
N-vs-1 scaling of each, specgen's next to llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.engine.llama import Engine  # noqa: E402
from specgen.rules.sampling import SamplingParams  # noqa: E402
from specgen.serve.scheduler import Job, Server  # noqa: E402

TEXT = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the budget for the next "
    "fiscal year, and the engineers argue about caches, batches and the cost of a verify pass. "
)


def llama_batched(tool: str, model: str, threads: int, npp: int, ntg: int, npl: int, ctx: int, kvu: bool) -> dict:
    cmd = [tool, "-m", model, "-c", str(ctx), "-b", "512", "-ub", "512", "-npp", str(npp), "-ntg", str(ntg),
           "-npl", f"1,{npl}", "-t", str(threads), "--output-format", "jsonl"] + (["-kvu"] if kvu else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return {r["pl"]: {"S_TG": r["speed_tg"], "S": r["speed"]} for r in rows}


def specgen_serve(engine: Engine, npp: int, ntg: int, n: int, level: int) -> dict:
    base = engine.tokenize(TEXT * 8)
    jobs = [Job(f"r{i}", base[i : i + npp], ntg, SamplingParams(ignore_eos=True)) for i in range(n)]
    for s in range(level):
        engine.truncate(s, 0)
    server = Server(engine, level)
    t0 = time.perf_counter()
    res = server.serve(jobs)
    wall = time.perf_counter() - t0
    gen = sum(len(r.gen.tokens) for r in res)
    # generation phase: each request's time after its first token (its prompt's step)
    if level == 1:
        tg_s = sum(r.latency_s - r.ttft_s for r in res)
    else:
        tg_s = max(r.latency_s for r in res) - max(r.ttft_s for r in res)
    return {"S_TG": (gen - n) / tg_s, "S": (n * npp + gen) / wall}


def sequential_check(args) -> None:
    """Concurrency 1 through the server vs the sequential `specgen bench` runner, alternating, one process."""
    from specgen import bench as B

    configs = B.parse_configs(args.configs)
    settings = B.Settings(max_tokens=args.ntg, ignore_eos=True, warmup=False)
    setup = B.open_bench(args.model, configs, ctx_size=args.ctx, threads=args.threads, n_seq_max=args.npl)
    try:
        seq_runner = B.Runner(setup, settings)
        prepared = seq_runner.prepare(B.load_requests(None)[: args.requests])
        sweep = B.SweepRunner(setup, settings, [1])
        names = [c.name for c in setup.configs]
        tput: dict[tuple[str, str], list[float]] = {}
        for rep in range(args.repeats):
            for who in (("sequential", "server") if rep % 2 == 0 else ("server", "sequential")):
                for c in setup.configs:
                    if who == "server":
                        r = sweep.serve_once(prepared, c, 1)
                        value = r["generated_tokens"] / sum(x["service_s"] for x in r["requests"])
                    else:
                        runs = [seq_runner.run_one(p, c) for p in prepared]
                        value = sum(x["generated_tokens"] for x in runs) / sum(x["total_s"] for x in runs)
                    tput.setdefault((who, c.name), []).append(value)
        print(f"concurrency 1 vs the sequential bench · {len(prepared)} bundled requests · {args.ntg} tokens · "
              f"{args.threads} threads · {args.repeats} repeats, medians (tokens / summed request time)")
        for name in names:
            a, b = median(tput[("sequential", name)]), median(tput[("server", name)])
            print(f"{name:24} sequential {a:7.1f} tok/s   server c=1 {b:7.1f} tok/s   ratio {b / a:.3f}")
    finally:
        setup.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default=None, help="llama-batched-bench (default: the one on PATH)")
    ap.add_argument("-m", "--model", default="gemma3-270m", help="GGUF (default: gemma3-270m, Gemma 3 270M base)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--npp", type=int, default=64)
    ap.add_argument("--ntg", type=int, default=32)
    ap.add_argument("--npl", type=int, default=4)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sequential-check", action="store_true",
                    help="instead: concurrency 1 through the server vs the sequential bench runner (bundled requests)")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("-C", "--configs", action="append", default=None)
    args = ap.parse_args()
    if args.sequential_check:
        return sequential_check(args)
    tool = args.tool or shutil.which("llama-batched-bench")
    if not tool or not Path(tool).is_file():
        sys.exit(f"concurrency: llama-batched-bench not found ({args.tool or 'not on PATH'}; build llama.cpp's tools "
                 "and give --tool PATH, or run --sequential-check)")
    args.tool = tool
    from specgen.models.registry import resolve_model

    args.model = str(resolve_model(args.model))

    engine = Engine(args.model, n_ctx=args.ctx, n_threads=args.threads, n_batch=512,
                    n_seq_max=args.npl, kv_unified=True)
    specgen_serve(engine, args.npp, 4, 1, 1)  # warm-up
    runs: dict[str, list] = {"specgen": [], "llama": [], "llama-kvu": []}
    for rep in range(args.repeats):
        order = ["specgen", "llama", "llama-kvu"]
        for who in order if rep % 2 == 0 else order[::-1]:
            if who == "specgen":
                # c=1 serves the same N requests one after another; c=N serves them together
                runs[who].append({1: specgen_serve(engine, args.npp, args.ntg, args.npl, 1),
                                  args.npl: specgen_serve(engine, args.npp, args.ntg, args.npl, args.npl)})
            else:
                runs[who].append(llama_batched(args.tool, args.model, args.threads, args.npp, args.ntg, args.npl,
                                               args.ctx, who == "llama-kvu"))
    engine.close()

    def med(who, pl, key):
        return median(r[pl][key] for r in runs[who])

    print(f"{args.repeats} repeats, medians · {Path(args.model).name} · {args.threads} threads · "
          f"npp {args.npp} · ntg {args.ntg} · 1 vs {args.npl} sequences")
    print(f"{'':12} {'S_TG@1':>8} {'S_TG@' + str(args.npl):>8} {'scaling':>8}   {'S@1':>8} {'S@' + str(args.npl):>8} {'scaling':>8}")
    res = {}
    for who in runs:
        tg1, tgn, s1, sn = med(who, 1, "S_TG"), med(who, args.npl, "S_TG"), med(who, 1, "S"), med(who, args.npl, "S")
        res[who] = (tg1, tgn, s1, sn)
        print(f"{who:12} {tg1:8.1f} {tgn:8.1f} {tgn / tg1:7.2f}×   {s1:8.1f} {sn:8.1f} {sn / s1:7.2f}×")
    for ref in ("llama", "llama-kvu"):
        sg, ll = res["specgen"], res[ref]
        print(f"specgen / {ref}: S_TG@{args.npl} {sg[1] / ll[1]:.2f}×, S_TG scaling {(sg[1] / sg[0]) / (ll[1] / ll[0]):.2f}×, "
              f"S@{args.npl} {sg[3] / ll[3]:.2f}×, S scaling {(sg[3] / sg[2]) / (ll[3] / ll[2]):.2f}×")
    print(json.dumps({"runs": {k: [{str(pl): v for pl, v in r.items()} for r in rs] for k, rs in runs.items()}}))


if __name__ == "__main__":
    main()
