"""The default (prompt lookup under the cost policy) on the real pair's target, replayed.

Plain greedy text of each chat request (the Qwen2.5-Coder 1.5B Q4_K_M as
downloaded, or with --f16 its F16 copy), recorded once with end-of-generation
ignored, then replayed through the real loop (`Generation`, prompt lookup, the
cost policy) on a stand-in target whose rows follow it, each pass priced on the
model's cached verify curve (`suffix.replay`, host work left out): the policy's
choices compared with no timing noise. A config names the cost policy's
variant: `current` (today's), `free_z=Z` (a free offer chosen Z posterior
deviations from its estimates; 0: at its means, the rule before free_z),
`fade=all` (a passed-over offer's judgment fades the evidence of every position,
the rule before `CostAware.observe` faded only those it reaches), `pool=off` (a
key's thinly seen positions start from its own estimate at the position before
alone, the rule before `CostAware.pool_positions`), `budget=off` (a round may
stake any cost the estimates favour, the rule before `CostAware.loss_budget`);
joined by commas
(`free_z=0,fade=all`).
Per request: decode speed over plain priced alike, and per config the
geometric mean, the lowest, the rounds drafted. Then, apart from the chat
requests, `real_pair.py`'s rewrite (benchmarks/prompts/inventory.py, "Add type
hints to every function signature.", its prompt as `specgen rewrite` builds it,
plain's text to its end, and the text the default's own run wrote, which batch
numerics part from plain's at near-ties): the use where lookup copies most
(--no-rewrite: leave it out).

    python benchmarks/replay.py lookup [--f16] [--requests A.jsonl B.jsonl] [-n 96] \\
        [--configs current fade=all free_z=0 pool=off budget=off]

What it leaves out: the host's work per round, and near-ties where a batched
verify row picks another token than plain's (the real run then follows a
slightly different text). Wall-clock confirmation: benchmarks/real_pair.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from pathlib import Path

from replaylib.common import load_curve, recordings, save_curve
from replaylib.suffix import replay

from specgen.apps import rewrite as rw
from specgen.apps.chat import format_for
from specgen.bench import load_requests
from specgen.bench.requests import request_tokens
from specgen.decode.generation import Generation
from specgen.drafters.build import DrafterOptions, build_drafter
from specgen.engine.costs import cost_profile
from specgen.engine.llama import Engine
from specgen.errors import SpecgenError
from specgen.policy.cost import CostAware, Costs
from specgen.rules.sampling import SamplingParams

HERE = Path(__file__).resolve().parent.parent
SETS = [HERE / "prompts" / "open.jsonl", HERE / "prompts" / "instruct.jsonl", None]  # None: the bundled requests
K_MAX = 16  # lookup's ceiling under the cost policy (the CLI's adaptive default)


def variant(config: str, curve):
    """A maker of fresh policies for `config` (see the module's description)."""
    opts = dict(o.split("=", 1) for o in config.split(",") if o and o != "current")
    free_z = opts.pop("free_z", None)
    fade = opts.pop("fade", "seen")
    pool = opts.pop("pool", "on")
    budget = opts.pop("budget", "on")
    if opts:
        raise SystemExit(f"config {config}: unknown option {', '.join(opts)} (free_z=, fade=, pool=, budget=)")
    if pool not in ("on", "off") or budget not in ("on", "off"):
        raise SystemExit(f"config {config}: pool and budget are on or off")
    if fade not in ("seen", "all"):
        raise SystemExit(f"config {config}: fade is seen or all")
    try:
        z = CostAware.free_z if free_z is None else float(free_z)
    except ValueError:
        raise SystemExit(f"config {config}: free_z is a number") from None

    def make():
        p = CostAware(K_MAX, Costs(curve))
        p.free_z = z
        p.observe_fades_all = fade == "all"
        p.pool_positions = pool == "on"
        p.loss_budget = budget == "on"
        return p
    return make


def record(engine: Engine, requests, n: int, store: Path) -> list[tuple[str, list[int], list[int]]]:
    """(id, prompt tokens, plain's n greedy tokens) per request, recorded where not cached."""
    return _recorded(engine, [(f"{label}:{req.id}", request_tokens(engine, req)) for label, req in requests],
                     n, True, store)


def record_rewrite(engine: Engine, curve, store: Path) -> list[tuple[str, list[int], list[int]]]:
    """real_pair.py's rewrite, twice: its prompt's tokens with plain's greedy text to the end
    of generation (within the CLI's default limit), and with the text the default's own run
    wrote (batch numerics part it from plain's at near-ties, and a different text gives
    lookup other matches), each recorded where not cached."""
    from real_pair import REWRITE_FILE, REWRITE_INSTRUCTION

    p = rw.build_prompt(engine, REWRITE_INSTRUCTION, REWRITE_FILE.read_text(), format_for(engine, "auto"))
    rid, n = f"rewrite:{REWRITE_FILE.stem}", rw.default_max_tokens(p, engine.n_ctx)
    return (_recorded(engine, [(f"{rid}:plain", p.tokens)], n, False, store)
            + _recorded(engine, [(f"{rid}:default", p.tokens)], n, False, store, curve))


def _recorded(engine: Engine, prompts, n: int, ignore_eos: bool, store: Path, curve=None):
    """curve: recorded through the default (lookup under the cost policy), not plain."""
    try:
        cache = json.loads(store.read_text()) if store.exists() else {}
    except (OSError, ValueError):
        cache = {}  # unreadable: recorded again
    out = []
    for rid, prompt in prompts:
        key = f"{rid}:{hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:12]}"
        if key not in cache:
            spec = dict(draft_max=K_MAX, policy=CostAware(K_MAX, Costs(curve))) if curve else {}
            gen = Generation(engine, prompt, build_drafter(DrafterOptions("lookup")) if curve else None,
                             max_tokens=n, params=SamplingParams(ignore_eos=ignore_eos), **spec)
            for _ in gen:
                pass
            cache[key] = list(gen.tokens)
            tmp = store.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, store)  # whole or not at all
        out.append((rid, prompt, cache[key]))
    return out


