"""Model-free drafting replayed on measured costs, and its hindsight ceiling.

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

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from replaylib.common import Clock, ReplayTarget, virtual_time
from suffixlib.llama import same_counts
from suffixlib.runs import sparse_curve, suffix_variant
from workloads import agent_example_requests, agent_requests, bundled_requests

from specgen.decode.generation import Generation
from specgen.decode.tree import TreeGeneration
from specgen.drafters.build import DrafterOptions, build_drafter
from specgen.engine.costs import cost_profile
from specgen.engine.llama import Engine
from specgen.policy.base import verify_cost
from specgen.policy.cost import CostAware, Costs
from specgen.rules.sampling import SamplingParams
from specgen.session import make_policy


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
                target, prompt, drafter, draft_max=k_max, max_tokens=len(plain), params=SamplingParams(ignore_eos=True),
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
    the suffix index's choice, min_match, min_global_match and switches (`cut_at_split=0`,
    `choice=frequent`: `suffixlib.runs.suffix_variant`), `shared=0` (a fresh policy per
    request, not the index's carried statistics), `hindsight=1` (each proposal cut to what
    plain's text accepts and drafted whole: the drafter under a perfect draft length), `sparse=1`
    (the policy priced by the verify curve as profiles did before every row count was
    measured, `suffixlib.runs.sparse_curve`; the rounds are priced by the real curve all the same)."""
    base, _, opts = name.partition(":")
    kw = dict(o.split("=") for o in opts.split(",") if o)
    fresh = kw.pop("shared", "1") == "0"  # shared=0: a fresh policy per request (no carried statistics)
    kw.pop("hindsight", None)  # replay's: perfect draft lengths for this drafter's proposals
    kw.pop("pick", None)  # replay's: a ceiling on the choice of continuation
    kw.pop("sparse", None)  # replay's: the policy's curve as profiles priced it before 2026-12-01
    if base == "lookup":
        return build_drafter(DrafterOptions("lookup"))
    if base not in ("current", "local"):
        raise SystemExit(f"unknown config {name}")
    # e.g. cut_at_split=0, choice=frequent: the options' own fields where they have one
    values = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in kw.items()}
    named = {field: values.pop(arg) for arg, field in (("choice", "suffix_choice"), ("min_match", "ngram_min"))
             if arg in values}
    try:
        d = suffix_variant(DrafterOptions("suffix", global_cache=base == "current", **named), **values)
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


def options(ap) -> None:
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


def run(args) -> None:
    given = read_curve(args.costs) if args.costs else None
    merged, meta = load_records(args.records)
    workloads = {"bundled": bundled_requests, "agent": agent_requests, "agent-example": agent_example_requests}
    dump = {}
    # with --costs the model only tokenizes the prompts
    path = Path(meta["model"])
    with (Engine.vocab(path) if given else Engine(path, n_ctx=512, n_threads=meta["threads"])) as e:
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
                if width and not drafter.trees:
                    raise SystemExit(f"{name}: only a suffix config drafts trees")
                shared = drafter.policy_stats  # as benchmarks/suffix.py and bench do
                pick = next((o[5:] for o in c.partition(":")[2].split(",") if o.startswith("pick=")), "")
                keyed = pick[3:].isdigit() and pick.startswith("key") and int(pick[3:]) > 0
                if (pick not in ("", "oracle", "pool") and not keyed) or (
                        pick == "pool" and drafter.name != "suffix"):
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
                        return CostAware(args.k_max, Costs(sparse_curve(curve)), shared=shared)
                    if given:  # what make_policy builds for a model-free drafter, on the given curve
                        return CostAware(args.k_max, Costs(curve), shared=shared)
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

