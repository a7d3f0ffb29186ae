"""The one place a drafter is built: `build_drafter(DrafterOptions, ...)`.

Every command (run, chat, rewrite, serve, bench, tune) says what it wants in
one `DrafterOptions` (specgen.plan: a `SpecPlan`'s `drafting`) and gets its drafter here: prompt lookup, the suffix
index, a draft model (its own vocabulary's ids, or drafting through text when
the vocabularies differ) or prediction heads over the target's hidden state,
with prompt lookup alongside it or not. A draft model's engine (the heads,
loaded and checked against the target) is opened by the caller (specgen.session, which also checks its
vocabulary once) and handed in as an `OpenedDraft`; building a drafter opens
nothing, so a fresh one (new indexes for a new server or repeat) is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

from specgen.drafters.base import Drafter
from specgen.drafters.heads import HeadsDrafter
from specgen.drafters.lookup import PromptLookup
from specgen.drafters.model import DraftModel, WithLookup
from specgen.drafters.suffix import SuffixDrafter
from specgen.drafters.translated import TranslatedDraftModel
from specgen.plan import DrafterOptions, Kind

__all__ = ["DrafterOptions", "OpenedDraft", "build_drafter"]


@dataclass(frozen=True)
class OpenedDraft:
    """A draft model's engine with what its vocabulary check found."""

    engine: object  # specgen.engine.llama.Engine
    same_vocab: bool  # the tokenizers match: drafts are the draft's own ids; else through text
    n_shared: int  # ids both vocabularies hold (rows are cut to it)


def build_drafter(opts: DrafterOptions, target=None, draft: OpenedDraft | None = None, heads=None) -> Drafter:
    """The drafter `opts` asks for; a model drafter needs the target (its vocabulary) and the opened draft,
    a heads drafter the target (opened with hidden=True) and the loaded heads (specgen.heads.model.Heads)."""
    if opts.kind is Kind.LOOKUP:
        return PromptLookup(opts.ngram_max, opts.ngram_min)
    if opts.kind is Kind.SUFFIX:
        return SuffixDrafter(global_cache=opts.global_cache, choice=opts.suffix_choice, min_match=opts.ngram_min)
    if opts.kind is Kind.HEADS:
        if heads is None or target is None:
            raise ValueError("a heads drafter needs the target and the loaded heads")
        if heads.kind == "layer":  # a feature-level layer (specgen.heads.layer.FeatureLayer)
            from specgen.drafters.layer import LayerDrafter

            model: Drafter = LayerDrafter(target, heads)
        else:
            model = HeadsDrafter(target, heads)
    elif draft is None or target is None:
        raise ValueError("a model drafter needs the target and an opened draft model")
    elif draft.same_vocab:
        model = DraftModel(draft.engine, draft.n_shared, target.n_vocab, p_min=opts.p_min)
    else:
        model = TranslatedDraftModel(target, draft.engine, p_min=opts.p_min)
    if not opts.lookup_alongside:
        return model
    model_max = opts.model_max
    if model.model_max is not None:  # the heads: never more a round than they have
        model_max = min(model_max or model.model_max, model.model_max)
    return WithLookup(model, PromptLookup(opts.ngram_max, opts.alongside_ngram_min), model_max=model_max)
