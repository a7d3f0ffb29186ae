"""Drafting through text: Gemma 3 270M target, SmolLM2 135M draft (another vocabulary).

Bundled requests (the first N of each category), greedy or sampled, through
four configurations, each built by the loader exactly as `specgen run` builds
it (`specgen.session.open_session`):

- plain      `specgen run --no-spec`
- k=K        `specgen run -d smollm2-135m -k K` (fixed k, the model alone)
- alone      `specgen run -d smollm2-135m --no-lookup` (cost policy, the model alone)
- default    `specgen run -d smollm2-135m` (cost policy, prompt lookup alongside)

Per request and configuration: acceptance, tokens per round, tokens/s and
speed vs plain (medians over repeats, the order reversing each repeat), the
translation time per model-drafted round and its share of that round's time
(draft + verify), the draft lengths chosen, and whether each run's tokens
equal plain's (point-mass drafts, sampled: sample-and-compare emits plain's
text for the seed, up to a near-tie of batch numerics; greedy: plain's argmax). --trace FILE writes one JSON
line per round (k, whether the model drafted, its costs, what the policy
estimated for that round before it ran).

    python benchmarks/translate.py [--n 48] [--k 4] [--repeats 1] [--per-category 1] [--configs default,default:old,...]
                                   [--temp 0.8 --seed 1] [--f32] [--threads 2] [--trace FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # this checkout's specgen, never an installed copy

DRAFT = "smollm2-135m"


def configs(k: int) -> list[tuple[str, dict]]:
    return [("plain", dict(no_spec=True)), (f"k={k}", dict(draft=DRAFT, draft_max=k)),
            ("alone", dict(draft=DRAFT, lookup=False)), ("default", dict(draft=DRAFT))]


OLD = ":old"  # a cost configuration with the cost policy's earlier exploration (only when asked for)
FLAT = ":flat"  # ... with the translated model's prior as under greedy (only when asked for)


def old_exploration(policy) -> None:
    """The cost policy's exploration before the near rule: a draw past a drafting
    best drafts its own best length."""
    policy.explore_near = False


def flat_prior(policy) -> None:
    """The translated model's prior before it followed the target's top probability
    (sampling): the same as under greedy."""
    policy.top_prior = False


VARIANTS = {OLD: old_exploration, FLAT: flat_prior}


def variant(name: str):
    """The change a configuration's suffix makes to its fresh policy, or None."""
    return next((fn for suffix, fn in VARIANTS.items() if name.endswith(suffix)), None)


def translator(drafter):
    """The TranslatedDraftModel inside a drafter (alone or with lookup alongside), or None."""
    inner = getattr(drafter, "model", drafter)
    return inner if getattr(inner, "translated", False) else None


def estimate(policy, k: int) -> float | None:
    """What a cost policy expects a round of k model drafts to take (verify + k steps, scaled)."""
    if not k or not hasattr(policy, "verify_s"):
        return None
    from specgen.policy.base import verify_cost

    return (verify_cost(policy.verify_s, k + 1) + k * policy.draft_step_s) * policy.round_scale


def run_one(loaded, prompt, n, params, trace=None, label="", change=None):
    from specgen.decode.generation import Generation

    target, tr = loaded.target, translator(loaded.drafter)
    target.truncate(0, 0)
    if loaded.draft_engine is not None:
        loaded.draft_engine.truncate(0, 0)
    policy = loaded.new_policy()
    if change is not None:
        change(policy)
    choice = {}
    if hasattr(policy, "choose_offer"):
        inner = policy.choose_offer

        def spy(key, offered, limit, situation=None):
            out = inner(key, offered, limit, situation) if situation is not None else inner(key, offered, limit)
            choice.update(key=key, offered=offered, lag=getattr(situation, "lag", 0), take=out[1])
            return out

        policy.choose_offer = spy
    gen = Generation(target, prompt, loaded.drafter, draft_max=loaded.draft_max, max_tokens=n, params=params,
                     ignore_eos=True, policy=policy)
    proposals, translate_s = (tr.proposals, tr.translate_s) if tr else (0, 0.0)
    model_rounds, model_round_s, model_translate_s = 0, 0.0, 0.0
    guess = {}  # k -> the policy's estimate of a model round, as it stood before this round
    for i, r in enumerate(gen):
        by_model = bool(tr and tr.proposals > proposals)
        if by_model:
            model_rounds += 1
            model_round_s += r.draft_s + r.verify_s
            model_translate_s += tr.translate_s - translate_s
        if trace is not None and i:
            trace.write(json.dumps({"run": label, "round": i, "k": r.drafted, "accepted": r.accepted,
                                    "model": by_model, "draft_s": r.draft_s, "verify_s": r.verify_s,
                                    "translate_s": (tr.translate_s - translate_s) if by_model else 0.0,
                                    "estimate_s": guess.get(r.drafted) if by_model else None,
                                    "round_scale": getattr(policy, "round_scale", None), **choice}) + "\n")
        if tr:
            proposals, translate_s = tr.proposals, tr.translate_s
        guess = {k: estimate(policy, k) for k in range(1, loaded.draft_max + 1)}
        choice.clear()
    st = gen.stats
    return {
        "tokens": gen.tokens,
        "tps": st.tokens_per_s,
        "acc": st.acceptance_rate,
        "mal": st.mean_accepted_len,
        "k_hist": st.k_hist,
        "model_rounds": model_rounds,
        "translate_ms": 1e3 * model_translate_s / model_rounds if model_rounds else 0.0,
        "translate_share": model_translate_s / model_round_s if model_round_s else 0.0,
        "prefill_ms": 1e3 * st.prefill_s,
        "draft_prefill_ms": 1e3 * st.draft_prefill_s,
    }


