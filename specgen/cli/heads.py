"""`specgen heads train` and `specgen heads show`: prediction heads over a frozen target (docs/heads.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from specgen.cli import render
from specgen.errors import SpecgenError
from specgen.cli.options import JsonOpt, ModelOpt, ThreadsOpt

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Prediction heads (Medusa-1, Hydra) over the target's own hidden state: train, show.")

TextsArg = Annotated[list[Path] | None, typer.Argument(
    help="Text files whose passages seed the target's own continuations and are read teacher-forced (default: built-in seed prompts; Python's reference and standard library).",
    show_default=False)]
OutOpt = Annotated[Path | None, typer.Option("-o", "--out", help="Heads file (default: specgen's cache, heads/<target>.npz).")]


class TrainProgress:
    """A bar over the time budget with ETA, the phase, examples, loss and top-1 per head; on a pipe, a
    line every 15 s."""

    def __init__(self, con) -> None:
        self.con, self.bar, self.task, self.last = con, None, None, -1e9

    def __enter__(self):
        if self.con.is_terminal:
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                                TimeRemainingColumn(), console=self.con, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("heads", total=1.0)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, p) -> None:
        what = f"{p.phase}: {p.examples} examples"
        if p.phase == "train":
            what += f", step {p.steps}, loss {p.loss:.3f}, top-1 " + " ".join(f"{x:.2f}" for x in p.top1)
        if self.bar is not None:
            self.bar.update(self.task, total=p.budget_s, completed=min(p.elapsed_s, p.budget_s), description=what)
        elif p.elapsed_s - self.last >= 15:
            self.last = p.elapsed_s
            self.con.print(f"[{p.elapsed_s:.0f}/{p.budget_s:.0f} s] {what}")


@app.command("train")
def train(
    texts: TextsArg = None,
    model: ModelOpt = None,
    kind: Annotated[str, typer.Option("--kind", help="medusa (independent heads), hydra (each head sees the token drafted before it) or layer (a feature-level draft layer, EAGLE-style: attention over its own features, autoregressive; trained on replies to the seeds, read back through the target).")] = "hydra",
    writer: Annotated[str | None, typer.Option("--writer", help="layer: the model that writes the replies it trains on (a draft model of the same vocabulary: several times faster). Default: the target itself.")] = None,
    n_heads: Annotated[int, typer.Option("--n-heads", help="Heads: tokens drafted per round at most.")] = 4,
    vocab: Annotated[int | None, typer.Option("--vocab", help="Restricted vocabulary: the most frequent labels, at most this many (default: 2048 for heads, 4096 for a layer).", show_default=False)] = None,
    width: Annotated[int, typer.Option("--width", help="Each head's hidden width.")] = 128,
    minutes: Annotated[float, typer.Option("--minutes", help="Time budget for data and training together.")] = 15.0,
    seqs: Annotated[int, typer.Option("--seqs", help="Sequences generated at once while collecting data.")] = 16,
    text_share: Annotated[float, typer.Option("--text-share", help="Share of the data time spent reading text teacher-forced (the files, else Python's reference and standard library); the rest generates.")] = 0.0,
    round_share: Annotated[float, typer.Option("--round-share", help="Cut the vocabulary until a round of all heads costs at most this share of a one-row target pass (0: --vocab alone).")] = 0.10,
    resume: Annotated[bool, typer.Option("--resume", help="Continue training the heads file (same kind, heads and vocabulary).")] = False,
    out: OutOpt = None,
    threads: ThreadsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Train heads over the frozen target on its own outputs (self-distillation), in numpy: its continuations
    of seed prompts, and its predictions over text read in one pass."""
    from specgen.heads.fit import TrainOptions, check_options, open_target, train_heads
    from specgen.models.registry import resolve_model

    if kind == "layer":
        return _train_layer(texts, model, writer, n_heads, vocab, minutes, out, threads, json_out, resume)
    if writer is not None:
        raise SpecgenError("--writer writes the replies of --kind layer only")
    opts = TrainOptions(kind=kind, n_heads=n_heads, vocab=2048 if vocab is None else vocab, width=width, minutes=minutes, n_seq=seqs,
                        text_share=text_share, round_share=round_share)
    check_options(opts)
    path = resolve_model(model)
    con = render.stderr_console()
    engine = open_target(path, opts, threads)
    try:
        with TrainProgress(con) as progress:
            s = train_heads(engine, path, opts, texts=texts or (), out=out, resume=resume, on_progress=progress)
    finally:
        engine.close()
    if json_out:
        sys.stdout.write(json.dumps(s.as_dict()) + "\n")
        return
    top = " ".join("-" if x is None else f"{x:.2f}" for x in s.heldout.get("top1", []))
    stop = " (interrupted: saved what was trained)" if s.interrupted else ""
    con.print(f"{s.kind} heads ×{s.n_heads} for {s.target}: held-out top-1 per head {top or '-'} "
              f"({s.held_out} examples); vocabulary {s.vocab} covering {s.covered:.1%} of labels; "
              f"{s.examples} training examples ({s.text_examples} from text), {s.steps} steps, {s.seconds:.0f} s{stop}",
              soft_wrap=True)
    if s.timing:
        con.print(f"a round of the heads: {s.timing['heads_round_ms']:.2f} ms, "
                  f"{s.timing['heads_round_ms'] / s.timing['target_pass_ms']:.1%} of a one-row target pass", soft_wrap=True)
    con.print(str(s.path), soft_wrap=True)


