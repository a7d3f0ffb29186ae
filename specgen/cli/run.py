"""`specgen run`: one completion (a prompt, a file or stdin), streamed or as one JSON object."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

import specgen.cli.render as render
from specgen.cli.options import (
    MACHINE, MODEL, NGRAM, POLICY, SAMPLING, Told, check_max_tokens, read_prompt, takes,
)
from specgen.errors import SpecgenError

RUN_TOLD = dict(
    system=Told("A system turn before the prompt's user turn, through the model's chat template (not with --raw)."),
)


def prompt_tokens(target, text: str, system: str | None, raw: bool) -> tuple[list[int] | str, str]:
    """What run feeds the model, and which template made it ("gguf" | "raw"): the text as the
    user turn of the GGUF's chat template (after a system turn), or, with --raw or a base
    model (no template in its GGUF), the text itself."""
    from specgen.apps.chat import format_for, one_turn

    if raw or not target.chat_template():
        if system:
            raise SpecgenError("--system sets a system turn of the chat template: not with --raw" if raw else
                               "--system needs a chat template, and this model's GGUF has none (a base model: "
                               "run completes the prompt as it is)")
        return text, "raw"
    return one_turn(format_for(target, "gguf"), target, text.strip(), system), "gguf"


@takes("prompt", "file", "system", "raw", *MODEL, "max_tokens", *SAMPLING, "ignore_eos", *MACHINE, *NGRAM, *POLICY,
       "json_out", "suffix", "tree_width", **RUN_TOLD)
def run(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt (after any piped stdin): the user turn of the model's chat template, or with --raw the text to complete.")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="Read the prompt from FILE ('-' = stdin).")] = None,
    tree_width: Annotated[int, typer.Option("--tree-width", help="With --suffix: draft trees of up to N branches, verified in one pass (off: 1; on 2 CPU cores measured slower, see docs/how-it-works.md).")] = 1,
    *, opts, params, system, raw, max_tokens, ignore_eos, json_out,
) -> None:
    """Answer the prompt through the model's chat template (a base model, or --raw: complete it
    verbatim), streaming tokens; stats on stderr."""
    from specgen.session import open_session

    check_max_tokens(max_tokens)
    params.validate()
    opts.validate()
    if raw and system:
        raise SpecgenError("--system sets a system turn of the chat template: not with --raw")
    text_in = read_prompt(prompt, file)
    loaded = open_session(opts)
    render.note_translated(loaded.translated)
    try:
        target = loaded.target
        fed, template = prompt_tokens(target, text_in, system, raw)
        status = render.StatusLine() if not json_out else None
        gen = loaded.generate(fed, max_tokens=max_tokens, params=params, ignore_eos=ignore_eos,
                              on_prefill=(lambda done, total: status.show(render.prefill_status(done, total)))
                              if status else None)
        stream = render.TextStream(target, None if json_out else sys.stdout)
        start = time.perf_counter()

        def show(st, r) -> None:
            status.show(render.round_status(st, r, time.perf_counter() - start))

        if status:
            status.start()
        try:
            interrupted = render.follow(gen, stream, show if status else None)
        finally:
            if status:
                status.stop()
        st = gen.stats
        if json_out:
            render.write_json({**render.generation_json(target.detokenize(gen.tokens), gen.tokens, loaded.mode, st,
                                                        loaded.draft_max, loaded.policy_name), "template": template})
        else:
            if sys.stdout.isatty() and stream.text and not stream.text.endswith("\n"):
                sys.stdout.write("\n")
                sys.stdout.flush()
            render.stderr_console().print(render.stats_table(st, loaded.label, loaded.draft_max, loaded.policy_name))
        if interrupted:
            raise typer.Exit(130)
    except BrokenPipeError:  # typer would turn it into exit 1 before main() sees it
        render.hang_up()
    finally:
        loaded.close()
