"""Does speculation pay on a real instruct pair, and does the default never lose?

Qwen2.5-Coder 1.5B Instruct drafted by its 0.5B (the catalog's pair
`qwen2.5-coder-1.5b`), in one run, side by side:
  1. the instruct requests of benchmarks/prompts/instruct.jsonl (code, prose, a
     list, SQL, edits, grounded QA; none of the bundled ones) through the chat
     template, greedy: plain against the default (prompt lookup, cost policy),
     the draft model under the cost policy (lookup alongside, as `-d` runs), and
     the draft model at a fixed k (and with --heads FILE a trained draft layer,
     alone and with lookup alongside); per request the decode speedup over plain,
     whether the text equals plain's, and each configuration's k histogram and
     acceptance (by draft position);
  2. `specgen rewrite` of benchmarks/prompts/inventory.py (108 lines) by an
     instruction, plain against the default: decode tok/s, wall time, the share
     of the output from drafts, and whether both outputs are the same bytes.
  3. with `--tools DIR` (llama.cpp's build/bin), llama.cpp's own tools on the
     same prompt tokens (the templated text; its token count is checked):
     `llama-speculative-simple --spec-type draft-simple -md 0.5B` at each
     `--spec-draft-n-max` of --llama-n-max, and its model-free types
     (llama-lookup, ngram-simple, ngram-mod, ngram-map-k) on the edit and QA
     requests; per request specgen's figure over llama.cpp's best.
With `--temp T` each request is sampled under `--seeds` seeds, each a row of its own.
Each request runs in every configuration `--repeats` times, the order
alternating (specgen bench's runner); speedups are of medians.

    python benchmarks/real_pair.py --repeats 3            # the Q4_K_M target as downloaded
    python benchmarks/real_pair.py --f16 --repeats 3      # an F16 copy: rows nearly free, as on a GPU
    python benchmarks/real_pair.py --f16 --parts bench --tools LLAMA_CPP_BUILD/bin

--parts bench,rewrite picks the parts. `--medians FILE` keeps the bench part's
per-request medians; `--parts llama --tools DIR --medians FILE` runs llama.cpp's
tools alone beside them (`--llama-n-max ""`: its model-free types only). The F16
copy is written once into specgen's cache (engine.quantize.requantize).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's specgen, never an installed copy
sys.path.insert(0, str(HERE))

from suffixlib.llama import find_tools, follows, llama_spec  # noqa: E402

PAIR = "qwen2.5-coder-1.5b"
REQUESTS = HERE / "prompts" / "instruct.jsonl"
REWRITE_FILE = HERE / "prompts" / "inventory.py"
REWRITE_INSTRUCTION = "Add type hints to every function signature."
MODEL_FREE = ("lookup", "ngram-simple", "ngram-mod", "ngram-map-k")  # llama.cpp's, on MODEL_FREE_ON
MODEL_FREE_ON = ("edit", "qa")


def models(f16: bool) -> tuple[str, str]:
    from specgen.models.catalog import load_catalog
    from specgen.models.registry import pull, resolve_model

    cat = load_catalog()
    target = pull(PAIR, cat)
    draft = resolve_model(cat.pairs[PAIR].draft, cat)
    if f16:
        from specgen.engine.quantize import requantize
        from specgen.models.cache import cache_dir

        out = cache_dir() / "test-drafts" / "qwen2.5-coder-1.5b-instruct-f16.gguf"
        target = out if out.is_file() else requantize(target, out, "f16")
    return str(target), str(draft)


def bench_part(target: str, draft: str, n: int, repeats: int, fixed_k: int, threads: int, limit: int | None,
               layer: str | None = None, requests: Path = REQUESTS, temp: float = 0.0, seeds: int = 1):
    from specgen.api import run_bench

    if temp > 0:
        requests = seeded(requests, limit, temp, seeds)
        limit = None

    configs = ["lookup:policy=cost", f"draft={draft}:policy=cost"] + [f"draft={draft}:k={fixed_k}"] * (fixed_k > 0)
    names = ["default (lookup)", "-d 0.5B (cost)"] + [f"-d 0.5B k={fixed_k}"] * (fixed_k > 0)
    keys = ["lookup", "draft", "draft_fixed"][:len(configs)]  # each one's figure in the medians (llama_part reads them)
    if layer:  # a trained draft layer (a heads file): alone under the cost policy, then with lookup alongside
        configs += [f"heads={layer}:policy=cost,lookup=off", f"heads={layer}:policy=cost"]
        names += ["layer (cost)", "layer + lookup"]
        keys += ["layer", "layer_lookup"]
    try:
        result = run_bench(requests, configs, model=target, max_tokens=n, repeats=repeats, threads=threads,
                           limit=limit)
    finally:
        if temp > 0:
            Path(requests).unlink()
    ids = [r["id"] for r in result.records]
    cfgs = result.configs
    medians = {}
    header = f"{'request':<10} {'plain tok/s':>11} " + " ".join(f"{nm:>18}" for nm in names)
    print(header)
    ratios = {c: [] for c in cfgs[1:]}
    hists = {c: collections.Counter() for c in cfgs[1:]}
    differs = {c: 0 for c in cfgs[1:]}
    counts = {c: [0, 0] for c in cfgs[1:]}  # drafted, accepted
    positions = {c: collections.defaultdict(list) for c in cfgs[1:]}  # acceptance at each draft position, per run
    for rec in result.records:
        by = collections.defaultdict(list)
        for run in rec["runs"]:
            by[run["config"]].append(run)
        plain = statistics.median(r["tokens_per_s"] for r in by["plain"])
        medians[rec["id"]] = {"plain": plain, "tokens": by["plain"][0]["tokens"]}
        cells = []
        for c, key in zip(cfgs[1:], keys):
            tps = statistics.median(r["tokens_per_s"] for r in by[c])
            medians[rec["id"]][key] = tps
            ratios[c].append(tps / plain)
            same = all(r["tokens"] == by["plain"][0]["tokens"] for r in by[c])
            differs[c] += not same
            for r in by[c]:
                hists[c].update({int(k): v for k, v in r["k_hist"].items()})
                counts[c][0] += r.get("drafted") or 0
                counts[c][1] += r.get("accepted") or 0
                for i, a in enumerate(r.get("per_position") or []):
                    positions[c][i].append(a)
            cells.append(f"{tps / plain:>16.2f}x{' ' if same else '*'}")
        print(f"{rec['id']:<10} {plain:>11.1f} " + " ".join(cells))
    print(f"{'geomean':<10} {'':>11} " + " ".join(
        f"{math.exp(statistics.fmean(math.log(x) for x in ratios[c])):>17.2f}x" for c in cfgs[1:]))
    print(f"{'lowest':<10} {'':>11} " + " ".join(f"{min(ratios[c]):>17.2f}x" for c in cfgs[1:]))
    print("decode tok/s, median of repeats, as a multiple of plain's; * = the text differs from plain's"
          + (" (sampled: the same seed's text where drafts are point masses; a distribution's draws otherwise)"
             if temp > 0 else ""))
    for c, nm in zip(cfgs[1:], names):
        hist = " ".join(f"{k}:{v}" for k, v in sorted(hists[c].items()))
        drafted, accepted = counts[c]
        rate = f"{accepted / drafted:.2f}" if drafted else "-"
        print(f"k chosen, {nm}: {hist}  (texts differing from plain: {differs[c]} of {len(ids)}; "
              f"drafted {drafted}, accepted {accepted}, acceptance {rate})")
        if positions[c]:
            print(f"  acceptance at draft position 1, 2, ... (mean of runs): "
                  + " ".join(f"{statistics.fmean(v):.2f}" for _, v in sorted(positions[c].items())))
    return medians


def seeded(requests: Path, limit: int | None, temp: float, seeds: int) -> str:
    """A request file of each request `seeds` times at temperature `temp`, seeds 0 … seeds-1
    (ids `ID/sN`), in a temporary file the caller removes."""
    rows = [json.loads(line) for line in Path(requests).read_text().splitlines() if line.strip()][:limit]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for r in rows:
            for seed in range(seeds):
                f.write(json.dumps({**r, "id": f"{r['id']}/s{seed}", "temperature": temp, "seed": seed}) + "\n")
    return f.name


def prompts(target: str, ours: dict | None, requests: Path = REQUESTS) -> dict[str, tuple[str, str, int, str | None]]:
    """Each request's templated text, category, token count (as specgen bench reads it) and
    plain's text (where the bench part ran)."""
    from specgen.bench.requests import apply_chat_template, load_requests, request_tokens
    from specgen.engine.llama import Engine

    with Engine.vocab(target) as engine:
        return {r.id: (apply_chat_template(engine, r.messages), r.category, len(request_tokens(engine, r)),
                       engine.detokenize(ours[r.id]["tokens"]) if ours and "tokens" in ours.get(r.id, {}) else None)
                for r in load_requests(requests)}


