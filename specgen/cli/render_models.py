"""What `specgen models --local` and `specgen pair` print: tables on stdout, notes on stderr."""

from __future__ import annotations

import os


def size_text(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def params_text(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n) if n else "-"


def _console():
    from rich.console import Console

    return Console(no_color=bool(os.environ.get("NO_COLOR")), highlight=False)


def _stderr():
    from specgen.cli.render import stderr_console

    return stderr_console()


def print_local(found, verbose: bool) -> None:
    """The local models table (stdout); where was searched and what was left out (stderr)."""
    from rich.table import Table

    t = Table(title="local models")
    for col in ("store", "name", "size", "arch", "params", "vocabulary"):
        t.add_column(col, justify="right" if col in ("size", "params") else "left")
    for m in found.models:
        t.add_row(m.store, m.name, size_text(m.size), m.architecture or "?", params_text(m.n_params),
                  (m.fingerprint or "none")[:12])
    if found.models:
        _console().print(t)
    err = _stderr()
    where = ", ".join(f"{s} {p}" for s, p in found.searched) or "no store found"
    err.print(f"{len(found.models)} GGUF files; searched: {where}", markup=False, soft_wrap=True)
    if found.skipped and not verbose:
        err.print(f"{len(found.skipped)} left out (--verbose says why)", markup=False)
    if verbose:
        for s in found.skipped:
            err.print(f"left out: {s.store} {s.name}: {s.reason}", markup=False, soft_wrap=True)


def print_pairing(p, verbose: bool) -> None:
    """The ranked drafts (stdout), the choice and the left-out ones (stderr)."""
    from rich.table import Table

    t = Table(title=f"drafts for {p.target.name} ({size_text(p.target_size)})")
    for col in ("#", "store", "name", "size", "vocabulary", "predicted"):
        t.add_column(col, justify="right" if col in ("#", "size", "predicted") else "left")
    for i, c in enumerate(p.candidates, 1):
        t.add_row(str(i), c.model.store, c.model.name, f"{size_text(c.model.size)} ({100 * c.size_ratio:.0f}%)",
                  c.vocabulary, "unmeasured" if c.speedup is None else f"{c.speedup:.2f}x")
    if p.candidates:
        _console().print(t)
    err = _stderr()
    chosen = p.chosen
    if chosen is not None:
        err.print(f"chosen: {chosen.model.name} — {chosen.reason()}", markup=False, soft_wrap=True)
    elif p.candidates:
        err.print("chosen: none — measured costs say no local draft would pay (--pair auto uses prompt lookup)",
                  markup=False, soft_wrap=True)
    else:
        err.print(f"no local model can draft for {p.target.name} ({len(p.scan.models)} local models; "
                  "--pair auto uses prompt lookup)", markup=False, soft_wrap=True)
    for basis in dict.fromkeys(c.basis for c in p.candidates):
        err.print(f"predicted: {basis}", markup=False, soft_wrap=True)
    for r in p.rejected if verbose else ():
        err.print(f"not a draft: {r.model.name}: {r.reason}", markup=False, soft_wrap=True)
    if p.rejected and not verbose:
        err.print(f"{len(p.rejected)} other local models are not drafts for it (--verbose says why)", markup=False)
