"""The specgen command line: the typer app, its commands, and the entry point.

stdout: generated text only (or one JSON object with --json).
stderr: live status, summaries, progress, errors: one line, non-zero exit.

This is the only module that imports the command modules; they import
options (what they read) and render (what they show), never this one.
"""

from __future__ import annotations

import os
import sys
from typing import List

# llama.cpp owns the cores: numpy's BLAS threads beside it only slow the small
# matmuls of the heads and the sampling rules (docs/notes/2026-12-02-heads-training.md).
# Set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer
from typing_extensions import Annotated

from specgen import __version__, notes
from specgen.cli import bench, chat, heads, models, rewrite, run, serve, tune
from specgen.cli.render import hang_up, note
from specgen.errors import SpecgenError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Speculative generation on GGUF models through llama.cpp, measured honestly.",
)
app.command("run")(run.run)
app.command("check")(models.check)
app.command("models")(models.models)
app.command("pull")(models.pull)
app.command("pair")(models.pair)
app.command("bench")(bench.bench)
app.command("report")(bench.report)
app.command("serve")(serve.serve)
app.command("tune")(tune.tune)
app.command("chat")(chat.chat)
app.command("rewrite")(rewrite.rewrite)
app.add_typer(heads.app, name="heads")


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"specgen {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False,
) -> None:
    """Speculative generation on GGUF models through llama.cpp."""


def _fail(message: str, code: int = 2) -> None:
    sys.stderr.write(f"specgen: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(code)


def main(argv: List[str] | None = None) -> None:
    """Entry point: one clear line on stderr for every error, no tracebacks; notes
    on what a slow step is doing (specgen.notes) on stderr too."""
    before = notes.to(note)
    try:
        rc = app(args=argv, standalone_mode=False)
    except SpecgenError as exc:
        _fail(str(exc))
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        _fail("interrupted", 130)
    except typer.TyperException as exc:  # usage errors: bad option values, unknown options
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `specgen`: show help
            sys.stdout.write(exc.format_message() + "\n")
            raise SystemExit(0) from None
        _fail(exc.format_message())
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except BrokenPipeError:
        hang_up()
    finally:
        notes.to(before)
    raise SystemExit(rc if isinstance(rc, int) else 0)
