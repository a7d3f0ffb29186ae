"""Open what a command asked for: the target engine and its drafter.

Resolves model references through the registry, drafts through text
(specgen.drafters.translated) with a draft model whose tokenizer differs from the
target's, refusing only one that cannot encode text, and says which mode the
run is in ("plain", "lookup", "suffix" or "draft"; `Loaded.translated` for a
translated draft, which the CLI reports in one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specgen.models import registry
from specgen.drafters.lookup import ALONGSIDE_NGRAM_MIN, NGRAM_MAX, PromptLookup
from specgen.drafters.model import DraftModel, WithLookup
from specgen.drafters.base import Drafter
from specgen.engine.llama import Engine
from specgen.errors import SpecgenError


@dataclass
class ModelOptions:
    model: str | None = None
    draft: str | None = None
    lookup: bool | None = None  # None: alongside a draft model under the cost policy; True: always; False: never
    no_spec: bool = False
    pair: str | None = None
    draft_max: int | None = None
    ctx_size: int = 4096
    threads: int | None = None
    gpu_layers: int = 0
    ngram_max: int = NGRAM_MAX
    ngram_min: int | None = None  # None: 1, or ALONGSIDE_NGRAM_MIN beside a draft model
    n_seq: int = 1
    adaptive: str | None = None  # cost | heuristic | fixed; None: cost, or fixed when -k is given
    p_min: float = 0.0
    drafter: str | None = None  # "suffix": the suffix index instead of prompt lookup
    global_cache: bool = False  # suffix: also draft from earlier requests of this process
    suffix_choice: str = "latest"  # suffix: latest occurrence's continuation, or "frequent"
    tree_width: int = 1  # suffix: draft trees of up to this many branches (specgen.decode.tree)

    def lookup_ngram_min(self, alongside: bool = False) -> int:
        """Prompt lookup's shortest match: as given, else 1 (2 beside a draft model)."""
        if self.ngram_min is not None:
            return self.ngram_min
        return ALONGSIDE_NGRAM_MIN if alongside else 1

    def validate(self) -> None:
        chosen = [name for name, on in (("-d/--draft", self.draft), ("--lookup", self.lookup and not self.draft),
                                        ("--no-spec", self.no_spec),
                                        ("--suffix", self.drafter == "suffix")) if on]
        if len(chosen) > 1:
            raise SpecgenError(f"choose one of {', '.join(chosen)}")
        if self.draft_max is not None and self.draft_max < 1:
            raise SpecgenError(f"-k/--draft-max must be >= 1 (got {self.draft_max})")
        if self.ctx_size < 16:
            raise SpecgenError(f"-c/--ctx-size must be >= 16 (got {self.ctx_size})")
        if self.threads is not None and self.threads < 1:
            raise SpecgenError(f"-t/--threads must be >= 1 (got {self.threads})")
        if not 1 <= self.lookup_ngram_min() <= self.ngram_max:
            raise SpecgenError("n-gram sizes need 1 <= --ngram-min <= --ngram-max")
        if self.adaptive is not None and self.adaptive not in POLICIES:
            raise SpecgenError(f"unknown --adaptive policy '{self.adaptive}' (choose {', '.join(POLICIES)})")
        if not 0.0 <= self.p_min < 1.0:
            raise SpecgenError(f"--p-min must be in [0, 1) (got {self.p_min})")
        if self.tree_width < 1:
            raise SpecgenError(f"--tree-width must be >= 1 (got {self.tree_width})")
        if self.tree_width > 1 and (self.drafter != "suffix" or self.n_seq > 1):
            raise SpecgenError("--tree-width needs --suffix (and one sequence)")
        if self.drafter not in (None, "lookup", "suffix"):
            raise SpecgenError(f"unknown drafter '{self.drafter}' (choose lookup or suffix)")
        from specgen.drafters.automaton import CHOICES

        if self.suffix_choice not in CHOICES:
            raise SpecgenError(f"unknown suffix continuation '{self.suffix_choice}' (choose {', '.join(CHOICES)})")

    @property
    def policy_name(self) -> str:
        if self.adaptive:
            return self.adaptive
        return "fixed" if self.draft_max is not None else "cost"


@dataclass
class Loaded:
    target: Engine
    drafter: Drafter | None
    mode: str  # plain | lookup | suffix | draft
    draft_max: int
    target_path: Path
    draft_path: Path | None = None
    draft_engine: Engine | None = None
    policy_name: str = "fixed"
    translated: bool = False  # the draft's vocabulary differs: its drafts are translated through text

    @property
    def label(self) -> str:
        """The mode as people read it: "draft + lookup" when lookup drafts alongside the model."""
        return "draft + lookup" if isinstance(self.drafter, WithLookup) else self.mode

    def new_policy(self):
        """A fresh policy for one generation (its estimates start from the priors)."""
        return make_policy(self.policy_name, self.draft_max, self.target, self.draft_engine)

    def close(self) -> None:
        if self.draft_engine is not None:
            self.draft_engine.close()
        self.target.close()


# Fixed k (-k without --adaptive) defaults, and the ceiling adaptive policies may reach.
DEFAULT_DRAFT_MAX = {"lookup": 8, "suffix": 8, "draft": 4, "plain": 0}
ADAPTIVE_K_MAX = {"lookup": 16, "suffix": 16, "draft": 8, "plain": 0}
POLICIES = ("cost", "heuristic", "fixed")


