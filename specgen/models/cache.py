"""specgen's own cache directory ($SPECGEN_CACHE, else $XDG_CACHE_HOME/specgen or ~/.cache/specgen).

Assembled and wheel-shipped models (specgen.models.packages), cost profiles
(specgen.engine.costs) and the benchmarks' stores live under it. A leaf: it
imports nothing of specgen but the error type, so any layer may ask for it.
"""

from __future__ import annotations

import os
from pathlib import Path

from specgen.errors import SpecgenError


def cache_dir() -> Path:
    """specgen's own cache ($SPECGEN_CACHE, else ~/.cache/specgen), created on first use."""
    d = cache_root()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecgenError(f"cannot create cache directory {d}: {e.strerror or e} (set SPECGEN_CACHE)") from None
    return d


def cache_root() -> Path:
    """Where the cache is, without creating it (for checks that must not write)."""
    env = os.environ.get("SPECGEN_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "specgen"
