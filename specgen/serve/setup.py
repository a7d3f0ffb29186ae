"""Open the models for serving and build the scheduler that `specgen serve` runs.

specgen.session.open_session with `parallel` sequences over one unified KV pool
(what specgen.serve.scheduler needs); one drafter serves every slot (a draft
model drafts all sequences together in its own context).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from specgen.errors import SpecgenError
from specgen.plan import Kind
from specgen.session import ModelOptions, Session, make_gate, open_session

CACHE_RAM_MIB = 1024  # host memory for prompt states saved from slots (llama-server's --cache-ram: 8192)


@dataclass
class Serving:
    """What the engine thread serves with; `new_server()` builds a fresh scheduler."""

    session: Session  # the opened models (closed by `close`)
    model_id: str
    parallel: int
    new_server: Callable[[], object]

    @property
    def target(self):
        return self.session.target

    def close(self) -> None:
        self.session.close()


def open_serving(opts: ModelOptions, parallel: int, *, prompt_cache: bool = True,
                 cache_ram_mib: int = CACHE_RAM_MIB, catalog=None, settings=None) -> Serving:
    """Load the target (and its drafter) with `parallel` sequences in one unified
    context (through open_session, as every command); the scheduler factory
    (`settings`: the schedulers' SchedulerSettings; None: the defaults)."""
    from specgen.serve.promptstore import PromptStore
    from specgen.serve.scheduler import MAX_SLOTS, SchedulerSettings, Server

    if not 1 <= parallel <= MAX_SLOTS:
        raise SpecgenError(f"--parallel must be in 1..{MAX_SLOTS} (got {parallel})")
    session = open_session(replace(opts, n_seq=parallel), catalog)
    target, k = session.target, session.draft_max
    try:
        if parallel * (k + 1) > target.n_batch:
            raise SpecgenError(
                f"--parallel {parallel} × {k + 1} verify rows exceed a batch of {target.n_batch} rows (lower -k or --parallel)"
            )
        _on_a_passing_thread(session.new_policy)  # measure costs now: measuring uses sequence 0
    except BaseException:
        session.close()
        raise

    # states saved from slots outlive a scheduler that an engine failure replaced
    store = PromptStore(cache_ram_mib << 20) if prompt_cache and cache_ram_mib > 0 else None
    settings = replace(settings or SchedulerSettings(), prompt_cache=prompt_cache)

    def new_server() -> Server:
        drafter = session.drafter
        if session.mode is Kind.LOOKUP:
            drafter = session.new_drafter()  # fresh indexes for a fresh server
        # Each request learns its own acceptance (a fresh prior drafts, and
        # requests differ); only a drafter that carries an index across requests
        # (suffix with its global index) carries its statistics too.
        shared = drafter.policy_stats if drafter is not None else None
        return Server(target, parallel, draft_max=k, drafter=drafter,
                      store=store, settings=settings, gate=make_gate(session.policy_name),
                      new_policy=lambda: session.new_policy(shared=shared))

    return Serving(session, _model_id(session.target_path), parallel, new_server)


def _on_a_passing_thread(fn) -> None:
    """fn() on a thread that ends when it returns (its exception raised here).
    llama.cpp's CPU backend keeps an OpenMP team for each thread that decodes; a
    team left behind on this thread beside the engine thread's own makes libgomp
    see more threads than cores and sleep at every barrier of every later pass
    (docs/notes/2026-12-07-serving-threads.md)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="specgen-measure") as pool:
        pool.submit(fn).result()


def _model_id(path: Path) -> str:
    return path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
