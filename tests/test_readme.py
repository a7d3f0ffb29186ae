"""README.md stays a first page: short, its commands parse and run, its links resolve, no machine paths.

- README.md has at most 300 lines (everything else lives in docs/).
- Every `specgen ...` command in README's sh / console code blocks parses: with
  `--help` appended through typer's CliRunner, and parsed in full (types, extra
  arguments, required ones) without running, so a renamed command or option fails.
- README shows every command the CLI has.
- The quick-start block (after the `<!-- quick-start` marker) runs for real on the
  embedded model with `-n 8`: exit 0 and text on stdout (marked `model`).
- Every relative link in README (docs/ pages above all) and in docs/*.md points
  to a file that exists, and a `#fragment` to one of its headings.
- No absolute machine path (/root, /tmp, /work, /home, ...) in README.md or
  docs/*.md; docs/notes/ is history and keeps its paths as measured.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from specgen.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300
SHELL_LANGS = {"sh", "bash", "shell", "console"}
OPERATORS = {"|", "||", "&&", ";", "&", "|&"}
REDIRECT = re.compile(r"^\d*(>>?|<|>&)(.*)$")
MACHINE_PATH = re.compile(r"(?<![\w.~/$-])/(?:root|tmp|work|home|Users|mnt|opt|srv|var|private|scratch)(?=/|\b)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
QUICK_START = "<!-- quick-start"
QUICK_TOKENS = "8"


# ------------------------------------------------------------------ reading the page


def code_blocks(text: str) -> list[tuple[str, list[str], int]]:
    """Fenced blocks as (language, lines, line number of the fence), in order."""
    blocks, lang, body, start = [], None, [], 0
    for n, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*```\s*([\w+-]*)\s*$", line)
        if fence and lang is None:
            lang, body, start = fence.group(1).lower() or "text", [], n
        elif fence:
            blocks.append((lang, body, start))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def shell_lines(lang: str, lines: list[str]) -> list[str]:
    """The command lines of a block: every line of sh, the `$ ` lines of a console; continuations joined."""
    out: list[str] = []
    pending = ""
    for line in lines:
        if lang == "console" and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return [line for line in out if line.strip()]


def pipeline(line: str) -> list[list[str]]:
    """A shell line as its simple commands (split at | ; && &), redirections and VAR=x prefixes dropped."""
    commands, words, skip = [], [], False
    for tok in shlex.split(line, comments=True):
        if skip:
            skip = False
            continue
        if tok in OPERATORS:
            commands.append(words)
            words = []
            continue
        redirect = REDIRECT.match(tok)
        if redirect:
            skip = redirect.group(2) == ""
            continue
        if not words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tok):
            continue
        words.append(tok)
    commands.append(words)
    return [c for c in commands if c]


def specgen_args(words: list[str]) -> list[str] | None:
    """The arguments after `specgen` (or `python -m specgen`); None for another program."""
    if words[:1] == ["specgen"]:
        return words[1:]
    if len(words) >= 3 and words[0].startswith("python") and words[1:3] == ["-m", "specgen"]:
        return words[3:]
    return None


def readme_commands(text: str) -> list[list[str]]:
    found = []
    for lang, lines, _ in code_blocks(text):
        if lang not in SHELL_LANGS:
            continue
        for line in shell_lines(lang, lines):
            for words in pipeline(line):
                args = specgen_args(words)
                if args is not None:
                    found.append(args)
    return found


def quick_start(text: str) -> list[tuple[str, list[str]]]:
    """The quick-start block's lines as (stdin command or "", specgen arguments)."""
    after = text.split(QUICK_START, 1)
    assert len(after) == 2, f"README has no {QUICK_START} marker before its quick-start block"
    blocks = code_blocks(after[1])
    assert blocks, "no code block after the quick-start marker"
    lang, lines, _ = blocks[0]
    out = []
    for line in shell_lines(lang, lines):
        cmds = pipeline(line)
        args = specgen_args(cmds[-1])
        assert args is not None, f"a quick-start line that does not end in specgen: {line}"
        feed = line.rsplit("|", 1)[0] if len(cmds) > 1 else ""
        out.append((feed, args))
    return out


def with_tokens(args: list[str], n: str) -> list[str]:
    """args with -n / --max-tokens set to n (added when absent)."""
    out, i, seen = [], 0, False
    while i < len(args):
        if args[i] in ("-n", "--max-tokens") and i + 1 < len(args):
            out += [args[i], n]
            i, seen = i + 2, True
            continue
        out.append(args[i])
        i += 1
    return out if seen else out + ["-n", n]


def parse_fully(args: list[str]) -> None:
    """Parse a command line as the CLI would, without running it (raises click's UsageError)."""
    group = typer.main.get_command(app)
    ctx = group.make_context("specgen", args[:1])
    cmd = group.get_command(ctx, args[0])
    assert cmd is not None, f"no command {args[0]!r}"
    cmd.make_context(args[0], list(args[1:]), parent=ctx)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    bad = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif fragment and dest.is_file() and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    return bad


