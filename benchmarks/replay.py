"""Drafting replayed on priced costs: the real loop, no timing noise.

Greedy decoding (and, for point-mass drafts, one seeded sampled run) makes a
round's outcome a function of the context and the draft, so recorded text
can be replayed through specgen's own loop (`Generation`, `plan_step`, the
drafters, the cost policy) on a stand-in target whose rows follow it, each
pass priced on a verify curve instead of timed. Three modes:

  suffix     model-free drafting (prompt lookup, the suffix index, draft trees)
             on `benchmarks/suffix.py`'s records, with its hindsight ceilings
  policy     draft-length policies against recorded greedy drafts of a draft
             model (the F32 target with its Q4_0 draft)
  translate  translated drafts (SmolLM2 drafting for Gemma through text) on
             recorded sampled runs

    python benchmarks/replay.py suffix agent-*.json --configs lookup current --no-host
    python benchmarks/replay.py policy --n 96 --seeds 8
    python benchmarks/replay.py translate --f32 --seeds 1,2 --n 48,96 --configs plain,alone,default

`python benchmarks/replay.py MODE --help` describes each. Recordings of the
policy and translate modes are cached next to the cost profiles
(~/.cache/specgen/replay, or $SPECGEN_CACHE/replay).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this checkout's specgen (and benchmarks/), never an installed copy

SUFFIX_DOC = """Model-free drafting replayed on measured costs, and its hindsight ceiling.

Greedy decoding makes a round's outcome a pure function of the context and
the draft: the target emits plain greedy's next tokens. So, given plain's
tokens of every request (kept in `benchmarks/suffix.py`'s records), the real
loop (`Generation`, `plan_step`, the drafter, the cost policy) is replayed on
a stand-in target whose rows follow them, on a virtual clock: each target
pass costs what the quiet machine's verify curve says for its rows (the
cached cost profile), everything else (drafting, the policy, bookkeeping) its
CPU time (so a loaded machine does not inflate it). Requests go in the workload's order through one drafter per
config, so a global index holds requests 0 … i-1 when request i runs.

Two ceilings beside the replayed configs (no drafter can beat them):
- `oracle`: at every position the longest continuation of plain's text that
  occurs anywhere before it (prompt and output so far, an overlapping copy
  included, and every earlier request's prompt + output), drafted exactly
  that long and sized by dynamic programming on the verify curve (k <= k_max);
- `oracle-local`: the same without earlier requests.

And two ceilings on the drafter's choice of continuation alone (what it copies,
not how long), each sized by the real cost policy: `CONFIG:pick=oracle` drafts
the longest continuation available anywhere (as `oracle`) under the drafter's
key (`CONFIG:pick=keyM`: only at occurrences that share the context's last M
tokens, the bound of any rule that copies what followed a match of M tokens,
whichever occurrence it picks); `CONFIG:pick=pool` the best of the
continuations the drafter's own indexes offer (`pool_candidates`: latest, most
frequent, each next token's latest, at every match length), the bound of any
rule that chooses among them.

`CONFIG@wW` replays the tree loop (`TreeGeneration`, draft trees of up to W
branches): a node on plain's path holds plain's next token in its row, any
other is never reached; a pass is priced by its rows as a chain's.

Each replayed or ceiling figure is a ratio to plain priced the same way
(verify(1) a token); `vs llama best` multiplies it by the measured ratio of
plain to llama.cpp's best type for that request, in the same run as the records:

    python benchmarks/replay.py suffix agent-*.json [--configs current ...]

