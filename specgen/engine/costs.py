"""The machine's costs: a target pass with n logit rows, and one draft step.

Cached as JSON per model file, thread count and backend under the specgen
cache, so every command starts from them. On a CPU each extra verified row
costs most of an LM-head pass, which is what makes long drafts lose; on a GPU
the curve is nearly flat.

Nothing blocks the first token (docs/performance.md, "Cost profiles"): a model
never seen gets a short probe (`probe`: a few passes) whose other figures are
filled by the shape of llama.cpp's CPU kernels (`block_curve`) and marked
provisional; the passes each run observes are merged into the cached profile
when its session closes (`learn`): a provisional figure is replaced by what
was observed, a measured one keeps the lower. `specgen tune` measures every
row count (`refresh`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

# A full profile measures every row count: the curve is a sawtooth, not a line. llama.cpp's
# CPU kernels for repacked quantized weights (ggml-cpu/repack.cpp) multiply rows
# in blocks of 4 and the rest one at a time, each at nearly a single row's cost,
# so 5 rows cost far more than 4, and 7 more than 8: interpolating between sparse
# points underpriced real rounds (docs/notes/2026-12-cost-profiles.md).
ROW_POINTS = list(range(1, 33))
# Profiles of another version (interpolated between sparse points) are measured
# again; a merge keeps only their measured figures (`_trusted`).
PROFILE_VERSION = 2


def _key(path: Path, threads: int, gpu_layers: int) -> str:
    st = Path(path).stat()
    ident = f"{Path(path).resolve()}|{st.st_size}|{int(st.st_mtime)}|t{threads}|ngl{gpu_layers}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _time_pass(engine, tokens: list[int], rows: int, base: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        engine.truncate(0, base)
        t = time.perf_counter()
        engine.decode(0, tokens[:rows], rows)
        times.append(time.perf_counter() - t)
    engine.truncate(0, base)
    return min(times)  # the least disturbed pass: other processes only ever add time


def _verify_setup(engine, max_rows: int) -> tuple[list[int], list[int]]:
    """The context a verify pass is timed after (synced into sequence 0), and its rows."""
    prompt = engine.tokenize("Measuring the cost of a verify pass. " * 4)
    engine.sync(0, prompt)
    return prompt, (prompt * (max_rows // len(prompt) + 1))[:max_rows]


def measure_verify(engine, max_rows: int = 32, repeats: int = 5) -> list[float]:
    """verify_s[n] for n = 0 … max_rows (index 0 unused), interpolated between points."""
    prompt, filler = _verify_setup(engine, max_rows)
    base = len(prompt)
    points = [n for n in ROW_POINTS if n <= max_rows]
    _time_pass(engine, filler, points[-1], base, 1)  # warm-up
    # Each figure as measured, even where it falls (7 rows cost more than 8: see
    # ROW_POINTS); other processes only ever add time, so the least of the repeats.
    # The repeats go round the row counts (a burst of load then touches one of a
    # figure's passes, not all), each pass after one of another shape, as in a run.
    times: dict[int, list[float]] = {n: [] for n in points}
    for _ in range(repeats):
        for n in points:
            times[n].append(_time_pass(engine, filler, n, base, 1))
    measured = {n: min(ts) for n, ts in times.items()}
    out = [0.0]
    for n in range(1, max_rows + 1):
        lo = max(p for p in points if p <= n)
        hi = min((p for p in points if p >= n), default=lo)
        if hi == lo:
            out.append(measured[lo])
        else:
            w = (n - lo) / (hi - lo)
            out.append(measured[lo] * (1 - w) + measured[hi] * w)
    engine.truncate(0, 0)
    return out


def measure_feed(engine, tokens: int = 64, repeats: int = 3) -> float:
    """Seconds per token of a bulk feed (prefill) with logits on its last row only:
    what catching a draft model's cache up costs."""
    prompt = engine.tokenize("Measuring the cost of a prompt prefill, token by token. " * 16)
    filler = (prompt * (tokens // len(prompt) + 1))[:tokens]
    engine.truncate(0, 0)
    _time_pass(engine, filler, len(filler), 0, 1)  # warm-up
    times = []
    for _ in range(repeats):
        engine.truncate(0, 0)
        t = time.perf_counter()
        engine.decode(0, filler, 1)
        times.append(time.perf_counter() - t)
    engine.truncate(0, 0)
    return min(times) / len(filler)


_picks: dict[tuple, float] = {}


def pick_cost(n_vocab: int, params) -> float:
    """Host seconds to turn one row of logits into a sampled token (the sampling
    transform to the kept tokens, then a draw, as the loop picks), measured once
    per process per vocabulary and settings, on made-up logits (the least
    disturbed of 5)."""
    from specgen.rules.sampling import sample, support

    key = (n_vocab, params.temperature, params.top_k, params.top_p, params.min_p)
    if key not in _picks:
        rng = np.random.default_rng(0)
        row = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            sample(support(row, params), rng)
            times.append(time.perf_counter() - t)
        _picks[key] = min(times)
    return _picks[key]


# The probe a model never seen gets before its first token: a plain step, k = 1,
# the sawtooth's low point at 4 rows and its jump at 5, and one more block at 8
# (docs/notes/2026-12-cost-profiles.md). Twice each, going round, the lesser
# kept: the fill spreads each figure over many row counts, so one pass a burst of
# load slowed would overprice them all, and an overpriced figure is never chosen,
# so never observed and corrected (docs/notes/2026-12-02-first-run.md). The
# verify setup's prompt prefill, timed in each round too, prices a bulk feed: a
# draft model whose feed is overpriced never pays its first catch-up, so never
# drafts, and its feed is never observed (docs/notes/2026-12-03-probe-feed.md).
PROBE_ROWS = (1, 2, 4, 5, 8)
PROBE_REPEATS = 2
PROBE_PASSES = 1 + PROBE_REPEATS * (1 + len(PROBE_ROWS))  # a warm-up; each round, the prefill and the passes


def block_curve(seen: dict[int, float], max_rows: int = 32) -> list[float]:
    """verify_s[0 … max_rows] from passes of PROBE_ROWS rows (index 0 unused), the
    rest filled by the shape of llama.cpp's CPU kernels for repacked weights:
    rows in blocks of 4 and the remainder one at a time, so n = 4b + r rows
    cost b blocks plus, for a remainder, the jump the 5th row showed (about a
    block: 5 rows cost about what 8 do) and one row's cost for each further
    remainder row. A GPU's flat curve and an unrepacked model's straight line
    come out as measured (their jump is one row's cost)."""
    c1, c2, c4, c5, c8 = (seen[n] for n in PROBE_ROWS)
    block = max(c8 - c4, 0.0)
    jump = max(c5 - c4, 0.0)
    row = max((c4 - c2) / 2, 0.0)
    out = [0.0, c1, c2, (c2 + c4) / 2, c4]
    for n in range(5, max_rows + 1):
        b, r = divmod(n, 4)
        out.append(c4 + (b - 1) * block + (jump + (r - 1) * row if r else 0.0))
    for n, t in seen.items():  # as measured, where measured
        if n <= max_rows:
            out[n] = t
    return out[: max_rows + 1]


def probe(engine, max_rows: int = 32) -> dict:
    """A provisional profile from a few passes (see PROBE_ROWS): the figures not
    measured are listed in `provisional`; the feed, timed on a short prompt
    rather than 64 tokens, is `feed_provisional`. Feeding n tokens costs no
    more than a pass that returns logits for all n, so the feed is at most the
    widest pass's time per row."""
    prompt = engine.tokenize("Measuring the cost of a verify pass. " * 4)
    filler = (prompt * (max(PROBE_ROWS) // len(prompt) + 1))[: max(PROBE_ROWS)]
    engine.truncate(0, 0)
    _time_pass(engine, filler, len(filler), 0, 1)  # warm-up: pages the weights in
    feeds: list[float] = []
    seen: dict[int, float] = {}
    for _ in range(PROBE_REPEATS):
        engine.truncate(0, 0)
        t = time.perf_counter()
        engine.sync(0, prompt)  # the context the passes are timed after (as measure_verify's), fed in bulk
        feeds.append((time.perf_counter() - t) / len(prompt))
        for n in PROBE_ROWS:
            seen[n] = min(seen.get(n, float("inf")), _time_pass(engine, filler, n, len(prompt), 1))
    engine.truncate(0, 0)
    widest = max(PROBE_ROWS)
    feed_s = min(min(feeds), seen[widest] / widest)
    return {"model": str(engine.path), "threads": engine.n_threads, "version": PROFILE_VERSION,
            "verify_s": block_curve(seen, max_rows), "feed_s": feed_s, "measured_at": time.time(),
            "provisional": [n for n in range(1, max_rows + 1) if n not in seen], "feed_provisional": True}


_checked: set[Path] = set()  # profiles spot-checked by this process

SPOT_ROWS = (1, 4)  # a plain step and a short draft's verify pass
# A pass now under this fraction of its profile's figure shows the profile was
# inflated (taken while other processes held the CPU), so it is probed again and
# merged, figure by figure, with the lower (docs/notes/2026-12-cost-profiles.md).
INFLATED = 0.85


def spot_check(engine, repeats: int = 3) -> dict[int, float]:
    """Seconds of a pass of each of SPOT_ROWS rows now (after a warm-up pass), the
    least disturbed of `repeats` each."""
    prompt, filler = _verify_setup(engine, max(SPOT_ROWS))  # as the profile measured them
    _time_pass(engine, filler, 1, len(prompt), 1)  # warm-up: pages the weights in
    out = {n: _time_pass(engine, filler, n, len(prompt), repeats) for n in SPOT_ROWS}
    engine.truncate(0, 0)
    return out


def _inflated(engine, f: Path, prof: dict) -> bool:
    """Was this cached profile measured while other processes held the CPU? Once
    per process, time a pass of 1 row and one of a few now: either clearly
    faster than the profile says means the profile was taken on a busy machine
    (other processes only ever add time). Slower passes now keep it: being busy
    now says nothing against a profile taken while quiet."""
    if f in _checked:
        return False
    _checked.add(f)
    curve = prof["verify_s"]
    now = spot_check(engine)
    return any(t < INFLATED * curve[n] for n, t in now.items() if n < len(curve))


def _trusted(prof: dict, n: int) -> bool:
    """Is figure n of a cached profile a measurement (never below the truth)? All
    but its provisional ones in this version's; in a sparse one (no version) only
    the rows it measured whose non-decreasing clamp cannot have lowered them: 1-4
    and the multiples of 4 (the sawtooth's low points)."""
    if prof.get("version") == PROFILE_VERSION:
        return n not in _provisional(prof)
    return n <= 4 or n % 4 == 0


def _provisional(prof: dict) -> set[int]:
    return {int(n) for n in prof.get("provisional", ())}


def _pick(old: float | None, new: float, new_measured: bool) -> tuple[float, bool]:
    """One figure of a merge: (value, measured). A measured old figure is the truth
    plus what other processes added, so the lower of it and the new one is kept
    (measured if it is the old, or the new was measured too); without one, the new."""
    if old is None:
        return new, new_measured
    if new_measured or old <= new:
        return min(old, new), True
    return new, False


def _merge(old: dict | None, new: dict) -> dict:
    """A retaken or probed profile never worse than the cached one it replaces:
    each figure the lower of the two where the old one's is a measurement
    (`_trusted`: an old sparse profile's in-between figures were interpolated
    too low, and a provisional figure is no measurement), else the new one."""
    try:
        if len(old["verify_s"]) != len(new["verify_s"]) or new.get("version") != PROFILE_VERSION:
            return new
        prov = _provisional(new)
        curve, still = [0.0], []
        for n in range(1, len(new["verify_s"])):
            a = float(old["verify_s"][n]) if _trusted(old, n) else None
            v, measured = _pick(a, new["verify_s"][n], n not in prov)
            curve.append(v)
            if not measured:
                still.append(n)
        old_feed = float(old["feed_s"]) if "feed_s" in old and not old.get("feed_provisional") else None
        feed, feed_measured = _pick(old_feed, new["feed_s"], not new.get("feed_provisional"))
    except (TypeError, KeyError, ValueError, AttributeError, IndexError):  # no old profile, or not one to trust
        return new
    out = {**new, "verify_s": curve, "feed_s": feed, "provisional": still, "feed_provisional": not feed_measured}
    return _tidy(_refill(out))


def _refill(prof: dict) -> dict:
    """Its provisional figures filled again from its figures at PROBE_ROWS as they
    stand now (lowered since the probe by observed passes or a second probe), so a
    probed figure a burst of load inflated stops inflating the row counts filled
    from it once it is corrected."""
    curve, prov = prof["verify_s"], _provisional(prof)
    if not prov or any(n in prov or n >= len(curve) for n in PROBE_ROWS):
        return prof
    fill = block_curve({n: float(curve[n]) for n in PROBE_ROWS}, len(curve) - 1)
    return {**prof, "verify_s": [fill[n] if n in prov else curve[n] for n in range(len(curve))]}


def _tidy(prof: dict) -> dict:
    """A profile with nothing provisional left is today's full profile, marks and all."""
    if not prof.get("provisional"):
        prof.pop("provisional", None)
    if not prof.get("feed_provisional"):
        prof.pop("feed_provisional", None)
    return prof


# Observed bulk feeds of at least this many tokens price the bulk rate per token
# (fewer cost more each: a pass's fixed cost is shared by fewer tokens).
FEED_MIN_TOKENS = 32


def merge_seen(prof: dict, seen) -> dict:
    """`prof` with what a run observed (`specgen.policy.estimates.Observed`: the least
    disturbed pass per row count, each bulk feed by its length): a provisional
    figure becomes the observation, now measured; a measured one keeps the lower
    (each is the truth plus what other processes added)."""
    curve, prov = list(prof["verify_s"]), _provisional(prof)
    for n, t in seen.verify.items():
        if 1 <= n < len(curve) and t > 0:
            curve[n] = t if n in prov else min(float(curve[n]), t)
            prov.discard(n)
    out = {**prof, "verify_s": curve, "provisional": sorted(prov)}
    bulk = [t / n for n, t in seen.feed.items() if n >= FEED_MIN_TOKENS and t > 0]
    if bulk:
        out["feed_s"] = min(bulk) if prof.get("feed_provisional") else min(float(prof["feed_s"]), *bulk)
        out["feed_provisional"] = False
    return _tidy(_refill(out))


def with_seen(prof: dict, seen) -> dict:
    """`prof` as a session's next policy starts from it: its provisional figures that
    the session's passes have observed taken from them (the least disturbed), so a
    first run's later generations start from what its earlier ones saw; measured
    figures stay as they are until the session closes (`learn`)."""
    prov = _provisional(prof)
    hit = {n: t for n, t in seen.verify.items() if n in prov and n < len(prof["verify_s"])}
    if not hit:
        return prof
    curve = [hit.get(n, t) for n, t in enumerate(prof["verify_s"])]
    return _tidy({**prof, "verify_s": curve, "provisional": sorted(prov - set(hit))})


# -- the cache file: one per model file, threads and GPU layers; read-modify-write
# -- under a lock, written whole (tmp + os.replace), so concurrent processes merge
# -- their figures rather than lose them, and a reader never sees half a file.

def profile_file(engine, cache: Path | None = None) -> Path:
    from specgen.models.cache import cache_dir

    cache = cache or cache_dir() / "costs"
    return cache / f"{_key(engine.path, engine.n_threads, getattr(engine, 'n_gpu_layers', 0))}.json"


def stored_profile(path: Path, threads: int, gpu_layers: int = 0, cache: Path | None = None) -> dict | None:
    """The cached profile of the model file at `path` (as an engine of `threads` threads and
    `gpu_layers` offloaded layers would find it), without opening the model; None when
    none is cached (or it cannot be read)."""
    from specgen.models.cache import cache_root

    try:
        f = (cache or cache_root() / "costs") / f"{_key(path, threads, gpu_layers)}.json"
    except OSError:
        return None
    prof = _read(f)
    return prof if _current(prof) else None


@contextmanager
def _locked(f: Path) -> Iterator[None]:
    f.parent.mkdir(parents=True, exist_ok=True)
    with open(f.with_suffix(".lock"), "a") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except (ImportError, OSError):  # no advisory locks here: writes stay atomic, a merge may be lost
            pass
        yield


def _read(f: Path) -> dict | None:
    """The cached profile at `f`; None when absent, damaged or not a profile (measured again)."""
    try:
        prof = json.loads(f.read_text())
        if not isinstance(prof, dict) or not isinstance(prof.get("verify_s"), list):
            return None
        [float(x) for x in prof["verify_s"]]
        _provisional(prof)
        return prof
    except (OSError, ValueError, TypeError):
        return None


def _current(prof: dict | None) -> bool:
    """A profile of this version, with every figure the policy reads."""
    try:
        return (prof is not None and prof.get("version") == PROFILE_VERSION and len(prof["verify_s"]) > 1
                and float(prof["feed_s"]) >= 0)
    except (KeyError, TypeError, ValueError):
        return False


def _write(f: Path, prof: dict) -> None:
    tmp = f.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(prof))
    os.replace(tmp, f)


def _name(engine) -> str:
    return Path(engine.path).name


def cost_profile(engine, *, cache: Path | None = None, refresh: bool = False,
                 note: Callable[[str], None] | None = None) -> dict:
    """The engine's verify curve and bulk-feed cost: from the cache when taken
    before (spot-checked once per process), else probed (provisional figures
    marked), or measured in full (`refresh`: what `specgen tune` does).
    `note`: told one line before a pass is timed (default: specgen.notes)."""
    from specgen import notes

    note = note or notes.note
    f = profile_file(engine, cache)
    old = None if refresh else _read(f)
    if _current(old) and not _inflated(engine, f, old):
        return old
    if refresh:
        note(f"measuring {_name(engine)}'s costs on this machine: every row count 1-32, 5 times each")
        prof = {"model": str(engine.path), "threads": engine.n_threads, "version": PROFILE_VERSION,
                "verify_s": measure_verify(engine), "feed_s": measure_feed(engine), "measured_at": time.time()}
    else:
        why = ("first use" if old is None else "its cached costs were taken on a busier machine" if _current(old)
               else "its cached costs are of an older format")
        note(f"timing {_name(engine)} on this machine ({why}: {PROBE_PASSES} passes; "
             "the rest is learned as it runs)")
        prof = probe(engine)
    _checked.add(f)
    with _locked(f):
        # a refresh does not merge: it may follow a change of machine; a probe merges
        # with what is cached now (another process may have written since)
        prof = prof if refresh else _merge(_read(f), prof)
        _write(f, prof)
    return prof


def learn(engine, seen, *, cache: Path | None = None) -> dict | None:
    """Merge what a run observed on `engine` (`merge_seen`) into its cached profile;
    the profile now, or None when there is none to merge into (nothing is
    written then). Never raises: a run's end is no place to fail."""
    from specgen.errors import SpecgenError

    if not (seen.verify or seen.feed):
        return None
    try:
        f = profile_file(engine, cache)
        with _locked(f):
            prof = _read(f)
            if not _current(prof):
                return None
            merged = merge_seen(prof, seen)
            if merged != prof:
                _write(f, merged)
            return merged
    except (OSError, ValueError, TypeError, KeyError, SpecgenError):
        return None
