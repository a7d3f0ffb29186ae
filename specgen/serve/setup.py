"""Open the models for serving and build the scheduler that `specgen serve` runs.

loader.open_models with `parallel` sequences over one unified KV pool (what
specgen.serve.scheduler needs); one drafter serves every slot (a draft model drafts all
sequences together in its own context).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specgen.errors import SpecgenError
from specgen.session import ModelOptions

CACHE_RAM_MIB = 1024  # host memory for prompt states saved from slots (llama-server's --cache-ram: 8192)


@dataclass
class Serving:
    """What the engine thread serves with; `new_server()` builds a fresh scheduler."""

    target: object
    mode: str  # plain | lookup | draft
    draft_max: int
    policy_name: str
    model_id: str
    parallel: int
    new_server: Callable[[], object]
    ignore_eos: bool = False
    owned: list = field(default_factory=list)  # engines to close
    translated: bool = False  # the draft model drafts through text (another vocabulary)

    def close(self) -> None:
        for e in reversed(self.owned):
            e.close()
        self.owned.clear()


def open_serving(opts: ModelOptions, parallel: int, *, ignore_eos: bool = False, prompt_cache: bool = True,
                 cache_ram_mib: int = CACHE_RAM_MIB, catalog=None, settings=None) -> Serving:
    """Load the target (and its drafter) with `parallel` sequences in one unified
    context (through loader.open_models, as every command); the scheduler factory
    (`settings`: the schedulers' SchedulerSettings; None: the defaults)."""
    from dataclasses import replace

    from specgen.drafters.lookup import PromptLookup
    from specgen.session import make_gate, make_policy, open_models
    from specgen.serve.promptstore import PromptStore
    from specgen.serve.scheduler import MAX_SLOTS, SchedulerSettings, Server

    if not 1 <= parallel <= MAX_SLOTS:
        raise SpecgenError(f"--parallel must be in 1..{MAX_SLOTS} (got {parallel})")
    loaded = open_models(replace(opts, n_seq=parallel), catalog)
    target, k = loaded.target, loaded.draft_max
    try:
        if parallel * (k + 1) > target.n_batch:
            raise SpecgenError(
                f"--parallel {parallel} × {k + 1} verify rows exceed a batch of {target.n_batch} rows (lower -k or --parallel)"
            )
        make_policy(loaded.policy_name, k, target, loaded.draft_engine)  # measure costs now: measuring uses sequence 0
    except BaseException:
        loaded.close()
        raise

    # states saved from slots outlive a scheduler that an engine failure replaced
    store = PromptStore(cache_ram_mib << 20) if prompt_cache and cache_ram_mib > 0 else None
    settings = settings or SchedulerSettings()

    def new_server() -> Server:
        drafter = loaded.drafter
        if loaded.mode == "lookup":
            drafter = PromptLookup(opts.ngram_max, opts.lookup_ngram_min())  # fresh indexes for a fresh server
        # Each request learns its own acceptance (a fresh prior drafts, and
        # requests differ); only a drafter that carries an index across requests
        # (suffix with its global index) carries its statistics too.
        shared = getattr(drafter, "policy_stats", None)
        return Server(target, parallel, draft_max=k, drafter=drafter, ignore_eos=ignore_eos, prompt_cache=prompt_cache, store=store,
                      settings=settings, gate=make_gate(loaded.policy_name), new_policy=lambda: make_policy(loaded.policy_name, k, target, loaded.draft_engine, shared=shared))

    owned = [e for e in (loaded.draft_engine, target) if e is not None]
    return Serving(target, loaded.mode, k, loaded.policy_name, _model_id(loaded.target_path), parallel, new_server,
                   ignore_eos, owned, translated=loaded.translated)


def _model_id(path: Path) -> str:
    return path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
