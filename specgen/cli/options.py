"""What the commands read: every shared option, the prompt (stdin read once, here), sampling parameters.

Each option is declared once, with its flags and its usual help text; a
command whose help says something else takes the same option `retold`.
"""

from __future__ import annotations

import copy
import sys
import typing
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from specgen.errors import SpecgenError, read_text_file

# -- models -------------------------------------------------------------------------
ModelOpt = Annotated[Optional[str], typer.Option("-m", "--model", help="Target: a .gguf path, a models.toml name or hf:OWNER/REPO/FILE.gguf. Default: the embedded Gemma 3 270M.")]
DraftOpt = Annotated[Optional[str], typer.Option("-d", "--draft", help="Draft model (same forms as -m). One with another vocabulary drafts through text: its drafts are re-encoded with the target's tokenizer and verified as point masses, so the output stays exactly the target's.")]
LookupOpt = Annotated[Optional[bool], typer.Option(
    "--lookup/--no-lookup",
    help="Draft by prompt lookup (n-gram match over prompt + output): the default without -d. With -d, lookup's free "
         "proposals go alongside the draft model's, the better per round by expected speed (the default under the cost "
         "policy); --no-lookup drafts with the model alone.")]
NoSpecOpt = Annotated[bool, typer.Option("--no-spec", help="Plain decoding, no speculation.")]
PairOpt = Annotated[Optional[str], typer.Option("--pair", help="A target/draft pair from models.toml.")]
DraftMaxOpt = Annotated[Optional[int], typer.Option("-k", "--draft-max", help="Draft length: with it alone, a fixed k; with --adaptive, the ceiling (defaults: fixed 8 lookup / 4 draft model; adaptive 16 / 8).")]
NgramMaxOpt = Annotated[int, typer.Option("--ngram-max", help="Longest n-gram prompt lookup matches.")]
NgramMinOpt = Annotated[Optional[int], typer.Option("--ngram-min", help="Shortest n-gram prompt lookup matches (default 1; 2 beside a draft model).", show_default=False)]
AdaptiveOpt = Annotated[Optional[str], typer.Option("--adaptive", help="Draft-length policy: cost (default; k = 0 … k_max by expected tokens/s from measured costs), heuristic, or fixed (the default when -k is given).")]
PMinOpt = Annotated[float, typer.Option("--p-min", help="Draft model: stop drafting when its top probability drops below this.")]
SuffixOpt = Annotated[bool, typer.Option("--suffix", help="Draft from a suffix index: the longest earlier match of the context, of any length.")]


class OnOff(str, Enum):
    on = "on"
    off = "off"


GlobalCacheOpt = Annotated[OnOff, typer.Option(
    "--global-cache", case_sensitive=False,
    help="With --suffix: also draft from what earlier requests of this process generated (chat turns, server requests), "
         "in one bounded index; off: each request drafts from its own prompt and output only.")]
TemplateOpt = Annotated[Optional[str], typer.Option("--template", help="Chat template: auto (the GGUF's, else a built-in by family), gguf, gemma, plain, or a Jinja file.")]

# -- generation and sampling --------------------------------------------------------
MaxTokOpt = Annotated[int, typer.Option("-n", "--max-tokens", help="Tokens to generate at most.")]
TempOpt = Annotated[float, typer.Option("--temp", help="Temperature; 0 = greedy.")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Drop tokens below this fraction of the top probability.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Seed for sampled runs (reproducible). With point-mass drafts (lookup, suffix, a draft of another vocabulary) the text for a seed does not depend on the drafter: it is the --no-spec text (up to near-ties of batch numerics).")]
IgnoreEosOpt = Annotated[bool, typer.Option("--ignore-eos", help="Do not stop at end-of-generation tokens.")]

# -- the machine ----------------------------------------------------------------------
CtxOpt = Annotated[int, typer.Option("-c", "--ctx-size", help="Context size in tokens.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: all cores).")]
NglOpt = Annotated[int, typer.Option("-ngl", "--gpu-layers", help="Layers to offload on a Metal/CUDA build.")]

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout at the end, nothing else.")]


def retold(option, help: str, type_=None):
    """The same option (same flags) with a command's own help text, and type where it differs."""
    base, info = typing.get_args(option)
    info = copy.copy(info)
    info.help = help
    return Annotated[type_ or base, info]


# -- reading ----------------------------------------------------------------------------


def read_stdin_bytes() -> bytes:
    """All of stdin as bytes; nothing when stdin is closed (`<&-`)."""
    if sys.stdin is None:
        return b""
    buf = getattr(sys.stdin, "buffer", None)
    return buf.read() if buf is not None else sys.stdin.read().encode("utf-8", "surrogateescape")


def read_stdin_text() -> str:
    # Bytes, decoded here: a non-UTF-8 pipe is one clear error, not a traceback.
    try:
        return read_stdin_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise SpecgenError("stdin is not UTF-8 text") from None


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """stdin (when piped) first, then the file or the argument."""
    parts = []
    if file is not None and str(file) == "-":
        parts.append(read_stdin_text())
    else:
        if sys.stdin is not None and not sys.stdin.isatty():
            piped = read_stdin_text()
            if piped:
                parts.append(piped)
        if file is not None:
            parts.append(read_text_file(file, "prompt file"))
    if prompt:
        parts.append(prompt)
    text = "\n".join(p.rstrip("\n") if i < len(parts) - 1 else p for i, p in enumerate(parts))
    if not text.strip():
        raise SpecgenError("empty prompt: give PROMPT, -f FILE, or pipe text on stdin")
    return text


# -- checking and building ---------------------------------------------------------------


def check_max_tokens(max_tokens: int | None) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise SpecgenError(f"-n/--max-tokens must be >= 1 (got {max_tokens})")


def global_cache_on(value: OnOff | str, suffix: bool, needs: str = "--suffix") -> bool:
    """--global-cache as a bool; on is refused without the suffix drafter, the only one that keeps an index."""
    on = OnOff(value) == OnOff.on
    if on and not suffix:
        raise SpecgenError(f"--global-cache on needs {needs} (only the suffix index drafts from earlier requests)")
    return on


def sampling_params(temp: float, top_k: int, top_p: float, min_p: float, seed: int | None):
    """SamplingParams from the sampling options, checked."""
    from specgen.rules.sampling import SamplingParams

    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    params.validate()
    return params
