"""Where greedy speculative output parts from plain greedy output, and why.

For each request: plain greedy (one row per decode, as llama.cpp's own plain
loop) and each drafting config, n tokens, end-of-generation ignored. For every
config that parts from plain, the first differing position i: the prefixes
agree up to i, so plain's row at i is the single-row truth for the very context
the speculative run scored in a batch. Reported there: plain's top-2 margin,
how far the speculative token sits below plain's best (gap), and the margin of
the speculative run's own (batched) row. A near-tie has both margin and gap
within the batch discrepancy (tests/test_model.py's TIE_MARGIN); anything else
is a bug. Not a timed run.

    PYTHONPATH=$PWD nice -n 19 python benchmarks/divergence.py -n 128 [--model F32.gguf] --out div.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parent / "tests")]  # this checkout's specgen and tests

# the tests' recorder of each row's top candidates, and their near-tie margin
from test_model import TIE_MARGIN, TopTwo as Rows  # noqa: E402


def generate(engine, prompt, drafter, n, k):
    from specgen.decode.generation import Generation
    from specgen.session import make_policy

    rec = Rows(engine)
    policy = make_policy("cost", k, engine) if drafter is not None else None
    gen = Generation(rec, prompt, drafter, draft_max=k if drafter else 0, max_tokens=n, ignore_eos=True, policy=policy)
    for _ in gen:
        pass
    return gen.tokens, rec.at, gen.stats


def first_difference(plain, spec):
    return next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)


def main(argv=None) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_suffix", Path(__file__).with_name("suffix.py"))
    bs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bs)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="gemma3-270m", help="default: gemma3-270m (Gemma 3 270M base)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--k-max", type=int, default=16)
    ap.add_argument("--workload", choices=("bundled", "agent"), default="bundled")
    ap.add_argument("--configs", nargs="+", default=["lookup", "suffix"])
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    from specgen.engine.llama import Engine
    from specgen.models.registry import resolve_model

    reqs = bs.bundled_requests() if args.workload == "bundled" else bs.agent_requests()
    if args.limit:
        reqs = reqs[: args.limit]
    out = []
    with Engine(resolve_model(args.model), n_ctx=2048, n_threads=args.threads) as target:
        for rid, text in reqs:
            prompt = target.tokenize(text)
            plain, prow, _ = generate(target, prompt, None, args.n, 0)
            base = len(prompt) - 1
            for c in args.configs:
                toks, srow, st = generate(target, prompt, bs.make_drafter(c), args.n, args.k_max)
                i = first_difference(plain, toks)
                rec = {"request": rid, "config": c, "parts_at": i, "rounds": st.rounds, "accepted": st.accepted}
                if i is not None:
                    ids, vals = prow[base + i]
                    sids, svals = srow[base + i]
                    rec.update(plain_token=plain[i], spec_token=toks[i], plain_margin=vals[0] - vals[1],
                               gap=vals[0] - vals[ids.index(toks[i])] if toks[i] in ids else None,
                               spec_margin=svals[0] - svals[1], spec_row_argmax=sids[0],
                               max_row_diff=max(abs(a - b) for a, b in zip(vals, [svals[sids.index(t)] if t in sids else float("nan") for t in ids])))
                    rec["near_tie"] = rec["gap"] is not None and rec["plain_margin"] < TIE_MARGIN and rec["gap"] < TIE_MARGIN
                out.append(rec)
                print(json.dumps(rec), file=sys.stderr, flush=True)
    parted = [r for r in out if r["parts_at"] is not None]
    for c in args.configs:
        rs = [r for r in parted if r["config"] == c]
        margins = sorted(round(r["plain_margin"], 3) for r in rs)
        print(f"{c}: {len(rs)}/{len(reqs)} part from plain; near-ties {sum(r['near_tie'] for r in rs)}; "
              f"plain top-2 margins {margins}")
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "n": args.n, "records": out}, indent=1))


if __name__ == "__main__":
    main()