def requests(per_category: int, want: set[str]):
    from specgen.bench import load_requests

    out, count = [], {}
    for r in load_requests(None):
        if (not want or r.category in want) and count.get(r.category, 0) < per_category:
            count[r.category] = count.get(r.category, 0) + 1
            out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=48, help="tokens generated per request")
    ap.add_argument("--k", type=int, default=4, help="the fixed-k configuration's draft length")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--per-category", type=int, default=1, help="bundled requests per category")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0: greedy)")
    ap.add_argument("--seed", type=int, default=1, help="sampling seed (each run of a request starts from it)")
    ap.add_argument("--f32", action="store_true", help="an all-F32 copy of the target (drafting is cheaper beside it)")
    ap.add_argument("--categories", default="", help="comma-separated categories (default: all)")
    ap.add_argument("--trace", type=Path, help="write one JSON line per round here")
    ap.add_argument("--configs", default="", help="comma-separated configurations to run besides plain "
                    "(k=K, alone, default; default: all; alone:old, default:old: the earlier exploration, side by side; "
                    "alone:flat, default:flat: the translated model's prior not following the target's top probability)")
    args = ap.parse_args()

    from specgen.bench.requests import request_tokens
    from specgen.session import ModelOptions, open_session
    from specgen.models.cache import cache_dir
    from specgen.models.registry import resolve_model
    from specgen.rules.sampling import SamplingParams

    tpath = resolve_model("gemma3-270m")
    if args.f32:
        from conftest import make_f32_target

        tpath = make_f32_target(tpath, cache_dir() / "test-drafts" / "gemma-3-270m-f32.gguf")
    params = SamplingParams(args.temp, seed=args.seed)
    reqs = requests(args.per_category, {c for c in args.categories.split(",") if c})
    want = {c for c in args.configs.split(",") if c}
    cfgs = [(name, kw) for name, kw in configs(args.k) if name == "plain" or not want or name in want]
    cfgs += [(name + sfx, kw) for sfx in VARIANTS for name, kw in configs(args.k) if name + sfx in want]
    loaded = {}
    for name, kw in cfgs:  # an ':old' or ':flat' configuration shares its models with its base
        base = name.partition(":")[0]
        loaded[name] = loaded.get(base) or open_session(ModelOptions(model=str(tpath), threads=args.threads, **kw))
        loaded.setdefault(base, loaded[name])
    trace = args.trace.open("w") if args.trace else None
    mode = "greedy" if params.greedy else f"sampled (temp {args.temp}, seed {args.seed})"
    print(f"target {tpath.name}, draft {DRAFT}, {mode}, n={args.n}, threads={args.threads}, repeats={args.repeats}")
    print(f"{'request':<22} {'config':<11} {'tok/s':>7} {'vs plain':>8} {'accept':>6} {'tok/round':>9} "
          f"{'transl ms':>9} {'share':>6}  k histogram")
    ratios = {name: {} for name, _ in cfgs[1:]}
    texts = {name: [] for name, _ in cfgs[1:]}  # per request: every run's text equals plain's
    try:
        first = request_tokens(loaded["plain"].target, reqs[0])
        for name, _ in cfgs:  # warm-up
            run_one(loaded[name], first, 8, params, change=variant(name))
        for i, r in enumerate(reqs):
            prompt = request_tokens(loaded["plain"].target, r)
            res = {name: [] for name, _ in cfgs}
            for rep in range(args.repeats):
                order = cfgs if (i + rep) % 2 == 0 else cfgs[::-1]
                for name, _ in order:
                    res[name].append(run_one(loaded[name], prompt, args.n, params, trace, f"{r.id}/{name}/{rep}",
                                             change=variant(name)))
            plain = statistics.median(x["tps"] for x in res["plain"])
            for name, _ in cfgs:
                runs = res[name]
                tps = statistics.median(x["tps"] for x in runs)
                if name != "plain":
                    ratios[name].setdefault(r.category, []).append(tps / plain)
                x = sorted(runs, key=lambda y: y["tps"])[len(runs) // 2]
                equal = [shared_prefix(y["tokens"], res["plain"][0]["tokens"]) for y in runs]
                if name != "plain":
                    texts[name].append(min(equal) == len(res["plain"][0]["tokens"]))
                same = "" if min(equal) == len(res["plain"][0]["tokens"]) else \
                    f"  (parts from plain at token {min(equal)}: near-tie?)"
                print(f"{r.id:<22} {name:<11} {tps:7.1f} {tps / plain:7.2f}x {x['acc']:6.2f} {x['mal']:9.2f} "
                      f"{x['translate_ms']:9.2f} {x['translate_share']:6.1%}  {x['k_hist']}{same}", flush=True)
    finally:
        if trace:
            trace.close()
        for lo in {id(lo): lo for lo in loaded.values()}.values():
            lo.close()
    print("speed vs plain, per category (mean over its requests):")
    cats = list(dict.fromkeys(r.category for r in reqs))
    print(f"{'config':<11} " + " ".join(f"{c:>12}" for c in cats) + f" {'min':>6}")
    for name, per in ratios.items():
        means = [statistics.mean(per[c]) for c in cats]
        print(f"{name:<11} " + " ".join(f"{m:11.2f}x" for m in means) + f" {min(means):5.2f}x")
    print("worst request per category:")
    for name, per in ratios.items():
        print(f"{name:<11} " + " ".join(f"{min(per[c]):11.2f}x" for c in cats) +
              f" {min(min(v) for v in per.values()):5.2f}x")
    for name, same in texts.items():  # sampled point-mass drafts: plain's text for the seed (sample-and-compare)
        print(f"{name}: {sum(same)} of {len(same)} requests emitted plain's tokens in every run")


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Tokens two outputs share before they first differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    main()
