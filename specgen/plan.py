"""What to speculate, decided once: `resolve()` turns what a user asked for into a
frozen `SpecPlan`.

Every caller speaks this one vocabulary: the CLI's options (specgen.session),
a bench configuration (specgen.bench.configs), chat and the server read the
session's plan. A drafting kind is a `Kind`; the drafter's own settings are one
`DrafterOptions` (specgen.drafters.build builds from it); k's defaults and
ceilings, and the rule for prompt lookup alongside a model, live here only.
This module is the floor: it imports nothing of specgen but its errors, so the
drafters, the policies and the loop can all read its constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    """What drafts: nothing, prompt lookup, the suffix index, a draft model, or
    prediction heads over the target's hidden state. Its value is the word the
    CLI, the JSON records and the server use."""

    PLAIN = "plain"
    LOOKUP = "lookup"
    SUFFIX = "suffix"
    DRAFT = "draft"
    HEADS = "heads"

    def __str__(self) -> str:
        return self.value

    @property
    def free(self) -> bool:
        """Its drafts cost (nearly) nothing: a copy from text already read."""
        return self in (Kind.LOOKUP, Kind.SUFFIX)

    @property
    def with_model(self) -> bool:
        """A model drafts (a second network or heads over the target's features)."""
        return self in (Kind.DRAFT, Kind.HEADS)


POLICIES = ("cost", "heuristic", "fixed")
# tokens a draft model's cache lags after a drafting round: its first draft step feeds them
NORMAL_FEED = 2
NGRAM_MAX = 4  # prompt lookup's longest n-gram, as llama.cpp's lookup: measured better than 3 on copy-heavy prompts
# Beside a draft model, lookup offers matches of two tokens or more: a
# one-token match (a quote, a comma) is a guess the model makes better, and
# its rejected offers leave the model's cache lagging (replayed: docs/notes/2026-11-drafting-and-policy.md).
ALONGSIDE_NGRAM_MIN = 2
# Beside prediction heads, one token: heads have no cache to leave lagging, and their own
# guesses are often worse than a one-token match's (docs/notes/2026-12-02-heads-training.md).
HEADS_NGRAM_MIN = 1
LATEST = "latest"  # the suffix index copies what followed the latest earlier occurrence (as prompt lookup does)
FREQUENT = "frequent"  # ... or, step by step, the next token seen most often after the match so far
SUFFIX_CHOICES = (LATEST, FREQUENT)

# k per kind: a fixed k's default (-k without --adaptive), and an adaptive policy's ceiling
DEFAULT_DRAFT_MAX = {Kind.LOOKUP: 8, Kind.SUFFIX: 8, Kind.DRAFT: 4, Kind.HEADS: 4, Kind.PLAIN: 0}
ADAPTIVE_K_MAX = {Kind.LOOKUP: 16, Kind.SUFFIX: 16, Kind.DRAFT: 8, Kind.HEADS: 8, Kind.PLAIN: 0}


def default_k(kind: Kind | str, policy: str) -> int:
    """k's default for `kind` under `policy`: a fixed k, or an adaptive policy's ceiling."""
    return (DEFAULT_DRAFT_MAX if policy == "fixed" else ADAPTIVE_K_MAX)[Kind(kind)]


@dataclass(frozen=True)
class DrafterOptions:
    """What a drafter is built from (specgen.drafters.build.build_drafter)."""

    kind: Kind  # LOOKUP | SUFFIX | DRAFT | HEADS
    ngram_max: int = NGRAM_MAX  # prompt lookup's longest n-gram
    ngram_min: int = 1  # prompt lookup's shortest n-gram; the suffix index's shortest match
    lookup_alongside: bool = False  # DRAFT, HEADS: prompt lookup offers its free drafts beside the model
    alongside_ngram_min: int = ALONGSIDE_NGRAM_MIN  # ... matching this many tokens at least
    model_max: int | None = None  # model alongside lookup: the model's own ceiling on k (None: the round's)
    p_min: float = 0.0  # DRAFT: stop drafting once its top probability falls below this
    global_cache: bool = False  # SUFFIX: also draft from earlier generations of this drafter
    suffix_choice: str = LATEST  # SUFFIX: which earlier occurrence's continuation drafts

    def __post_init__(self) -> None:
        try:
            kind = Kind(self.kind)
        except ValueError:
            kind = Kind.PLAIN
        if kind is Kind.PLAIN:
            raise ValueError(f"unknown drafter kind '{self.kind}' (choose {', '.join(k.value for k in Kind if k is not Kind.PLAIN)})")
        object.__setattr__(self, "kind", kind)


@dataclass(frozen=True)
class SpecPlan:
    """What one command speculates with: the kind, the round's ceiling on k, the
    policy that chooses k within it, and the drafter's options. For PLAIN,
    `drafting` is prompt lookup with the user's n-grams (what chat's /spec turns on)."""

    kind: Kind
    k: int  # the round's ceiling (a fixed policy's k); 0 for PLAIN
    policy: str  # cost | heuristic | fixed
    drafting: DrafterOptions
    tree_width: int = 1  # SUFFIX: draft trees of up to this many branches (specgen.decode.tree)

    @property
    def lookup_alongside(self) -> bool:
        return self.drafting.lookup_alongside

    @property
    def model_k(self) -> int:
        """The most a model drafts a round (lookup's offers alongside it reach k)."""
        return self.drafting.model_max or self.k

    def free_drafting(self) -> DrafterOptions:
        """Prompt lookup with this plan's n-grams (chat's switch from a model to lookup)."""
        d = self.drafting
        return d if d.kind is Kind.LOOKUP else DrafterOptions(Kind.LOOKUP, d.ngram_max, d.ngram_min)


def resolve(kind: Kind | str, *, k: int | None = None, policy: str | None = None, lookup: bool | None = None,
            ngram_max: int = NGRAM_MAX, ngram_min: int | None = None, p_min: float = 0.0,
            global_cache: bool = False, suffix_choice: str = LATEST, tree_width: int = 1,
            k_cap: int | None = None) -> SpecPlan:
    """The one rule from a request to a plan.

    policy: as given, else fixed when k is given and cost when not (PLAIN: fixed).
    k: as given, else the kind's default under the policy (DEFAULT_DRAFT_MAX /
    ADAPTIVE_K_MAX), at most `k_cap` (the heads' count). Prompt lookup drafts
    alongside a draft model or heads when `lookup`, or by default under the cost
    policy; then the model keeps its k and lookup's offers reach lookup's own
    ceiling, unless k was given, which bounds the whole round. ngram_min: as
    given, else 1 for lookup (its offers alongside: ALONGSIDE_NGRAM_MIN beside a
    draft model, HEADS_NGRAM_MIN beside heads)."""
    kind = Kind(kind)
    policy = "fixed" if kind is Kind.PLAIN else policy or ("fixed" if k is not None else "cost")
    own = 0 if kind is Kind.PLAIN else k or default_k(kind, policy)
    if k_cap is not None:
        own = min(own, k_cap)
    alongside = kind.with_model and bool(lookup or (lookup is None and policy == "cost"))
    round_k = (k or default_k(Kind.LOOKUP, policy)) if alongside else own
    beside = ALONGSIDE_NGRAM_MIN  # (unused without a model: kept at its default, so equal requests give equal plans)
    if kind.with_model:
        beside = ngram_min if ngram_min is not None else HEADS_NGRAM_MIN if kind is Kind.HEADS else ALONGSIDE_NGRAM_MIN
    drafting = DrafterOptions(Kind.LOOKUP if kind is Kind.PLAIN else kind, ngram_max,
                              1 if ngram_min is None else ngram_min, lookup_alongside=alongside,
                              alongside_ngram_min=beside, model_max=own if alongside else None, p_min=p_min,
                              global_cache=global_cache, suffix_choice=suffix_choice)
    return SpecPlan(kind, round_k, policy, drafting, tree_width)
