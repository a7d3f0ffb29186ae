"""specgen chat: templates, the conversation's token list, slash commands, and the command itself.

The pure parts run against a byte-level fake tokenizer; the command runs the
real models through CliRunner (scripted turns) and a real subprocess (piped
stdin, SIGINT): the embedded default (SmolLM2 135M Instruct), and Gemma 3 270M
base by name where a test reads Gemma's tokens.
"""

import os
import re
import signal
import subprocess
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from specgen.apps.chat import (
    GEMMA_TEMPLATE, ChatFormat, ContextFull, Conversation, StopScanner, choose_format, encode, message_text, parse_command, render, reusable_prefix,
)
from specgen.cli import app
from specgen.engine.llama import common_prefix
from specgen.errors import SpecgenError

from helpers import ByteTok, start_specgen, specgen

def gemma_fmt():
    return choose_format("gemma", gguf_template=None, architecture="gemma3", bos_token="<bos>", eos_token="<eos>")


def text_tokens(tok, text):
    return tok.tokenize(text, add_special=False, parse_special=False)


# -- templates -----------------------------------------------------------------------


def test_gemma_fallback_renders_gemma_turns_with_the_system_prompt_first():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!\n"},
        {"role": "user", "content": "Bye"},
    ]
    assert render(gemma_fmt(), msgs) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(SpecgenError, match="alternate"):
        render(gemma_fmt(), [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_format_choice_by_gguf_template_then_family():
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert choose_format(None, gguf_template=chatml, architecture="gemma3").name == "gguf"
    assert choose_format(None, gguf_template=None, architecture="gemma3").template == GEMMA_TEMPLATE
    plain = choose_format(None, gguf_template=None, architecture="llama")
    assert plain.name == "plain (built-in)" and plain.stop == ("\nUser:",)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert render(plain, msgs) == "S\n\nUser: Q\nAssistant:"
    with pytest.raises(SpecgenError, match="no chat template"):
        choose_format("gguf", gguf_template=None, architecture="gemma3")


def test_template_from_a_file_and_its_errors(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                 "{% if add_generation_prompt %}[assistant]{% endif %}")
    fmt = choose_format(str(f), gguf_template=None, architecture=None, bos_token="<s>")
    assert render(fmt, [{"role": "user", "content": "x"}]) == "<s>[user]x[assistant]"
    f.write_text("{% for m in messages %}")
    with pytest.raises(SpecgenError, match="does not compile"):
        choose_format(str(f), gguf_template=None, architecture=None)
    with pytest.raises(SpecgenError, match="no such file"):
        choose_format(str(tmp_path / "missing.jinja"), gguf_template=None, architecture=None)


def test_templates_run_sandboxed():
    def fmt(src):
        return ChatFormat("gguf", src)

    with pytest.raises(SpecgenError, match="failed"):
        render(fmt("{{ messages.__class__.__mro__[1].__subclasses__() }}"), [])
    with pytest.raises(SpecgenError, match="failed"):  # immutable: no mutating the caller's data
        render(fmt("{{ messages.append(1) }}"), [])
    with pytest.raises(SpecgenError, match="only user and assistant"):
        render(fmt("{{ raise_exception('only user and assistant') }}"), [])
    # Hugging Face's tojson: no HTML escaping
    assert render(fmt("{{ messages[0].content | tojson }}"), [{"role": "user", "content": "<a & b>"}]) == '"<a & b>"'


# -- the token list ------------------------------------------------------------------


def start(system="Be brief.", tok=None, fmt=None):
    tok = tok or ByteTok()
    return Conversation(fmt or gemma_fmt(), tok, system), tok


def test_second_prompt_extends_first_prompt_and_reply():
    conv, tok = start()
    conv.add_user("Hi")
    p1 = conv.prompt()
    assert p1 == tok.tokenize(render(conv.fmt, conv.all_messages()), add_special=False)
    assert p1.count(1) == 1  # the template wrote <bos>: no second one
    reply = text_tokens(tok, "Hello!") + [4]  # the model ends its turn with <end_of_turn>
    conv.add_reply("Hello!", p1, reply)
    conv.add_user("Bye")
    p2 = conv.prompt()
    assert p2[: len(p1) + len(reply)] == p1 + reply  # the cache holds exactly this prefix
    assert p2 == tok.tokenize(render(conv.fmt, conv.all_messages()), add_special=False)


@pytest.mark.parametrize(
    "generated, text, kept",
    [
        ("Hello wor", "Hello wor", "Hello wor"),  # cut by max tokens: no end-of-turn token
        ("Hello!\n\n", "Hello!\n\n", "Hello!"),  # the template trims the reply
    ],
)
def test_reply_prefix_is_reused_as_far_as_it_matches(generated, text, kept):
    conv, tok = start()
    conv.add_user("Hi")
    p1 = conv.prompt()
    conv.add_reply(text, p1, text_tokens(tok, generated))
    conv.add_user("Bye")
    p2 = conv.prompt()
    n = len(p1) + len(text_tokens(tok, kept))
    assert p2[:n] == conv.tokens[:n]
    assert common_prefix(p2, conv.tokens) == n


def test_a_different_end_token_is_not_reused():
    conv, tok = start()
    conv.add_user("Hi")
    p1 = conv.prompt()
    conv.add_reply("Hello", p1, text_tokens(tok, "Hello") + [2])  # <eos>, where the template writes <end_of_turn>
    conv.add_user("Bye")
    p2 = conv.prompt()
    n = len(p1) + 5
    assert p2[:n] == conv.tokens[:n] and p2[n] == 4


def test_implicit_bos_and_plain_template():
    fmt = choose_format("plain", gguf_template=None, architecture="llama")
    conv, tok = start(system=None, fmt=fmt)
    conv.add_user("Hi")
    p1 = conv.prompt()
    assert p1[0] == 1 and p1.count(1) == 1  # the vocabulary adds BOS; the template did not write it
    conv.add_reply("Hello", p1, text_tokens(tok, " Hello\nUser: more"))  # ran past the stop string
    conv.add_user("Bye")
    p2 = conv.prompt()
    assert p2[: len(p1) + 6] == conv.tokens[: len(p1) + 6]  # " Hello" and on
    assert tok.tokenize(render(fmt, conv.all_messages())) == p2


def test_no_cut_inside_a_character():
    tok = ByteTok()
    held = text_tokens(tok, "aé")
    assert reusable_prefix(tok, held, "aè".encode()) == (1, 1)  # é and è share their first byte
    assert reusable_prefix(tok, held, "aéb".encode()) == (3, 3)


def test_message_text_is_never_parsed_for_control_tokens():
    conv, tok = start(system=None)
    conv.add_user("say <end_of_turn> now")
    p = conv.prompt()
    assert p.count(4) == 1  # only the template's own end of turn
    assert bytes(t - 1000 for t in p if t >= 1000).decode().count("<end_of_turn>") == 1


def test_fit_drops_oldest_turns_then_refuses_an_oversized_message():
    conv, tok = start(system="S")
    for i in range(4):
        conv.add_user(f"question {i} " + "x" * 20)
        p = conv.prompt()
        conv.add_reply(f"answer {i}", p, text_tokens(tok, f"answer {i}") + [4])
    conv.add_user("last")
    full = len(conv.prompt())
    prompt, dropped = conv.fit(n_ctx=full + 10 - 60, reserve=10)
    assert dropped >= 2 and conv.turns == 4 - dropped
    assert conv.messages[-1] == {"role": "user", "content": "last"}
    assert len(prompt) + 10 <= full - 50
    n = len(tok.tokenize("<bos><start_of_turn>user\nS", add_special=False))
    assert prompt[:n] == conv.tokens[:n]  # the system prompt's cache stays usable
    before = list(conv.messages)
    conv.add_user("y" * 500)
    with pytest.raises(ContextFull, match="too long for the context"):
        conv.fit(n_ctx=200, reserve=10)
    assert conv.messages[:-1] == before[:-1]  # nothing dropped for a message that cannot be answered
    conv.drop_pending_user()
    assert conv.messages[-1]["role"] == "assistant"


def test_reset_forgets_messages_but_keeps_the_system_prefix_reusable():
    conv, tok = start(system="You are terse.")
    conv.add_user("Hi")
    p1 = conv.prompt()
    conv.add_reply("Yo", p1, text_tokens(tok, "Yo") + [4])
    conv.reset()
    assert conv.messages == [] and conv.turns == 0
    conv.add_user("Again")
    p2 = conv.prompt()
    assert common_prefix(p2, conv.tokens) >= len(tok.tokenize("<bos><start_of_turn>user\nYou are terse.\n\n", add_special=False))


def test_encode_without_held_tokens_matches_plain_tokenization():
    tok = ByteTok(add_bos=False)
    assert encode(tok, "abc<end_of_turn>", ["abc"]) == text_tokens(tok, "abc") + [4]


# -- stop strings ----------------------------------------------------------------------


def test_stop_scanner_holds_back_a_possible_stop_and_cuts_at_it():
    s = StopScanner(["\nUser:"])
    assert s.feed("Hello", "own") == [("Hello", "own")]
    assert s.feed(" there\nUs", "draft") == [(" there", "draft")]  # "\nUs" may start the stop
    assert s.feed("er: next", "own") == []
    assert s.stopped and s.text == "Hello there"


def test_stop_scanner_releases_a_false_alarm_and_finishes():
    s = StopScanner(["\nUser:"])
    assert s.feed("a\nUs", "own") == [("a", "own")]
    assert s.feed("ed", "draft") == [("\nUs", "own"), ("ed", "draft")]
    assert s.feed("\n", "own") == []
    assert s.finish() == [("\n", "own")]
    assert not s.stopped and s.text == "a\nUsed\n"
    assert StopScanner().feed("x\n", 1) == [("x\n", 1)]


# -- slash commands ----------------------------------------------------------------------


def test_parse_command():
    assert parse_command("hello") is None and parse_command("//etc") is None
    assert message_text("//etc/hosts") == "/etc/hosts" and message_text("  hi ") == "hi"
    assert parse_command("/k 3").arg == 3
    assert parse_command("/spec off").arg is False and parse_command("/spec ON").arg is True
    assert [parse_command(c).name for c in ("/stats", "/lookup", "/reset", "/exit", "/quit", "/help", "/?")] == [
        "stats", "lookup", "reset", "exit", "exit", "help", "help"]
    for bad, msg in [("/k", "usage"), ("/k 0", ">= 1"), ("/k x", "usage"), ("/spec maybe", "usage"),
                     ("/reset now", "no argument"), ("/frobnicate", "unknown command")]:
        with pytest.raises(SpecgenError, match=msg):
            parse_command(bad)


# -- the command, with the real model ---------------------------------------------------

# One thread: on a small shared machine, llama.cpp threads that wait on each other cost far more than they give.
FAST = ["-c", "1024", "-t", "1", "--temp", "0"]


def status_lines(stderr):
    return [ln for ln in stderr.splitlines() if ln.startswith("[") and "tokens" in ln]


@pytest.fixture
def count_prefill(monkeypatch):
    """Record every Engine sync of one sequence: (engine, tokens, cached before, tokens actually decoded)."""
    from specgen.engine.llama import Engine

    decoded = Counter()
    calls = []
    orig_batch, orig_sync = Engine.decode_batch, Engine.sync_many

    def decode_batch(self, parts):
        decoded[id(self)] += sum(len(t) for _, t, _ in parts)
        return orig_batch(self, parts)

    def sync_many(self, items):
        assert len(items) == 1, "a chat syncs one sequence"
        (seq, tokens), = items
        before, d0 = self.kv_tokens(seq), decoded[id(self)]
        out = orig_sync(self, items)
        calls.append(SimpleNamespace(engine=id(self), tokens=list(tokens), before=before, decoded=decoded[id(self)] - d0))
        return out

    monkeypatch.setattr(Engine, "decode_batch", decode_batch)
    monkeypatch.setattr(Engine, "sync_many", sync_many)
    return calls


@pytest.mark.model
def test_second_turn_prefills_only_its_new_tokens_target_and_draft(gemma_path, count_prefill):
    from specgen.engine.llama import Engine

    res = CliRunner().invoke(app, ["chat", "-m", str(gemma_path), *FAST, "-n", "6", "-d", str(gemma_path), "-k", "3"],
                             input="Hello there, I would like to hear about the history of the Roman empire.\nTell me more\n")
    assert res.exit_code == 0, res.output
    assert len(status_lines(res.stderr)) == 2
    target = count_prefill[0].engine
    t1, t2 = [c for c in count_prefill if c.engine == target]
    assert t1.decoded == len(t1.tokens)  # first turn: everything is new
    assert t2.tokens[: len(t1.tokens)] == t1.tokens  # the prompt's prefix is stable
    assert t2.decoded == len(t2.tokens) - common_prefix(t2.before, t2.tokens)
    with Engine.vocab(gemma_path) as v:
        suffix = v.tokenize("<end_of_turn>\n<start_of_turn>user\nTell me more<end_of_turn>\n<start_of_turn>model\n",
                            add_special=False)
    # only the new turn (plus the reply's last token, which the loop never feeds)
    assert t2.decoded <= len(suffix) + 2 < len(t2.tokens) // 2
    # The draft model's cache: its first sync of turn 2 keeps all of turn 1 it
    # saw. It lags the target by the reply tokens of the last round (at most
    # k + 1, never drafted from) and feeds the first token of the new reply.
    i2 = count_prefill.index(t2)
    d2 = next(c for c in count_prefill[i2:] if c.engine != target)
    assert d2.tokens[: len(t2.tokens)] == t2.tokens
    assert d2.decoded == len(d2.tokens) - common_prefix(d2.before, d2.tokens)
    assert common_prefix(d2.before, d2.tokens) > len(t1.tokens)
    assert d2.decoded <= len(suffix) + 1 + (3 + 1) < len(d2.tokens) // 2
    m = re.search(r"prefill (\d+) new \+ (\d+) cached", status_lines(res.stderr)[1])
    assert int(m.group(1)) == t2.decoded and int(m.group(2)) == len(t2.tokens) - t2.decoded


@pytest.mark.model
def test_slash_commands(gemma_path, count_prefill):
    script = "\n".join(["/help", "/k 2", "/spec off", "Hi", "/spec on", "/lookup", "/stats", "/bogus", "/k x",
                        "/reset", "Hi again", "/exit", "never sent"]) + "\n"
    res = CliRunner().invoke(app, ["chat", "-m", str(gemma_path), *FAST, "-n", "4"], input=script)  # Gemma's token ids below
    assert res.exit_code == 0, res.output
    err = res.stderr
    for expected in ["/spec on|off", "drafting 2 tokens per round", "speculative decoding off", "speculative decoding on: lookup k=2",
                     "already drafting by prompt lookup", "mean accepted length", "turns 1", "unknown command /bogus",
                     "usage: /k N", "conversation reset"]:
        assert expected in err, expected
    first, second = status_lines(err)
    assert "plain decoding" in first and "lookup k=2" in second
    turns = [c for c in count_prefill if c.tokens[1:2] == [105]]  # <start_of_turn>: not a cost measurement
    assert len(turns) == 2  # "never sent" was not: /exit ended the chat
    assert "never sent" not in res.stdout


@pytest.mark.model
def test_ctrl_c_ends_the_reply_not_the_chat(monkeypatch):
    from specgen.decode.generation import Generation

    orig = Generation.__iter__
    seen = {"n": 0}

    def interrupted_once(self):
        seen["n"] += 1
        it = orig(self)
        yield next(it)
        if seen["n"] == 1:
            it.throw(KeyboardInterrupt)  # what Ctrl-C does inside the loop
        yield from it

    monkeypatch.setattr(Generation, "__iter__", interrupted_once)
    res = CliRunner().invoke(app, ["chat", *FAST, "-n", "4", "-k", "2"], input="Hi\nStill there?\n")
    assert res.exit_code == 0, res.output
    first, second = status_lines(res.stderr)
    assert first.startswith("[1 tokens") and "interrupted" in first
    assert "interrupted" not in second


@pytest.mark.model
def test_full_context_drops_oldest_turns_and_never_crashes():
    words = " ".join(f"w{i}" for i in range(45))  # ~90 tokens a message
    script = "\n".join([words] * 4 + ["z " * 400, "short"]) + "\n"
    res = CliRunner().invoke(app, ["chat", "-c", "256", "-t", "1", "--temp", "0", "-n", "8", "-k", "4"], input=script)
    assert res.exit_code == 0, res.output
    assert "dropped the" in res.stderr and "oldest turn" in res.stderr
    assert "too long for the context" in res.stderr
    assert len(status_lines(res.stderr)) == 5  # every message but the oversized one got a reply


@pytest.mark.model
def test_chat_from_a_pipe_and_sigint_in_a_real_process(gemma_path):
    cmd = ["chat", *FAST, "-k", "4"]
    done = specgen(*cmd, "-n", "4", input="Hello\nAnd then?\n", text=True)
    assert done.returncode == 0, done.stderr
    assert len(status_lines(done.stderr)) == 2 and "specgen chat ·" not in done.stderr  # no banner for a pipe
    assert done.stdout.count("\n") >= 2

    p = start_specgen(*cmd, "-n", "200", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdin.write(b"Write a very long story about a dragon.\n")
    p.stdin.flush()
    os.set_blocking(p.stdout.fileno(), True)
    assert p.stdout.read(1)  # the reply has started
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(b"/stats\n/exit\n", timeout=120)
    err = err.decode()
    assert p.returncode == 0, err
    assert "Traceback" not in err and "turns 1" in err
    assert "interrupted" in status_lines(err)[0]


# -- live status line, --json per turn, the suffix index across turns ---------------------------

RUN_JSON_KEYS = {"text", "tokens", "mode", "prompt_tokens", "generated_tokens", "stop_reason", "timings", "spec"}


@pytest.mark.model
def test_piped_chat_json_gives_one_object_per_turn_and_no_status_line(gemma_path):
    import json

    done = specgen("chat", *FAST, "-n", "6", "-k", "2", "--json", input="Hello\nAnd then?\n", text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and done.stdout.endswith("\n"), done.stdout  # nothing else on stdout
    turns = [json.loads(ln) for ln in lines]
    for i, t in enumerate(turns, 1):
        assert set(t) == RUN_JSON_KEYS | {"turn"} and t["turn"] == i
        assert t["mode"] == "lookup" and t["generated_tokens"] == len(t["tokens"]) <= 6
        assert t["spec"]["draft_max"] == 2 and t["spec"]["accepted"] <= t["spec"]["drafted"]
    assert turns[1]["prompt_tokens"] > turns[0]["prompt_tokens"] + turns[0]["generated_tokens"]  # the conversation grows
    # stderr is not a terminal: no live status (no line clearing, no round counter), the summary line per turn
    assert "\x1b[2K" not in done.stderr and "round " not in done.stderr
    assert len(status_lines(done.stderr)) == 2


@pytest.mark.model
def test_chat_status_line_on_a_terminal_is_cleared_before_the_next_line(gemma_path):
    import pty
    import threading

    master, slave = pty.openpty()
    p = start_specgen("chat", *FAST, "-n", "12", "-k", "2", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=slave,
                      env={"NO_COLOR": "1"})
    os.close(slave)
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # the other end closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = p.communicate(b"Repeat exactly: one two three four, one two three four, one two\n", timeout=120)
    reader.join(timeout=10)
    os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    assert p.returncode == 0, err
    assert out.strip() and "\x1b" not in out.decode()  # the reply on stdout, no status in it
    shown = re.findall(r"\r\x1b\[2K(round \d+ \|[^\r]*)", err)
    assert shown and all("acceptance" in s and "tok/s" in s and "drafted" in s for s in shown), err
    assert "\r\x1b[2K[" in err  # the status was cleared, then the turn's summary line
    assert err.rindex("round ") < err.index("\r\x1b[2K[")


def test_global_cache_needs_the_suffix_drafter():
    res = CliRunner().invoke(app, ["chat", "--global-cache", "on"], input="")
    assert res.exit_code != 0 and "--global-cache on needs --suffix" in str(res.exception or res.output)


@pytest.mark.model
@pytest.mark.parametrize("flag", ["on", "off"])
def test_chat_global_cache_drafts_a_later_turn_from_an_earlier_one(flag, monkeypatch):
    """After /reset the same question again: only with the global index on do its drafts come from turn 1."""
    import json

    from specgen.drafters.continuations import KEY_GLOBAL
    from specgen.drafters.suffix import SuffixDrafter

    made, keys = [], []
    orig_init, orig_propose = SuffixDrafter.__init__, SuffixDrafter.propose_one

    def init(self, *a, **kw):
        orig_init(self, *a, **kw)
        made.append(self)

    def propose_one(self, *a, **kw):
        d = orig_propose(self, *a, **kw)
        keys.append(d.key if d.tokens else None)
        return d

    monkeypatch.setattr(SuffixDrafter, "__init__", init)
    monkeypatch.setattr(SuffixDrafter, "propose_one", propose_one)
    question = "Name three colours of the rainbow."
    res = CliRunner().invoke(app, ["chat", *FAST, "-n", "12", "-k", "8", "--json", "--suffix", "--global-cache", flag],
                             input=f"{question}\n/reset\n{question}\n")
    assert res.exit_code == 0, res.output
    first, second = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert first["mode"] == second["mode"] == "suffix"
    (drafter,) = made
    from_global = [k for k in keys if k is not None and k >= KEY_GLOBAL]
    if flag == "on":
        # turn 1 (prompt and whole reply) was remembered when it ended, and turn 2 drafted from it
        assert drafter.global_index is not None
        docs = [len(d) for d in drafter.global_index.docs]
        assert docs == [first["prompt_tokens"] + first["generated_tokens"], second["prompt_tokens"] + second["generated_tokens"]]
        assert from_global and second["spec"]["accepted"] > 0
    else:
        assert drafter.global_index is None and not from_global


# -- a base model -----------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("which, args, noted", [("gemma", [], True), ("gemma", ["--template", "gemma"], False),
                                                 ("smollm", [], False)])
def test_chat_on_a_base_model_says_so_in_one_line(gemma_path, smollm_path, which, args, noted):
    """Gemma 3 270M base has no template in its GGUF: auto falls back to the built-in one, and says so."""
    model = gemma_path if which == "gemma" else smollm_path
    res = CliRunner().invoke(app, ["chat", "-m", str(model), *FAST, "-n", "2", *args], input="Hi\n")
    assert res.exit_code == 0, res.output
    notes = [ln for ln in res.stderr.splitlines() if "no chat template" in ln]
    assert len(notes) == int(noted), res.stderr
    if noted:
        assert notes[0].startswith(gemma_path.name) and "base model" in notes[0] and "gemma (built-in)" in notes[0]