def _train_layer(texts, model, writer_ref, n_heads, vocab, minutes, out, threads, json_out, resume) -> None:
    """`train --kind layer` (specgen.heads.layer_fit): --n-heads is its longest draft, --vocab its readout."""
    from specgen.engine.llama import Engine
    from specgen.heads.collect import seeds_from_files
    from specgen.heads.layer_fit import LayerOptions, check_layer_options, train_layer
    from specgen.models.registry import resolve_model
    from specgen.models.vocab import require_compatible

    opts = LayerOptions(minutes=minutes, n_heads=n_heads, vocab=4096 if vocab is None else vocab)
    check_layer_options(opts)
    path = resolve_model(model)
    seeds = [t for _, t in seeds_from_files(texts)] if texts else []
    con = render.stderr_console()
    n_ctx = max(1024, opts.reply_tokens + 768)  # a sequence's: prompt and reply, read in one pass
    # the writer's cache holds its `writers` replies at once, in one pool (kv_unified)
    many = dict(n_ctx=n_ctx * opts.writers, n_seq_max=opts.writers, kv_unified=True)
    with Engine(path, **(many if writer_ref is None else {"n_ctx": n_ctx}), n_threads=threads, hidden=True,
                n_batch=n_ctx) as engine:
        writer = Engine(resolve_model(writer_ref), **many, n_threads=threads) if writer_ref else None
        try:
            if writer is not None:
                require_compatible(engine, writer)
            with TrainProgress(con) as progress:
                s = train_layer(engine, path, opts, writer=writer, seeds=seeds, out=out, resume=resume,
                                on_progress=progress)
        finally:
            if writer is not None:
                writer.close()
    if json_out:
        sys.stdout.write(json.dumps(s) + "\n")
        return
    top = " ".join("-" if x is None else f"{x:.2f}" for x in s["heldout"]["top1"])
    stop = " (interrupted: saved what was trained)" if s["interrupted"] else ""
    runs = f" ({s['total_steps']} over {s['runs']} runs)" if s["resumed"] else ""
    if s["steps"] < 100 and not s["interrupted"]:
        stop += " (few steps: the replies took most of the budget; raise --minutes)"
    con.print(f"draft layer for {s['target']}: held-out top-1 at draft steps 1, 2 {top} "
              f"({s['heldout']['positions']} positions); readout {s['vocab']} ids covering {s['covered']:.1%} of labels; "
              f"{s['positions']} training positions from {s['replies']} replies by the {s['writer']}, "
              f"{s['steps']} steps{runs}, {s['seconds']:.0f} s{stop}", soft_wrap=True)
    con.print(s["path"], soft_wrap=True)


@app.command("show")
def show(
    file: Annotated[Path | None, typer.Argument(help="A heads file (default: the one for -m's target).", show_default=False)] = None,
    model: ModelOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """What a heads file holds: target, kind, heads, vocabulary and covered mass, data size, held-out top-1."""
    from specgen.heads.layer import load_any
    from specgen.heads.model import heads_path, target_identity

    if file is None:
        from specgen.models.registry import resolve_model

        file = heads_path(target_identity(resolve_model(model)))
    h = load_any(file, None)
    i = h.info
    held = i.get("heldout", {})
    data = {"file": str(file), "target": h.target, "kind": h.kind, "heads": h.n_heads, "width": h.width,
            "vocab": len(h.ids), "n_vocab": h.n_vocab, "covered": i.get("covered"), "examples": i.get("examples"),
            "held_out": i.get("held_out"), "steps": i.get("steps"), "best_step": i.get("best_step"), "runs": i.get("runs"),
            "text_examples": i.get("text_examples"), "timing": i.get("timing"),
            "top1": held.get("top1"), "top1_per_group": held.get("per_group", {}),
            "bytes": Path(file).stat().st_size}
    if json_out:
        sys.stdout.write(json.dumps(data) + "\n")
        return
    lines = [f"{key:>10}: {data[key]}" for key in ("file", "target", "kind", "heads", "width", "vocab", "n_vocab",
                                                     "covered", "examples", "text_examples", "held_out", "steps",
                                                     "best_step", "runs", "bytes")]
    if data["timing"]:
        t = data["timing"]
        lines.append(f"{'round':>10}: {t['heads_round_ms']:.2f} ms of {t['target_pass_ms']:.2f} ms for a one-row target pass "
                     f"(bound {t['round_share']:.0%})")
    lines.append(f"{'top-1':>10}: " + _heads_line(data["top1"]))
    lines += [f"{group:>10}: " + _heads_line(accs) for group, accs in sorted(data["top1_per_group"].items())]
    sys.stdout.write("\n".join(lines) + "\n")


def _heads_line(accs) -> str:
    return " ".join("-" if a is None else f"{a:.3f}" for a in (accs or [])) or "-"
