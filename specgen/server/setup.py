"""Open the models for serving and build the scheduler that `specgen serve` runs.

Like loader.open_models, but every context holds `parallel` sequences over one
unified KV pool (specgen.serving needs that), and a draft model drafts all
sequences together (BatchedDraftModel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specgen import registry
from specgen.errors import SpecgenError
from specgen.loader import ADAPTIVE_K_MAX, DEFAULT_DRAFT_MAX, ModelOptions


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

    def close(self) -> None:
        for e in reversed(self.owned):
            e.close()
        self.owned.clear()


def policy_factory(name: str, k: int, target, draft_engine=None) -> Callable[[], object]:
    """A fresh policy per request. Cost-aware ones share one acceptance estimate
    per server, so a new request starts from what earlier ones taught."""
    from specgen import policy
    from specgen.serving import BatchCostAware

    if name == "fixed" or k == 0:
        return policy.FixedK
    if name == "heuristic":
        return lambda: policy.Heuristic(k)
    from specgen.costs import cost_profile

    verify = cost_profile(target)["verify_s"]
    step = cost_profile(draft_engine)["verify_s"][1] if draft_engine is not None else 0.0
    shared: dict = {}

    def make() -> BatchCostAware:
        p = BatchCostAware(k, verify, step)
        p.stats = shared
        return p

    return make


def open_serving(opts: ModelOptions, parallel: int, *, ignore_eos: bool = False, catalog=None) -> Serving:
    """Load the target (and draft model) with `parallel` sequences; the scheduler factory."""
    from specgen.drafters import PromptLookup
    from specgen.engine import Engine
    from specgen.loader import open_draft
    from specgen.serving import MAX_SLOTS, BatchedDraftModel, Server

    opts.validate()
    if not 1 <= parallel <= MAX_SLOTS:
        raise SpecgenError(f"--parallel must be in 1..{MAX_SLOTS} (got {parallel})")
    catalog = catalog or registry.load_catalog()
    model_ref, draft_ref, draft_max = opts.model, opts.draft, opts.draft_max
    if opts.pair:
        pair = registry.resolve_pair(opts.pair, catalog)
        model_ref = model_ref or pair.target
        if not (opts.lookup or opts.no_spec):
            draft_ref = draft_ref or pair.draft
        draft_max = draft_max or pair.draft_max
    target_path = registry.resolve_model(model_ref, catalog)
    draft_path = registry.resolve_model(draft_ref, catalog) if draft_ref else None
    mode = "plain" if opts.no_spec else "draft" if draft_path else "lookup"
    policy_name = "fixed" if mode == "plain" else opts.policy_name
    default_k = DEFAULT_DRAFT_MAX if policy_name == "fixed" else ADAPTIVE_K_MAX
    k = 0 if mode == "plain" else (draft_max or default_k[mode])

    kw = dict(n_ctx=opts.ctx_size, n_threads=opts.threads, n_gpu_layers=opts.gpu_layers,
              n_seq_max=parallel, kv_unified=True)
    target = Engine(target_path, **kw)
    owned = [target]
    try:
        if parallel * (k + 1) > target.n_batch:
            raise SpecgenError(
                f"--parallel {parallel} × {k + 1} verify rows exceed a batch of {target.n_batch} rows (lower -k or --parallel)"
            )
        draft_engine = None
        server_kw: dict = {}
        if mode == "draft":
            dm = open_draft(target, draft_path, p_min=opts.p_min, **kw)
            draft_engine = dm.engine
            owned.append(draft_engine)
            server_kw["batched"] = lambda: BatchedDraftModel(draft_engine, dm.n_shared, dm.n_target_vocab, dm.p_min)
        elif mode == "lookup":
            server_kw["drafter_for"] = lambda seq: PromptLookup(opts.ngram_max, opts.ngram_min)
        new_policy = policy_factory(policy_name, k, target, draft_engine)
    except BaseException:
        for e in reversed(owned):
            e.close()
        raise

    def new_server() -> Server:
        kw2 = dict(server_kw)
        if "batched" in kw2:
            kw2["batched"] = kw2["batched"]()
        return Server(target, parallel, draft_max=k, new_policy=new_policy, ignore_eos=ignore_eos, **kw2)

    return Serving(target, mode, k, policy_name, _model_id(target_path), parallel, new_server, ignore_eos, owned)


def _model_id(path: Path) -> str:
    return path.name[: -len(".gguf")] if path.name.endswith(".gguf") else path.name
