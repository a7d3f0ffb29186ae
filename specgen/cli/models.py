"""The model commands: `specgen models` (the catalog, or with --local the GGUF files on this machine),
`check` (a pair's tokenizers), `pull` (into the cache) and `pair` (the local drafts for a target)."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from typing_extensions import Annotated

import specgen.cli.render as render
from specgen.cli.options import JsonOpt, NglOpt, ThreadsOpt

VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="Also list the files left out, each with its reason.")]


def list_local(json_out: bool, verbose: bool) -> None:
    """The local listing, on stdout (the table, or one JSON object)."""
    from specgen.models.local import scan

    found = scan()
    if json_out:
        sys.stdout.write(json.dumps(found.to_dict()) + "\n")
        return
    from specgen.cli.render_models import print_local

    print_local(found, verbose)


def pair(
    target: Annotated[str, typer.Argument(help="Target model: a .gguf path, a models.toml name, hf:… or ollama:NAME[:TAG].")],
    save: Annotated[Optional[str], typer.Option(
        "--save", help="Write the chosen pair into your models file ($SPECGEN_MODELS, else "
                       "$XDG_CONFIG_HOME/specgen/models.toml) under this name ('-': the target's name), for --pair NAME.",
        show_default=False)] = None,
    threads: ThreadsOpt = None,
    gpu_layers: NglOpt = 0,
    json_out: JsonOpt = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Also list the local models that are not drafts for it, each with why.")] = False,
) -> None:
    """Rank the local models (`specgen models --local`) that can draft for TARGET: same vocabulary or
    usable by translation, at most half the target's file size; with the speedup predicted from this
    machine's measured costs where both have them. Exit 1 when none can."""
    from specgen.drafters.candidates import pair as rank_drafts
    from specgen.errors import SpecgenError
    from specgen.models import registry
    from specgen.models.catalog import user_models_file

    path = registry.resolve_model(target)
    got = rank_drafts(path, threads=threads, gpu_layers=gpu_layers)
    saved = None
    if save is not None:
        chosen = got.chosen
        if chosen is None:
            raise SpecgenError(f"no local draft for {path.name} to save (`specgen pair {target}` says why)")
        from specgen.models.pairing import model_name, save_pair

        tname = target if _is_name(target) else model_name(path)
        dname = model_name(chosen.model.path) if chosen.model.store != "ollama" else model_name(chosen.model.name)
        if dname == tname:
            dname += "-draft"
        name = tname if save in ("", "-") else save
        saved = save_pair(user_models_file(), name, (tname, path), (dname, chosen.model.path),
                          description=f"chosen by specgen pair: {chosen.reason()}")
    if json_out:
        obj = {"target": str(path), "target_size": got.target_size,
               "chosen": got.chosen.to_dict() if got.chosen else None,
               "candidates": [c.to_dict() for c in got.candidates], "rejected": [r.to_dict() for r in got.rejected],
               "saved": str(saved) if saved else None, "name": name if saved else None}
        sys.stdout.write(json.dumps(obj) + "\n")
    else:
        from specgen.cli.render_models import print_pairing

        print_pairing(got, verbose)
        if saved:
            from specgen.cli.render import stderr_console

            stderr_console().print(f"saved: [pairs.{name}] in {saved} (use --pair {name})", markup=False,
                                   highlight=False, soft_wrap=True)
    if not got.candidates:
        raise typer.Exit(1)


def _is_name(ref: str) -> bool:
    """A models.toml name (not a file, hf: or ollama: reference)."""
    from pathlib import Path

    from specgen.models.catalog import load_catalog

    if ref.startswith(("hf:", "ollama:")) or "/" in ref or Path(ref).expanduser().is_file():
        return False
    return ref in load_catalog().models


def check(
    target: Annotated[str, typer.Argument(help="Target model (path, models.toml name or hf: reference).")],
    draft: Annotated[str, typer.Argument(help="Draft model.")],
    json_out: JsonOpt = False,
) -> None:
    """Tokenizer compatibility report: exit 0 if the pair shares a vocabulary (1 otherwise,
    also when the draft is usable by translating its drafts through text)."""
    from specgen.models import registry
    from specgen.models.catalog import load_catalog
    from specgen.engine.llama import Engine
    from specgen.drafters.translated import translation_problem
    from specgen.models.vocab import compare

    catalog = load_catalog()
    tp = registry.resolve_model(target, catalog)
    dp = registry.resolve_model(draft, catalog)
    with Engine.vocab(tp) as te, Engine.vocab(dp) as de:
        report = compare(te, de)
        why_not = translation_problem(te, de) if not report.compatible else ""
    if json_out:
        obj = {**report.to_dict(), "translatable": report.compatible or not why_not}
        if why_not:
            obj["translation_problem"] = why_not
        sys.stdout.write(json.dumps(obj) + "\n")
    else:
        render.print_check(report, why_not)
    if not report.compatible:
        raise typer.Exit(1)


def models(
    local: Annotated[bool, typer.Option("--local", help="List the GGUF files already on this machine instead: the Hugging Face cache, Ollama's store, LM Studio's folder and $SPECGEN_MODEL_DIRS (header reads only).")] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="With --local: also the files left out (split, not GGUF, broken), each with its reason.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """List models.toml entries and whether each is present locally (--local: the GGUF files on this machine)."""
    if local:
        return list_local(json_out, verbose)
    from specgen.models import registry
    from specgen.models.catalog import DEFAULT_MODEL, load_catalog

    catalog = load_catalog()
    rows = []
    for name, e in catalog.models.items():
        where = e.path or (f"{e.repo}/{e.file}" if e.repo else f"pypi:{e.package}")
        rows.append({"name": name, "source": where, "present": registry.is_present(e), "default": name == DEFAULT_MODEL})
    if json_out:
        sys.stdout.write(json.dumps({"models": rows, "pairs": {n: {"target": p.target, "draft": p.draft, "draft_max": p.draft_max} for n, p in catalog.pairs.items()}}) + "\n")
        return
    render.print_models(rows, catalog.pairs)


def pull(name: Annotated[str, typer.Argument(help="A models.toml model or pair name, or hf:OWNER/REPO/FILE.gguf.")]) -> None:
    """Download a model (or both models of a pair) into the shared cache."""
    from specgen.models import registry

    path = registry.pull(name)
    sys.stdout.write(f"{path}\n")
