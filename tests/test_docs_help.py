"""docs/commands.md shows each command's real `--help` (80 columns): checked against the CLI.

Refresh the blocks after changing an option: SPECGEN_WRITE_DOCS=1 python -m pytest tests/test_docs_help.py
"""

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "commands.md"
BLOCK = re.compile(r"```text\n(Usage: specgen ([a-z ]*?) \[OPTIONS\].*?)```", re.S)


def live_help(command: str) -> str:
    result = CliRunner().invoke(app, [*command.split(), "--help"], prog_name="specgen", terminal_width=80,
                                env={"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return result.output


def blocks() -> list[tuple[str, str]]:
    return [(m.group(2).strip(), m.group(1)) for m in BLOCK.finditer(DOC.read_text())]


def test_the_page_shows_the_help_of_every_command():
    shown = {name for name, _ in blocks()}
    assert {"run", "chat", "rewrite", "serve", "bench", "report", "tune", "models", "pull", "check"} <= shown


@pytest.mark.parametrize("command", sorted({name for name, _ in blocks()}))
def test_a_help_block_is_the_commands_real_help(command):
    text = DOC.read_text()
    shown = dict(blocks())[command]
    real = live_help(command)
    if os.environ.get("SPECGEN_WRITE_DOCS") and shown != real:
        DOC.write_text(text.replace(f"```text\n{shown}```", f"```text\n{real}```"))
        return
    assert shown == real, f"docs/commands.md shows an old `specgen {command} --help` (SPECGEN_WRITE_DOCS=1 refreshes it)"
