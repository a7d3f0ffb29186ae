"""The one hook for notes on stderr: what a slow step before the first token is doing.

Layers below the CLI never print. Where a wait may pass a couple of seconds
(timing a model's costs, assembling or opening a large model) they call
`note(line)`, which does nothing unless the command line routed notes to
stderr (`to`, in `specgen.cli.main`): the Python API stays silent.
"""

from __future__ import annotations

from typing import Callable

Sink = Callable[[str], None]

_sink: Sink | None = None


def note(line: str) -> None:
    """One line about what is happening now, to wherever notes go (nowhere by default)."""
    if _sink is not None:
        _sink(line)


def to(sink: Sink | None) -> Sink | None:
    """Send notes to `sink` (None: nowhere); returns where they went before."""
    global _sink
    before, _sink = _sink, sink
    return before
