"""Drafting through text: Gemma 3 270M target, SmolLM2 135M draft (another vocabulary).

One bundled request per category (the first of each), greedy: plain decoding,
a translated draft with fixed k, and the default cost policy. Per request:
acceptance, tokens/s, the share of a round spent translating (re-tokenizing
the accepted text for the draft, re-encoding its proposal for the target),
and speed vs plain. Runs are interleaved per request; medians over repeats.

    python benchmarks/translate.py [--n 48] [--k 4] [--repeats 1] [--f32] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # this checkout's specgen, never an installed copy


def run_one(target, draft, prompt, n, k, policy):
    from specgen.decoding import Generation
    from specgen.loader import make_policy
    from specgen.translate import TranslatedDraftModel

    target.truncate(0, 0)
    draft.truncate(0, 0)
    drafter = TranslatedDraftModel(target, draft) if k else None
    pol = make_policy(policy, k, target, draft) if k else None
    gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, ignore_eos=True, policy=pol)
    for _ in gen:
        pass
    st = gen.stats
    drafting_rounds = sum(c for kk, c in st.k_chosen.items() if kk > 0)
    round_s = st.decode_s / max(st.rounds - 1, 1)
    tr_round = drafter.translate_s / drafter.proposals if drafter and drafter.proposals else 0.0
    return {
        "tokens": gen.tokens,
        "tps": st.tokens_per_s,
        "acc": st.acceptance_rate,
        "mal": st.mean_accepted_len,
        "drafting_rounds": drafting_rounds,
        "rounds": st.rounds,
        "k_hist": st.k_hist,
        "translate_round_ms": tr_round * 1e3,
        "translate_share": tr_round / round_s if round_s else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--f32", action="store_true", help="an all-F32 copy of the target (drafting is cheaper beside it)")
    ap.add_argument("--categories", default="", help="comma-separated categories (default: all)")
    args = ap.parse_args()

    from specgen.bench import load_requests
    from specgen.engine import Engine
    from specgen.registry import cache_dir, resolve_model

    tpath = resolve_model(None)
    if args.f32:
        from conftest import make_f32_target

        tpath = make_f32_target(tpath, cache_dir() / "test-drafts" / "gemma-3-270m-f32.gguf")
    dpath = resolve_model("smollm2-135m")
    want = {c for c in args.categories.split(",") if c}
    reqs, seen = [], set()
    for r in load_requests(None):
        if r.prompt and r.category not in seen and (not want or r.category in want):
            seen.add(r.category)
            reqs.append(r)

    configs = [("plain", 0, "fixed"), (f"k={args.k}", args.k, "fixed"), ("cost", 8, "cost")]
    print(f"target {tpath.name}, draft {dpath.name}, greedy, n={args.n}, threads={args.threads}, repeats={args.repeats}")
    print(f"{'category':<13} {'config':<6} {'tok/s':>7} {'vs plain':>8} {'accept':>6} {'tok/round':>9} "
          f"{'translate ms/round':>18} {'share':>6}  k histogram")
    totals = {name: [] for name, _, _ in configs}
    with Engine(tpath, n_ctx=2048, n_threads=args.threads) as target, \
            Engine(dpath, n_ctx=2048, n_threads=args.threads) as draft:
        for r in reqs:
            prompt = target.tokenize(r.prompt)
            res = {name: [] for name, _, _ in configs}
            for _ in range(args.repeats):
                for name, k, policy in configs:
                    res[name].append(run_one(target, draft, prompt, args.n, k, policy))
            plain_tps = statistics.median(x["tps"] for x in res["plain"])
            for name, _, _ in configs:
                runs = res[name]
                tps = statistics.median(x["tps"] for x in runs)
                totals[name].append(tps / plain_tps)
                x = runs[len(runs) // 2]
                same = "" if x["tokens"] == res["plain"][0]["tokens"] else "  (output differs: near-tie?)"
                print(f"{r.category:<13} {name:<6} {tps:7.1f} {tps / plain_tps:7.2f}x {x['acc']:6.2f} {x['mal']:9.2f} "
                      f"{x['translate_round_ms']:18.2f} {x['translate_share']:6.1%}  {x['k_hist']}{same}", flush=True)
    for name, _, _ in configs[1:]:
        v = totals[name]
        print(f"{name}: speed vs plain median {statistics.median(v):.2f}x, min {min(v):.2f}x, max {max(v):.2f}x")


if __name__ == "__main__":
    main()
