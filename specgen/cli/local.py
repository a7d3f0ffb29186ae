"""`specgen models --local` (the GGUF files on this machine) and `specgen pair` (the drafts among them for a target)."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from typing_extensions import Annotated

from specgen.cli.options import JsonOpt, NglOpt, ThreadsOpt

VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="Also list the files left out, each with its reason.")]


def list_local(json_out: bool, verbose: bool) -> None:
    """The local listing, on stdout (the table, or one JSON object)."""
    from specgen.models.local import scan

    found = scan()
    if json_out:
        sys.stdout.write(json.dumps(found.to_dict()) + "\n")
        return
    from specgen.cli.render_local import print_local

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
    from specgen.drafters.pairing import pair as rank_drafts
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
        from specgen.cli.render_local import print_pairing

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
