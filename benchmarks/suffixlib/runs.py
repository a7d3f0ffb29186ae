"""suffix.py's specgen side: its configs (drafters built by build_drafter, or the
experiments' variants of the suffix index, `suffix_variant`; their cost policies), one
timed run, and where a run parts from plain (a near-tie or a bug)."""

from __future__ import annotations

import resource
import time

import llama_cpp
import numpy as np

from specgen.decode.generation import Generation
from specgen.decode.tree import TreeGeneration
from specgen.drafters.automaton import FREQUENT, LATEST
from specgen.drafters.build import DrafterOptions, build_drafter
from specgen.drafters.suffix import SuffixDrafter
from specgen.engine.costs import cost_profile
from specgen.policy.base import verify_cost
from specgen.policy.cost import CostAware, Costs
from specgen.session import make_policy
from specgen.rules.sampling import SamplingParams


# suffix+global:old -- as before draft cuts at varying fields and carried acceptance
# statistics: no `cut_at_split`, a fresh policy per request (before and after, one run).
# suffix+global:counts -- the cost policy reads the index's counts along each draft
# (the SuffixDrafter switch `counts`, turned by `suffix_variant`; `policy.with_counts`)
# suffix+global:sparse -- its cost policy priced by the verify curve as profiles
# were before 2026-12-01: measured at SPARSE_ROWS only, interpolated, made
# non-decreasing (`sparse_curve`; specgen.engine.costs.ROW_POINTS says why that was wrong)
CONFIGS = ("plain", "lookup", "suffix", "suffix+global", "suffix+global:frequent", "suffix+global:old",
           "suffix+global:counts", "suffix+global:sparse")
SPARSE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def sparse_curve(curve):
    """A verify curve (index 0 unused) as a profile of SPARSE_ROWS priced it: those
    row counts as measured, the rest interpolated between them, then clamped to be
    non-decreasing (a point above a later one was taken for a disturbed one)."""
    pts = [n for n in SPARSE_ROWS if n < len(curve)]
    at = {n: curve[n] for n in pts}
    for a, b in reversed(list(zip(pts, pts[1:]))):
        at[a] = min(at[a], at[b])
    out = [0.0]
    for n in range(1, len(curve)):
        lo = max(p for p in pts if p <= n)
        hi = min((p for p in pts if p >= n), default=lo)
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        out.append(at[lo] * (1 - w) + at[hi] * w)
    return out


def make_cost_policy(name: str, k: int, target, shared=None):
    """The cost policy of a config: as the CLI's (`make_policy`), or with `:sparse`
    its verify curve priced as before every row count was measured."""
    if not name.endswith(":sparse"):
        return make_policy("cost", k, target, shared=shared)
    return CostAware(k, Costs(sparse_curve(cost_profile(target)["verify_s"])), shared=shared)


def drafter_options(name: str) -> DrafterOptions | None:
    """What a config drafts with (None: plain)."""
    if name == "plain":
        return None
    if name == "lookup":
        return DrafterOptions("lookup")
    return DrafterOptions("suffix", global_cache="+global" in name,
                          suffix_choice=FREQUENT if name.endswith(":frequent") else LATEST)


def suffix_variant(opts: DrafterOptions, **settings):
    """The suffix index `opts` asks for, built by build_drafter, with the experiments'
    switches (SuffixDrafter.SWITCHES) and `min_global_match` set on this instance."""
    d = build_drafter(opts)
    unknown = set(settings) - {*SuffixDrafter.SWITCHES, "min_global_match"}
    if unknown:
        raise TypeError(f"not a suffix index setting: {', '.join(sorted(unknown))}")
    for name, value in settings.items():
        setattr(d, name, max(int(value), d.min_match) if name == "min_global_match" else bool(value))
    return d


def make_drafter(name: str):
    """A fresh drafter of a config (None: plain); `:old` carries no statistics across requests."""
    opts = drafter_options(name)
    if opts is None:
        return None
    variant = {"cut_at_split": False} if name.endswith(":old") else {"counts": True} if name.endswith(":counts") else {}
    d = suffix_variant(opts, **variant) if opts.kind == "suffix" else build_drafter(opts)
    if name.endswith(":old"):
        d.policy_stats = None
    return d


def run_one(target, prompt, drafter, n, k_max, tree_width=1, name=""):
    k = k_max if drafter is not None else 0
    policy = make_cost_policy(name, k, target, shared=drafter.policy_stats) if k else None
    if tree_width > 1:
        gen = TreeGeneration(target, prompt, drafter, draft_max=k, max_tokens=n, policy=policy,
                             tree_width=tree_width, params=SamplingParams(ignore_eos=True))
    else:
        gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, policy=policy, params=SamplingParams(ignore_eos=True))
    rounds = iter(gen)
    next(rounds)  # the prefill round: decode speed counts what comes after it
    cpu0, c0 = _cpu_s(), _IN_LLAMA[0]
    for _ in rounds:
        pass
    cpu, in_llama = _cpu_s() - cpu0, _IN_LLAMA[0] - c0
    st = gen.stats
    extra = {"tree_rounds": gen.tree_rounds, "tree_accepts": gen.tree_accepts} if tree_width > 1 else {}
    return {**extra, "tokens_per_s": st.tokens_per_s, "tokens_per_s_raw": st.tokens_per_s, "cpu_tokens_per_s": (st.generated - 1) / cpu if cpu > 0 else float("nan"), "generated": st.generated, "rounds": st.rounds,
            "drafted": st.drafted, "accepted": st.accepted, "draft_s": st.draft_s, "decode_s": st.decode_s,
            "python_share": max(st.decode_s - in_llama, 0.0) / st.decode_s if st.decode_s > 0 else float("nan"),
            "prompt_tokens": len(prompt), "k_hist": st.k_hist, "tokens": gen.tokens}


