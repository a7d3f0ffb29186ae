"""Everything the commands show: the one text streamer, the live status line, notes, tables and charts.

stdout carries generated text only; everything else goes to stderr. Colour
(accepted-draft tokens vs the target's own) only when the stream is a
terminal and NO_COLOR is unset.
"""

from __future__ import annotations

import codecs
import os
import shutil
import sys
from typing import TYPE_CHECKING, Callable, Sequence, TextIO

if TYPE_CHECKING:
    from specgen.decode.generation import Generation
    from specgen.decode.stats import Round, Stats

DRAFT_COLOUR = "\x1b[36m"  # cyan: tokens the drafter proposed and the target accepted
RESET = "\x1b[0m"


def colour_enabled(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR")


def stderr_console(width_when_piped: bool = False):
    """A rich console on stderr; `width_when_piped`: a fixed width (COLUMNS, else 200) when not a terminal."""
    from rich.console import Console

    width = None
    if width_when_piped and not sys.stderr.isatty():
        width = int(os.environ.get("COLUMNS", 0)) or 200
    return Console(stderr=True, no_color=bool(os.environ.get("NO_COLOR")), highlight=False, width=width)


def hang_up() -> None:
    """The reader closed stdout (`| head`): stop quietly with status 0, as Unix tools do."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush finds a sink
    except (OSError, ValueError, AttributeError):
        pass  # a stdout without a file descriptor (tests)
    raise SystemExit(0)


def note(line: str) -> None:
    """One line on stderr, dimmed on a terminal."""
    sys.stderr.write((f"\x1b[2m{line}\x1b[0m" if colour_enabled(sys.stderr) else line) + "\n")
    sys.stderr.flush()


TRANSLATED_DRAFT = "the draft's vocabulary differs from the target's: drafting through text (lossless)"


def note_translated(translated: bool) -> None:
    """The one line every command prints when its draft model drafts through text."""
    if translated:
        note(TRANSLATED_DRAFT)


def write_json(obj: dict) -> None:
    """One JSON object, one line, on stdout."""
    import json

    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def generation_json(text: str, tokens: list[int], mode: str, st: Stats, draft_max: int, policy: str) -> dict:
    """One generation as `run --json` (and each `chat --json` turn) reports it."""
    return {
        "text": text,
        "tokens": list(tokens),
        "mode": mode,
        "prompt_tokens": st.prompt_tokens,
        "generated_tokens": st.generated,
        "stop_reason": st.stop_reason,
        "timings": st.timings(),
        "spec": {**st.spec(draft_max), "policy": policy},
    }


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


# -- generated text ------------------------------------------------------------------


class TextStream:
    """Writes each round's tokens as UTF-8 text, flushed per round; accepted drafts in colour on a terminal.

    With stop strings, text that may begin one is held back, and nothing from a
    stop string on is ever written. `out=None` writes nothing (the text is still
    kept). `text` is everything generated, without a stop string.
    """

    def __init__(self, engine, out: TextIO | None, stops: Sequence[str] = (), colour: bool | None = None) -> None:
        from specgen.apps.chat import StopScanner

        self.engine = engine
        self.out = out
        self.colour = out is not None and (colour_enabled(out) if colour is None else colour)
        self._scan = StopScanner(stops)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.written: list[str] = []

    @property
    def stopped(self) -> bool:
        return self._scan.stopped

    @property
    def text(self) -> str:
        return self._scan.text

    def _decode(self, tokens) -> str:
        return self._utf8.decode(b"".join(self.engine.piece(t) for t in tokens))

    def _write(self, pieces) -> None:
        if self.out is None or not pieces:
            return
        for text, tag in pieces:
            self.written.append(text)
            self.out.write(f"{DRAFT_COLOUR}{text}{RESET}" if self.colour and tag == "draft" else text)
        self.out.flush()

    def write_round(self, r: Round) -> None:
        drafted = self._scan.feed(self._decode(r.tokens[: r.accepted]), "draft")
        self._write(drafted + self._scan.feed(self._decode(r.tokens[r.accepted :]), "own"))

    def finish(self) -> str:
        """Write what was held back (unless a stop string ended the text); return the text."""
        if not self.stopped:
            self._write(self._scan.feed(self._utf8.decode(b"", final=True), "own") + self._scan.finish())
        return self.text


def prefill_status(done: int, total: int) -> str:
    """The status line while the target reads a long prompt."""
    return f"reading the prompt: {done} of {total} tokens ({100 * done // max(total, 1)}%)"


def follow(gen: Generation, stream: TextStream, on_round: Callable | None = None) -> bool:
    """Run a Generation to its end, a stop string, or Ctrl-C, streaming its text; True if interrupted."""
    interrupted = False
    it = iter(gen)
    try:
        for r in it:
            stream.write_round(r)
            if on_round is not None:
                on_round(gen.stats, r)
            if stream.stopped:
                gen.stats.stop_reason = "stop"
                break
    except KeyboardInterrupt:
        interrupted = True
        gen.interrupt()
    finally:
        it.close()
    stream.finish()
    return interrupted


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


# -- run, chat, rewrite: one generation's numbers ---------------------------------------------


def stats_table(st: Stats, mode: str, draft_max: int, policy: str = "fixed"):
    from rich.table import Table

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


def policy_name(policy) -> str:
    """A generation's policy by name ("fixed" where it has none: plain decoding)."""
    return "fixed" if policy is None else policy.name


def k_label(k: int, policy) -> str:
    return f"k={k}" if policy_name(policy) == "fixed" else f"k<={k} ({policy.name})"


def reply_status(st: Stats, mode: str, k_text: str, prefilled: int, cached: int) -> str:
    """The line under each chat reply."""
    parts = [f"{st.generated} tokens", f"{st.tokens_per_s:.1f} tok/s", f"prefill {prefilled} new + {cached} cached"]
    if mode == "plain":
        parts.append("plain decoding")
    else:
        rate = pct(st.acceptance_rate) if st.drafted else "-"
        parts.append(f"{mode} {k_text}: accepted {st.accepted}/{st.drafted} ({rate})")
        parts.append(f"{pct(st.accepted / st.generated if st.generated else 0)} of the reply from drafts")
    if st.stop_reason in ("max_tokens", "context_full", "interrupted"):
        parts.append(st.stop_reason.replace("_", " "))
    return "[" + " · ".join(parts) + "]"


def show_diff(text: str) -> None:
    """A unified diff on stderr, coloured on a terminal."""
    if not text:
        note("diff: no changes")
        return
    if colour_enabled(sys.stderr):
        colours = {"+": "\x1b[32m", "-": "\x1b[31m", "@": "\x1b[36m"}
        lines = []
        for line in text.splitlines(keepends=True):
            c = colours.get(line[:1]) if not line.startswith(("+++", "---")) else "\x1b[1m"
            lines.append(f"{c}{line.rstrip(chr(10))}\x1b[0m\n" if c else line)
        text = "".join(lines)
    sys.stderr.write(text)
    sys.stderr.flush()


# -- check, models, tune ----------------------------------------------------------------------


def print_check(report, why_not: str = "") -> None:
    """The checks, then the verdict: shared vocabulary, usable by translation, or neither."""
    con = stderr_console()
    for name, ok, detail in report.checks:
        con.print(f"{'ok  ' if ok else 'FAIL'}  {name}: {detail}")
    if report.compatible:
        con.print("compatible")
    elif not why_not:
        # the first differing ids, where the token texts are compared
        ids = next((d for n, ok, d in report.checks if n == "token text" and not ok), report.first_problem())
        con.print(f"different vocabularies — usable by translation (lossless; {ids})")
    else:
        con.print(f"incompatible: {report.first_problem()}; not usable by translation: {why_not}")


def print_models(rows: list[dict], pairs: dict) -> None:
    """The models and pairs tables, on stdout."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="models")
    for col in ("name", "source", "present"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"] + (" (default)" if r["default"] else ""), r["source"], "yes" if r["present"] else "no")
    p = Table(title="pairs")
    for col in ("name", "target", "draft", "k"):
        p.add_column(col)
    for n, pe in pairs.items():
        p.add_row(n, pe.target, pe.draft, str(pe.draft_max or ""))
    con = Console()
    con.print(t)
    con.print(p)


def tune_table(mode: str, prediction: list[dict], alphas: list[float], verify: list[float]):
    from rich.table import Table

    t = Table(title=f"{mode}: predicted speedup per k (Leviathan, measured verify cost)")
    for col in ("k", "α at k", "verify ms", "tokens/round", "speedup"):
        t.add_column(col, justify="right")
    for row in prediction:
        k = row["k"]
        t.add_row(str(k), f"{alphas[k - 1]:.2f}" if k else "-", f"{1000 * verify[min(k + 1, 32)]:.1f}",
                  f"{row['tokens_per_round']:.2f}", f"{row['speedup']:.2f}x")
    return t
