"""specgen rewrite: input checks, the prompt, the atomic write (killed mid-way), and the command."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.apps import rewrite as rw
from specgen.apps.chat import choose_format
from specgen.cli import app, main

from helpers import ByteTok, error_of, specgen, specgen_env, start_specgen

# One thread: on a small shared machine, llama.cpp threads that wait on each other cost far more than they give.
# Gemma 3 270M base (by name), which copies a file it is asked to fix: the plumbing's tests need a rewrite to finish.
FAST = ["-m", "gemma3-270m", "-c", "512", "-t", "1", "-k", "4"]
POEM = "Twinkle twinkle little\n"


def snapshot(path: Path):
    st = path.stat()
    return path.read_bytes(), st.st_mtime_ns, stat.S_IMODE(st.st_mode)


# -- reading ---------------------------------------------------------------------------


def test_decode_text_refuses_binary_and_non_utf8():
    assert rw.decode_text("héllo\n".encode(), "f") == "héllo\n"
    assert "binary file" in error_of(rw.decode_text, b"ab\x00cd", "f.bin")
    msg = error_of(rw.decode_text, b"caf\xe9\n", "latin1.txt")
    assert "not UTF-8 text" in msg and "0xe9 at offset 3" in msg


def test_read_source(tmp_path):
    assert "file not found: " in error_of(rw.read_source, str(tmp_path / "nope.txt"))
    assert "is a directory" in error_of(rw.read_source, str(tmp_path))
    big = tmp_path / "big.txt"
    big.write_text("word " * 5000)
    msg = error_of(rw.read_source, str(big), max_bytes=rw.max_bytes_for(256))
    assert "too large for the context: 25000 bytes" in msg and "256 tokens" in msg
    src = rw.read_source("-", lambda: "from stdin\n".encode())
    assert (src.text, src.name, src.path) == ("from stdin\n", "stdin", None)


# -- where the output goes -----------------------------------------------------------------


def test_plan_output_checks_before_any_model_is_loaded(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x\n")
    src = rw.read_source(str(f))
    assert rw.plan_output(src, None, False, False).path is None
    plan = rw.plan_output(src, None, True, False)
    assert plan.in_place and plan.path == f.resolve() and plan.backup == f.resolve().with_name("notes.txt.bak")
    assert rw.plan_output(src, None, True, True).backup is None
    assert "choose one of" in error_of(rw.plan_output, src, str(tmp_path / "o"), True, False)
    assert "--no-backup only applies" in error_of(rw.plan_output, src, None, False, True)
    assert "is a directory" in error_of(rw.plan_output, src, str(tmp_path), False, False)
    assert "use --in-place" in error_of(rw.plan_output, src, str(f), False, False)
    assert "does not exist" in error_of(rw.plan_output, src, str(tmp_path / "no" / "o.txt"), False, False)
    stdin_src = rw.Source("x", "stdin", None)
    assert "needs a FILE" in error_of(rw.plan_output, stdin_src, None, True, False)
    f.chmod(0o444)
    assert "notes.txt is read-only" in error_of(rw.plan_output, src, None, True, False)
    out = tmp_path / "out.txt"
    out.write_text("old")
    out.chmod(0o444)
    assert "is read-only" in error_of(rw.plan_output, src, str(out), False, False)


def test_in_place_through_a_symlink_replaces_its_target(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old\n")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    plan = rw.plan_output(rw.read_source(str(link)), None, True, False)
    rw.atomic_write(plan.path, b"new\n", backup=plan.backup, mode=plan.mode)
    assert link.is_symlink() and link.read_text() == "new\n"
    assert (tmp_path / "real.txt.bak").read_text() == "old\n"


# -- the prompt ------------------------------------------------------------------------------


def test_fence_is_longer_than_any_backtick_run():
    assert rw.fence_for("plain") == "```"
    assert rw.fence_for("a ```py\ncode\n``` and ````") == "`````"


def test_completion_prompt_opens_the_fence_and_keeps_the_file_literal():
    content = "say <end_of_turn> here\n"
    text, fence = rw.prompt_text("Shout.", content, None)
    assert text == f"Shout.\n\nOriginal:\n```\n{content}```\n\nRewritten:\n```\n"
    p = rw.build_prompt(ByteTok(), "Shout.", content, None)
    assert p.tokens[0] == 1 and 4 not in p.tokens  # the file's text is never a control token
    assert p.stop == "\n```" and p.content_tokens == len(content.encode())
    assert "empty instruction" in error_of(rw.build_prompt, ByteTok(), "  ", content, None)


def test_chat_template_prompt_prefills_the_answer_fence():
    fmt = choose_format("gemma", gguf_template=None, architecture="gemma3", bos_token="<bos>")
    text, fence = rw.prompt_text("Fix it.", "abc", fmt)
    assert text.startswith("<bos><start_of_turn>user\nFix it.\n\n")
    assert text.endswith("```\nabc\n```<end_of_turn>\n<start_of_turn>model\n```\n")


def test_check_fits_names_the_token_counts():
    p = rw.RewritePrompt(tokens=[0] * 150, stop="\n```", content_tokens=120)
    rw.check_fits(p, 300, "f.txt")
    msg = error_of(rw.check_fits, p, 256, "f.txt")
    assert "f.txt is too large for the context: it has 120 tokens" in msg and "context holds 256" in msg


def test_finish_text_keeps_the_final_newline_as_the_original_had_it():
    assert rw.finish_text("abc", "x\n") == "abc\n"
    assert rw.finish_text("abc\n", "x") == "abc"
    assert rw.finish_text("abc\n", "x\n") == "abc\n"


def test_unified_diff():
    d = rw.unified_diff("a\nb\n", "a\nc", "f.txt")
    assert d.startswith("--- a/f.txt\n+++ b/f.txt\n") and "-b\n+c\n\\ No newline at end of file\n" in d
    assert rw.unified_diff("same\n", "same\n", "f") == ""


# -- the atomic write ---------------------------------------------------------------------------


def test_atomic_write_backup_and_mode(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("old\n")
    f.chmod(0o640)
    rw.atomic_write(f, b"new\n", backup=tmp_path / "f.txt.bak", mode=0o640)
    assert f.read_text() == "new\n" and stat.S_IMODE(f.stat().st_mode) == 0o640
    assert (tmp_path / "f.txt.bak").read_text() == "old\n"
    rw.atomic_write(f, b"newer\n", backup=tmp_path / "f.txt.bak")  # an older backup is replaced
    assert (tmp_path / "f.txt.bak").read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt", "f.txt.bak"]


def test_backup_falls_back_to_a_copy_without_hard_links(tmp_path, monkeypatch):
    f = tmp_path / "f.txt"
    f.write_text("old\n")

    def no_links(*a):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    rw.atomic_write(f, b"new\n", backup=tmp_path / "f.txt.bak")
    assert f.read_text() == "new\n" and (tmp_path / "f.txt.bak").read_text() == "old\n"


def test_a_failed_write_leaves_the_old_file_and_no_debris(tmp_path, monkeypatch):
    f = tmp_path / "f.txt"
    f.write_text("old\n")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    assert "No space left on device" in error_of(rw.atomic_write, f, b"new\n")
    assert f.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


KILL_CHILD = """
import sys
from pathlib import Path
from specgen.apps.rewrite import atomic_write
p = Path(sys.argv[1])
versions = [b"A" * 3_000_000 + b"\\n", b"B" * 5_000_000 + b"\\n"]
print("ready", flush=True)
i = 0
while True:
    atomic_write(p, versions[i % 2], backup=p.with_name(p.name + ".bak"))
    i += 1
