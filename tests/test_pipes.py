"""Unix pipes, end to end in real processes: stdin into run, and a reader that hangs up.

`cat notes.md | specgen run "Summarise:"`, `specgen run < prompt.txt` and
`specgen run -f -` must build the same prompt; a closed stdout (`| head -c`)
must end run, rewrite and chat quietly: exit 0 or the SIGPIPE status, no
traceback.
"""

import json
import os
import signal
import subprocess

import pytest
from typer.testing import CliRunner

from specgen.cli import app

from helpers import specgen, start_specgen

pytestmark = pytest.mark.model
NOTES = "Meeting notes: ship the parser on Monday, fix the cache bug, review the docs.\n"
# One thread: on a small shared machine, llama.cpp threads that wait on each other cost far more than they give.
FAST = ["-c", "512", "-t", "1", "--no-spec"]


@pytest.fixture(scope="module")
def expected(gemma_path):
    """`run` on the whole prompt as one argument, in-process (CliRunner's stdin is empty)."""
    res = CliRunner().invoke(app, ["run", NOTES + "Summarise:", "-n", "3", "--json", *FAST])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    return obj["prompt_tokens"], obj["tokens"]


def as_run(res):
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    return obj["prompt_tokens"], obj["tokens"]


def test_piped_stdin_goes_before_the_prompt(expected):
    assert as_run(specgen("run", "Summarise:", "-n", "3", "--json", *FAST, input=NOTES.encode())) == expected


def test_redirected_file_and_dash_f(tmp_path, expected):
    f = tmp_path / "prompt.txt"
    f.write_text(NOTES + "Summarise:")
    with open(f, "rb") as stdin:  # specgen run < prompt.txt
        assert as_run(specgen("run", "-n", "3", "--json", *FAST, stdin=stdin)) == expected
    both = specgen("run", "-f", "-", "-n", "3", "--json", *FAST, input=(NOTES + "Summarise:").encode())
    assert as_run(both) == expected


def test_non_utf8_stdin_is_one_clear_line():
    res = specgen("run", "-f", "-", "-n", "2", *FAST, input=b"caf\xe9 \xff\n")
    assert res.returncode == 2 and res.stdout == b""
    assert res.stderr == b"specgen: error: stdin is not UTF-8 text\n"


def test_closed_stdin_is_no_stdin():
    res = specgen("run", "Hello", "-n", "2", *FAST, preexec_fn=lambda: os.close(0))
    assert res.returncode == 0, res.stderr


def hang_up_after_first_bytes(args, stdin_bytes=b""):
    """Start specgen, read a few bytes of stdout, close it; return (exit status, stderr)."""
    p = start_specgen(*args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write(stdin_bytes)
    p.stdin.close()
    first = p.stdout.read(5)
    p.stdout.close()  # `| head -c 5`
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert first, err
    return p.returncode, err


def assert_quiet(rc, err):
    assert rc in (0, -signal.SIGPIPE, 128 + signal.SIGPIPE), (rc, err)
    assert "Traceback" not in err and "Exception ignored" not in err and "Error" not in err, err


def test_closed_stdout_ends_run_quietly():
    assert_quiet(*hang_up_after_first_bytes(["run", "Count: 1, 2, 3,", "-n", "200", "--ignore-eos", *FAST]))


def test_closed_stdout_ends_rewrite_quietly(tmp_path):
    f = tmp_path / "list.txt"
    f.write_text("".join(f"- item {i}: water plant number {i}.\n" for i in range(15)))
    rc, err = hang_up_after_first_bytes(["rewrite", str(f), "-i", "Copy the list.", *FAST])
    assert_quiet(rc, err)
    assert "from drafts" not in err  # it stopped at the hang-up, before its summary


def test_closed_stdout_ends_chat_quietly():
    rc, err = hang_up_after_first_bytes(["chat", "-n", "40", "--temp", "0", *FAST], b"Tell me a story.\nAnother one.\n")
    assert_quiet(rc, err)
    assert "prefill" not in err  # it stopped at the hang-up, before the first reply's stats
