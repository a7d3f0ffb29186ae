"""`specgen rewrite`: a file rewritten as instructed, streamed or written atomically; prompt
lookup drafts its unchanged lines. The logic lives in specgen.apps.rewrite; the printing in render."""

from __future__ import annotations

import sys
import time
from typing import Optional

import typer
from typing_extensions import Annotated

import specgen.cli.render as render
from specgen.cli.chat import stats_table
from specgen.cli.options import MACHINE, MODEL, NGRAM, SAMPLING, Told, check_max_tokens, read_stdin_bytes, takes
from specgen.errors import SpecgenError
from specgen.plan import Kind

REWRITE_TOLD = dict(
    max_tokens=Told("Tokens to generate at most (default: twice the file's, within the context).", None, Optional[int]),
    template=Told("auto (the GGUF's chat template, else a completion-style prompt), none, gguf, gemma, plain, or a Jinja file."),
)


@takes("file", "instruction", "output", "in_place", "no_backup", "show_diff", *MODEL, "max_tokens", *SAMPLING, *MACHINE, *NGRAM,
       "template", **REWRITE_TOLD)
def rewrite(
    file: Annotated[str, typer.Argument(help="The file to rewrite ('-' = stdin).", show_default=False)],
    instruction: Annotated[str, typer.Option("-i", "--instruction", help="What to do with the file.")],
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Write the result to OUT (atomically) instead of stdout.", metavar="OUT")] = None,
    in_place: Annotated[bool, typer.Option("--in-place", help="Replace FILE atomically; the old one is kept as FILE.bak.")] = False,
    no_backup: Annotated[bool, typer.Option("--no-backup", help="With --in-place: keep no FILE.bak.")] = False,
    show_diff: Annotated[bool, typer.Option("--diff", help="Show a unified diff of the change on stderr.")] = False,
    *, opts, params, max_tokens, draft_max, ctx_size, template,
) -> None:
    """Rewrite a file as instructed; prompt lookup drafts from the file by default."""
    from specgen.apps import rewrite as rw
    from specgen.apps.chat import format_for
    from specgen.session import open_session

    note = render.note
    check_max_tokens(max_tokens)
    params.validate()
    opts.validate()
    if not instruction.strip():
        raise SpecgenError("empty instruction: -i/--instruction says what to do with the file")
    rw.check_options(file, output, in_place, no_backup)
    src = rw.read_source(file, read_stdin_bytes, rw.max_bytes_for(ctx_size))
    plan = rw.plan_output(src, output, in_place, no_backup)
    loaded = open_session(opts)
    render.note_translated(loaded.translated)
    try:
        target = loaded.target
        use_template = template or "auto"
        if use_template == "none" or (use_template == "auto" and not target.chat_template()):
            fmt = None
        else:
            fmt = format_for(target, use_template)
        prompt = rw.build_prompt(target, instruction, src.text, fmt)
        rw.check_fits(prompt, target.n_ctx, src.name)
        limit = max_tokens or rw.default_max_tokens(prompt, target.n_ctx)
        status = render.StatusLine(shared_terminal=sys.stdout.isatty() and plan.path is None)
        gen = loaded.generate(prompt.tokens, max_tokens=limit, params=params,
                              on_prefill=lambda done, total: status.show(render.prefill_status(done, total)))
        policy = gen.policy if loaded.mode is not Kind.PLAIN else None
        dest = plan.path or "stdout"
        note(
            f"rewriting {src.name} ({prompt.content_tokens} tokens) to {dest} · "
            f"{loaded.mode}{' ' + render.k_label(loaded.draft_max, policy) if loaded.mode != 'plain' else ''} · "
            f"prompt {'template ' + fmt.name if fmt else 'completion-style'}"
        )
        stream = render.TextStream(target, sys.stdout if plan.path is None else None, [prompt.stop])
        start = time.perf_counter()
        status.start()
        try:
            interrupted = render.follow(gen, stream, lambda st, r: status.show(render.round_status(st, r, time.perf_counter() - start)))
        finally:
            status.stop()
        new_text = rw.finish_text(stream.text, src.text)
        streamed = "".join(stream.written)
        if plan.path is None and new_text.startswith(streamed):  # the newline that went with the fence
            sys.stdout.write(new_text[len(streamed) :])
            sys.stdout.flush()
        st = gen.stats
        table = stats_table(st, loaded.label, loaded.draft_max, policy)
        table.add_row("from drafts", f"{st.accepted} of {st.generated} output tokens ({render.pct(rw.draft_share(st.accepted, st.generated))})")
        if interrupted:
            render.stderr_console().print(table)
            note(f"interrupted: {plan.path} left unchanged" if plan.path else "interrupted")
            raise typer.Exit(130)
        if st.stop_reason in ("max_tokens", "context_full"):
            render.stderr_console().print(table)
            raise SpecgenError(
                f"the rewrite reached {st.generated} tokens before the model finished: "
                + (f"{plan.path} left unchanged" if plan.path else "output incomplete")
                + " (raise -n/--max-tokens" + (" or -c/--ctx-size)" if st.stop_reason == "context_full" else ")")
            )
        if show_diff:
            render.show_diff(rw.unified_diff(src.text, new_text, src.name))
        if plan.path is not None:
            if plan.in_place and new_text == src.text:
                render.stderr_console().print(table)
                note(f"no changes: {src.name} left as it was")
                return
            rw.atomic_write(plan.path, new_text.encode("utf-8"), backup=plan.backup, mode=plan.mode)
        render.stderr_console().print(table)
        if plan.path is not None:
            note(f"wrote {plan.path}" + (f" (the old file is {plan.backup})" if plan.backup else ""))
    except BrokenPipeError:
        render.hang_up()
    finally:
        loaded.close()