"""


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_kill_9_during_writes_leaves_a_whole_file(tmp_path, delay):
    a, b = b"A" * 3_000_000 + b"\n", b"B" * 5_000_000 + b"\n"
    f = tmp_path / "f.txt"
    f.write_bytes(b)
    p = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(f)], stdout=subprocess.PIPE, env=specgen_env())
    assert p.stdout.readline() == b"ready\n"
    time.sleep(delay)
    assert p.poll() is None
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert f.read_bytes() in (a, b)
    bak = tmp_path / "f.txt.bak"
    assert not bak.exists() or bak.read_bytes() in (a, b)
    for debris in set(tmp_path.iterdir()) - {f, bak}:  # a temporary file the kill left: never the target
        assert debris.name.startswith(".") and debris.name.endswith(".specgen-tmp")


# -- the command, with the real model --------------------------------------------------------------



@pytest.fixture
def poem(tmp_path):
    f = tmp_path / "poem.txt"
    f.write_text(POEM)
    return f


@pytest.mark.model
def test_rewrite_stdout_output_file_and_stdin_agree(poem, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["rewrite", str(poem), "-i", "Fix the text.", *FAST])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert text.endswith("\n") and "twinkle" in text.lower()
    assert "lookup k=4" in res.stderr and "from drafts" in res.stderr
    out = tmp_path / "out.txt"
    res = runner.invoke(app, ["rewrite", str(poem), "-i", "Fix the text.", "-o", str(out), *FAST])
    assert res.exit_code == 0, res.output
    assert res.stdout == "" and out.read_text() == text and poem.read_text() == POEM
    assert f"wrote {out}" in res.stderr
    res = runner.invoke(app, ["rewrite", "-", "-i", "Fix the text.", *FAST], input=POEM)
    assert res.exit_code == 0 and res.stdout == text
    res = runner.invoke(app, ["rewrite", str(poem), "-i", "Fix the text.", "--in-place", "--diff", *FAST])
    assert res.exit_code == 0, res.output
    assert poem.read_text() == text
    if text != POEM:  # this model adds a comma: "Twinkle, twinkle little"
        assert (tmp_path / "poem.txt.bak").read_text() == POEM
        assert f"--- a/{poem}" in res.stderr and "-Twinkle twinkle little" in res.stderr
    else:
        assert "no changes" in res.stderr and not (tmp_path / "poem.txt.bak").exists()


@pytest.mark.model
def test_in_place_write_path_with_backup_and_no_backup(poem, tmp_path, monkeypatch):
    # Whatever the model writes, make the result differ so the write path always runs.
    finish = rw.finish_text
    monkeypatch.setattr(rw, "finish_text", lambda out, orig: finish(out, orig).upper())
    poem.chmod(0o640)
    res = CliRunner().invoke(app, ["rewrite", str(poem), "-i", "Copy.", "--in-place", *FAST])
    assert res.exit_code == 0, res.output
    new = poem.read_text()
    assert new == new.upper() and new != POEM and stat.S_IMODE(poem.stat().st_mode) == 0o640
    assert (tmp_path / "poem.txt.bak").read_text() == POEM
    res = CliRunner().invoke(app, ["rewrite", str(poem), "-i", "Copy.", "--in-place", "--no-backup", *FAST])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "poem.txt.bak").read_text() == POEM  # untouched: no new backup
    assert sorted(p.name for p in tmp_path.iterdir()) == ["poem.txt", "poem.txt.bak"]


@pytest.mark.model
def test_token_limit_before_the_model_finishes_leaves_file_untouched(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("".join(f"Line {i}: the quick brown fox.\n" for i in range(10)))
    before = snapshot(f)
    res = CliRunner().invoke(app, ["rewrite", str(f), "-i", "Copy.", "--in-place", "-n", "5", *FAST])
    assert res.exit_code != 0
    assert "before the model finished" in str(res.exception) and "left unchanged" in str(res.exception)
    assert snapshot(f) == before and not (tmp_path / "long.txt.bak").exists()


@pytest.mark.model
@pytest.mark.parametrize("model, prompt", [(None, "prompt template gguf"), ("gemma3-270m", "prompt completion-style")])
def test_rewrite_uses_the_gguf_template_when_there_is_one(poem, model, prompt):
    """The default (SmolLM2 135M Instruct) has a template in its GGUF; Gemma 3 270M base has none."""
    res = CliRunner().invoke(app, ["rewrite", str(poem), "-i", "Fix the text.", *(["-m", model] if model else []),
                                   "-c", "512", "-t", "1", "-n", "2"])
    assert res.stderr.startswith("rewriting ") and prompt in res.stderr.splitlines()[0], res.output


@pytest.mark.model
def test_kill_9_mid_generation_leaves_the_original(tmp_path, gemma_path):
    f = tmp_path / "notes.md"
    original = "".join(f"- item {i}: remember to water plant number {i}.\n" for i in range(20)).encode()
    f.write_bytes(original)
    p = start_specgen(
        "rewrite", str(f), "-i", "Copy the list.", "--in-place", "-m", str(gemma_path), "--no-spec", "-c", "1024", "-t", "1",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    line = p.stderr.readline()  # "rewriting notes.md (… tokens) …": generation starts now
    assert b"rewriting" in line, line
    time.sleep(0.5)
    assert p.poll() is None, "finished before the kill"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert f.read_bytes() == original
    assert sorted(x.name for x in tmp_path.iterdir()) == ["notes.md"]  # no backup, no temporary file


# -- bad input: one line on stderr, non-zero exit, FILE untouched ---------------------------------


def run_main(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specgen: error: "), err
    return lines[0]


def test_bad_inputs_fail_before_the_model_loads(tmp_path, capsys):
    binary = tmp_path / "a.bin"
    binary.write_bytes(b"\x7fELF\x00\x01")
    latin = tmp_path / "l.txt"
    latin.write_bytes(b"caf\xe9\n")
    ro = tmp_path / "ro.txt"
    ro.write_text("read only\n")
    ro.chmod(0o444)
    cases = [
        ([str(tmp_path / "missing.txt")], "file not found"),
        ([str(tmp_path)], "is a directory"),
        ([str(binary)], "binary file"),
        ([str(latin)], "not UTF-8 text"),
        ([str(ro), "--in-place"], "read-only"),
        ([str(latin), "-o", str(tmp_path / "x"), "--in-place"], "choose one of"),
        (["-", "--in-place"], "needs a FILE"),
    ]
    before = {p: snapshot(p) for p in (binary, latin, ro)}
    for args, expected in cases:
        code, out, err = run_main(capsys, "rewrite", *args, "-i", "Fix.")
        assert code == 2 and out == ""
        assert expected in one_error_line(err), (args, err)
    assert {p: snapshot(p) for p in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "l.txt", "ro.txt"]


@pytest.mark.model
def test_file_too_large_for_the_context_says_its_tokens(tmp_path, capsys):
    f = tmp_path / "big.txt"
    f.write_text(" ".join(f"word{i}" for i in range(150)) + "\n")
    before = snapshot(f)
    code, out, err = run_main(capsys, "rewrite", str(f), "-i", "Fix.", "--in-place", "-c", "256", "-t", "1")
    line = one_error_line(err)
    assert code == 2 and "big.txt is too large for the context: it has" in line and "context holds 256" in line
    assert snapshot(f) == before and not (tmp_path / "big.txt.bak").exists()


def test_bad_input_in_a_real_process_is_one_line(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"\x00\x01\x02")
    res = specgen("rewrite", str(f), "-i", "Fix.", "--in-place", text=True, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == f"specgen: error: {f} is a binary file (it contains NUL bytes): rewrite takes UTF-8 text\n"
    assert f.read_bytes() == b"\x00\x01\x02"
