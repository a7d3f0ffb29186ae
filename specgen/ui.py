"""Terminal rendering for the CLI: streamed text, the live status line, summaries.

stdout carries generated text only; everything else goes to stderr. Colour
(accepted-draft tokens vs the target's own) only when stdout is a terminal and
NO_COLOR is unset.
"""

from __future__ import annotations

import codecs
import os
import shutil
import sys
from typing import TextIO

from rich.console import Console
from rich.table import Table

from specgen.decoding import Round, Stats

DRAFT_COLOUR = "\x1b[36m"  # cyan: tokens the drafter proposed and the target accepted
RESET = "\x1b[0m"


def colour_enabled(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR")


def stderr_console() -> Console:
    return Console(stderr=True, no_color=bool(os.environ.get("NO_COLOR")), highlight=False)


class TextStream:
    """Writes each round's tokens to stdout as UTF-8 text, flushed per round."""

    def __init__(self, engine, out: TextIO | None = None, colour: bool | None = None) -> None:
        self.engine = engine
        self.out = out or sys.stdout
        self.colour = colour_enabled(self.out) if colour is None else colour
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text: list[str] = []

    def _decode(self, tokens) -> str:
        return self._utf8.decode(b"".join(self.engine.piece(t) for t in tokens))

    def write_round(self, r: Round) -> None:
        drafted = self._decode(r.tokens[: r.accepted])
        own = self._decode(r.tokens[r.accepted :])
        self.text += [drafted, own]
        if self.colour and drafted:
            self.out.write(f"{DRAFT_COLOUR}{drafted}{RESET}{own}")
        else:
            self.out.write(drafted + own)
        self.out.flush()

    def finish(self) -> str:
        tail = self._utf8.decode(b"", final=True)
        if tail:
            self.out.write(tail)
        self.text.append(tail)
        self.out.flush()
        return "".join(self.text)


class StatusLine:
    """A live one-line status on stderr, in the terminal's bottom row.

    When text streams to the same terminal, the bottom row is kept out of the
    scrolling region (as apt does), so the status never mixes with the text.
    """

    def __init__(self, err: TextIO | None = None, shared_terminal: bool | None = None) -> None:
        self.err = err or sys.stderr
        self.enabled = self.err.isatty()
        self.shared = sys.stdout.isatty() if shared_terminal is None else shared_terminal
        self.rows = shutil.get_terminal_size().lines
        self.active = False

    def start(self) -> None:
        if not self.enabled or not self.shared:
            return
        # Reserve the bottom row: scroll region 1..rows-1.
        self.err.write(f"\n\x1b7\x1b[1;{self.rows - 1}r\x1b8\x1b[1A")
        self.err.flush()
        self.active = True

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        width = shutil.get_terminal_size().columns
        text = text[: width - 1]
        if self.active:
            self.err.write(f"\x1b7\x1b[{self.rows};1H\x1b[2K{text}\x1b8")
        else:
            self.err.write(f"\r\x1b[2K{text}")
        self.err.flush()

    def stop(self) -> None:
        if not self.enabled:
            return
        if self.active:
            self.err.write(f"\x1b7\x1b[1;{self.rows}r\x1b[{self.rows};1H\x1b[2K\x1b8")
            self.active = False
        else:
            self.err.write("\r\x1b[2K")
        self.err.flush()


def round_status(st: Stats, r: Round, elapsed: float) -> str:
    rate = f"{100 * st.acceptance_rate:.0f}%" if st.drafted else "-"
    tps = st.generated / elapsed if elapsed > 0 else 0.0
    return (
        f"round {st.rounds} | drafted {r.drafted} accepted {r.accepted} | "
        f"acceptance {rate} | mean len {st.mean_accepted_len:.2f} | {tps:.1f} tok/s"
    )


def summary_table(st: Stats, mode: str, draft_max: int, policy: str = "fixed") -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    pos = " ".join(f"{100 * a:.0f}%" for a in st.per_position) or "-"
    rows = [
        ("mode", mode + ("" if mode == "plain" else f" (k = {draft_max})" if policy == "fixed" else f" ({policy} policy, k <= {draft_max})")),
        ("tokens", f"{st.generated} generated, {st.prompt_tokens} prompt ({st.stop_reason or 'running'})"),
        ("time", f"{st.total_s:.2f} s total, {1000 * st.prefill_s:.0f} ms to first token"),
        ("speed", f"{st.tokens_per_s:.1f} tok/s decode"),
        ("rounds", f"{st.rounds}"),
        ("drafted", f"{st.drafted}, accepted {st.accepted} ({100 * st.acceptance_rate:.1f}%)"),
        ("mean accepted length", f"{st.mean_accepted_len:.2f} tokens/round"),
        ("per position", pos),
    ]
    if mode != "plain" and policy != "fixed":
        rows.append(("k chosen", " ".join(f"{k}:{n}" for k, n in sorted(st.k_chosen.items()))))
    for k, v in rows:
        t.add_row(k, v)
    return t