# A near-tie: plain's top-2 margin and the speculative token's gap below plain's best
# both under this many logits, the batch kernels' discrepancy (tests/test_model.py's bound).
TIE_MARGIN = 2.5


class TopRows:
    """Wraps an engine; the top 8 candidates (ids, logits) of every row read, by position."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.at: dict[int, tuple[list[int], list[float]]] = {}

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def _record(self, first_pos, rows) -> None:
        for j, row in enumerate(rows):
            ids = np.argsort(row)[-8:][::-1]
            self.at[first_pos + j] = ([int(t) for t in ids], [float(row[t]) for t in ids])

    def decode(self, seq, tokens, n_logits=1):
        first = len(self.engine.kv_tokens(seq)) + len(tokens) - n_logits
        rows = self.engine.decode(seq, tokens, n_logits)
        self._record(first, rows)
        return rows

    def sync(self, seq, tokens):
        row = self.engine.sync(seq, tokens)
        self._record(len(tokens) - 1, [row])
        return row


def plain_rows(target, prompt, n, plain):
    """Plain greedy again (one row per decode), with the top candidates of each row."""
    rec = TopRows(target)
    gen = Generation(rec, prompt, None, draft_max=0, max_tokens=n, params=SamplingParams(ignore_eos=True))
    for _ in gen:
        pass
    return gen.tokens, [rec.at[len(prompt) - 1 + i] for i in range(len(gen.tokens))]


def _first_difference(a, b):
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def parting(plain, mine, again):
    """Where a speculative output first parts from plain, and the row of plain run
    again (one row per decode) there: the single-row truth for the same context.
    Its top-2 margin, and how far below its best the speculative token sits (None:
    not among its top 8). When plain run again parts from plain itself earlier
    (llama.cpp's sums depend on where the cache put earlier cells), the record
    says so ("plain_again_at") and reads the margin where the two plain runs part."""
    tokens, rows = again
    i = _first_difference(plain, mine)
    j = _first_difference(plain, tokens)
    out = {"at": i}
    if j < i:
        out["plain_again_at"] = j
        i, mine = j, tokens
    if i >= len(rows):
        return {**out, "length_differs": True}
    ids, vals = rows[i]
    gap = vals[0] - vals[ids.index(mine[i])] if mine[i] in ids else None
    margin = vals[0] - vals[1]
    return {**out, "margin": margin, "gap": gap,
            "near_tie": gap is not None and margin < TIE_MARGIN and gap < TIE_MARGIN}


_IN_LLAMA = [0.0]  # seconds inside llama_decode / llama_get_logits (the rest of a round is Python's)


def time_llama() -> None:
    """Wrap llama.cpp's decode and logits calls with a clock: Python time per round is
    the decode time outside them (drafting, acceptance, argmax, bookkeeping)."""
    for name in ("llama_decode", "llama_get_logits"):
        fn = getattr(llama_cpp, name)
        if getattr(fn, "_timed", False):
            continue

        def timed(*a, _fn=fn):
            t = time.perf_counter()
            try:
                return _fn(*a)
            finally:
                _IN_LLAMA[0] += time.perf_counter() - t
        timed._timed = True
        setattr(llama_cpp, name, timed)


def _cpu_s() -> float:
    """CPU seconds of this process, all threads: the work done, much less sensitive than
    wall time to other processes on a shared CPU (a stalled thread's spin still counts)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def modelled_tokens_per_s(r, curve):
    """Decode tok/s had each target pass cost what the quiet machine's verify curve says
    (rounds after the first, k + 1 rows each) plus the measured drafting time: the
    work a config did, priced without the shared CPU's noise."""
    hist = dict(r["k_hist"])
    hist["0"] = hist.get("0", 0) - 1  # the prefill round gave the first token
    t = sum(n * verify_cost(curve, int(k) + 1) for k, n in hist.items()) + r["draft_s"]
    return (r["generated"] - 1) / t if t > 0 else float("nan")


def config_drafter_width(c) -> int:
    return int(c.partition("@w")[2] or 1)


def config_drafter(c):
    """(drafter, tree width) of a specgen config; `NAME@wW` drafts trees of width W."""
    base, _, w = c.partition("@w")
    return make_drafter(base), int(w or 1)