def open_draft(target: Engine, path: Path, *, p_min: float = 0.0, **engine_kw):
    """A draft model for `target`: the tokenizer check first (from the vocabulary
    alone, before any weights load), then its engine. A draft with another
    vocabulary drafts through text (a TranslatedDraftModel, `translated` True);
    one that cannot encode text is refused. engine_kw as Engine's; the caller
    closes `drafter.engine`."""
    from specgen.drafters.translated import TranslatedDraftModel
    from specgen.drafters.translated import translation_problem
    from specgen.models.vocab import compare, n_shared

    with Engine(path, vocab_only=True) as draft_vocab:
        report = compare(target, draft_vocab)
        if not report.compatible:
            why = translation_problem(target, draft_vocab)
            if why:
                raise SpecgenError(
                    f"draft model's tokenizer does not match the target's ({report.first_problem()}) "
                    f"and it cannot draft by translation: {why}"
                )
        shared = n_shared(target, draft_vocab)
    engine = Engine(path, **engine_kw)
    if not report.compatible:
        return TranslatedDraftModel(target, engine, p_min=p_min)
    return DraftModel(engine, shared, target.n_vocab, p_min=p_min)


def make_policy(name: str, k_max: int, target: Engine, draft_engine: Engine | None = None, *,
                shared: dict | None = None, **cost_kw):
    """A fresh policy for one generation. cost: from the measured profiles of the
    target (verify curve) and the draft model (one step, bulk feed); `shared`
    acceptance statistics let a server's requests learn from each other;
    `cost_kw`: further CostAware arguments (e.g. explore_near=False)."""
    from specgen.policy.base import FixedK, Heuristic
    from specgen.policy.cost import DRAFT_MODEL_PRIOR, CostAware

    if name == "fixed" or k_max == 0:
        return FixedK()
    if name == "heuristic":
        return Heuristic(k_max)
    from specgen.engine.costs import cost_profile

    verify = cost_profile(target)["verify_s"]
    step = feed = 0.0
    curve = None
    # a draft of another vocabulary (translated through text) keeps the weaker prior
    same_vocab = draft_engine is not None and draft_engine.n_vocab == target.n_vocab
    if draft_engine is not None:
        draft = cost_profile(draft_engine)
        step, feed, curve = draft["verify_s"][1], draft["feed_s"], draft["verify_s"]
    return CostAware(k_max, verify, step, feed, draft_verify_s=curve, shared=shared,
                            model_prior=DRAFT_MODEL_PRIOR if same_vocab else None, **cost_kw)


def make_gate(policy_name: str):
    """The shared-step gate of a server whose requests use `policy_name`: the cost
    policy's shared steps draft only while measured throughput says drafting
    pays (specgen.policy.stepgate); a fixed or heuristic k is drafted as asked."""
    from specgen.policy.stepgate import StepGate

    return StepGate() if policy_name == "cost" else None


def make_suffix_drafter(opts: ModelOptions):
    """The suffix-index drafter; its global index lives as long as the drafter
    (one process), and only with global_cache on."""
    from specgen.drafters.suffix import SuffixDrafter

    return SuffixDrafter(global_cache=opts.global_cache, choice=opts.suffix_choice, min_match=opts.lookup_ngram_min())


def open_models(opts: ModelOptions, catalog: registry.Catalog | None = None) -> Loaded:
    opts.validate()
    catalog = catalog or registry.load_catalog()
    model_ref, draft_ref, draft_max = opts.model, opts.draft, opts.draft_max
    if opts.pair:
        pair = registry.resolve_pair(opts.pair, catalog)
        model_ref = model_ref or pair.target
        if not (opts.lookup or opts.no_spec or opts.drafter == "suffix"):
            draft_ref = draft_ref or pair.draft
        draft_max = draft_max or pair.draft_max
    target_path = registry.resolve_model(model_ref, catalog)
    draft_path = registry.resolve_model(draft_ref, catalog) if draft_ref else None
    mode = "plain" if opts.no_spec else "draft" if draft_path else "suffix" if opts.drafter == "suffix" else "lookup"
    if opts.lookup is False and mode != "draft":
        raise SpecgenError("--no-lookup needs a draft model (-d/--draft or --pair); to decode plainly use --no-spec")
    policy_name = "fixed" if mode == "plain" else opts.policy_name
    alongside = mode == "draft" and (opts.lookup or (opts.lookup is None and policy_name == "cost"))
    default_k = DEFAULT_DRAFT_MAX if policy_name == "fixed" else ADAPTIVE_K_MAX
    k = 0 if mode == "plain" else (draft_max or default_k[mode])
    model_max = k
    if alongside and not draft_max:  # lookup's offers reach as far as lookup's own ceiling; the model's stays
        k = default_k["lookup"]

    # several sequences (a server) share one unified KV pool: see specgen.serve.scheduler
    # (draft trees: one sequence per branch, in one unified pool: see specgen.decode.tree)
    n_seq = max(opts.n_seq, opts.tree_width)
    kw = dict(n_threads=opts.threads, n_gpu_layers=opts.gpu_layers, n_seq_max=n_seq, kv_unified=n_seq > 1)
    target = Engine(target_path, n_ctx=opts.ctx_size, **kw)
    drafter: Drafter | None = None
    draft_engine = None
    try:
        if mode == "draft":
            drafter = open_draft(target, draft_path, n_ctx=opts.ctx_size, p_min=opts.p_min, **kw)
            draft_engine = drafter.engine
            if alongside:
                drafter = WithLookup(drafter, PromptLookup(opts.ngram_max, opts.lookup_ngram_min(alongside=True)),
                                     model_max=model_max)
        elif mode == "lookup":
            drafter = PromptLookup(opts.ngram_max, opts.lookup_ngram_min())
        elif mode == "suffix":
            drafter = make_suffix_drafter(opts)
    except BaseException:
        if draft_engine is not None:
            draft_engine.close()
        target.close()
        raise
    return Loaded(target, drafter, mode, k, target_path, draft_path, draft_engine, policy_name,
                  translated=bool(getattr(drafter, "translated", False)))