What it leaves out: near-ties where a batched verify row picks another token
than plain's single row (the real run then follows a slightly different
text), and the machine's noise (the reason to replay).
"""
POLICY_DOC = """Replay draft-length policies against recorded greedy drafts, on measured costs.

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
TRANSLATE_DOC = """Translated drafts (SmolLM2 drafting for Gemma through text) replayed on measured costs, sampled.

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


# == the virtual clock and the stand-in target (every mode) =======================

class Clock:
    """time.perf_counter for specgen.decode.generation: this process's CPU time (the host's work,
    blind to other processes on a shared CPU) plus the virtual target passes. host=False:
    the target passes alone, so a replay is the same to the last digit run after run
    (CPU time still moves with the machine's load by ~1 %, enough to blur a small change)."""

    def __init__(self, host: bool = True) -> None:
        self.offset = 0.0
        self.host = host

    def perf_counter(self) -> float:
        return (time.process_time() if self.host else 0.0) + self.offset


class _Row:
    __slots__ = ("tok",)

    def __init__(self, tok: int) -> None:
        self.tok = tok

    def argmax(self) -> int:
        return self.tok


class ReplayTarget:
    """A stand-in for the target engine whose greedy rows are plain's tokens: the
    row after context position p holds truth[p + 1]. Each decode advances the
    clock by the verify curve's cost of its logit rows."""

    def __init__(self, truth: list[int], curve, clock: Clock, n_ctx: int = 4096) -> None:
        from specgen.policy.base import verify_cost

        self.truth, self.curve, self.clock, self._cost = truth, curve, clock, verify_cost
        self.n_ctx, self.n_vocab, self.n_batch = n_ctx, 262144, 4096
        self.kv: list[int] = []
        self.trace: list[tuple] = []  # per verify pass: (context position, k, accepted, offered, key)
        self.offer: tuple[int, int] = (0, 0)  # the drafter's last proposal: (length, key)

    def is_eog(self, tok: int) -> bool:  # noqa: ARG002 - end of generation is ignored
        return False

    def kv_tokens(self, seq: int = 0) -> list[int]:  # noqa: ARG002
        return list(self.kv)

    def truncate(self, seq: int, n: int) -> None:  # noqa: ARG002
        del self.kv[n:]

    def decode(self, seq: int, tokens, n_logits: int = 1):  # noqa: ARG002
        base = len(self.kv)
        self.kv.extend(tokens)
        first = base + len(tokens) - n_logits
        if n_logits == len(tokens) and base:  # a verify pass: [last, d1 … dk]
            k, truth = len(tokens) - 1, self.truth
            acc = next((j for j in range(k) if tokens[1 + j] != truth[base + 1 + j]), k)
            self.trace.append((base + 1, k, acc, *self.offer))
        self.clock.offset += self._cost(self.curve, max(n_logits, 1))
        return [_Row(self.truth[p + 1]) for p in range(first, first + n_logits)]

    def sync(self, seq: int, tokens):
        self.kv = []
        return self.decode(seq, tokens, 1)[0]

    # draft trees (`TreeGeneration`): a node's row holds plain's next token when its path
    # from the root is plain's text; any other node is never reached (row -1)
    kv_unified, n_seq_max = True, 64

    def decode_tree(self, seq: int, scratch, last: int, tokens, parents):
        base = len(self.kv)

        def truth(i: int) -> int:  # past plain's end: no token
            return self.truth[i] if i < len(self.truth) else -1

        self.kv.append(last)
        depth, on = [], []  # each node's depth, and whether its path is plain's text
        for t, par in zip(tokens, parents):
            depth.append(1 if par < 0 else depth[par] + 1)
            on.append((par < 0 or on[par]) and t == truth(base + depth[-1]))
        rows = [_Row(truth(base + 1))] + [_Row(truth(base + 1 + d) if o else -1) for d, o in zip(depth, on)]
        has_child = set(parents)
        leaves = [i for i in range(len(tokens)) if i not in has_child]
        ids = [seq, *scratch][: max(len(leaves), 1)]
        self._paths = {ids[j]: [tokens[node] for node in _path(parents, leaf)] for j, leaf in enumerate(leaves)}
        acc = max((d for d, o in zip(depth, on) if o), default=0)
        self.trace.append((base + 1, len(tokens), acc, *self.offer))
        self.clock.offset += self._cost(self.curve, len(tokens) + 1)
        return rows, ids

    def keep_path(self, seq: int, scratch, via: int, root: int, n_accepted: int) -> None:  # noqa: ARG002
        self.kv = self.kv[: root + 1] + self._paths[via][:n_accepted]


def _path(parents, node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@contextmanager
def virtual_time(clock: Clock):
    """specgen's loops (the chain and the tree one) read `clock` as their time.perf_counter."""
    import specgen.decode.generation as decoding
    import specgen.decode.tree as treedecode

    real = decoding.time
    decoding.time = treedecode.time = clock
    try:
        yield clock
    finally:
        decoding.time = treedecode.time = real


def bundled_subset(per_category: int, categories: set[str] | None = None):
    """The first `per_category` requests of each category of the bundled set (raw-text ones),
    in the set's order; `categories`: only those (None or empty: all)."""
    from specgen.bench import load_requests

    out, count = [], {}
    for r in load_requests(None):
        if r.prompt and (not categories or r.category in categories) and count.get(r.category, 0) < per_category:
            count[r.category] = count.get(r.category, 0) + 1
            out.append(r)
    return out


def target_path(f32: bool) -> Path:
    """The embedded Gemma 3 270M, or (f32) its all-F32 copy (made once, in specgen's cache)."""
    from policy import f32_target

    from specgen.models.registry import resolve_model

    return f32_target() if f32 else resolve_model(None)


DEPTH = 8  # a draft model's drafts recorded per position (its ceiling with lookup alongside, as in the loader)
OFFER_MAX = 16  # lookup's offers alongside a draft model reach lookup's own ceiling
DRAFT = "smollm2-135m"  # the translated draft (another vocabulary than the Gemma target's)


# == suffix: model-free drafting on benchmarks/suffix.py's records ==================

def accepted(draft, truth) -> int:
    """How many of draft's tokens plain's text accepts (truth: plain's tokens from there)."""
    return next((j for j, t in enumerate(draft) if j >= len(truth) or t != truth[j]), len(draft))


def replay(requests, drafter, k_max: int, curve, make_policy, hindsight: bool = False, pick: str = "",
           lengths: dict | None = None, host: bool = True, tree_width: int = 0) -> list[dict]:
    """Each request through the real loop in order (one drafter across them).
    hindsight: every proposal is cut to the part plain's text accepts and drafted
    whole (a fixed k): the drafter's proposals under a perfect draft length.
    pick: a ceiling on the drafter's choice of continuation, sized by the real policy:
    `oracle`, every proposal replaced by the longest continuation available anywhere
    (lengths[rid]: per output position, as `longest_continuations`), under the
    drafter's key; `pool`, by the best of the index's own candidates (`pool_candidates`).
    host=False: the host's work costs nothing (see Clock). tree_width: draft trees of up
    to that many branches (`TreeGeneration`; 0: the chain loop), a pass priced by its rows."""
    from specgen.decode.generation import Generation
    from specgen.decode.tree import TreeGeneration

    out = []
    with virtual_time(Clock(host)) as clock:
        for rid, prompt, plain in requests:
            target = ReplayTarget(list(prompt) + list(plain), curve, clock)

            def propose(wants, _propose=type(drafter).propose, _t=target, _n=len(prompt), _rid=rid):
                drafts = _propose(drafter, wants)
                for w, d in zip(wants, drafts) if pick else ():
                    truth = _t.truth[len(w.context):len(w.context) + w.k]
                    if pick == "oracle":
                        at = len(w.context) - _n
                        d.tokens = truth[: lengths[_rid][at]] if at < len(lengths[_rid]) else []
                    else:
                        best = max(pool_candidates(drafter, w.seq, w.k), key=lambda c: accepted(c, truth), default=[])
                        if accepted(best, truth) > accepted(d.tokens, truth):
                            d.tokens = best
                    d.counts = ()
                if hindsight:
                    for w, d in zip(wants, drafts):
                        truth = _t.truth[len(w.context):]
                        d.tokens = d.tokens[: next((j for j, t in enumerate(d.tokens) if j >= len(truth) or t != truth[j]),
                                                   len(d.tokens))]
                _t.offer = (len(drafts[0].tokens), drafts[0].key) if drafts else (0, 0)
                return drafts
            drafter.propose = propose
            tree = {"tree_width": tree_width} if tree_width else {}
            gen = (TreeGeneration if tree else Generation)(
                target, prompt, drafter, draft_max=k_max, max_tokens=len(plain), ignore_eos=True,
                policy=None if hindsight else make_policy(), **tree)
            rounds = iter(gen)
            next(rounds)
            for _ in rounds:
                pass
            st = gen.stats
            assert gen.tokens == list(plain), f"{rid}: the replay left plain's tokens"
            out.append({"rid": rid, "tokens_per_s": (st.generated - 1) / st.decode_s, "rounds": st.rounds,
                        "drafted": st.drafted, "accepted": st.accepted, "draft_s": st.draft_s,
                        "k_hist": dict(sorted(st.k_chosen.items())), "trace": target.trace})
    return out


def pool_candidates(drafter, seq: int, k: int) -> list[list[int]]:
    """Every continuation a SuffixDrafter's indexes offer for its sequence's context
    now: at the match of each index (local, and global from min_global_match) and
    at every shorter match down its suffix links, what followed the latest
    occurrence, the most frequent path, and the latest occurrence of each next
    token seen. The best of them is the ceiling of any rule choosing among them."""
    st = drafter._seqs.get(seq)
    if st is None:
        return []
    out = []
    sam = st.sam
    n = len(sam.tokens)
    if sam.match:  # the local index: an end at n - 1 is the context itself, not an earlier occurrence
        out += _chain(sam, sam.match, k, 1, n - 1, sam.match_end)
    m = st.matcher
    if m is not None and m.state and m.length >= drafter.min_global_match:
        g = drafter.global_index.sam
        out += _chain(g, m.state, k, drafter.min_global_match, len(g.tokens), None, m.length)
    return [c for c in out if c]


def _chain(sam, v, k, min_len, limit, first_end, length=None):
    out = []
    length = sam.length[v] if length is None else length
    while v > 0 and min(length, sam.length[v]) >= min_len:
        end = first_end if first_end is not None and not out else sam.last_end[v]
        if end < limit:
            out.append(sam.after(end, k))
        out.append(sam.frequent(v, k))
        out += [[t] + sam.after(sam.last_end[w], k - 1) for t, w in sam.nxt[v].items()
                if t >= 0 and sam.last_end[w] < limit]
        v = sam.link[v]
        length = sam.length[v]
    return out


# -- the hindsight ceiling ------------------------------------------------------

def longest_continuations(text: list[int], start: int, docs: list[list[int]], context: int = 0) -> list[int]:
    """For each position p >= start of text: the length of the longest prefix of
    text[p:] that occurs starting before p in text (overlap allowed, as an LZ77
    copy) or anywhere in one of docs. context: only at occurrences whose `context`
    tokens before them equal the `context` tokens before p (a key that long)."""
    out = []
    n = len(text)
    for p in range(start, n):
        best = 0
        first = text[p]
        key = text[p - context:p] if context else None
        for src, limit in [(text, p)] + [(d, len(d)) for d in docs]:
            m = len(src)
            for q in range(context, limit):
                if src[q] != first or (key is not None and src[q - context:q] != key):
                    continue
                length = 1
                while p + length < n and q + length < m and src[q + length] == text[p + length]:
                    length += 1
                best = max(best, length)
        out.append(best)
    return out


def diagnose(trace, lengths: list[int], n_prompt: int) -> dict:
    """Where a replayed run's rounds left tokens behind, against the hindsight lengths:
    `plain_with_match`: rounds that drafted nothing where >= 4 tokens were there to copy;
    `cut_short`: every draft accepted but the continuation went on (k < length);
    `wrong_copy`: a draft rejected where a longer right continuation existed;
    `wasted_rows`: drafted rows rejected."""
    d = {"rounds": len(trace), "drafting": 0, "mean_k": 0.0, "plain_with_match": 0, "cut_short": 0,
         "wrong_copy": 0, "wasted_rows": 0}
    for pos, k, acc, offered, key in trace:
        length = lengths[pos - n_prompt] if pos - n_prompt < len(lengths) else 0
        d["policy_cut"] = d.get("policy_cut", 0) + (acc == k and k < offered and length > k)
        d["offer_short"] = d.get("offer_short", 0) + (0 < acc == k == offered and length > k)
        if k:
            d["drafting"] += 1
            d["mean_k"] += k
            d["wasted_rows"] += k - acc
            d["cut_short"] += acc == k and length > k
            d["wrong_copy"] += acc < k and length > acc
        else:
            d["plain_with_match"] += length >= 4
    d["mean_k"] = d["mean_k"] / d["drafting"] if d["drafting"] else 0.0
    return d


def oracle_time(lengths: list[int], curve, k_max: int, round_s: float = 0.0) -> float:
    """Least time to emit tokens 1 … len(lengths) (token 0 is the prefill's): a round at
    token i drafts k <= min(lengths[i], k_max) tokens, all accepted, and emits k + 1."""
    from specgen.policy.base import verify_cost

    n = len(lengths)
    best = [0.0] * (n + 2)
    for i in range(n - 1, 0, -1):
        top = min(lengths[i], k_max, n - 1 - i)
        best[i] = min(verify_cost(curve, k + 1) + (round_s if k else 0.0) + best[i + k + 1] for k in range(top + 1))
    return best[1]


# -- configs ---------------------------------------------------------------------

def config_drafter(name: str):
    """`current`: SuffixDrafter with the global index as `benchmarks/suffix.py`'s
    suffix+global; `local`: without it; `lookup`: prompt lookup. Options after a colon:
    SuffixDrafter's integer arguments (`cut_at_split=0`), `shared=0` (a fresh policy per
    request, not the index's carried statistics), `hindsight=1` (each proposal cut to what
    plain's text accepts and drafted whole: the drafter under a perfect draft length), `sparse=1`
    (the policy priced by the verify curve as profiles did before every row count was
    measured, `suffixlib.runs.sparse_curve`; the rounds are priced by the real curve all the same)."""
    from specgen.drafters.lookup import PromptLookup
    from specgen.drafters.suffix import SuffixDrafter

    base, _, opts = name.partition(":")
    kw = dict(o.split("=") for o in opts.split(",") if o)
    fresh = kw.pop("shared", "1") == "0"  # shared=0: a fresh policy per request (no carried statistics)
    kw.pop("hindsight", None)  # replay's: perfect draft lengths for this drafter's proposals
    kw.pop("pick", None)  # replay's: a ceiling on the choice of continuation
    kw.pop("sparse", None)  # replay's: the policy's curve as profiles priced it before 2026-12-01
    if base == "lookup":
        return PromptLookup()
    if base not in ("current", "local"):
        raise SystemExit(f"unknown config {name}")
    # e.g. cut_at_split=0, choice=frequent
    values = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in kw.items()}
    try:
        d = SuffixDrafter(global_cache=base == "current", **values)
    except (TypeError, ValueError) as err:
        raise SystemExit(f"config {name}: {err}") from None
    if fresh:
        d.policy_stats = None
    return d


def geomean(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def load_records(paths):
    """Merged per-request results of benchmarks/suffix.py runs, per workload (chunks in order);
    llama.cpp's figures over the tokens specgen counts (`suffixlib.llama.same_counts`)."""
    from suffixlib.llama import same_counts

    merged: dict[str, dict] = {}
    meta = None
    for path in paths:
        report = json.loads(Path(path).read_text())
        meta = meta or report
        for w, data in report["workloads"].items():
            same_counts(data["results"], report["n"])  # llama.cpp timed over the tokens specgen counts
            for rid, per in data["results"].items():
                if per.get("plain") and all(per.values()):
                    merged.setdefault(w, {})[rid] = per
    return merged, meta


def suffix_options(ap) -> None:
    ap.add_argument("records", type=Path, nargs="+", help="benchmarks/suffix.py --out files (plain's tokens kept)")
    ap.add_argument("--configs", nargs="+", default=["lookup", "current"])
    ap.add_argument("--k-max", type=int, default=16)
    ap.add_argument("--oracle-k", type=int, default=0, help="the ceiling's k_max (default: --k-max)")
    ap.add_argument("--no-oracle", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write per-request figures here")
    ap.add_argument("--no-host", action="store_true",
                    help="price the target passes only, not the host's CPU time: the same figures on every run")
    ap.add_argument("--costs", type=Path, default=None,
                    help="price the passes on, and start the policies from, this verify curve (a JSON list of "
                         "seconds by row count, index 0 unused, or an object with \"verify\") instead of the "
                         "records' model's cached cost profile")


def read_curve(path: Path) -> list[float]:
    """A verify curve from a file: a JSON list, or an object with "verify" (as --measure-costs writes)."""
    try:
        data = json.loads(path.read_text())
        curve = data["verify"] if isinstance(data, dict) else data
        if len(curve) < 2 or not all(isinstance(x, (int, float)) for x in curve):
            raise ValueError("not a list of seconds")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"replay: --costs {path}: not a verify curve ({e})") from None
    return [float(x) for x in curve]


def run_suffix(args) -> None:
    from suffixlib.runs import sparse_curve
    from workloads import agent_example_requests, agent_requests, bundled_requests

    from specgen.engine.costs import cost_profile
    from specgen.engine.llama import Engine
    from specgen.session import make_policy
    from specgen.policy.cost import CostAware

    given = read_curve(args.costs) if args.costs else None
    merged, meta = load_records(args.records)
    workloads = {"bundled": bundled_requests, "agent": agent_requests, "agent-example": agent_example_requests}
    dump = {}
    # with --costs the model only tokenizes the prompts
    kw = {"vocab_only": True} if given else {"n_ctx": 512, "n_threads": meta["threads"]}
    with Engine(Path(meta["model"]), **kw) as e:
        curve = given or cost_profile(e)["verify_s"]
        for w, results in merged.items():
            texts = dict(workloads[w]())
            order = [rid for rid in texts if rid in results]  # the workload's order
            reqs = [(rid, e.tokenize(texts[rid]), results[rid]["plain"][0]["tokens"]) for rid in order]
            meas = {}
            for rid in order:
                per = results[rid]
                med = {c: statistics.median(r["tokens_per_s"] for r in rs if "tokens_per_s" in r)
                       for c, rs in per.items() if any("tokens_per_s" in r for r in rs)}
                llama = {c: v for c, v in med.items() if c.startswith("llama:")}
                best = max(llama, key=llama.get) if llama else None
                meas[rid] = {"plain": med["plain"], "llama_best": llama.get(best, float("nan")), "llama_type": best,
                             **{c: v for c, v in med.items() if not c.startswith("llama:")}}
            plain_rate = 1.0 / curve[1]
            rows = {rid: {"measured": meas[rid]} for rid in order}
            lens, docs = {}, []  # hindsight: the longest continuation at each output position
            for rid, prompt, plain in reqs:
                text = list(prompt) + list(plain)
                lens[rid] = (longest_continuations(text, len(prompt), docs),
                             longest_continuations(text, len(prompt), []))
                docs.append(text)
            cols = []
            for name in args.configs:
                c, _, width = name.partition("@w")  # NAME@wW: draft trees of width W
                if width and not (width.isdigit() and int(width) >= 1):
                    raise SystemExit(f"unknown tree width in {name} (@wW, W >= 1)")
                drafter = config_drafter(c)
                if width and not hasattr(drafter, "propose_tree"):
                    raise SystemExit(f"{name}: only a suffix config drafts trees")
                shared = getattr(drafter, "policy_stats", None)  # as benchmarks/suffix.py and bench do
                pick = next((o[5:] for o in c.partition(":")[2].split(",") if o.startswith("pick=")), "")
                keyed = pick[3:].isdigit() and pick.startswith("key") and int(pick[3:]) > 0
                if (pick not in ("", "oracle", "pool") and not keyed) or (
                        pick == "pool" and not hasattr(drafter, "global_index")):
                    raise SystemExit(f"unknown pick in {c} (pick=oracle, pick=keyM, or pool for a suffix config)")
                lengths = {rid: ls[0] for rid, ls in lens.items()}
                if keyed:  # the oracle's choice among the occurrences that share the context's last M tokens
                    m, seen, lengths = int(pick[3:]), [], {}
                    for rid, prompt, plain in reqs:
                        text = list(prompt) + list(plain)
                        lengths[rid] = longest_continuations(text, len(prompt), seen, context=m)
                        seen.append(text)
                sparse = "sparse=1" in c.partition(":")[2].split(",")  # priced on `curve` all the same

                def new_policy(shared=shared, sparse=sparse):
                    if sparse:
                        return CostAware(args.k_max, sparse_curve(curve), shared=shared)
                    if given:  # what make_policy builds for a model-free drafter, on the given curve
                        return CostAware(args.k_max, curve, shared=shared)
                    return make_policy("cost", args.k_max, e, shared=shared)
                res = replay(reqs, drafter, args.k_max, curve, new_policy,
                             hindsight="hindsight=1" in c, pick="oracle" if keyed else pick, lengths=lengths,
                             host=not args.no_host, tree_width=int(width or 0))
                for r, (rid, prompt, _) in zip(res, reqs):
                    rows[rid][name] = {**r, "vs_plain": r["tokens_per_s"] / plain_rate,
                                       "diagnosis": diagnose(r.pop("trace"), lens[rid][0], len(prompt))}
                cols.append(name)
            if not args.no_oracle:
                kmax = args.oracle_k or args.k_max
                for rid, prompt, plain in reqs:
                    n = len(plain)
                    for col, ls in zip(("oracle", "oracle-local"), lens[rid]):
                        t = oracle_time(ls, curve, kmax)
                        rows[rid][col] = {"tokens_per_s": (n - 1) / t, "vs_plain": (n - 1) / t / plain_rate}
                cols += ["oracle", "oracle-local"]
            dump[w] = rows
            print_workload(w, order, rows, cols)
    if args.json:
        args.json.write_text(json.dumps(dump, indent=1))


def print_workload(w, order, rows, cols) -> None:
    print(f"\n## {w}: replayed on the verify curve; ratio to plain priced alike, and x (measured plain / llama.cpp best)")
    print("| request | llama best (measured vs plain) | " + " | ".join(f"{c} vs plain | {c} vs llama" for c in cols) + " |")
    print("|---" * (2 + 2 * len(cols)) + "|")
    agg = {c: ([], []) for c in cols}
    for rid in order:
        m = rows[rid]["measured"]
        lb = m["llama_best"] / m["plain"]
        cells = [f"{m['llama_type']} {lb:.2f}"]
        for c in cols:
            v = rows[rid][c]["vs_plain"]
            agg[c][0].append(v)
            agg[c][1].append(v / lb)
            cells += [f"{v:.2f}", f"{v / lb:.2f}"]
        print(f"| {rid} | " + " | ".join(cells) + " |")
    lbs = [rows[r]["measured"]["llama_best"] / rows[r]["measured"]["plain"] for r in order]
    cells = [f"{geomean(lbs):.2f}"]
    for c in cols:
        cells += [f"{geomean(agg[c][0]):.2f}", f"{geomean(agg[c][1]):.2f} (min {min(agg[c][1]):.2f})"]
    print("| geomean | " + " | ".join(cells) + " |")
    for c in cols:
        if "diagnosis" not in rows[order[0]][c]:
            continue
        print(f"\n{c}: per request rounds / drafting / mean k / accepted of drafted / plain rounds with >= 4 to copy / "
              "all accepted but cut short / rejected where a longer copy existed / wasted rows")
        for rid in order:
            r, d = rows[rid][c], rows[rid][c]["diagnosis"]
            print(f"  {rid}: {d['rounds']} / {d['drafting']} / {d['mean_k']:.1f} / {r['accepted']}/{r['drafted']} / "
                  f"{d['plain_with_match']} / {d['cut_short']} (policy {d['policy_cut']}, offer {d['offer_short']}) / "
                  f"{d['wrong_copy']} / {d['wasted_rows']}  k {r['k_hist']}")


# == policy: draft-length policies on recorded greedy drafts =======================

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
    from specgen.policy.base import MODEL_KEY, Situation, unused_offer_outcome, verify_cost

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


def policy_options(ap) -> None:
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--categories")
    ap.add_argument("--requests", type=int, default=4, help="requests per category (the bundled set has 4)")
    ap.add_argument("--seeds", type=int, default=8, help="Thompson seeds of the cost policy (mean reported)")
    ap.add_argument("--threads", type=int, default=2)


def run_policy(args) -> None:
    from policy import models

    from specgen.engine.costs import cost_profile
    from specgen.drafters.lookup import ALONGSIDE_NGRAM_MIN, PromptLookup
    from specgen.engine.llama import Engine
    from specgen.policy.cost import DRAFT_MODEL_PRIOR, CostAware
    from specgen.policy.base import FixedK
    from specgen.models.cache import cache_dir

    class Fixed(FixedK):
        def __init__(self, k: int) -> None:
            super().__init__()
            self.k = k

        def choose(self, key, limit, situation=None):
            return min(self.k, limit)

    base, f32, q4 = models()
    reqs = bundled_subset(args.requests, set(args.categories.split(",")) if args.categories else None)
    store = cache_dir() / "replay"
    store.mkdir(parents=True, exist_ok=True)
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
        return CostAware(OFFER_MAX, c["verify"], c["draft"][1], c["feed"], draft_verify_s=c["draft"], model_prior=prior, seed=s)

    def mean_tps(rec, make, c, lookup=False, seeds=args.seeds):
        return statistics.mean(replay_policy(rec, make(s), args.n, c, PromptLookup(ngram_min=ALONGSIDE_NGRAM_MIN) if lookup else None)["tps"]
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


# == translate: translated drafts on recorded sampled runs ===========================

# -- recording -----------------------------------------------------------------

def record_translated(target, draft, prompt: list[int], n: int, params) -> dict:
    """The target's plain sampled tokens (n + DEPTH), and at every prefix m = 0 … n the
    draft's stream of the text; for m >= 1 its DEPTH-token greedy continuation and
    the translation of its first k tokens for k = 1 … DEPTH."""
    from specgen.decode.generation import Generation
    from specgen.drafters.translated import Stream, TranslatedDraftModel, proposal_text, to_target

    target.truncate(0, 0)
    gen = Generation(target, prompt, None, draft_max=0, max_tokens=n + DEPTH, params=params, ignore_eos=True)
    for _ in gen:
        pass
    traj = list(gen.tokens)
    tr = TranslatedDraftModel(target, draft)
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
    import numpy as np

    from specgen.rules.sampling import probs

    target.truncate(0, 0)
    rows = [np.array(target.sync(0, prompt))]
    rows += list(np.array(target.decode(0, traj[:-1], len(traj) - 1)))
    return [float(probs(row[: target.n_vocab], params).max()) for row in rows]


# -- replay --------------------------------------------------------------------

def _cp(a, b) -> int:
    from specgen.engine.llama import common_prefix

    return common_prefix(a, b)


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


from specgen.drafters.base import Drafter  # noqa: E402


class ReplayDraft(Drafter):
    """The translated draft model, from a recording: proposals and their priced costs."""

    name, free, prefills, translated = "draft", False, True, True

    def __init__(self, rec: dict, n_prompt: int, curve, feed_s: float, clock: Clock) -> None:
        self.rec, self.n_prompt, self.curve, self.feed_s, self.clock = rec, n_prompt, curve, feed_s, clock
        self.cache: list[int] = []  # the draft's KV: its own tokens
        self.seen: list[int] | None = None  # target tokens its stream has seen, with its last proposal
        self.proposals = 0
        self.log: dict[int, int] = {}  # context length of each proposal -> tokens its first pass fed

    def begin(self, seq: int = 0) -> None:
        pass

    def lag(self, seq: int, context) -> int:  # noqa: ARG002
        if self.seen is None:
            return len(context)
        return len(context) - min(_cp(self.seen, context), len(context))

    def _feed_cost(self, rows: int) -> float:
        from specgen.policy.base import verify_cost

        return verify_cost(self.curve, rows) if rows < len(self.curve) else rows * self.feed_s

    def prefill(self, seq: int, context):  # noqa: ARG002
        from specgen.drafters.base import Draft

        ctx = self.rec["ctx"][len(context) - self.n_prompt]
        fed = len(ctx) - min(_cp(self.cache, ctx), len(ctx) - 1)
        d = Draft()
        d.fed, d.fed_s, d.extra_s = fed, self._feed_cost(fed), 0.0
        self.clock.offset += d.fed_s
        self.cache, self.seen = list(ctx), list(context)
        return d

    def propose(self, wants):
        from specgen.drafters.model import NORMAL_FEED
        from specgen.drafters.base import Draft

        out = []
        for w in wants:
            m = len(w.context) - self.n_prompt
            ctx, cont = self.rec["ctx"][m], self.rec["drafts"][m - 1]
            ids = list(self.rec["proposals"][m - 1][w.k - 1])
            fed = len(ctx) - min(_cp(self.cache, ctx), len(ctx) - 1)
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


def parse_config(name: str) -> tuple[str, dict]:
    """`default:old` (the earlier exploration, `explore_near=False`), `default:flat`
    (the prior as under greedy, `top_prior=False`) or `default:NAME=VALUE+NAME=VALUE`
    (arguments of the fresh cost policy, `CostAware(NAME=VALUE)`: a flag, a number)."""
    from specgen.policy.cost import CostAware

    base, _, opts = name.partition(":")
    if opts == "old":
        return base, {"explore_near": False}
    if opts == "flat":
        return base, {"top_prior": False}
    params = inspect.signature(CostAware).parameters
    kw = {}
    for o in (o for o in opts.split("+") if o):
        k, eq, v = o.partition("=")
        default = params[k].default if k in params else None
        if not eq or k in ("seed", "k_max") or type(default) not in (bool, int, float):
            raise SystemExit(f"config {name}: {o!r} is not NAME=VALUE of a cost policy's flag or number")
        try:
            kw[k] = bool(float(v)) if type(default) is bool else type(default)(float(v))
        except ValueError:
            raise SystemExit(f"config {name}: {o!r}: not a number") from None
    return base, kw


def replay_translated(rec, prompt, n, config, costs, engines, pick_s, policy_seed=0) -> dict:
    """One generation of n tokens under `config`; its priced decode speed and k histogram."""
    from specgen.decode.generation import Generation
    from specgen.drafters.lookup import ALONGSIDE_NGRAM_MIN, PromptLookup
    from specgen.drafters.model import WithLookup
    from specgen.session import make_policy
    from specgen.policy.base import FixedK

    base, cost_kw = parse_config(config)
    with virtual_time(Clock()) as clock:
        target = PricedTarget(list(prompt) + rec["target"], costs["verify"], clock, pick_s)
        model = ReplayDraft(rec, len(prompt), costs["draft"], costs["feed"], clock)
        if base == "plain":
            drafter, k, policy = None, 0, FixedK()
        elif base.startswith("k="):
            drafter, k, policy = model, int(base[2:]), FixedK()
        else:
            drafter, k = model, DEPTH
            if base == "default":
                drafter, k = WithLookup(model, PromptLookup(ngram_min=ALONGSIDE_NGRAM_MIN), model_max=DEPTH), OFFER_MAX
            elif base != "alone":
                raise SystemExit(f"unknown config {config}")
            policy = make_policy("cost", k, *engines, seed=policy_seed, **cost_kw)
        policy.sampling(pick_s, draft_picks=False)  # the replay's loop is greedy on the recorded tokens
        gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, ignore_eos=True, policy=policy)
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

def translate_options(ap) -> None:
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


def run_translate(args) -> None:
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

    from specgen.bench.requests import request_tokens
    from specgen.engine.costs import cost_profile, pick_cost
    from specgen.engine.llama import Engine
    from specgen.models.cache import cache_dir
    from specgen.models.registry import resolve_model
    from specgen.rules.sampling import SamplingParams

    tpath = target_path(args.f32)
    ns = [int(x) for x in args.n.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    if "plain" not in configs:
        configs.insert(0, "plain")
    reqs = bundled_subset(args.per_category, {c for c in args.categories.split(",") if c})
    store = cache_dir() / "replay"
    store.mkdir(parents=True, exist_ok=True)
    kw = dict(n_ctx=4096, n_threads=args.threads)
    with Engine(tpath, **kw) as target, Engine(resolve_model(DRAFT), **kw) as draft:
        if args.measure_costs:
            from specgen.engine.costs import measure_feed, measure_verify

            costs = {"verify": measure_verify(target), "draft": measure_verify(draft), "feed": measure_feed(draft)}
            args.measure_costs.write_text(json.dumps(costs))
        elif args.costs:
            costs = cost_files["--costs"]
        else:
            dprof = cost_profile(draft)
            costs = {"verify": cost_profile(target)["verify_s"], "draft": dprof["verify_s"], "feed": dprof["feed_s"]}
        if args.believe:
            import specgen.engine.costs

            b = cost_files["--believe"]
            believed = {id(target): {"verify_s": b["verify"], "feed_s": 0.0},
                        id(draft): {"verify_s": b["draft"], "feed_s": b["feed"]}}
            specgen.engine.costs.cost_profile = lambda engine, **_: believed[id(engine)]  # what make_policy reads
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


# == the command ====================================================================

MODES = {
    "suffix": (SUFFIX_DOC, suffix_options, run_suffix),
    "policy": (POLICY_DOC, policy_options, run_policy),
    "translate": (TRANSLATE_DOC, translate_options, run_translate),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True, metavar="MODE")
    for name, (text, options, _) in MODES.items():
        p = sub.add_parser(name, help=text.strip().splitlines()[0], description=text,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        options(p)
    args = ap.parse_args(argv)
    MODES[args.mode][2](args)


if __name__ == "__main__":
    main()