TEXT = README.read_text()
COMMANDS = readme_commands(TEXT)


# ------------------------------------------------------------------ the helpers themselves


def test_the_helpers_read_shell_as_the_shell_does():
    assert pipeline("printf 'a\\n' | SPECGEN_X=1 specgen chat -n 8 2>/dev/null # note") == [
        ["printf", "a\\n"], ["specgen", "chat", "-n", "8"]]
    assert pipeline("specgen serve --port 8080 & curl -s x > out.txt") == [
        ["specgen", "serve", "--port", "8080"], ["curl", "-s", "x"]]
    assert shell_lines("console", ["$ specgen run \\", "  -n 3", "output $ text"]) == ["specgen run    -n 3"]
    assert quick_start("<!-- quick-start -->\n```sh\nprintf 'a' | specgen chat -n 3\nspecgen run x  # y\n```\n") == [
        ("printf 'a' ", ["chat", "-n", "3"]), ("", ["run", "x"])]
    assert with_tokens(["run", "-n", "90"], "8") == ["run", "-n", "8"]
    assert with_tokens(["chat"], "8") == ["chat", "-n", "8"]
    assert slug("How the default decides: the cost policy") == "how-the-default-decides-the-cost-policy"
    assert slug("`specgen bench` and `specgen report`") == "specgen-bench-and-specgen-report"
    assert MACHINE_PATH.search("see /work/main/x") and MACHINE_PATH.search("`/tmp/a.lock`")
    assert not MACHINE_PATH.search("specgen/data/x ~/.cache/specgen 2>/dev/null http://h/v1/models $HOME/x")


def test_a_renamed_option_or_command_fails_to_parse():
    with pytest.raises(Exception, match="No such option"):
        parse_fully(["run", "--no-such-option"])
    with pytest.raises(Exception, match="No such command|no command"):
        parse_fully(["no-such-command"])
    assert CliRunner().invoke(app, ["run", "--no-such-option", "--help"]).exit_code != 0


# ------------------------------------------------------------------ (a) short


def test_readme_is_at_most_300_lines():
    n = len(TEXT.splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move the rest to docs/"


# ------------------------------------------------------------------ (b) every command parses


def test_readme_shows_every_command():
    group = typer.main.get_command(app)
    shown = {args[0] for args in COMMANDS if args}
    missing = set(group.list_commands(group.make_context("specgen", ["run"]))) - shown
    assert not missing, f"commands with no example in README: {sorted(missing)}"


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a)[:60] for a in COMMANDS])
def test_readme_command_parses(args, monkeypatch):
    monkeypatch.chdir(ROOT)
    if not args or args[0].startswith("-"):  # `specgen --version`, `specgen --help`: the group's own options
        assert CliRunner().invoke(app, args, prog_name="specgen").exit_code == 0
        return
    res = CliRunner().invoke(app, [*args, "--help"], prog_name="specgen")
    assert res.exit_code == 0, f"specgen {' '.join(args)} --help: {res.output}"
    assert f"Usage: specgen {args[0]}" in res.output
    parse_fully(args)


# ------------------------------------------------------------------ (c) the quick start runs


@pytest.mark.model
@pytest.mark.parametrize("feed, args", quick_start(TEXT), ids=[" ".join(a)[:60] for _, a in quick_start(TEXT)])
def test_quick_start_runs_on_the_embedded_model(feed, args, monkeypatch):
    monkeypatch.chdir(ROOT)
    stdin = subprocess.run(["sh", "-c", feed], capture_output=True, check=True).stdout if feed else b""
    args = with_tokens(args, QUICK_TOKENS)
    res = CliRunner().invoke(app, args, input=stdin, prog_name="specgen")
    assert res.exit_code == 0, f"specgen {' '.join(args)}: {res.output}"
    if "--json" in args:
        objects = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
        assert objects and all(o["generated_tokens"] >= 1 and o["text"] for o in objects)
    else:
        assert res.stdout.strip(), f"specgen {' '.join(args)} printed no text"


def test_the_quick_start_block_holds_a_run():
    assert any(args[0] == "run" for _, args in quick_start(TEXT))


# ------------------------------------------------------------------ (d) links resolve


def test_readme_links_to_docs_resolve():
    links = [t for t in LINK.findall(TEXT) if t.startswith("docs/")]
    assert links, "README links to no docs/ page"
    assert broken_links(README) == []


def test_docs_links_resolve():
    pages = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "docs" / "notes" / "README.md"]
    assert [b for page in pages for b in broken_links(page)] == []


# ------------------------------------------------------------------ (e) no machine paths


def test_no_absolute_machine_paths_in_readme_or_docs():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]  # docs/notes/ is history: its paths stay
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in pages
             for n, line in enumerate(p.read_text().splitlines(), 1) if MACHINE_PATH.search(line)]
    assert found == [], "absolute machine paths:\n" + "\n".join(found)
