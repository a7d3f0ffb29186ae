"""Side-by-side benchmark of specgen's core against llama.cpp's own tools.

Same model, prompt, threads, draft length and token count; runs interleaved
(A B … B A) over --repeats, medians reported as ratios. Needs llama.cpp's
tools (llama-lookup, llama-bench) built from the llama-cpp-python sdist, so
both sides run the same llama.cpp (benchmarks/README.md says how):

    python benchmarks/core.py --tools /path/to/llama.cpp/build/bin

Measures:
  1. specgen --lookup decode tok/s vs llama-lookup, and vs llama-cpp-python's
     LlamaPromptLookupDecoding, on a copy-heavy prompt;
  2. specgen --no-spec decode tok/s vs llama-bench tg at the prompt's depth
     (-d: the same tokens already cached, as after specgen's prefill);
  3. Python time per round outside llama.cpp calls, as a share of the round;
  4. peak RSS vs model file + KV cache.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's specgen, never an installed copy
PROMPT = HERE / "prompts" / "copy_code.txt"
TOOLS = ("llama-lookup", "llama-bench")


def specgen_run(model, mode_args, n, threads, ctx):
    out = subprocess.run(
        [sys.executable, "-m", "specgen", "run", "-f", str(PROMPT), "-m", str(model), "--raw", *mode_args,
         "-n", str(n), "-t", str(threads), "-c", str(ctx), "--ignore-eos", "--json"],
        capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
    )
    return json.loads(out.stdout)


def llama_lookup(tools, model, k, n, threads, ctx):
    out = subprocess.run(
        [str(Path(tools) / "llama-lookup"), "-m", str(model), "-f", str(PROMPT), "-n", str(n), "-t", str(threads),
         "--spec-draft-n-max", str(k), "--temp", "0", "-c", str(ctx)],
        capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
    )
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", out.stderr + out.stdout)
    acc = re.search(r"accept\s+=\s+([\d.]+)%", out.stderr + out.stdout)
    return {"tokens_per_s": float(m.group(3)), "acceptance": float(acc.group(1)) / 100 if acc else None}


def prompt_tokens(model) -> int:
    from specgen.engine.llama import Engine

    with Engine.vocab(model) as e:
        return len(e.tokenize(PROMPT.read_text()))


def llama_bench(tools, model, n, threads, depth):
    """tg speed with `depth` tokens already in the cache: the prompt specgen decodes after."""
    out = subprocess.run(
        [str(Path(tools) / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(n), "-d", str(depth),
         "-t", str(threads), "-r", "1", "-o", "json"],
        capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
    )
    return {"tokens_per_s": json.loads(out.stdout)[0]["avg_ts"]}


LCPP_LOOKUP = r"""
import json, sys, time
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
model, prompt, k, n, threads, ctx = sys.argv[1], open(sys.argv[2]).read(), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
llm = Llama(model, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, verbose=False, logits_all=True,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k))
t0 = time.perf_counter(); first = None; count = 0
for chunk in llm.create_completion(prompt, max_tokens=n, temperature=0.0, stream=True):
    count += 1
    if first is None:
        first = time.perf_counter()
