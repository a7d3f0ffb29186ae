"""Chat as pure logic: templates, the conversation's token list, slash commands.

A chat template (the GGUF's own, or a built-in one for families whose GGUF
carries none) is rendered in a sandboxed Jinja environment. The conversation
keeps the tokens the model last saw and produced; the next prompt reuses the
longest prefix of them that the newly rendered conversation still starts
with, so the KV cache (which holds exactly those tokens) is reused and a new
turn prefills only its own tokens. Nothing here prints or touches a model
beyond tokenizing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from specgen.errors import SpecgenError

# Gemma's own format (Gemma 2/3 instruction-tuned models). A system message
# goes before the first user message, as Google's template does it.
GEMMA_TEMPLATE = r"""{{ bos_token }}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}"""

# For anything else without a template: a plain transcript, which base models
# continue sensibly. The model would go on to write the user's next line, so
# the reply stops at "\nUser:".
PLAIN_TEMPLATE = r"""{%- for message in messages -%}
    {%- if message['role'] == 'system' -%}
        {{ message['content'] | trim }}{{ '\n\n' }}
    {%- elif message['role'] == 'user' -%}
        {{ 'User: ' }}{{ message['content'] | trim }}{{ '\n' }}
    {%- else -%}
        {{ 'Assistant: ' }}{{ message['content'] | trim }}{{ '\n' }}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}"""

BUILTIN = {"gemma": (GEMMA_TEMPLATE, ()), "plain": (PLAIN_TEMPLATE, ("\nUser:",))}


class Tokenizer(Protocol):
    """What this module needs of an Engine."""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def piece(self, token: int, *, special: bool = False) -> bytes: ...

    def vocab_info(self): ...

    def token_text(self, token: int) -> bytes: ...


# -- templates ---------------------------------------------------------------


@dataclass(frozen=True)
class ChatFormat:
    """A chat template and what goes with it."""

    name: str  # where it came from, for the banner: "gguf", "gemma (built-in)" …
    template: str
    stop: tuple[str, ...] = ()  # text that ends a reply (besides end-of-generation tokens)
    bos_token: str = ""
    eos_token: str = ""


def _raise(message: str):
    raise SpecgenError(f"chat template: {message}")


def _tojson(value, indent=None, ensure_ascii=False, **_):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    import datetime

    return datetime.datetime.now().strftime(fmt)


def _environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # As Hugging Face renders chat templates: trimmed blocks, loop controls,
    # a tojson that does not HTML-escape, raise_exception and strftime_now.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


def compile_template(source: str, name: str = "chat template"):
    from jinja2 import TemplateError

    try:
        return _environment().from_string(source)
    except TemplateError as exc:
        raise SpecgenError(f"{name} does not compile: {exc}") from None


def render(fmt: ChatFormat, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """The conversation as the model should see it (sandboxed: no attribute tricks)."""
    from jinja2 import TemplateError

    tmpl = compile_template(fmt.template, f"chat template ({fmt.name})")
    try:
        return tmpl.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=fmt.bos_token,
            eos_token=fmt.eos_token,
            tools=None,
            documents=None,
        )
    except SpecgenError:
        raise
    except TemplateError as exc:  # SecurityError is one
        raise SpecgenError(f"chat template ({fmt.name}) failed: {exc}") from None
    except Exception as exc:  # a template is foreign code: any error is its own
        raise SpecgenError(f"chat template ({fmt.name}) failed: {type(exc).__name__}: {exc}") from None


def choose_format(
    choice: str | None,
    *,
    gguf_template: str | None,
    architecture: str | None,
    bos_token: str = "",
    eos_token: str = "",
) -> ChatFormat:
    """The template a command will use.

    choice: None/"auto" (the GGUF's template, else a built-in by family),
    "gguf", "gemma", "plain", or a path to a Jinja file.
    """
    choice = choice or "auto"
    if choice == "auto":
        if gguf_template:
            choice = "gguf"
        elif (architecture or "").lower().startswith("gemma"):
            choice = "gemma"
        else:
            choice = "plain"
    if choice == "gguf":
        if not gguf_template:
            raise SpecgenError("the model's GGUF has no chat template (use --template gemma|plain|FILE)")
        fmt = ChatFormat("gguf", gguf_template, (), bos_token, eos_token)
    elif choice in BUILTIN:
        source, stop = BUILTIN[choice]
        fmt = ChatFormat(f"{choice} (built-in)", source, stop, bos_token, eos_token)
    else:
        path = Path(choice)
        try:
            source = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SpecgenError(f"--template: no such file {path} (or use auto, gguf, gemma, plain)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecgenError(f"--template: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
        fmt = ChatFormat(str(path), source, (), bos_token, eos_token)
    compile_template(fmt.template, f"chat template ({fmt.name})")
    return fmt


def format_for(engine, choice: str | None = None) -> ChatFormat:
    """choose_format with what a loaded Engine says about itself."""
    info = engine.vocab_info()
    return choose_format(
        choice,
        gguf_template=engine.chat_template(),
        architecture=engine.meta("general.architecture"),
        bos_token=engine.token_text(info.bos).decode("utf-8", "replace") if info.bos >= 0 else "",
        eos_token=engine.token_text(info.eos).decode("utf-8", "replace") if info.eos >= 0 else "",
    )


# -- text → tokens -----------------------------------------------------------


def segments(text: str, contents: Sequence[str]) -> list[tuple[str, bool]]:
    """Split rendered text into (part, parse_special) pieces.

    Message contents are found in order and marked plain, so a user (or a
    rewritten file) that writes "<end_of_turn>" gets those characters, not
    the control token. Content the template changed beyond trimming is not
    found and is tokenized with the template's text, as llama.cpp does.
    """
    out: list[tuple[str, bool]] = []
    pos = 0
    for content in contents:
        for needle in (content, content.strip()):
            if not needle:
                continue
            i = text.find(needle, pos)
            if i >= 0:
                if i > pos:
                    out.append((text[pos:i], True))
                out.append((needle, False))
                pos = i + len(needle)
                break
    if pos < len(text):
        out.append((text[pos:], True))
    return out


def tokenize_segments(tok: Tokenizer, parts: Sequence[tuple[str, bool]]) -> list[int]:
    tokens: list[int] = []
    for text, special in parts:
        if text:
            tokens += tok.tokenize(text, add_special=False, parse_special=special)
    return tokens


def cut_segments(parts: Sequence[tuple[str, bool]], start: int) -> list[tuple[str, bool]]:
    """The pieces from character offset `start` on."""
    out, pos = [], 0
    for text, special in parts:
        end = pos + len(text)
        if end > start:
            out.append((text[max(start - pos, 0) :], special))
        pos = end
    return out


def reusable_prefix(tok: Tokenizer, held: Sequence[int], data: bytes, start: int = 0) -> tuple[int, int]:
    """How many of `held` (from `start`) spell a prefix of `data`, and its length in bytes.

    Stops at the first token whose text differs; only cuts that fall on a
    UTF-8 character boundary count.
    """
    best = (start, 0)
    pos = 0
    for i in range(start, len(held)):
        p = tok.piece(held[i], special=True)
        if not p or data[pos : pos + len(p)] != p:
            break
        pos += len(p)
        if pos == len(data) or (data[pos] & 0xC0) != 0x80:
            best = (i + 1, pos)
    return best


def encode(tok: Tokenizer, text: str, contents: Sequence[str] = (), held: Sequence[int] = ()) -> list[int]:
    """Tokens for rendered `text`, reusing the longest prefix of `held` that fits.

    A BOS is added when the vocabulary wants one and the template did not
    write it. The result starts with held[:n] for the largest usable n, so a
    KV cache holding `held` is reused up to there.
    """
    info = tok.vocab_info()
    bos_text = tok.piece(info.bos, special=True).decode("utf-8", "replace") if info.bos >= 0 else ""
    implicit_bos = bool(info.add_bos) and info.bos >= 0 and not (bos_text and text.startswith(bos_text))
    parts = segments(text, contents)
    prefix: list[int] = []
    start = 0
    if implicit_bos:
        prefix = [info.bos]
        if held and held[0] == info.bos:
            start = 1
        else:
            held = ()
    n, nbytes = reusable_prefix(tok, held, text.encode("utf-8"), start) if held else (start, 0)
    if n > start:
        prefix = list(held[:n])
    chars = len(text.encode("utf-8")[:nbytes].decode("utf-8"))
    return prefix + tokenize_segments(tok, cut_segments(parts, chars))


# -- the conversation --------------------------------------------------------


class ContextFull(SpecgenError):
    """The newest message alone does not leave room for a reply."""


@dataclass
class Conversation:
    """Messages plus the tokens the model last saw and produced.

    `tokens` is the last prompt followed by the reply the model generated
    (its own tokens, not a re-tokenization), which is what the KV cache holds.
    """

    fmt: ChatFormat
    tok: Tokenizer
    system: str | None = None
    messages: list[dict] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def all_messages(self) -> list[dict]:
        sys_msg = [{"role": "system", "content": self.system}] if self.system else []
        return sys_msg + self.messages

    @property
    def turns(self) -> int:
        """Completed user/assistant exchanges."""
        return sum(1 for m in self.messages if m["role"] == "assistant")

    def add_user(self, text: str) -> None:
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()  # a user turn that got no reply is replaced
        self.messages.append({"role": "user", "content": text})

    def drop_pending_user(self) -> None:
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()

    def add_reply(self, text: str, prompt: Sequence[int], generated: Sequence[int]) -> None:
        self.messages.append({"role": "assistant", "content": text})
        self.tokens = list(prompt) + list(generated)

    def prompt(self) -> list[int]:
        """Tokens for the next reply: the rendered conversation, cache prefix reused."""
        msgs = self.all_messages()
        text = render(self.fmt, msgs, add_generation_prompt=True)
        return encode(self.tok, text, [m["content"] for m in msgs], self.tokens)

    def drop_oldest_turn(self) -> bool:
        """Forget the oldest user/assistant exchange; False when none is left to drop."""
        if self.turns == 0:
            return False
        del self.messages[:2]
        return True

    def reset(self) -> None:
        self.messages.clear()
        # tokens stay: they describe the cache, whose system-prompt prefix is reusable

    def fit(self, n_ctx: int, reserve: int) -> tuple[list[int], int]:
        """The next prompt, dropping oldest turns until `reserve` tokens are left.

        Returns (prompt, turns dropped). Raises ContextFull when the newest
        message alone leaves no room to reply at all.
        """
        kept = list(self.messages)
        dropped = 0
        prompt = self.prompt()
        while len(prompt) + reserve > n_ctx and self.drop_oldest_turn():
            dropped += 1
            prompt = self.prompt()
        if len(prompt) + min(reserve, 16) > n_ctx:
            self.messages[:] = kept  # nothing is lost for a message that cannot be answered
            raise ContextFull(
                f"this message makes a prompt of {len(prompt)} tokens, too long for the context of {n_ctx} "
                f"(shorten it, /reset, or raise -c/--ctx-size)"
            )
        return prompt, dropped


def one_turn(fmt: ChatFormat, tok: Tokenizer, user: str, system: str | None = None) -> list[int]:
    """The tokens of one user turn (after a system turn when `system` is given), rendered by
    `fmt` up to the model's reply: what `run` feeds an instruction-tuned model."""
    conv = Conversation(fmt, tok, system)
    conv.add_user(user)
    return conv.prompt()


# -- stop strings ------------------------------------------------------------


class StopScanner:
    """Holds back streamed text that may be the start of a stop string.

    feed() returns the (text, tag) pieces that are safe to print; once a stop
    string appears, `stopped` is set and nothing from it on is ever returned.
    `text` is the reply without the stop string.
    """

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = [s for s in stops if s]
        self._buf = ""
        self._tags: list[tuple[int, object]] = []  # (start offset, tag)
        self._emitted = 0
        self._end: int | None = None  # where a stop string begins

    @property
    def stopped(self) -> bool:
        return self._end is not None

    @property
    def text(self) -> str:
        return self._buf[: self._end] if self._end is not None else self._buf

    def _held_back(self) -> int:
        """Length of the longest tail of the buffer that begins some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self._buf)), best, -1):
                if self._buf.endswith(s[:n]):
                    best = n
                    break
        return best

    def _slice(self, start: int, end: int) -> list[tuple[str, object]]:
        first = len(self._tags) - 1  # the piece holding `start`: the earlier ones all end before it
        while first > 0 and self._tags[first][0] > start:
            first -= 1
        out = []
        for i, (off, tag) in enumerate(self._tags[first:], first):
            nxt = self._tags[i + 1][0] if i + 1 < len(self._tags) else len(self._buf)
            lo, hi = max(off, start), min(nxt, end)
            if lo < hi:
                out.append((self._buf[lo:hi], tag))
        return out

    def feed(self, text: str, tag: object = None) -> list[tuple[str, object]]:
        if self.stopped or not text:
            return []
        search_from = max(0, len(self._buf) - max((len(s) for s in self.stops), default=0) + 1)
        self._tags.append((len(self._buf), tag))
        self._buf += text
        hits = [i for i in (self._buf.find(s, search_from) for s in self.stops) if i >= 0]
        if hits:
            self._end = min(hits)
            safe = self._end
        else:
            safe = len(self._buf) - self._held_back()
        out = self._slice(self._emitted, safe)
        self._emitted = max(self._emitted, safe)
        return out

    def finish(self) -> list[tuple[str, object]]:
        """Whatever was held back, when the reply ended without a stop string."""
        end = len(self.text)
        out = self._slice(self._emitted, end)
        self._emitted = end
        return out


# -- slash commands ----------------------------------------------------------

HELP = [
    ("/stats", "session statistics so far"),
    ("/k N", "draft N tokens per round"),
    ("/spec on|off", "speculative decoding on or off"),
    ("/lookup", "draft by prompt lookup (again: back to the draft model, if one is loaded)"),
    ("/reset", "forget the conversation (the system prompt stays)"),
    ("/exit", "quit (Ctrl-D does too)"),
    ("/help", "this list"),
]
_ALIASES = {"quit": "exit", "q": "exit", "?": "help"}


@dataclass(frozen=True)
class Command:
    name: str
    arg: object = None


def parse_command(line: str) -> Command | None:
    """A slash command, or None when the line is a message ("//x" sends "/x").

    Raises SpecgenError for a malformed or unknown command.
    """
    s = line.strip()
    if not s.startswith("/") or s.startswith("//"):
        return None
    name, _, arg = s[1:].partition(" ")
    name = _ALIASES.get(name.lower(), name.lower())
    arg = arg.strip()
    if name in ("stats", "lookup", "reset", "exit", "help"):
        if arg:
            raise SpecgenError(f"/{name} takes no argument")
        return Command(name)
    if name == "k":
        try:
            k = int(arg)
        except ValueError:
            raise SpecgenError("usage: /k N (tokens drafted per round, N >= 1)") from None
        if k < 1:
            raise SpecgenError(f"/k needs N >= 1 (got {k}); /spec off turns speculation off")
        return Command("k", k)
    if name == "spec":
        if arg.lower() not in ("on", "off"):
            raise SpecgenError("usage: /spec on|off")
        return Command("spec", arg.lower() == "on")
    raise SpecgenError(f"unknown command /{name} (/help lists them; start with // to send a line beginning with /)")


def message_text(line: str) -> str:
    """The message a non-command line sends."""
    s = line.strip()
    return s[1:] if s.startswith("//") else s
