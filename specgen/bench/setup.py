"""Bench models: the target opened once, each distinct draft model (heads file) once, in one `Session`.

Each configuration's drafter is built through the one `build_drafter`
(specgen.drafters.build), from the configuration's `DrafterOptions`; the
runners ask `Setup.new_drafter` for a fresh one where a run needs fresh
indexes (a server's, a repeat's global suffix index).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from specgen.models.catalog import AUTO_PAIR, load_catalog
from specgen.bench.configs import PLAIN, Config
from specgen.drafters.build import build_drafter
from specgen.engine.llama import Engine
from specgen.errors import SpecgenError
from specgen.models import registry
from specgen.heads.model import time_heads
from specgen.plan import Kind, default_k
from specgen.session import Session, open_heads


@dataclass
class Setup:
    """The loaded models: one target engine shared by every configuration."""

    target: object  # specgen.engine.llama.Engine
    target_path: Path
    configs: list[Config]  # resolved; plain first
    drafters: dict[str, object]  # config name → drafter (None for plain)
    draft_engines: dict[str, object] = field(default_factory=dict)  # config name → its draft Engine
    session: Session | None = None  # what holds the opened models (closed by `close`)
    opened: dict[str, object] = field(default_factory=dict)  # config name → its OpenedDraft
    heads: dict[str, object] = field(default_factory=dict)  # config name → its loaded heads
    heads_step_s: dict[str, float] = field(default_factory=dict)  # config name → its heads' timed step

    def new_drafter(self, config: Config):
        """A fresh drafter for `config` (new indexes), over its draft model (or heads) if it has one."""
        return build_drafter(config.drafter_options(), self.target, self.opened.get(config.name),
                             self.heads.get(config.name))

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def _auto(model: str | None, c: Config, catalog) -> Config:
    """pair=auto: a draft config with the chosen local draft (said in one note), else prompt lookup."""
    from specgen.drafters.candidates import choose
    from specgen.notes import note

    path, line = choose(registry.resolve_model(model, catalog))
    note(line)
    if path is None:
        return Config("lookup", c.k or default_k(Kind.LOOKUP, c.policy), policy=c.policy, k_given=c.k_given)
    return replace(c, kind="draft", pair=None, draft=str(path), k=c.k or default_k(Kind.DRAFT, c.policy))


def _resolve_pairs(model: str | None, configs: list[Config], catalog) -> tuple[str | None, list[Config]]:
    out, targets = [], {}
    for c in configs:
        if c.kind != "pair":
            out.append(c)
            continue
        if c.pair == AUTO_PAIR:  # the best local draft for the bench's target, as `run --pair auto`
            out.append(_auto(model, c, catalog))
            continue
        p = registry.resolve_pair(c.pair, catalog)
        targets[c.pair] = p.target
        # a pair's draft_max is its k, as `specgen run --pair` reads it
        out.append(replace(c, k=c.k or p.draft_max or default_k(Kind.DRAFT, c.policy), draft=p.draft,
                           k_given=c.k_given or bool(p.draft_max)))
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
    seen: set[str] = set()  # pair=auto may come to a configuration already listed
    return model, [c for c in out if not (c.name in seen or seen.add(c.name))]


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
    wants_heads = any(c.kind == "heads" for c in configs)
    loaded = {ref: open_heads(ref, target_path, model) for ref in {c.heads for c in configs if c.kind == "heads"}}
    # with heads among the configurations the target keeps hidden states for every one, plain included
    session = Session(Engine(target_path, **kw, hidden=wants_heads), target_path, engine_kw=kw)
    setup = Setup(session.target, target_path, [PLAIN, *configs], {"plain": None}, session=session)
    try:
        if loaded:
            session.hold_blas()
        timed = {ref: time_heads(h, session.target.n_embd) for ref, h in loaded.items()}
        for c in configs:
            if c.kind == "heads":
                setup.heads[c.name], setup.heads_step_s[c.name] = loaded[c.heads], timed[c.heads]
            if c.drafts_with_model:
                # configurations of one draft model share its engine (runs are sequential;
                # a drafter keeps nothing between generations but its engine's cache)
                setup.opened[c.name] = session.open_draft(draft_paths[c.name])
                setup.draft_engines[c.name] = setup.opened[c.name].engine
            # suffix: the runners build one per repeat (or batch); this one is for warm-ups
            setup.drafters[c.name] = setup.new_drafter(c)
    except BaseException:
        setup.close()
        raise
    return setup