def pair_options(ap, configs: list[str]) -> None:
    """The options of a replay on the real pair's target (this mode's and `model`'s)."""
    ap.add_argument("--f16", action="store_true", help="the target's F16 copy (cheap rows)")
    ap.add_argument("--requests", type=Path, nargs="+", default=None,
                    help="chat request files (default: benchmarks/prompts/open.jsonl, instruct.jsonl and the bundled set)")
    ap.add_argument("-n", type=int, default=96, help="tokens per request")
    ap.add_argument("--threads", type=int, default=2, help="the cost profiles' threads (and the recordings')")
    ap.add_argument("--configs", nargs="+", default=configs)
    ap.add_argument("--no-rewrite", dest="rewrite", action="store_false", help="leave the rewrite out")
    ap.add_argument("--save-curve", type=Path, default=None, help="write the verify curve the replay priced on (JSON)")
    ap.add_argument("--curve", type=Path, default=None,
                    help="price the target on this verify curve (JSON, seconds of a pass of n rows at index n), "
                         "not its cached profile")


def options(ap) -> None:
    pair_options(ap, ["current", "fade=all"])


def run(args) -> None:
    from real_pair import models

    if args.n < 2:
        raise SystemExit(f"replay: -n must be at least 2 (got {args.n})")
    for c in args.configs:
        variant(c, [])  # a bad config fails before any model loads
    pinned = load_curve(args.curve, K_MAX + 1) if args.curve else None
    try:
        requests = [(Path(s).stem if s else "bundled", r) for s in args.requests or SETS for r in load_requests(s)]
    except SpecgenError as err:
        raise SystemExit(f"replay: {err}") from None
    target, _ = models(args.f16)
    with Engine(Path(target), n_ctx=4096, n_threads=args.threads) as e:
        curve = pinned or cost_profile(e)["verify_s"]
        if args.save_curve:
            save_curve(args.save_curve, curve)
        makers = {c: variant(c, curve) for c in args.configs}
        reqs = record(e, requests, args.n, recordings() / f"lookup-{Path(target).stem}-{args.threads}t-{args.n}.json")
        rewrites = record_rewrite(e, curve, recordings() / f"rewrite-{Path(target).stem}-{args.threads}t.json") \
            if args.rewrite else []
    plain_rate = 1.0 / curve[1]
    results = {c: replay(reqs, build_drafter(DrafterOptions("lookup")), K_MAX, curve, make, host=False)
               for c, make in makers.items()}
    print(f"{'request':<22}" + "".join(f"{c:>24}" for c in makers))
    for i, (rid, _, _) in enumerate(reqs):
        print(f"{rid:<22}" + "".join(f"{results[c][i]['tokens_per_s'] / plain_rate:>23.2f}x" for c in makers))
    for label, fn in (("geomean", lambda xs: math.exp(statistics.fmean(map(math.log, xs)))), ("lowest", min)):
        print(f"{label:<22}" + "".join(
            f"{fn([r['tokens_per_s'] / plain_rate for r in results[c]]):>23.3f}x" for c in makers))
    print(f"{'rounds drafted':<22}" + "".join(f"{sum(r['rounds'] - r['k_hist'].get(0, 0) for r in results[c]):>24}"
                                              for c in makers))
    for rewrite in rewrites:
        for c, make in makers.items():
            r = replay([rewrite], build_drafter(DrafterOptions("lookup")), K_MAX, curve, make, host=False)[0]
            hist = " ".join(f"{k}:{n}" for k, n in r["k_hist"].items())
            print(f"{rewrite[0]} ({len(rewrite[2])} tokens), {c}: {r['tokens_per_s'] / plain_rate:.3f}x, "
                  f"{r['accepted']} from drafts, k chosen {hist}")
    print(f"decode speed over plain's, both priced on {Path(target).name}'s "
          f"{'verify curve from ' + str(args.curve) if args.curve else 'cached verify curve'} "
          f"({args.threads} threads; 4 rows {curve[4] / curve[1]:.2f}x one, 16 rows {curve[16] / curve[1]:.2f}x)")