def llama_part(tools: str, target: str, draft: str, n: int, threads: int, n_maxes: list[int],
               limit: int | None, ours: dict | None, requests: Path = REQUESTS):
    """llama.cpp's tools on the same prompt tokens; each request's best n-max / type beside
    specgen's figure (`ours`: bench_part's medians) as a ratio."""
    rows = []
    for rid, (text, category, n_tokens, plain_text) in list(prompts(target, ours, requests).items())[:limit]:
        runs = {f"draft n-max {k}": llama_spec(tools, target, text, "draft-simple", n, threads, 4096, k, draft=draft)
                for k in n_maxes}  # --llama-n-max "": the model-free types alone
        if category in MODEL_FREE_ON:
            runs.update({t: llama_spec(tools, target, text, t, n, threads, 4096, 8) for t in MODEL_FREE})
        for name, r in runs.items():
            if "error" in r:
                sys.exit(f"real_pair.py: llama.cpp {name} on {rid}: {r['error']}")
            if r["prompt_tokens"] is not None and r["prompt_tokens"] != n_tokens:
                sys.exit(f"real_pair.py: llama.cpp read {r['prompt_tokens']} prompt tokens of {rid}, specgen {n_tokens}")
        rows.append((rid, runs))
        drafts = {k: r for k, r in runs.items() if k.startswith("draft")}
        line = f"{rid:<10}"
        if drafts:
            best_d = max(drafts, key=lambda k: drafts[k]["tokens_per_s"])
            line += f" draft: best {best_d.split()[-1]:>2} {drafts[best_d]['tokens_per_s']:6.1f} tok/s"
            if ours and rid in ours:
                line += f"  specgen -d (cost) / it {ours[rid]['draft'] / drafts[best_d]['tokens_per_s']:5.2f}x"
                parted = follows(drafts[best_d]["text"], plain_text)
                line += "" if parted is None else f" (its text parts from plain's at char {parted})"
        free = {k: r for k, r in runs.items() if not k.startswith("draft")}
        if free:
            best_f = max(free, key=lambda k: free[k]["tokens_per_s"])
            line += f"   model-free: best {best_f} {free[best_f]['tokens_per_s']:6.1f} tok/s"
            if ours and rid in ours:
                line += f"  specgen default / it {ours[rid]['lookup'] / free[best_f]['tokens_per_s']:5.2f}x"
        print(line, flush=True)
    print("llama.cpp's decode tok/s over the tokens specgen counts (suffixlib.llama.same_count_rate), one run each")
    return rows


