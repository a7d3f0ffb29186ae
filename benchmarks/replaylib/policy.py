"""Replay draft-length policies against recorded greedy drafts, on measured costs.

Wall-clock runs of a 96-token generation vary by 5-10 % on a shared CPU, which
is as large as the differences between good policies. In greedy mode a round's
outcome is a pure function of where it starts and how many tokens it drafts:
the draft's greedy continuation from that prefix, compared with the target's
greedy text. So this script records, once per request, the target's plain
greedy tokens and the draft model's 8-token greedy continuation from every
prefix, then replays any policy over them, charging each round the cached cost
profile (verify curve of the target, one draft step, bulk feed per token):
the policies' decisions compared with no noise at all. What it leaves out:
the host's time per round (the same for every policy up to a few %), and
near-ties where a batched verify row would pick another token.

    python benchmarks/replay.py policy [--n 96] [--categories a,b] [--seeds 8]

Recordings are cached next to the cost profiles (~/.cache/specgen/replay).
Wall-clock confirmation of a choice made here: benchmarks/policy.py.
"""

from __future__ import annotations

import json
import statistics

from policy import models
from replaylib.common import ALONGSIDE, DEPTH, OFFER_MAX, bundled_subset, recordings

from specgen.drafters.build import build_drafter
from specgen.engine.costs import cost_profile
from specgen.engine.llama import Engine
from specgen.policy.base import MODEL_KEY, FixedK, Situation, unused_offer_outcome, verify_cost
from specgen.policy.cost import DRAFT_MODEL_PRIOR, CostAware, Costs, Priors


def record_drafts(target, draft, prompt: list[int], n: int) -> dict:
    """The target's greedy tokens (n + DEPTH) and, for every m in 1..n, the draft's
    DEPTH-token greedy continuation of prompt + tokens[:m]."""
    target.truncate(0, 0)
    draft.truncate(0, 0)
    row = target.sync(0, prompt)
    out = []
    while len(out) < n + DEPTH:
        out.append(int(row.argmax()))
        row = target.decode(0, [out[-1]], 1)[-1]
    conts = []
    for m in range(1, n + 1):
        ctx = prompt + out[:m]
        row = draft.sync(0, ctx)
        cont = []
        for _ in range(DEPTH):
            cont.append(int(row.argmax()))
            row = draft.decode(0, [cont[-1]], 1)[-1]
        draft.truncate(0, len(ctx))
        conts.append(cont)
    return {"target": out, "drafts": conts}


def replay_policy(rec: dict, policy, n: int, costs: dict, lookup=None) -> dict:
    """One generation of n tokens under `policy`, every round charged its modeled
    time: the target's pass of k + 1 rows, and for a model draft its steps, the
    first feeding whatever its cache lags (a pass of that many rows on the
    draft's curve). `lookup`: a PromptLookup offering its proposals first
    (specgen's default with a draft model), chosen per round by
    `policy.choose_offer` as in `specgen.decode.generation.plan_step`; an offer passed over
    teaches its key what it would have met (`policy.observe`), as in
    `Generation.settle`."""
    tgt, drafts, prompt = rec["target"], rec["drafts"], rec["prompt"]
    verify, dcurve = costs["verify"], costs["draft"]
    if lookup is not None:
        lookup.begin(0)
    m, t, fed_to, hist, took = 1, 0.0, 1, {}, 0
    while m < n:
        limit = min(DEPTH, n - m - 1)  # the model's drafts: as deep as recorded
        lag = m - fed_to
        reach = min(OFFER_MAX, n - m - 1)  # lookup's offers: as far as the loader lets them
        offer = lookup.propose_one(prompt + tgt[:m], reach) if lookup is not None and limit > 0 else None
        offered = len(offer.tokens) if offer is not None else 0
        key = offer.key if offered else MODEL_KEY
        k, take = (policy.choose_offer(key, offered, limit, Situation(lag=lag, remaining=n - m))
                   if limit > 0 else (0, True))
        hist[k] = hist.get(k, 0) + 1
        d = (offer.tokens if take and offered else drafts[m - 1])[:k]
        acc = 0
        while acc < k and d[acc] == tgt[m + acc]:
            acc += 1
        t += verify_cost(verify, k + 1)
        if k and not take:  # the model drafted: k steps, the first one feeding its lag
            t += verify_cost(dcurve, max(lag, 1)) + (k - 1) * dcurve[1]
            fed_to = m + acc  # its cache holds the accepted prefix; the target's token is fed next round
        took += bool(k and take)
        policy.update(key if take else MODEL_KEY, k, acc)
        if offered and (k == 0 or not take):  # an offer passed over learns from what the round emitted
            policy.observe(key, *unused_offer_outcome(offer.tokens, tgt[m:m + acc + 1]))
        m += acc + 1
    return {"tps": (m - 1) / t, "k_hist": dict(sorted(hist.items())), "lookup_rounds": took}


def options(ap) -> None:
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--categories")
    ap.add_argument("--requests", type=int, default=4, help="requests per category (the bundled set has 4)")
    ap.add_argument("--seeds", type=int, default=8, help="Thompson seeds of the cost policy (mean reported)")
    ap.add_argument("--threads", type=int, default=2)


