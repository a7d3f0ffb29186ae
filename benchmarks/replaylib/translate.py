"""Translated drafts (SmolLM2 drafting for Gemma through text) replayed on measured costs, sampled.

Why a sampled run can be replayed: a translated draft (and prompt lookup's
offer) is verified as a point mass. Accepting a point-mass draft d with the
target's probability p(d), and otherwise emitting from p without d, is the
same joint law as drawing the target's own token x ~ p and accepting d iff
d == x. So one plain sampled run of the target (seeded) fixes, for every
policy, what each round would emit: a round at position m accepts the
drafts that equal that run's tokens m, m+1, … and emits the first token that
differs. Every policy then produces the same text (one coupling of the
lossless rule), and what differs between policies is only time, which is
priced, not timed: no machine noise at all.

Recorded once per request, sampling seed and length (cached under
~/.cache/specgen/replay): the target's sampled tokens (plain, seeded) and, at
every prefix m, the draft's own tokens of the text (its stream), its 8-token
greedy continuation, that continuation's translation into target tokens for
each k (the text of its first k tokens, re-encoded, at most k tokens), and
the CPU time of that translation; and, added to older recordings on first use
(one batched pass), the top probability of the target's processed
distribution at each position, which the replay tells the policy as a
sampled run's loop does (`Policy.target_top`).

Replayed through the real loop (`Generation`, `plan_step`, the loader's
drafter shape and `make_policy`'s cost policy), on a virtual clock (this
process's CPU time plus priced passes, as the suffix mode):
- a target pass of r rows: the verify curve at r (the cached profile, or
  curves measured side by side: `--measure-costs FILE`, then `--costs FILE`;
  the policies start from the cached profiles either way, or from the curves
  `--believe FILE` gives them), plus one sampled
  pick (`costs.pick_cost`) per row the acceptance rule reads;
- a model proposal of k: its first pass feeds what the draft's cache lacks
  of its stream (a pass of that many rows on the draft's cached curve),
  then k - 1 steps (the draft's curve, as above), plus the recorded translation time; reported to the
  policy as the real drafter reports it (steps, or a bulk feed, extra_s).
Configurations: `plain`, `k=K` (fixed, the model alone), `alone` (cost
policy, the model alone), `default` (cost policy, lookup alongside), each
cost configuration over several Thompson seeds of the policy (the product
uses seed 0). A suffix `:NAME=VALUE+...` passes arguments to the fresh cost
policy (`CostAware(NAME=VALUE)`, a variant of it, e.g. `default:explore_near=0`);
`:old`, the exploration before the near rule (the same); `:flat`, the
translated model's prior not scaled by the target's top probability
(`top_prior=0`).

    python benchmarks/replay.py translate [--f32] [--temp 0.8] [--seeds 1,2] [--n 48,96]
        [--categories continuation] [--per-category 4] [--configs plain,k=1,alone,alone:old,default] [--policy-seeds 8]
        [--measure-costs costs.json | --costs costs.json] [--believe costs.json] [--pick-ms 2.55] [--json out.json]

What it leaves out: the machine's noise (the reason to replay), the host's
work beyond this process's CPU time, near-ties between a batched row and a
single one, and the draft's stream drifting from the recorded one at a
token boundary (the recording follows one prefix at a time).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from replaylib.common import (
    ALONGSIDE, DEPTH, DRAFT, OFFER_MAX, Clock, ReplayTarget, bundled_subset, recordings, target_path, virtual_time,
)

import specgen.engine.costs as engine_costs
from specgen.bench.requests import request_tokens
from specgen.decode.generation import Generation
from specgen.drafters.base import Draft, Drafter
from specgen.drafters.build import DrafterOptions, OpenedDraft, build_drafter
from specgen.plan import NORMAL_FEED
from specgen.drafters.translated import Stream, proposal_text, to_target
from specgen.engine.costs import cost_profile, measure_feed, measure_verify, pick_cost
from specgen.engine.llama import Engine, common_prefix
from specgen.models.registry import resolve_model
from specgen.models.vocab import n_shared
from specgen.policy.base import FixedK, verify_cost
from specgen.policy.cost import CostAware, Priors
from specgen.rules.sampling import SamplingParams, probs
from specgen.session import make_policy


# -- recording -----------------------------------------------------------------

def record_translated(target, draft, prompt: list[int], n: int, params) -> dict:
    """The target's plain sampled tokens (n + DEPTH), and at every prefix m = 0 … n the
    draft's stream of the text; for m >= 1 its DEPTH-token greedy continuation and
    the translation of its first k tokens for k = 1 … DEPTH."""
    target.truncate(0, 0)
    gen = Generation(target, prompt, None, draft_max=0, max_tokens=n + DEPTH, params=replace(params, ignore_eos=True))
    for _ in gen:
        pass
    traj = list(gen.tokens)
    tr = build_drafter(DrafterOptions("draft"), target, OpenedDraft(draft, same_vocab=False, n_shared=n_shared(target, draft)))
    stream = Stream(fixed=list(tr.fixed))  # the draft's stream of the text, as the drafter keeps one per sequence
    draft.truncate(0, 0)
    ctxs, conts, props, trans = [], [], [], []
    for m in range(n + 1):
        t = time.process_time()
        stream.update(target, draft, prompt + traj[:m])
        ctx = stream.draft_context()
        dt = time.process_time() - t
        ctxs.append(list(ctx))
        if m == 0:
            continue
        row = draft.sync(0, ctx)
        cont = []
        for _ in range(DEPTH):
            cont.append(int(row[: draft.n_vocab].argmax()))
            row = draft.decode(0, [cont[-1]], 1)[-1]
        draft.truncate(0, len(ctx))
        t = time.process_time()
        props.append([to_target(target, stream, proposal_text(draft, cont[:k]), k) for k in range(1, DEPTH + 1)])
        trans.append(dt + (time.process_time() - t) / DEPTH)  # one update and one translation, as a round does
        conts.append(cont)
    return {"target": traj, "ctx": ctxs, "drafts": conts, "proposals": props, "translate_s": trans}


def target_tops(target, prompt: list[int], traj: list[int], params) -> list[float]:
    """At every recorded position, the top probability of the target's processed
    distribution there (what a sampled run's policy is told, `Policy.target_top`):
    one batched pass over the recorded text, logits on its rows."""
    target.truncate(0, 0)
    rows = [np.array(target.sync(0, prompt))]
    rows += list(np.array(target.decode(0, traj[:-1], len(traj) - 1)))
    return [float(probs(row[: target.n_vocab], params).max()) for row in rows]


# -- replay --------------------------------------------------------------------

class PricedTarget(ReplayTarget):
    """The suffix mode's stand-in target (its rows are the recorded sampled tokens), each
    pass also charged one sampled pick per row the acceptance rule reads."""

    def __init__(self, truth, curve, clock, pick_s: float) -> None:
        super().__init__(truth, curve, clock)
        self.pick_s = pick_s

    def decode(self, seq, tokens, n_logits=1):
        before = len(self.trace)
        rows = super().decode(seq, tokens, n_logits)
        if len(self.trace) > before:
            self.clock.offset += (self.trace[-1][2] + 1) * self.pick_s
        return rows


class ReplayDraft(Drafter):
    """The translated draft model, from a recording: proposals and their priced costs.

    `lookup` (a drafter build_drafter made, `ALONGSIDE`): prompt lookup alongside, as
    build_drafter's `lookup_alongside` puts it beside a real draft model (`WithLookup`):
    its free proposals are offered first (`offers`), the model drafts at most `model_max`.
    A recording is not an engine, so this stand-in declares that shape itself."""

    name, free, prefills, translated = "draft", False, True, True

    def __init__(self, rec: dict, n_prompt: int, curve, feed_s: float, clock: Clock,
                 lookup: Drafter | None = None, model_max: int | None = None) -> None:
        self.rec, self.n_prompt, self.curve, self.feed_s, self.clock = rec, n_prompt, curve, feed_s, clock
        self.cache: list[int] = []  # the draft's KV: its own tokens
        self.seen: list[int] | None = None  # target tokens its stream has seen, with its last proposal
        self.proposals = 0
        self.log: dict[int, int] = {}  # context length of each proposal -> tokens its first pass fed
        self.lookup, self.model_max, self.offers = lookup, model_max, lookup is not None
        if lookup is not None:
            self.name = f"{self.name}+lookup"

    def begin(self, seq: int = 0) -> None:
        if self.lookup is not None:
            self.lookup.begin(seq)

    def finish(self, seq: int, context) -> None:
        if self.lookup is not None:
            self.lookup.finish(seq, context)

    def offer(self, wants):
        return self.lookup.propose(wants)

    def lag(self, seq: int, context) -> int:  # noqa: ARG002
        if self.seen is None:
            return len(context)
        return len(context) - min(common_prefix(self.seen, context), len(context))

    def _feed_cost(self, rows: int) -> float:
        return verify_cost(self.curve, rows) if rows < len(self.curve) else rows * self.feed_s

    def prefill(self, seq: int, context):  # noqa: ARG002
        ctx = self.rec["ctx"][len(context) - self.n_prompt]
        fed = len(ctx) - min(common_prefix(self.cache, ctx), len(ctx) - 1)
        d = Draft()
        d.fed, d.fed_s, d.extra_s = fed, self._feed_cost(fed), 0.0
        self.clock.offset += d.fed_s
        self.cache, self.seen = list(ctx), list(context)
        return d

    def propose(self, wants):
        out = []
        for w in wants:
            m = len(w.context) - self.n_prompt
            ctx, cont = self.rec["ctx"][m], self.rec["drafts"][m - 1]
            ids = list(self.rec["proposals"][m - 1][w.k - 1])
            fed = len(ctx) - min(common_prefix(self.cache, ctx), len(ctx) - 1)
            first, rest = self._feed_cost(fed), (w.k - 1) * self.curve[1]
            d = Draft(ids, None)
            if fed > NORMAL_FEED:
                d.fed, d.fed_s, d.steps, d.step_s = fed, first, w.k - 1, rest
            else:
                d.steps, d.step_s = w.k, first + rest
            d.extra_s = self.rec["translate_s"][m - 1]
            self.clock.offset += first + rest + d.extra_s
            self.cache = ctx + cont[: w.k - 1]
            self.seen = list(w.context) + ids
            self.proposals += 1
            self.log[len(w.context)] = fed
            out.append(d)
        return out


LAB_FLAGS = ("explore_near", "top_prior")  # CostAware's rules a variant may turn off (class attributes)


def parse_config(name: str) -> tuple[str, dict]:
    """`default:old` (the earlier exploration, `explore_near=False`), `default:flat`
    (the prior as under greedy, `top_prior=False`) or `default:NAME=VALUE+NAME=VALUE`
    (one of those rules, or a field of the cost policy's `Priors`: a flag, a number)."""
    base, _, opts = name.partition(":")
    if opts == "old":
        return base, {"explore_near": False}
    if opts == "flat":
        return base, {"top_prior": False}
    defaults = {f.name: f.default for f in fields(Priors)} | {f: getattr(CostAware, f) for f in LAB_FLAGS}
    kw = {}
    for o in (o for o in opts.split("+") if o):
        k, eq, v = o.partition("=")
        default = defaults.get(k)
        if not eq or type(default) not in (bool, int, float):
            raise SystemExit(f"config {name}: {o!r} is not NAME=VALUE of a cost policy's flag or number")
        try:
            kw[k] = bool(float(v)) if type(default) is bool else type(default)(float(v))
        except ValueError:
            raise SystemExit(f"config {name}: {o!r}: not a number") from None
    return base, kw


def cost_variant(kw: dict):
    """What builds the cost policy a config's variant names (`make_policy(build=...)`):
    CostAware with its rules turned off as asked (a subclass) and its priors replaced."""
    flags = {f: kw[f] for f in LAB_FLAGS if f in kw}
    priors = {k: v for k, v in kw.items() if k not in LAB_FLAGS}
    cls = type("CostVariant", (CostAware,), flags) if flags else CostAware

    def build(k_max, costs, base: Priors, **rest):
        return cls(k_max, costs, replace(base, **priors), **rest)

    return build


def replay_translated(rec, prompt, n, config, costs, engines, pick_s, policy_seed=0) -> dict:
    """One generation of n tokens under `config`; its priced decode speed and k histogram."""
    base, cost_kw = parse_config(config)
    with virtual_time(Clock()) as clock:
        target = PricedTarget(list(prompt) + rec["target"], costs["verify"], clock, pick_s)
        alongside = {"lookup": build_drafter(ALONGSIDE), "model_max": DEPTH} if base == "default" else {}
        model = ReplayDraft(rec, len(prompt), costs["draft"], costs["feed"], clock, **alongside)
        if base == "plain":
            drafter, k, policy = None, 0, FixedK()
        elif base.startswith("k="):
            drafter, k, policy = model, int(base[2:]), FixedK()
        else:
            drafter, k = model, OFFER_MAX if alongside else DEPTH
            if base not in ("alone", "default"):
                raise SystemExit(f"unknown config {config}")
            policy = make_policy("cost", k, *engines, seed=policy_seed, build=cost_variant(cost_kw))
        policy.sampling(pick_s, draft_picks=False)  # the replay's loop is greedy on the recorded tokens
        gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, policy=policy, params=SamplingParams(ignore_eos=True))
        tops = iter(rec["top"])
        for r in gen:  # what a sampled run's rule tells the policy of each row it emitted from
            for _ in r.tokens:
                policy.target_top(next(tops))
    assert gen.tokens == rec["target"][:n], "the replay left the recorded tokens"
    st = gen.stats
    # per verify pass: (position in the output, k, accepted, by the model, tokens its first pass fed)
    rounds = [(pos - len(prompt), k, acc, pos in model.log, model.log.get(pos, 0))
              for pos, k, acc, _, _ in target.trace]
    return {"tps": st.tokens_per_s, "k_hist": dict(sorted(st.k_chosen.items())), "rounds": st.rounds,
            "accepted": st.accepted, "drafted": st.drafted, "model_rounds": model.proposals, "trace": rounds}


# -- the run -------------------------------------------------------------------

def options(ap) -> None:
    ap.add_argument("--n", default="48,96", help="tokens per generation, comma-separated (recorded at the largest)")
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--seeds", default="1,2", help="sampling seeds of the recorded target runs")
    ap.add_argument("--f32", action="store_true", help="the all-F32 copy of the target")
    ap.add_argument("--categories", default="continuation")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--configs", default="plain,k=1,k=2,alone,default")
    ap.add_argument("--policy-seeds", type=int, default=8, help="Thompson seeds per cost configuration (mean)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write per-run figures here")
    ap.add_argument("--costs", type=Path, help="price passes on the curves in this file (else the cached profiles, "
                    "which the policies start from either way)")
    ap.add_argument("--measure-costs", type=Path, help="measure both models' curves now, write them here, and price on them "
                    "(run it under the bench lock)")
    ap.add_argument("--believe", type=Path, help="the policies start from the curves in this file (as --costs) "
                    "instead of the cached profiles, unchecked: e.g. a profile a busy machine inflated")
    ap.add_argument("--pick-ms", type=float, help="price a sampled pick at this (else measured now: runs compared "
                    "in different processes then differ by its noise)")


def run(args) -> None:
    cost_files = {}
    for opt, path in (("--costs", args.costs), ("--believe", args.believe)):
        if path:  # read before the models load: a bad file is one line, not a traceback later
            try:
                cost_files[opt] = b = json.loads(path.read_text())
                b["verify"], b["draft"], b["feed"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"replay translate: {opt} {path}: not a costs file written by --measure-costs ({e})")
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:  # a bad configuration is one line, before the models load
        parse_config(c)

    tpath = target_path(args.f32)
    ns = [int(x) for x in args.n.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    if "plain" not in configs:
        configs.insert(0, "plain")
    reqs = bundled_subset(args.per_category, {c for c in args.categories.split(",") if c})
    store = recordings()
    kw = dict(n_ctx=4096, n_threads=args.threads)
    with Engine(tpath, **kw) as target, Engine(resolve_model(DRAFT), **kw) as draft:
        if args.measure_costs:
            costs = {"verify": measure_verify(target), "draft": measure_verify(draft), "feed": measure_feed(draft)}
            args.measure_costs.write_text(json.dumps(costs))
        elif args.costs:
            costs = cost_files["--costs"]
        else:
            dprof = cost_profile(draft)
            costs = {"verify": cost_profile(target)["verify_s"], "draft": dprof["verify_s"], "feed": dprof["feed_s"]}
        if args.believe:
            b = cost_files["--believe"]
            believed = {id(target): {"verify_s": b["verify"], "feed_s": 0.0},
                        id(draft): {"verify_s": b["draft"], "feed_s": b["feed"]}}
            engine_costs.cost_profile = lambda engine, **_: believed[id(engine)]  # what make_policy reads
        params = SamplingParams(args.temp, seed=0)
        pick_s = args.pick_ms / 1e3 if args.pick_ms else pick_cost(target.n_vocab, params)
        recs = []
        for r in reqs:
            prompt = request_tokens(target, r)
            for s in seeds:
                path = store / f"translate-{tpath.stem}-{r.id}-t{args.temp}-s{s}-{max(ns)}.json"
                if path.exists():
                    rec = json.loads(path.read_text())
                else:
                    rec = record_translated(target, draft, prompt, max(ns), SamplingParams(args.temp, seed=s))
                    path.write_text(json.dumps(rec))
                if "top" not in rec:  # recorded before the policy read the target's top probability
                    rec["top"] = target_tops(target, prompt, rec["target"], SamplingParams(args.temp, seed=0))
                    path.write_text(json.dumps(rec))
                recs.append((r, s, prompt, rec))
        v = costs["verify"]
        print(f"target {tpath.name}: verify[1..4] " + " ".join(f"{x * 1e3:.1f}" for x in v[1:5]) +
              f" ms; draft step {costs['draft'][1] * 1e3:.1f} ms; sampled pick {pick_s * 1e3:.2f} ms; "
              f"temp {args.temp}, seeds {seeds}, policy seeds {args.policy_seeds}")
        rows = []
        for r, s, prompt, rec in recs:
            for n in ns:
                res = {}
                for c in configs:
                    fixed = c == "plain" or c.startswith("k=")
                    runs = [replay_translated(rec, prompt, n, c, costs, (target, draft), pick_s, ps)
                            for ps in range(1 if fixed else args.policy_seeds)]
                    res[c] = {"tps": statistics.mean(x["tps"] for x in runs), "seed0": runs[0]["tps"],
                              "worst": min(x["tps"] for x in runs), "k_hist": runs[0]["k_hist"],
                              "trace": runs[0]["trace"]}
                plain = res["plain"]["tps"]
                rows.append({"request": r.id, "category": r.category, "seed": s, "n": n,
                             **{c: {**x, "vs_plain": x["tps"] / plain, "seed0_vs_plain": x["seed0"] / plain,
                                    "worst_vs_plain": x["worst"] / plain} for c, x in res.items()}})
                print(f"{r.id:<20} seed {s} n {n:3d}  " + "  ".join(
                    f"{c} {res[c]['tps'] / plain:.3f}" + ("" if c == "plain" or c.startswith("k=") else
                                                          f" (s0 {res[c]['seed0'] / plain:.3f}, min {res[c]['worst'] / plain:.3f})")
                    for c in configs[1:]), flush=True)
    summarise_translated(rows, configs[1:], ns)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def summarise_translated(rows, configs, ns) -> None:
    geo = statistics.geometric_mean
    print("\nspeed vs plain, priced (geomean over requests and seeds; policy seeds: mean / the product's seed 0 / worst run)")
    cats = list(dict.fromkeys(r["category"] for r in rows))
    for cat in cats:
        for n in ns:
            sel = [r for r in rows if r["category"] == cat and r["n"] == n]
            cells = []
            for c in configs:
                g = geo([r[c]["vs_plain"] for r in sel])
                if c == "plain" or c.startswith("k="):
                    cells.append(f"{c} {g:.3f}")
                else:
                    cells.append(f"{c} {g:.3f} / {geo([r[c]['seed0_vs_plain'] for r in sel]):.3f} / "
                                 f"{min(r[c]['worst_vs_plain'] for r in sel):.3f}")
            print(f"  {cat:<13} n {n:3d}: " + "; ".join(cells))

