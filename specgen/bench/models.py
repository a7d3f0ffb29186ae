"""Bench models: the target loaded once, each distinct draft model once (through specgen.session)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from specgen.models import registry
from specgen.models.catalog import load_catalog
from specgen.bench.configs import PLAIN, Config
from specgen.drafters.lookup import ALONGSIDE_NGRAM_MIN, PromptLookup
from specgen.drafters.model import WithLookup
from specgen.engine.llama import Engine
from specgen.errors import SpecgenError
from specgen.session import DEFAULT_DRAFT_MAX, open_draft


@dataclass
class Setup:
    """The loaded models: one target engine shared by every configuration."""

    target: object  # specgen.engine.llama.Engine
    target_path: Path
    configs: list[Config]  # resolved; plain first
    drafters: dict[str, object]  # config name → drafter (None for plain)
    draft_engines: dict[str, object] = field(default_factory=dict)  # config name → its draft Engine
    _owned: list = field(default_factory=list)

    def close(self) -> None:
        for e in reversed(self._owned):
            e.close()
        self._owned.clear()


def _resolve_pairs(model: str | None, configs: list[Config], catalog) -> tuple[str | None, list[Config]]:
    out, targets = [], {}
    for c in configs:
        if c.kind != "pair":
            out.append(c)
            continue
        p = registry.resolve_pair(c.pair, catalog)
        targets[c.pair] = p.target
        out.append(replace(c, k=c.k or p.draft_max or DEFAULT_DRAFT_MAX["draft"], draft=p.draft))
    if model is None and targets:
        distinct = {registry.resolve_model(t, catalog) for t in targets.values()}
        if len(distinct) > 1:
            raise SpecgenError(f"pairs {', '.join(targets)} have different targets: one bench measures one target (give -m)")
        model = next(iter(targets.values()))
    if targets:
        tpath = registry.resolve_model(model, catalog)
        for name, t in targets.items():
            if registry.resolve_model(t, catalog) != tpath:
                raise SpecgenError(f"pair '{name}' has target '{t}', but this bench measures {tpath.name}")
    return model, out


def suffix_drafter(config: Config):
    """A fresh suffix-index drafter for a suffix configuration: its global index (if on) starts empty."""
    from specgen.drafters.suffix import SuffixDrafter

    return SuffixDrafter(global_cache=config.global_cache, min_match=config.ngram_min)


def open_bench(
    model: str | None,
    configs: Sequence[Config],
    *,
    ctx_size: int = 4096,
    threads: int | None = None,
    gpu_layers: int = 0,
    catalog=None,
    n_seq_max: int = 1,
) -> Setup:
    """Load the target once and each distinct draft model once; build every drafter.

    n_seq_max > 1 (a concurrency sweep) opens every context with that many
    sequences over one unified KV pool of ctx_size tokens (see specgen.serve.scheduler).
    """
    catalog = catalog if catalog is not None else load_catalog()
    model, configs = _resolve_pairs(model, list(configs), catalog)
    target_path = registry.resolve_model(model, catalog)
    draft_paths = {c.name: registry.resolve_model(c.draft, catalog) for c in configs if c.drafts_with_model}
    kw = dict(n_ctx=ctx_size, n_threads=threads, n_gpu_layers=gpu_layers)
    if n_seq_max > 1:
        kw.update(n_seq_max=n_seq_max, kv_unified=True)
    target = Engine(target_path, **kw)
    setup = Setup(target, target_path, [PLAIN, *configs], {"plain": None}, _owned=[target])
    try:
        opened: dict[Path, object] = {}
        for c in configs:
            if c.kind == "lookup":
                setup.drafters[c.name] = PromptLookup(c.ngram_max, c.ngram_min)
                continue
            if c.kind == "suffix":  # the runners build one per repeat (or batch); this one is for warm-ups
                setup.drafters[c.name] = suffix_drafter(c)
                continue
            path = draft_paths[c.name]
            if path not in opened:
                opened[path] = open_draft(target, path, **kw)
                setup._owned.append(opened[path].engine)
            # configurations of one draft model share it (runs are sequential; a
            # drafter keeps nothing between generations but its engine's cache)
            setup.drafters[c.name] = (WithLookup(opened[path], PromptLookup(c.ngram_max, ALONGSIDE_NGRAM_MIN))
                                      if c.lookup_alongside else opened[path])
            setup.draft_engines[c.name] = opened[path].engine
    except BaseException:
        setup.close()
        raise
    return setup
