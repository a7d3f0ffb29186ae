"""numpy's BLAS held at one thread while prediction heads draft beside llama.cpp."""

from __future__ import annotations

_blas = {"holders": 0, "limits": None}


def hold_one_blas_thread() -> None:
    """While heads draft, numpy's BLAS runs on one thread: its idle threads spin
    beside llama.cpp's after every small matmul of the heads and slow each target
    pass about fourfold on 2 cores (docs/notes/2026-12-03-blas-threads.md). Held
    by every session that loads heads; the last `release_blas()` restores the
    process's own setting. The CLI sets OPENBLAS_NUM_THREADS=1 before numpy loads;
    this covers the Python API, where numpy may be loaded first."""
    if _blas["holders"] == 0:
        from threadpoolctl import threadpool_limits

        _blas["limits"] = threadpool_limits(limits=1, user_api="blas")
    _blas["holders"] += 1


def release_blas() -> None:
    if _blas["holders"] <= 0:
        return
    _blas["holders"] -= 1
    if _blas["holders"] == 0 and _blas["limits"] is not None:
        _blas["limits"].restore_original_limits()
        _blas["limits"] = None