def rewrite_once(target: str, spec: bool, threads: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "specgen", "rewrite", str(REWRITE_FILE), "-i", REWRITE_INSTRUCTION,
           "-m", target, "-t", str(threads), "-o", str(out)] + ([] if spec else ["--no-spec"])
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    wall = time.perf_counter() - t
    if res.returncode != 0:
        sys.exit(f"real_pair.py: rewrite failed: {res.stderr.strip().splitlines()[-1:]}")
    fields = {}
    for line in res.stderr.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            fields.setdefault(parts[0], parts[1].strip())
    speed = float(fields["speed"].split()[0])
    return {"tps": speed, "wall": wall, "text": out.read_bytes(), "drafts": fields.get("from", ""),
            "k": fields.get("k", "").removeprefix("chosen").strip()}


def rewrite_part(target: str, repeats: int, threads: int):
    runs = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for spec in ((False, True) if i % 2 == 0 else (True, False)):
                runs[spec].append(rewrite_once(target, spec, threads, Path(tmp) / f"out-{spec}-{i}.py"))
    plain, spec = runs[False], runs[True]
    p_tps, s_tps = statistics.median(r["tps"] for r in plain), statistics.median(r["tps"] for r in spec)
    p_wall, s_wall = statistics.median(r["wall"] for r in plain), statistics.median(r["wall"] for r in spec)
    same = all(r["text"] == plain[0]["text"] for r in plain + spec)
    print(f"rewrite {REWRITE_FILE.name} ({REWRITE_INSTRUCTION!r}), {repeats} repeats, medians:")
    print(f"  plain    {p_tps:6.1f} tok/s decode   {p_wall:6.1f} s wall")
    print(f"  default  {s_tps:6.1f} tok/s decode   {s_wall:6.1f} s wall   "
          f"{s_tps / p_tps:.2f}x decode, {p_wall / s_wall:.2f}x wall")
    print(f"  from {spec[0]['drafts']}; k chosen {spec[0]['k']}; same output as --no-spec: "
          f"{'yes' if same else 'NO'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--f16", action="store_true", help="an F16 copy of the target (cheap rows)")
    ap.add_argument("-n", type=int, default=96, help="tokens per request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fixed-k", type=int, default=3, help="the draft model's fixed k (0: leave it out)")
    ap.add_argument("--heads", default="", help="a draft layer's (or heads') file: add it alone under the cost "
                    "policy and with lookup alongside")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="only the first N requests")
    ap.add_argument("--requests", type=Path, default=REQUESTS, help="the request set (JSONL of chat messages; "
                    "default: prompts/instruct.jsonl; prompts/open.jsonl holds open-ended requests none of the "
                    "layer's seed prompts)")
    ap.add_argument("--temp", type=float, default=0.0, help="sample at this temperature (bench part; default greedy)")
    ap.add_argument("--seeds", type=int, default=3, help="with --temp: seeds per request (each its own row)")
    ap.add_argument("--parts", default="bench,rewrite", help="bench, rewrite and/or llama (llama.cpp's tools "
                    "alone, beside the figures of an earlier bench part: --medians)")
    ap.add_argument("--medians", default="", help="a JSON file: the bench part writes its per-request medians "
                    "there, and the llama part alone reads them")
    ap.add_argument("--tools", default="", help="llama.cpp's build/bin: add its tools on the same prompts")
    ap.add_argument("--llama-n-max", default="2,3,4,6,8", help="llama-speculative-simple's n-max values")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts - {"bench", "rewrite", "llama"}:
        ap.error("--parts takes bench, rewrite and/or llama")
    if args.temp < 0 or args.seeds < 1:
        ap.error("--temp must be >= 0 and --seeds at least 1")
    if "llama" in parts and not args.tools:
        ap.error("--parts llama needs --tools")
    n_maxes = [int(k) for k in args.llama_n_max.split(",") if k.strip()]
    target, draft = models(args.f16)
    mode = f"temperature {args.temp}, {args.seeds} seeds a request" if args.temp > 0 else "greedy"
    print(f"target {Path(target).name} · draft {Path(draft).name} · {args.threads} threads · {mode} · "
          f"{args.n} tokens · {args.repeats} repeats")
    ours = None
    if "bench" in parts:
        ours = bench_part(target, draft, args.n, args.repeats, args.fixed_k, args.threads, args.limit,
                          args.heads or None, args.requests, args.temp, args.seeds)
        if args.medians:
            Path(args.medians).write_text(json.dumps(ours))
    elif args.medians:
        ours = json.loads(Path(args.medians).read_text())
    tools = find_tools(args.tools)
    if tools and (parts & {"bench", "llama"}):
        llama_part(tools, target, draft, args.n, args.threads, n_maxes, args.limit, ours, args.requests)
    if "rewrite" in parts:
        rewrite_part(target, args.repeats, args.threads)


if __name__ == "__main__":
    main()
