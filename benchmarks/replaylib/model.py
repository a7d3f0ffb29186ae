"""The draft model (`-d`, the pair's 0.5B, prompt lookup alongside, the cost policy) on the real pair, replayed.

Greedy acceptance stops at a draft's first token that differs from the target's
text, so a draft model's round is decided by what it predicts along that text
alone: after each prefix of prompt + plain's reply, the token it would draft
next. One pass of the draft model over the whole text, with logits on every row,
records them all. A stand-in for its engine (`ReplayDraft`) serves them to
specgen's own `DraftModel`, each pass priced on the draft's cached cost profile,
while `ReplayTarget` serves the target's rows priced on the target's verify
curve. So the real loop (`Generation`, `WithLookup`, the cost policy) runs with
no timing noise, on the chat requests of `replay.py lookup` (plain's greedy
text, recorded once) and on `real_pair.py`'s rewrite (plain's text).

A config is a plan, as the CLI resolves it (`specgen.plan.resolve`):
`default` (`-d`: the model, lookup alongside, the cost policy), `model`
(`-d --no-lookup`), `k=N` (`-d -k N`: the model alone, a fixed k), `lookup`
(the default without `-d`); `,budget=off` after any but `k=N` turns the cost
policy's loss budget off (`CostAware.loss_budget`, the rule before it). The cost
policy's draws are seeded (`--seeds`: the mean over that many).

    python benchmarks/replay.py model [--f16] [--requests A.jsonl] [-n 96] [--seeds 3] \\
        [--configs lookup default model k=3 default,budget=off]

What it leaves out: the host's work per round; near-ties where a batched
verify row picks another token than plain's; and the draft's own batch numerics
(its rows come from one pass over the text, not from its steps).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from replaylib.common import Clock, ReplayTarget, load_curve, recordings, save_curve, virtual_time
from replaylib.lookup import SETS, pair_options, record, record_rewrite

import specgen.drafters.model as draftmodel
from specgen.bench import load_requests
from specgen.decode.generation import Generation
from specgen.drafters.build import OpenedDraft, build_drafter
from specgen.engine.costs import cost_profile
from specgen.engine.llama import Engine, common_prefix
from specgen.errors import SpecgenError
from specgen.plan import Kind, resolve
from specgen.policy.base import FixedK
from specgen.policy.cost import DRAFT_MODEL_PRIOR, CostAware, Costs, Priors
from specgen.rules.sampling import SamplingParams

CHUNK = 256  # tokens a recording pass of the draft reads at a time


class ReplayDraft:
    """A stand-in for the draft model's engine, for `DraftModel`: after a context
    that is the recorded text's prefix, its row's argmax is the draft's recorded
    prediction there; after any other (past a drafted token the text does not
    have, which the target rejects anyway) it is token 0. Each pass advances the
    clock by the draft's cost of its rows: its curve, and past the curve's end the
    bulk feed per token."""

    n_batch = 4096

    def __init__(self, truth, preds, curve, feed_s: float, clock: Clock) -> None:
        self.truth, self.preds, self.curve, self.feed_s, self.clock = truth, preds, curve, feed_s, clock
        self.kv: list[int] = []
        self.agree = 0  # how much of kv is the text's prefix
        self._rows: dict[int, np.ndarray] = {}

    def kv_tokens(self, seq: int = 0) -> list[int]:  # noqa: ARG002
        return list(self.kv)

    def truncate(self, seq: int, n: int) -> None:  # noqa: ARG002
        del self.kv[n:]
        self.agree = min(self.agree, n)

    def _feed(self, tokens) -> None:
        for t in tokens:
            if self.agree == len(self.kv) < len(self.truth) and self.truth[self.agree] == t:
                self.agree += 1
            self.kv.append(t)

    def _row(self) -> np.ndarray:
        p = len(self.kv) - 1
        tok = self.preds[p] if self.agree == len(self.kv) and p < len(self.preds) else 0
        row = self._rows.get(tok)
        if row is None:
            row = self._rows[tok] = np.eye(1, tok + 1, tok, dtype=np.float32)[0]  # argmax: tok
        return row

    def _price(self, rows: int) -> None:
        top = len(self.curve) - 1
        self.clock.offset += self.curve[min(rows, top)] + max(rows - top, 0) * self.feed_s

    def sync_many(self, items) -> dict[int, np.ndarray]:
        out, fed = {}, 0
        for seq, ctx in items:
            keep = min(common_prefix(self.kv, ctx), len(ctx) - 1)
            self.truncate(seq, keep)
            self._feed(ctx[keep:])
            fed += len(ctx) - keep
            out[seq] = self._row()
        self._price(fed)
        return out

    def decode_batch(self, parts) -> list[list[np.ndarray]]:
        out = []
        for _, tokens, _ in parts:
            self._feed(tokens)
            out.append([self._row()])  # DraftModel reads each part's last row
        self._price(sum(len(t) for _, t, _ in parts))
        return out


@contextmanager
def draft_time(clock: Clock):
    """`DraftModel` times its steps and catch-ups on `clock` too (the policy prices them from those times)."""
    real = draftmodel.time
    draftmodel.time = clock
    try:
        yield clock
    finally:
        draftmodel.time = real


def record_preds(draft: Engine, texts, store: Path) -> dict[str, list[int]]:
    """Per (id, prompt, reply): the draft's greedy prediction after each prefix of prompt + reply,
    from one pass over it, recorded where not cached."""
    try:
        cache = json.loads(store.read_text()) if store.exists() else {}
    except (OSError, ValueError):
        cache = {}  # unreadable: recorded again
    out = {}
    for rid, prompt, reply in texts:
        text = list(prompt) + list(reply)
        key = f"{rid}:{hashlib.sha256(json.dumps(text).encode()).hexdigest()[:12]}"
        if key not in cache:
            draft.truncate(0, 0)
            preds: list[int] = []
            for i in range(0, len(text), CHUNK):
                part = text[i:i + CHUNK]
                preds += [int(t) for t in np.argmax(draft.decode(0, part, len(part)), axis=1)]
            cache[key] = preds
            tmp = store.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, store)  # whole or not at all
        out[rid] = cache[key]
    return out


def configure(config: str):
    """(plan, policy maker(seed) or None for the cost policy, its loss budget on) for
    `config`; SystemExit on a bad one."""
    name, _, extra = config.partition(",")
    if extra not in ("", "budget=off"):
        raise SystemExit(f"config {config}: the one option is budget=off")
    budget = extra != "budget=off"
    if name == "lookup":
        return resolve("lookup"), None, budget
    if name in ("default", "model"):
        return resolve("draft", lookup=name == "default"), None, budget
    if name.startswith("k=") and not extra:
        try:
            return resolve("draft", k=int(name[2:])), FixedK, budget
        except ValueError:
            pass
    raise SystemExit(f"config {config}: choose lookup, default, model or k=N (the first three may add ,budget=off)")


def replay_one(rid, prompt, reply, preds, config: str, seed: int, costs: dict) -> dict:
    """One request through the real loop under `config`, priced on `costs`; its stats."""
    plan, fixed, budget = configure(config)
    clock = Clock(host=False)
    with virtual_time(clock), draft_time(clock):
        target = ReplayTarget(list(prompt) + list(reply), costs["target"], clock)
        opened = OpenedDraft(ReplayDraft(target.truth, preds, costs["draft"], costs["feed"], clock), True, target.n_vocab)
        drafter = build_drafter(plan.drafting, target, None if plan.kind is Kind.LOOKUP else opened)
        if fixed:
            policy = fixed()
        elif plan.kind is Kind.LOOKUP:
            policy = CostAware(plan.k, Costs(costs["target"]), seed=seed)
        else:
            policy = CostAware(plan.k, Costs(costs["target"], costs["draft"][1], costs["feed"],
                                             draft_verify_s=costs["draft"]), Priors(model=DRAFT_MODEL_PRIOR), seed=seed)
        if not fixed:
            policy.loss_budget = budget
        gen = Generation(target, prompt, drafter, draft_max=plan.k, max_tokens=len(reply),
                         params=SamplingParams(ignore_eos=True), policy=policy)
        for _ in gen:
            pass
    assert gen.tokens == list(reply), f"{rid}: the replay left plain's tokens"
    st = gen.stats
    return {"ratio": (st.generated - 1) / st.decode_s * costs["target"][1], "k_hist": st.k_chosen,
            "model_rounds": st.rounds - st.k_chosen.get(0, 0)}


def options(ap) -> None:
    pair_options(ap, ["lookup", "default", "model", "k=3"])
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the cost policy's draws (the mean reported)")


def run(args) -> None:
    from real_pair import models

    if args.n < 2 or args.seeds < 1:
        raise SystemExit("replay: -n must be at least 2 and --seeds at least 1")
    for c in args.configs:
        configure(c)  # a bad config fails before any model loads
    pinned = load_curve(args.curve, 17) if args.curve else None
    try:
        requests = [(Path(s).stem if s else "bundled", r) for s in args.requests or SETS for r in load_requests(s)]
    except SpecgenError as err:
        raise SystemExit(f"replay: {err}") from None
    target_path, draft_path = models(args.f16)
    store = recordings()
    with Engine(Path(target_path), n_ctx=4096, n_threads=args.threads) as e:
        curve = pinned or cost_profile(e)["verify_s"]
        if args.save_curve:
            save_curve(args.save_curve, curve)
        texts = record(e, requests, args.n, store / f"lookup-{Path(target_path).stem}-{args.threads}t-{args.n}.json")
        if args.rewrite:
            texts += record_rewrite(e, curve, store / f"rewrite-{Path(target_path).stem}-{args.threads}t.json")[:1]
    with Engine(Path(draft_path), n_ctx=4096, n_threads=args.threads) as d:
        dprof = cost_profile(d)
        preds = record_preds(d, texts, store / f"model-{Path(draft_path).stem}-on-{Path(target_path).stem}.json")
    costs = {"target": curve, "draft": dprof["verify_s"], "feed": dprof["feed_s"]}
    seeds = {c: range(1 if c.split(",")[0] == "lookup" or c.startswith("k=") else args.seeds) for c in args.configs}
    width = {c: max(12, len(c) + 2) for c in args.configs}
    print(f"{'request':<28}" + "".join(f"{c:>{width[c]}}" for c in args.configs))
    ratios: dict[str, list[float]] = {c: [] for c in args.configs}
    for rid, prompt, reply in texts:
        row = f"{rid:<28}"
        for c in args.configs:
            x = statistics.fmean(replay_one(rid, prompt, reply, preds[rid], c, s, costs)["ratio"] for s in seeds[c])
            ratios[c].append(x)
            row += f"{x:>{width[c] - 1}.3f}x"
        print(row)
    chat = slice(0, len(texts) - args.rewrite)
    for label, fn in (("geomean", lambda xs: math.exp(statistics.fmean(map(math.log, xs)))), ("lowest", min)):
        print(f"{label + ' (chat)':<28}" + "".join(f"{fn(ratios[c][chat]):>{width[c] - 1}.3f}x" for c in args.configs))
    print(f"decode speed over plain's, priced on {Path(target_path).name}'s "
          f"{'verify curve from ' + str(args.curve) if args.curve else 'cached verify curve'} ({args.threads} threads; "
          f"4 rows {curve[4] / curve[1]:.2f}x one) and {Path(draft_path).name}'s (a step {dprof['verify_s'][1] / curve[1]:.2f}x "
          f"a target row); the cost policy's mean over {args.seeds} seeds")
