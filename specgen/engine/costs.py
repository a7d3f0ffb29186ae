"""The machine's costs: a target pass with n logit rows, and one draft step.

Measured once per model file, thread count and backend, and cached as JSON
under the specgen cache, so every command starts from them without
re-measuring. On a CPU each extra verified row costs most of an LM-head pass,
which is what makes long drafts lose; on a GPU the curve is nearly flat.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

# Every row count is measured: the curve is a sawtooth, not a line. llama.cpp's
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


_checked: set[Path] = set()  # profiles spot-checked by this process

SPOT_ROWS = (1, 4)  # a plain step and a short draft's verify pass
# A pass now under this fraction of its profile's figure shows the profile was
# inflated (taken while other processes held the CPU), so it is retaken; honest
# profiles stay above it on a busy machine (docs/notes/2026-12-cost-profiles.md).
# A retake costs seconds, and never makes a profile worse.
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
    (other processes only ever add time), so it is measured again. Slower
    passes now keep it: being busy now says nothing against a profile taken
    while quiet."""
    if f in _checked:
        return False
    _checked.add(f)
    curve = prof["verify_s"]
    now = spot_check(engine)
    return any(t < INFLATED * curve[n] for n, t in now.items() if n < len(curve))


def _trusted(prof: dict, n: int) -> bool:
    """Is figure n of a cached profile a measurement (never below the truth)? All are
    in this version's; in a sparse one (no version) only the rows it measured whose
    non-decreasing clamp cannot have lowered them: 1-4 and the multiples of 4 (the
    sawtooth's low points)."""
    return prof.get("version") == PROFILE_VERSION or n <= 4 or n % 4 == 0


def _merge(old: dict | None, new: dict) -> dict:
    """A retaken profile never worse than the one it replaces: each figure is the
    lower of the two (each is the truth plus what other processes added), where the
    old one's is a measurement (`_trusted`: an old sparse profile's in-between
    figures were interpolated too low, and are not kept)."""
    try:
        if len(old["verify_s"]) != len(new["verify_s"]) or new.get("version") != PROFILE_VERSION:
            return new
        curve = [min(float(a), b) if _trusted(old, n) else b
                 for n, (a, b) in enumerate(zip(old["verify_s"], new["verify_s"]))]
        feed = min(float(old["feed_s"]), new["feed_s"])
    except (TypeError, KeyError, ValueError, AttributeError):  # no old profile, or not one to trust
        return new
    return {**new, "verify_s": curve, "feed_s": feed}


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


def cost_profile(engine, *, cache: Path | None = None, refresh: bool = False) -> dict:
    """The engine's verify curve and bulk-feed cost, from the cache when measured before."""
    from specgen.models.cache import cache_dir

    cache = cache or cache_dir() / "costs"
    f = cache / f"{_key(engine.path, engine.n_threads, getattr(engine, 'n_gpu_layers', 0))}.json"
    old = None
    if f.exists() and not refresh:
        try:
            old = json.loads(f.read_text())
            # profiles of another version (from before feed_s, or interpolated between
            # sparse row counts), and ones a busy machine inflated, are measured again
            if "feed_s" in old and old.get("version") == PROFILE_VERSION and not _inflated(engine, f, old):
                return old
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            old = None  # a damaged cache entry is measured again
    prof = {"model": str(engine.path), "threads": engine.n_threads, "version": PROFILE_VERSION,
            "verify_s": measure_verify(engine), "feed_s": measure_feed(engine), "measured_at": time.time()}
    # a retake keeps the better figures (a refresh does not: it may follow a change of machine)
    prof = _merge(old, prof)
    _checked.add(f)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(prof))
    os.replace(tmp, f)
    return prof