class Fixed(FixedK):
    """k tokens every round (fewer where the limit says so)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def choose(self, key, limit, situation=None):
        return min(self.k, limit)


def run(args) -> None:
    base, f32, q4 = models()
    reqs = bundled_subset(args.requests, set(args.categories.split(",")) if args.categories else None)
    store = recordings()
    kw = dict(n_ctx=4096, n_threads=args.threads)
    with Engine(f32, **kw) as target, Engine(q4, **kw) as draft:
        dprof = cost_profile(draft)
        costs = {"verify": cost_profile(target)["verify_s"], "draft": dprof["verify_s"], "feed": dprof["feed_s"]}
        recs = {}
        for r in reqs:
            path = store / f"{r.id}-{args.n}.json"
            rec = json.loads(path.read_text()) if path.exists() else record_drafts(target, draft, target.tokenize(r.prompt), args.n)
            rec["prompt"] = target.tokenize(r.prompt)
            path.write_text(json.dumps(rec))
            recs[r.id] = rec
    with Engine(base, **kw) as q4km:
        nopay = dict(costs, verify=cost_profile(q4km)["verify_s"])

    def cost_policy(s, c, prior=DRAFT_MODEL_PRIOR):
        return CostAware(OFFER_MAX, Costs(c["verify"], c["draft"][1], c["feed"], draft_verify_s=c["draft"]), Priors(model=prior), seed=s)

    def mean_tps(rec, make, c, lookup=False, seeds=args.seeds):
        return statistics.mean(replay_policy(rec, make(s), args.n, c, build_drafter(ALONGSIDE) if lookup else None)["tps"]
                               for s in range(seeds))

    v = costs["verify"]
    print(f"costs: target verify[1] {v[1] * 1e3:.1f} ms, verify[9] {v[9] * 1e3:.1f} ms; draft step "
          f"{costs['draft'][1] * 1e3:.1f} ms; Q4_K_M target verify[1] {nopay['verify'][1] * 1e3:.1f} ms")
    rows = {}
    for r in reqs:
        rec = recs[r.id]
        row = {f"k={k}": mean_tps(rec, lambda s, k=k: Fixed(k), costs, seeds=1) for k in range(DEPTH + 1)}
        row["k=8, lookup first"] = mean_tps(rec, lambda s: Fixed(8), costs, lookup=True, seeds=1)  # llama.cpp's order
        row["cost alone"] = mean_tps(rec, lambda s: cost_policy(s, costs), costs)
        row["cost alone, prior (0.6, 2)"] = mean_tps(rec, lambda s: cost_policy(s, costs, None), costs)
        row["default"] = mean_tps(rec, lambda s: cost_policy(s, costs), costs, lookup=True)
        row["nopay plain"] = mean_tps(rec, lambda s: Fixed(0), nopay, seeds=1)
        row["nopay default"] = mean_tps(rec, lambda s: cost_policy(s, nopay), nopay, lookup=True)
        row["nopay cost alone"] = mean_tps(rec, lambda s: cost_policy(s, nopay), nopay)
        rows[r.id] = (r.category, row)
    summarise_policy(rows)


def summarise_policy(rows: dict) -> None:
    """Per category, geometric means over its requests; the best fixed k is one k for the whole category."""
    by_cat: dict[str, list[dict]] = {}
    for cat, row in rows.values():
        by_cat.setdefault(cat, []).append(row)
    geo = statistics.geometric_mean
    print(f"\n{'category':13s} {'plain':>6s} {'best fixed k':>15s} {'cost alone':>17s} {'(prior 0.6,2)':>13s} "
          f"{'default':>18s} {'k=8 lookup 1st':>15s} | nopay: default, cost alone vs plain")
    worst = {}
    for cat, rs in by_cat.items():
        g = {name: geo([r[name] for r in rs]) for name in rs[0]}
        best = max((n for n in g if n.startswith("k=") and n != "k=0" and "lookup" not in n), key=g.__getitem__)
        ratio = {name: g[name] / g[best] for name in ("cost alone", "cost alone, prior (0.6, 2)", "default",
                                                     "k=8, lookup first")}
        for name, x in ratio.items():
            worst[name] = min(worst.get(name, 9.0), x)
        print(f"{cat:13s} {g['k=0']:6.1f} {best:>5s} {g[best]:5.1f} t/s {g['cost alone']:5.1f} ({ratio['cost alone']:.2f}) "
              f"{ratio['cost alone, prior (0.6, 2)']:13.2f} {g['default']:5.1f} ({ratio['default']:.2f}, "
              f"{g['default'] / g['k=0']:.2f}x) {ratio['k=8, lookup first']:15.2f} | "
              f"{g['nopay default'] / g['nopay plain']:.2f}, {g['nopay cost alone'] / g['nopay plain']:.2f}")
    print("worst category vs its best fixed k: " + ", ".join(f"{n} {x:.3f}" for n, x in worst.items()))
    every = [row for _, row in rows.values()]
    print("nopay, worst request vs plain: default {:.3f}, cost alone {:.3f}".format(
        min(r["nopay default"] / r["nopay plain"] for r in every), min(r["nopay cost alone"] / r["nopay plain"] for r in every)))

