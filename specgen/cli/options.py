"""What the commands read: every shared option, the prompt (stdin read once, here), sampling parameters.

Each option is declared once, with its flags, its usual help text and its
usual default (SHARED); a command names the ones it takes with `takes`, in
the order its help lists them, `told` where its help or default differs.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import typing
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from specgen.plan import NGRAM_MAX, Kind
from specgen.errors import SpecgenError, read_text_file

# -- models -------------------------------------------------------------------------
ModelOpt = Annotated[Optional[str], typer.Option("-m", "--model", help="Target: a .gguf path, a models.toml name or hf:OWNER/REPO/FILE.gguf. Default: the embedded SmolLM2 135M Instruct (smollm2-135m).")]
DraftOpt = Annotated[Optional[str], typer.Option("-d", "--draft", help="Draft model (same forms as -m). One with another vocabulary drafts through text: its drafts are re-encoded with the target's tokenizer and verified as point masses, so the output stays exactly the target's.")]
LookupOpt = Annotated[Optional[bool], typer.Option(
    "--lookup/--no-lookup",
    help="Draft by prompt lookup (n-gram match over prompt + output): the default without -d. With -d, lookup's free "
         "proposals go alongside the draft model's, the better per round by expected speed (the default under the cost "
         "policy); --no-lookup drafts with the model alone.")]
HeadsOpt = Annotated[Optional[str], typer.Option(
    "--heads", metavar="FILE|auto",
    help="Draft with prediction heads over the target's own hidden state: a heads file, or auto (the one "
         "`specgen heads train` made for this target). Lossless as a draft model (rejection sampling with the heads' "
         "distribution); prompt lookup offers its free drafts alongside under the cost policy (--no-lookup: heads alone).")]
NoSpecOpt = Annotated[bool, typer.Option("--no-spec", help="Plain decoding, no speculation.")]
PairOpt = Annotated[Optional[str], typer.Option("--pair", help="A target/draft pair from models.toml, or auto: the best local draft for -m (`specgen pair` ranks them), said on stderr; none: prompt lookup.")]
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
SystemOpt = Annotated[Optional[str], typer.Option("-s", "--system", help="System prompt.")]
RawOpt = Annotated[bool, typer.Option("--raw", help="Complete the prompt verbatim, without the model's chat template (a base model, whose GGUF has none, always does).")]

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


def retold(option, help: str | None, type_=None):
    """The same option (same flags) with a command's own help text (None: the usual), and type where it differs."""
    base, info = typing.get_args(option)
    info = copy.copy(info)
    info.help = info.help if help is None else help
    return Annotated[type_ or base, info]


# -- which command takes which ---------------------------------------------------------

# Every shared option once: the command parameter it fills, its declaration, its usual default.
SHARED = {
    "model": (ModelOpt, None), "draft": (DraftOpt, None), "lookup": (LookupOpt, None), "no_spec": (NoSpecOpt, False), "heads": (HeadsOpt, None),
    "pair": (PairOpt, None), "draft_max": (DraftMaxOpt, None),
    "max_tokens": (MaxTokOpt, 256), "temp": (TempOpt, 0.0), "top_k": (TopKOpt, 40), "top_p": (TopPOpt, 0.95),
    "min_p": (MinPOpt, 0.05), "seed": (SeedOpt, None), "ignore_eos": (IgnoreEosOpt, False),
    "ctx_size": (CtxOpt, 4096), "threads": (ThreadsOpt, None), "gpu_layers": (NglOpt, 0),
    "ngram_max": (NgramMaxOpt, NGRAM_MAX), "ngram_min": (NgramMinOpt, None), "adaptive": (AdaptiveOpt, None),
    "p_min": (PMinOpt, 0.0), "template": (TemplateOpt, None), "suffix": (SuffixOpt, False),
    "global_cache": (GlobalCacheOpt, OnOff.off), "json_out": (JsonOpt, False),
    "system": (SystemOpt, None), "raw": (RawOpt, False),
}
# The groups, as the commands list them.
MODEL = ("model", "draft", "heads", "lookup", "no_spec", "pair", "draft_max")
SAMPLING = ("temp", "top_k", "top_p", "min_p", "seed")  # -> SamplingParams
MACHINE = ("ctx_size", "threads", "gpu_layers")
NGRAM = ("ngram_max", "ngram_min")
POLICY = ("adaptive", "p_min")

_SAME = object()


class Told(typing.NamedTuple):
    """A shared option as one command tells it: its own help, default or type (None / _SAME: the usual one)."""

    help: str | None = None
    default: object = _SAME
    type_: object = None


def _shared_parameter(name: str, how: Told | None) -> inspect.Parameter:
    option, default = SHARED[name]
    if how is not None:
        option = retold(option, how.help, how.type_)
        default = default if how.default is _SAME else how.default
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=option, default=default)


def model_options(values: dict):
    """The one ModelOptions of a command's values: every option named like one of its fields,
    --suffix as its drafter and --global-cache as a bool (checked by the command, with global_cache_on)."""
    from dataclasses import fields

    from specgen.session import ModelOptions

    kw = {f.name: values[f.name] for f in fields(ModelOptions) if f.name in values}
    if values.get("suffix"):
        kw["drafter"] = Kind.SUFFIX
    if "global_cache" in values:
        kw["global_cache"] = OnOff(values["global_cache"]) == OnOff.on
    return ModelOptions(**kw)


def sampling(values: dict):
    """SamplingParams of the sampling options (and --ignore-eos where the command takes it),
    not yet checked (the command validates it where it always did)."""
    from specgen.rules.sampling import SamplingParams

    return SamplingParams(temperature=values["temp"], top_k=values["top_k"], top_p=values["top_p"],
                          min_p=values["min_p"], seed=values["seed"], ignore_eos=bool(values.get("ignore_eos", False)))


def takes(*order: str, **retell: Told):
    """A command's options, in the order its help lists them: shared ones by name (SHARED), its own by
    parameter name. The command's own options are its parameters before `*`; after it, what it receives:
    `opts` (one ModelOptions), `params` (SamplingParams) or any option's value by name."""

    def decorate(fn):
        sig = inspect.signature(fn, eval_str=True)
        own = {n: p for n, p in sig.parameters.items() if p.kind is not p.KEYWORD_ONLY}
        wants = [n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY]
        unknown = [n for n in order if n not in own and n not in SHARED]
        unknown += [n for n in own if n not in order] + [n for n in retell if n not in order or n in own]
        unknown += [n for n in wants if n not in order and n not in ("opts", "params")]
        unknown += [n for n in SAMPLING if "params" in wants and n not in order]
        if unknown:
            raise TypeError(f"{fn.__name__}: not a shared option, or not listed in takes(): {', '.join(unknown)}")
        parameters = [own[n].replace(kind=inspect.Parameter.KEYWORD_ONLY) if n in own else _shared_parameter(n, retell.get(n))
                      for n in order]

        @functools.wraps(fn)
        def command(**values):
            kw = {n: values[n] for n in own}
            for n in wants:
                kw[n] = model_options(values) if n == "opts" else sampling(values) if n == "params" else values[n]
            return fn(**kw)

        command.__signature__ = inspect.Signature(parameters, return_annotation=sig.return_annotation)
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.shared = tuple(n for n in order if n not in own)
        return command

    return decorate


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
