"""The specgen command line. All printing lives here (and in ui.py).

stdout: generated text only (or one JSON object with --json).
stderr: live status, summaries, progress, errors: one line, non-zero exit.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from typing_extensions import Annotated

from specgen import __version__
from specgen.errors import SpecgenError, read_text_file
from specgen.drafters import NGRAM_MAX

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Speculative generation on GGUF models through llama.cpp, measured honestly.",
)

# -- options shared by the generating commands --------------------------------
ModelOpt = Annotated[Optional[str], typer.Option("-m", "--model", help="Target: a .gguf path, a models.toml name or hf:OWNER/REPO/FILE.gguf. Default: the embedded Gemma 3 270M.")]
DraftOpt = Annotated[Optional[str], typer.Option("-d", "--draft", help="Draft model (same forms as -m).")]
LookupOpt = Annotated[bool, typer.Option("--lookup", help="Draft by prompt lookup (n-gram match over prompt + output). The default without -d.")]
NoSpecOpt = Annotated[bool, typer.Option("--no-spec", help="Plain decoding, no speculation.")]
PairOpt = Annotated[Optional[str], typer.Option("--pair", help="A target/draft pair from models.toml.")]
DraftMaxOpt = Annotated[Optional[int], typer.Option("-k", "--draft-max", help="Draft length: with it alone, a fixed k; with --adaptive, the ceiling (defaults: fixed 8 lookup / 4 draft model; adaptive 16 / 8).")]
MaxTokOpt = Annotated[int, typer.Option("-n", "--max-tokens", help="Tokens to generate at most.")]
TempOpt = Annotated[float, typer.Option("--temp", help="Temperature; 0 = greedy.")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Drop tokens below this fraction of the top probability.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Seed for sampled runs (reproducible).")]
IgnoreEosOpt = Annotated[bool, typer.Option("--ignore-eos", help="Do not stop at end-of-generation tokens.")]
CtxOpt = Annotated[int, typer.Option("-c", "--ctx-size", help="Context size in tokens.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: all cores).")]
NglOpt = Annotated[int, typer.Option("-ngl", "--gpu-layers", help="Layers to offload on a Metal/CUDA build.")]
NgramMaxOpt = Annotated[int, typer.Option("--ngram-max", help="Longest n-gram prompt lookup matches.")]
NgramMinOpt = Annotated[int, typer.Option("--ngram-min", help="Shortest n-gram prompt lookup matches.")]
AdaptiveOpt = Annotated[Optional[str], typer.Option("--adaptive", help="Draft-length policy: cost (default; k = 0 … k_max by expected tokens/s from measured costs), heuristic, or fixed (the default when -k is given).")]
PMinOpt = Annotated[float, typer.Option("--p-min", help="Draft model: stop drafting when its top probability drops below this.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout at the end, nothing else.")]


def _read_prompt(prompt: str | None, file: Path | None) -> str:
    """stdin (when piped) first, then the file or the argument."""

    def stdin_text() -> str:
        # Bytes, decoded here: a non-UTF-8 pipe is one clear error, not a traceback.
        if sys.stdin is None:  # stdin closed (`<&-`)
            return ""
        buf = getattr(sys.stdin, "buffer", None)
        data = buf.read() if buf is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecgenError("stdin is not UTF-8 text") from None

    parts = []
    if file is not None and str(file) == "-":
        parts.append(stdin_text())
    else:
        if sys.stdin is not None and not sys.stdin.isatty():
            piped = stdin_text()
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


def _sampling(temp, top_k, top_p, min_p, seed):
    from specgen.sampling import SamplingParams

    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    params.validate()
    return params


@app.command()
def run(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt (after any piped stdin).")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="Read the prompt from FILE ('-' = stdin).")] = None,
    model: ModelOpt = None,
    draft: DraftOpt = None,
    lookup: LookupOpt = False,
    no_spec: NoSpecOpt = False,
    pair: PairOpt = None,
    draft_max: DraftMaxOpt = None,
    max_tokens: MaxTokOpt = 256,
    temp: TempOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    ignore_eos: IgnoreEosOpt = False,
    ctx_size: CtxOpt = 4096,
    threads: ThreadsOpt = None,
    gpu_layers: NglOpt = 0,
    ngram_max: NgramMaxOpt = NGRAM_MAX,
    ngram_min: NgramMinOpt = 1,
    adaptive: AdaptiveOpt = None,
    p_min: PMinOpt = 0.0,
    json_out: JsonOpt = False,
    suffix: Annotated[bool, typer.Option("--suffix", help="Draft from a suffix index: the longest earlier match of the context, of any length.")] = False,
) -> None:
    """Generate a completion, streaming tokens; stats on stderr."""
    from specgen.decoding import Generation
    from specgen.loader import ModelOptions, open_models
    from specgen.ui import StatusLine, TextStream, round_status, stderr_console, summary_table

    if max_tokens < 1:
        raise SpecgenError(f"-n/--max-tokens must be >= 1 (got {max_tokens})")
    params = _sampling(temp, top_k, top_p, min_p, seed)
    opts = ModelOptions(model, draft, lookup, no_spec, pair, draft_max, ctx_size, threads, gpu_layers, ngram_max, ngram_min,
                        adaptive=adaptive, p_min=p_min, drafter="suffix" if suffix else None)
    opts.validate()
    text_in = _read_prompt(prompt, file)
    loaded = open_models(opts)
    try:
        target = loaded.target
        tokens = target.tokenize(text_in)
        gen = Generation(
            target, tokens, loaded.drafter, draft_max=loaded.draft_max, max_tokens=max_tokens,
            params=params, ignore_eos=ignore_eos, policy=loaded.new_policy(),
        )
        stream = TextStream(target) if not json_out else None
        status = StatusLine() if not json_out else None
        interrupted = False
        start = time.perf_counter()
        if status:
            status.start()
        try:
            for r in gen:
                if stream:
                    stream.write_round(r)
                if status:
                    status.show(round_status(gen.stats, r, time.perf_counter() - start))
        except KeyboardInterrupt:
            interrupted = True
            gen.interrupt()
        finally:
            if status:
                status.stop()
        text = stream.finish() if stream else target.detokenize(gen.tokens)
        st = gen.stats
        if json_out:
            obj = {
                "text": text,
                "tokens": gen.tokens,
                "mode": loaded.mode,
                "prompt_tokens": st.prompt_tokens,
                "generated_tokens": st.generated,
                "stop_reason": st.stop_reason,
                "timings": st.timings(),
                "spec": {**st.spec(loaded.draft_max), "policy": loaded.policy_name},
            }
            sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
            sys.stdout.flush()
        else:
            if sys.stdout.isatty() and text and not text.endswith("\n"):
                sys.stdout.write("\n")
                sys.stdout.flush()
            con = stderr_console()
            con.print(summary_table(st, loaded.mode, loaded.draft_max, loaded.policy_name))
        if interrupted:
            raise typer.Exit(130)
    except BrokenPipeError:  # typer would turn it into exit 1 before main() sees it
        hang_up()
    finally:
        loaded.close()


@app.command()
def check(
    target: Annotated[str, typer.Argument(help="Target model (path, models.toml name or hf: reference).")],
    draft: Annotated[str, typer.Argument(help="Draft model.")],
    json_out: JsonOpt = False,
) -> None:
    """Tokenizer compatibility report: exit 0 if the pair can speculate together."""
    from specgen import registry
    from specgen.engine import Engine
    from specgen.vocab import compare

    catalog = registry.load_catalog()
    tp = registry.resolve_model(target, catalog)
    dp = registry.resolve_model(draft, catalog)
    with Engine(tp, vocab_only=True) as te, Engine(dp, vocab_only=True) as de:
        report = compare(te, de)
    if json_out:
        sys.stdout.write(json.dumps(report.to_dict()) + "\n")
    else:
        from specgen.ui import stderr_console

        con = stderr_console()
        for name, ok, detail in report.checks:
            con.print(f"{'ok  ' if ok else 'FAIL'}  {name}: {detail}")
        con.print("compatible" if report.compatible else f"incompatible: {report.first_problem()}")
    if not report.compatible:
        raise typer.Exit(1)


@app.command("models")
def models_cmd(json_out: JsonOpt = False) -> None:
    """List models.toml entries and whether each is present locally."""
    from specgen import registry

    catalog = registry.load_catalog()
    rows = []
    for name, e in catalog.models.items():
        where = e.path or (f"{e.repo}/{e.file}" if e.repo else f"pypi:{e.package}")
        rows.append({"name": name, "source": where, "present": registry.is_present(e), "default": name == registry.DEFAULT_MODEL})
    if json_out:
        sys.stdout.write(json.dumps({"models": rows, "pairs": {n: {"target": p.target, "draft": p.draft, "draft_max": p.draft_max} for n, p in catalog.pairs.items()}}) + "\n")
        return
    from rich.table import Table

    t = Table(title="models")
    for col in ("name", "source", "present"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"] + (" (default)" if r["default"] else ""), r["source"], "yes" if r["present"] else "no")
    p = Table(title="pairs")
    for col in ("name", "target", "draft", "k"):
        p.add_column(col)
    for n, pe in catalog.pairs.items():
        p.add_row(n, pe.target, pe.draft, str(pe.draft_max or ""))
    from rich.console import Console

    con = Console()
    con.print(t)
    con.print(p)


@app.command()
def pull(name: Annotated[str, typer.Argument(help="A models.toml model or pair name, or hf:OWNER/REPO/FILE.gguf.")]) -> None:
    """Download a model (or both models of a pair) into the shared cache."""
    from specgen import registry

    path = registry.pull(name, registry.load_catalog())
    sys.stdout.write(f"{path}\n")


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
    """Entry point: one clear line on stderr for every error, no tracebacks."""
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
        _fail(exc.format_message() if hasattr(exc, "format_message") else str(exc))
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except BrokenPipeError:
        hang_up()
    raise SystemExit(rc if isinstance(rc, int) else 0)


def hang_up() -> None:
    """The reader closed stdout (`| head`): stop quietly with status 0, as Unix tools do."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush finds a sink
    except (OSError, ValueError, AttributeError):
        pass  # a stdout without a file descriptor (tests)
    raise SystemExit(0)


# The other commands live in their own modules (which import the option types above).
from specgen.cli_bench import bench as _bench  # noqa: E402 - the command lives in its own module
app.command("bench")(_bench)
from specgen.cli_tune import tune as _tune  # noqa: E402
app.command("tune")(_tune)
from specgen.cli_chat import chat as _chat, rewrite as _rewrite  # noqa: E402 - commands in their own module
app.command("chat")(_chat)
app.command("rewrite")(_rewrite)
