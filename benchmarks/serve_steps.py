"""Where a concurrent server's time goes, step by step: specgen's scheduler in process.

Serves the bundled requests (raw-text ones) through `specgen.serve.scheduler.Server`
as `specgen serve` builds it (server.setup.open_serving), closed loop: N
requests in flight, the next submitted the moment one finishes, as N HTTP
clients would; no HTTP, so only the scheduler and llama.cpp are timed.
Configurations run side by side in alternating order (--repeats: the first
pass prefills every prompt; later passes find them in the slots' caches).
Each step is classed by what it held: prefill (with how many verify rows
beside it) or verify (sequences, drafting or plain), and each
class reports steps, seconds, tokens settled, tokens per second and rows per
step: JSON lines, one per (configuration, repeat, class), then a total.

    python benchmarks/serve_steps.py --repeats 2 \\
        --config default --config "chunk off=--shared-step-rows 1000000" --config "plain=--no-spec"

A --config is NAME or NAME=FLAGS, FLAGS from: --no-spec, -k N (fixed k), and
the scheduler's settings (`specgen.serve.scheduler.SchedulerSettings`, passed
to every scheduler of that configuration): --shared-step-rows N (the prefill
cap beside generating sequences, `shared_step_rows`), --row-group N (shared
steps shaped to a multiple of N rows, `row_group`; 1: off), --min-copy N (a
running request's prefix is copied for a new prompt from N tokens more than a
free slot holds, `min_copy`; a huge N: off), --prefill-drafts 0|1 (steps that
prefill beside generating sequences may draft, `prefill_drafts`). --fresh
empties the prompt cache before each repeat, so every repeat is a first pass.
--categories code-edit,reformat serves only those categories of the set;
--limit N only its first N requests.

Why it stays: it is the in-process A/B of SchedulerSettings, the tool every
scheduler knob was decided with (docs/notes/2026-11-serving-knobs.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.bench import load_requests  # noqa: E402
from specgen.session import ModelOptions  # noqa: E402
from specgen.rules.sampling import SamplingParams  # noqa: E402
from specgen.serve.setup import open_serving  # noqa: E402
from specgen.serve.scheduler import Job, SchedulerSettings  # noqa: E402


def parse_config(text: str) -> tuple[str, dict]:
    """NAME=FLAGS: {"no_spec", "k", "settings": SchedulerSettings}."""
    name, _, flags = text.partition("=")
    d = SchedulerSettings()
    p = argparse.ArgumentParser(prog=f"--config {name}")
    p.add_argument("--no-spec", action="store_true")
    p.add_argument("-k", type=int, default=None)
    p.add_argument("--shared-step-rows", type=int, default=d.shared_step_rows)
    p.add_argument("--row-group", type=int, default=d.row_group)
    p.add_argument("--min-copy", type=int, default=d.min_copy)
    p.add_argument("--prefill-drafts", type=int, choices=(0, 1), default=int(d.prefill_drafts))
    args = p.parse_args(flags.split())
    if args.row_group < 1 or args.shared_step_rows < 1 or args.min_copy < 1:
        p.error("--row-group, --shared-step-rows and --min-copy must be at least 1")
    settings = SchedulerSettings(shared_step_rows=args.shared_step_rows, row_group=args.row_group,
                                 min_copy=args.min_copy, prefill_drafts=bool(args.prefill_drafts),
                                 slot_similarity=d.slot_similarity)
    return name, {"no_spec": args.no_spec, "k": args.k, "settings": settings}


def traced(server, log: list, settled: list) -> None:
    """Wrap server.step: each step's time, llama_decode time, rows, tokens settled
    (settled[0]: the tokens the server has reported so far, by its on_tokens callbacks)."""
    step, decode = server.step, server.target.decode_batch

    def one_step():
        rec = {"decode_s": 0.0}

        def timed(parts):
            t = time.perf_counter()
            views = decode(parts)
            rec["decode_s"] += time.perf_counter() - t
            return views

        server.target.decode_batch = timed
        before, n_log = settled[0], len(server.step_log)
        t0 = time.perf_counter()
        try:
            out = step()
        finally:
            del server.target.decode_batch
        rec["s"] = time.perf_counter() - t0
        rec["rows"] = server.step_log[-1] if len(server.step_log) > n_log else None
        rec["tokens"] = settled[0] - before
        log.append(rec)
        return out

    server.step = one_step


def closed_loop(serving, prompts: list[list[int]], ids: list[str], n: int, max_tokens: int, log: list):
    server = serving.new_server()
    settled = [0]
    traced(server, log, settled)
    todo = list(range(len(prompts)))

    def on_tokens(_job, tokens) -> None:
        settled[0] += len(tokens)

    def submit_next(_res=None) -> None:
        if todo:
            i = todo.pop(0)
            server.submit(Job(ids[i], prompts[i], max_tokens, SamplingParams(ignore_eos=True)), on_tokens=on_tokens,
                          on_finish=submit_next)

    for _ in range(n):
        submit_next()
    t0 = time.perf_counter()
    while server.busy:
        server.step()
    return time.perf_counter() - t0, server


def classify(rec: dict) -> str:
    seqs, verify_rows, prefill_rows = rec["rows"]
    if prefill_rows:
        return f"prefill beside {verify_rows} verify rows"
    return f"verify {seqs} seqs, " + ("drafting" if verify_rows > seqs else "plain")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=None, help="NAME or NAME=FLAGS (default: default)")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--fresh", action="store_true", help="empty the prompt cache before each repeat (all first passes)")
    ap.add_argument("--categories", default=None, help="comma-separated categories of the bundled set (default: all)")
    ap.add_argument("--limit", type=int, default=0, help="the first N requests only (after --categories)")
    a = ap.parse_args()
    configs = dict(parse_config(c) for c in (a.config or ["default"]))
    cats = set(a.categories.split(",")) if a.categories else None
    reqs = [r for r in load_requests(None) if r.prompt is not None and (cats is None or r.category in cats)]
    if a.limit:
        reqs = reqs[: a.limit]
    if not reqs:
        sys.exit(f"serve_steps: no bundled request in categories {a.categories}")
    servings = {}
    try:
        for name, cfg in configs.items():
            opts = ModelOptions(model="gemma3-270m", threads=a.threads, ctx_size=a.ctx_size, no_spec=cfg["no_spec"], draft_max=cfg["k"])
            servings[name] = open_serving(opts, a.concurrency, settings=cfg["settings"])
        for name, serving in servings.items():  # warm-up: a prompt outside the set
            warm = serving.target.tokenize("Warm-up: list three colours of the rainbow, one per line.\n")
            serving.new_server().serve([Job("warm-up", warm, 8)])
        for rep in range(a.repeats):
            for name in (list(servings) if rep % 2 == 0 else list(servings)[::-1]):
                serving = servings[name]
                if a.fresh:  # every repeat a first pass: no slot holds a prompt, none is stored
                    for seq in range(a.concurrency):
                        serving.target.truncate(seq, 0)
                    store = serving.new_server().store  # the one store all its schedulers share
                    if store is not None:
                        store.clear()
                prompts = [serving.target.tokenize(r.prompt) for r in reqs]
                log: list = []
                wall, server = closed_loop(serving, prompts, [r.id for r in reqs], a.concurrency, a.max_tokens, log)
                by = defaultdict(lambda: {"steps": 0, "s": 0.0, "decode_s": 0.0, "tokens": 0, "verify_rows": 0, "prefill_rows": 0})
                for rec in log:
                    if rec["rows"] is None:
                        continue
                    c = by[classify(rec)]
                    c["steps"] += 1
                    c["s"] += rec["s"]
                    c["decode_s"] += rec["decode_s"]
                    c["tokens"] += rec["tokens"]
                    c["verify_rows"] += rec["rows"][1]
                    c["prefill_rows"] += rec["rows"][2]
                for cls, c in sorted(by.items()):
                    print(json.dumps({"config": name, "repeat": rep, "class": cls, **c,
                                      "tokens_per_s": c["tokens"] / c["s"] if c["s"] else 0.0,
                                      "rows_per_step": (c["verify_rows"] + c["prefill_rows"]) / c["steps"]}), flush=True)
                tokens = sum(rec["tokens"] for rec in log)
                print(json.dumps({"config": name, "repeat": rep, "class": "total", "wall_s": wall, "steps": len(log),
                                  "tokens": tokens, "tokens_per_s": tokens / wall,
                                  "gate": server.gate.summary() if server.gate is not None else None}), flush=True)
    finally:
        for s in servings.values():
            s.close()


if __name__ == "__main__":
    main()