end = time.perf_counter()
print(json.dumps({"tokens_per_s": (count - 1) / (end - first), "chunks": count}))
"""


def lcpp_lookup(model, k, n, threads, ctx):
    out = subprocess.run(
        [sys.executable, "-c", LCPP_LOOKUP, str(model), str(PROMPT), str(k), str(n), str(threads), str(ctx)],
        capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def python_overhead(model, k, n, threads, ctx):
    """Share of each round spent in Python, outside llama_decode / logits reads."""
    import llama_cpp as L

    from specgen.decode.generation import Generation
    from specgen.drafters.build import DrafterOptions, build_drafter
    from specgen.engine.llama import Engine
    from specgen.rules.sampling import SamplingParams

    spent = [0.0]
    real_decode = L.llama_decode

    def timed_decode(ctx_, batch):
        t = time.perf_counter()
        rc = real_decode(ctx_, batch)
        spent[0] += time.perf_counter() - t
        return rc

    L.llama_decode = timed_decode
    lookup = DrafterOptions("lookup")  # specgen run --lookup's drafter
    try:
        with Engine(model, n_ctx=ctx, n_threads=threads) as e:
            gen = Generation(e, e.tokenize(PROMPT.read_text()), build_drafter(lookup), draft_max=k, max_tokens=n, params=SamplingParams(ignore_eos=True))
            rounds = list(gen)
            spent[0] = 0.0  # count decode rounds only, not the prefill
            gen = Generation(e, e.tokenize(PROMPT.read_text()), build_drafter(lookup), draft_max=k, max_tokens=n, params=SamplingParams(ignore_eos=True))
            it = iter(gen)
            next(it)  # prefill round
            spent[0] = 0.0
            t0 = time.perf_counter()
            rounds = list(it)
            wall = time.perf_counter() - t0
    finally:
        L.llama_decode = real_decode
    return {"rounds": len(rounds), "wall_s": wall, "llama_decode_s": spent[0],
            "python_share": (wall - spent[0]) / wall, "python_ms_per_round": 1000 * (wall - spent[0]) / len(rounds)}


def peak_rss(model, n, threads, ctx):
    """Peak RSS of a `specgen run --lookup` process vs model file + KV cache."""
    from specgen.engine.llama import Engine

    with Engine.vocab(model) as e:
        arch = e.meta("general.architecture")
        layers = int(e.meta(f"{arch}.block_count"))
        kv_heads = int(e.meta(f"{arch}.attention.head_count_kv"))
        k_len = int(e.meta(f"{arch}.attention.key_length") or 0)
        v_len = int(e.meta(f"{arch}.attention.value_length") or 0)
    n_ctx = -(-ctx // 256) * 256  # llama.cpp pads the context to 256
    kv_bytes = layers * n_ctx * kv_heads * (k_len + v_len) * 2  # f16 K and V
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    specgen_run(model, ["--lookup", "-k", "8"], n, threads, ctx)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    model_bytes = Path(model).stat().st_size
    return {"peak_rss_mb": rss / 2**20, "model_mb": model_bytes / 2**20, "kv_mb": kv_bytes / 2**20,
            "budget_mb": (model_bytes + kv_bytes) / 2**20 + 300, "note": "max over child processes so far" if before else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", required=True, help="folder with llama-lookup and llama-bench")
    ap.add_argument("--model", default=None, help="GGUF (default: gemma3-270m, Gemma 3 270M base)")
    ap.add_argument("-k", type=int, nargs="+", default=[8, 16])
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "core.json")
    args = ap.parse_args()
    missing = [t for t in TOOLS if not (Path(args.tools) / t).is_file()]
    if missing:
        sys.exit(f"core: no {' or '.join(missing)} in {args.tools} (build llama.cpp's tools: benchmarks/README.md)")
    from specgen.models.registry import resolve_model

    model = Path(args.model) if args.model else resolve_model("gemma3-270m")
    res: dict = {"model": str(model), "n": args.n, "threads": args.threads, "prompt": PROMPT.name, "k": {}}

    # RSS first: the child-process maximum only grows.
    res["rss"] = peak_rss(model, args.n, args.threads, args.ctx)
    for k in args.k:
        runs: dict[str, list[float]] = {"specgen_lookup": [], "llama_lookup": [], "lcpp_lookup": []}
        for r in range(args.repeats):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for name in order:
                if name == "specgen_lookup":
                    v = specgen_run(model, ["--lookup", "-k", str(k), "--adaptive", "fixed"], args.n, args.threads, args.ctx)["timings"]["tokens_per_s"]
                elif name == "llama_lookup":
                    v = llama_lookup(args.tools, model, k, args.n, args.threads, args.ctx)["tokens_per_s"]
                else:
                    v = lcpp_lookup(model, k, args.n, args.threads, args.ctx)["tokens_per_s"]
                runs[name].append(v)
        med = {name: statistics.median(v) for name, v in runs.items()}
        res["k"][k] = {"runs": runs, "median_tok_s": med,
                       "specgen_vs_llama_lookup": med["specgen_lookup"] / med["llama_lookup"],
                       "specgen_vs_lcpp_lookup": med["specgen_lookup"] / med["lcpp_lookup"]}
    # specgen's default: lookup with the cost-aware policy (k <= 16), against
    # llama-lookup at each fixed k measured above (its best is the bar).
    cost_runs = [specgen_run(model, ["--lookup", "--adaptive", "cost", "-k", str(max(args.k))], args.n, args.threads, args.ctx)
                 ["timings"]["tokens_per_s"] for _ in range(args.repeats)]
    best_ll = max(v["median_tok_s"]["llama_lookup"] for v in res["k"].values())
    res["cost_policy"] = {"runs": cost_runs, "median_tok_s": statistics.median(cost_runs),
                          "vs_best_llama_lookup": statistics.median(cost_runs) / best_ll}
    depth = prompt_tokens(model)
    plain: dict[str, list[float]] = {"specgen_plain": [], "llama_bench": []}
    for r in range(args.repeats):
        order = list(plain) if r % 2 == 0 else list(reversed(plain))
        for name in order:
            if name == "specgen_plain":
                v = specgen_run(model, ["--no-spec"], args.n, args.threads, args.ctx)["timings"]["tokens_per_s"]
            else:
                v = llama_bench(args.tools, model, args.n, args.threads, depth)["tokens_per_s"]
            plain[name].append(v)
    pm = {name: statistics.median(v) for name, v in plain.items()}
    res["plain"] = {"runs": plain, "median_tok_s": pm, "specgen_vs_llama_bench": pm["specgen_plain"] / pm["llama_bench"]}
    res["python_overhead"] = python_overhead(model, max(args.k), args.n, args.threads, args.ctx)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    for k, v in res["k"].items():
        m = v["median_tok_s"]
        print(f"k={k}: specgen lookup {m['specgen_lookup']:.1f} tok/s | llama-lookup {m['llama_lookup']:.1f} "
              f"({v['specgen_vs_llama_lookup']:.2f}x) | llama-cpp-python lookup {m['lcpp_lookup']:.1f} ({v['specgen_vs_lcpp_lookup']:.2f}x)")
    cp = res["cost_policy"]
    print(f"specgen lookup, cost policy (k <= {max(args.k)}): {cp['median_tok_s']:.1f} tok/s = "
          f"{cp['vs_best_llama_lookup']:.2f}x llama-lookup at its best k")
    print(f"plain: specgen {pm['specgen_plain']:.1f} tok/s | llama-bench tg{args.n} @ d{depth} {pm['llama_bench']:.1f} "
          f"({res['plain']['specgen_vs_llama_bench']:.3f}x)")
    po = res["python_overhead"]
    print(f"python outside llama_decode: {100 * po['python_share']:.2f}% of the round ({po['python_ms_per_round']:.3f} ms/round)")
    rs = res["rss"]
    print(f"peak RSS {rs['peak_rss_mb']:.0f} MB vs model {rs['model_mb']:.0f} MB + KV {rs['kv_mb']:.0f} MB + 300 MB = {rs['budget_mb']:.0f} MB")
    print(f"full results: {args.out}")


if __name__ == "__main__":
    main()
