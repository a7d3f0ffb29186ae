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

ROW_POINTS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]


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


def measure_verify(engine, max_rows: int = 32, repeats: int = 5) -> list[float]:
    """verify_s[n] for n = 0 … max_rows (index 0 unused), interpolated between points."""
    prompt = engine.tokenize("Measuring the cost of a verify pass. " * 4)
    engine.sync(0, prompt)
    base = len(prompt)
    filler = (prompt * (max_rows // len(prompt) + 1))[:max_rows]
    points = [n for n in ROW_POINTS if n <= max_rows]
    _time_pass(engine, filler, points[-1], base, 1)  # warm-up
    measured = {n: _time_pass(engine, filler, n, base, repeats) for n in points}
    # More rows never cost less, and other processes only ever add time: a
    # point above a later (larger) one was disturbed, so it takes that value.
    for a, b in reversed(list(zip(points, points[1:]))):
        measured[a] = min(measured[a], measured[b])
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


def spot_check(engine, repeats: int = 3) -> float:
    """Seconds of one 1-row pass now (after a warm-up pass), the least disturbed of `repeats`."""
    prompt = engine.tokenize("A spot check of the cost of one pass.")
    engine.sync(0, prompt)
    _time_pass(engine, prompt, 1, len(prompt) - 1, 1)  # warm-up: pages the weights in
    t = _time_pass(engine, prompt, 1, len(prompt) - 1, repeats)
    engine.truncate(0, 0)
    return t


def _inflated(engine, f: Path, prof: dict) -> bool:
    """Was this cached profile measured while other processes held the CPU? Once
    per process, time one pass now: clearly faster than the profile says means
    the profile was taken on a busy machine (other processes only ever add
    time), so it is measured again. A slower pass now keeps it: being busy now
    says nothing against a profile taken while quiet."""
    if f in _checked:
        return False
    _checked.add(f)
    cached = prof["verify_s"][1]
    return spot_check(engine) < INFLATED * cached


INFLATED = 0.75  # a pass this much faster than its profile retakes the profile


_picks: dict[tuple, float] = {}


def pick_cost(n_vocab: int, params) -> float:
    """Host seconds to turn one row of logits into a sampled token (the sampling
    transform, then a draw), measured once per process per vocabulary and
    settings, on made-up logits (the least disturbed of 5)."""
    from specgen.sampling import probs, sample

    key = (n_vocab, params.temperature, params.top_k, params.top_p, params.min_p)
    if key not in _picks:
        rng = np.random.default_rng(0)
        row = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            sample(probs(row, params), rng)
            times.append(time.perf_counter() - t)
        _picks[key] = min(times)
    return _picks[key]


def cost_profile(engine, *, cache: Path | None = None, refresh: bool = False) -> dict:
    """The engine's verify curve and bulk-feed cost, from the cache when measured before."""
    from specgen.registry import cache_dir

    cache = cache or cache_dir() / "costs"
    f = cache / f"{_key(engine.path, engine.n_threads, getattr(engine, 'n_gpu_layers', 0))}.json"
    if f.exists() and not refresh:
        try:
            prof = json.loads(f.read_text())
            # profiles from before feed_s, and ones a busy machine inflated, are measured again
            if "feed_s" in prof and not _inflated(engine, f, prof):
                return prof
        except (OSError, ValueError):
            pass  # a damaged cache entry is measured again
    prof = {"model": str(engine.path), "threads": engine.n_threads, "verify_s": measure_verify(engine),
            "feed_s": measure_feed(engine), "measured_at": time.time()}
    _checked.add(f)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(prof))
    os.replace(tmp, f)
    return prof
