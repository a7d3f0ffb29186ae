"""Prompt lookup: the incremental index proposes what the reference scan does."""

import numpy as np
import pytest

from specgen.drafters.lookup import PromptLookup, lookup_draft


def test_copies_continuation_of_latest_match():
    toks = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3]
    # "1 2 3" occurred twice before; the latest is followed by 5 7
    assert lookup_draft(toks, 2) == [5, 7]
    assert PromptLookup().propose_one(toks, 2).tokens == [5, 7]


def test_prefers_longest_ngram():
    toks = [8, 3, 4, 4, 9, 3, 6, 8, 3]
    # 2-gram "8 3" matches at 0 (followed by 4); 1-gram "3" latest at 5 (followed by 6)
    assert lookup_draft(toks, 1, ngram_max=2) == [4]
    assert lookup_draft(toks, 1, ngram_max=1) == [6]


def test_no_match_proposes_nothing():
    assert lookup_draft([1, 2, 3, 4], 5) == []
    assert PromptLookup().propose_one([1, 2, 3, 4], 5).tokens == []


def test_draft_is_cut_at_k_and_at_context_end():
    toks = [5, 6, 7, 8, 5]
    assert lookup_draft(toks, 2) == [6, 7]
    assert lookup_draft(toks, 10) == [6, 7, 8, 5]


def test_min_ngram_excludes_single_token_matches():
    toks = [1, 2, 3, 1]
    assert lookup_draft(toks, 3, ngram_max=3, ngram_min=2) == []
    assert PromptLookup(3, 2).propose_one(toks, 3).tokens == []


@pytest.mark.parametrize("seed", range(5))
def test_incremental_index_matches_reference_scan(seed):
    rng = np.random.default_rng(seed)
    toks = [int(t) for t in rng.integers(0, 6, size=30)]
    d = PromptLookup(ngram_max=3, ngram_min=1)
    for _ in range(60):  # grow the context like the loop does, a few tokens a round
        k = int(rng.integers(1, 6))
        assert d.propose_one(toks, k).tokens == lookup_draft(toks, k, 3, 1)
        toks += [int(t) for t in rng.integers(0, 6, size=int(rng.integers(1, 4)))]


def test_begin_forgets_previous_context():
    d = PromptLookup()
    d.propose_one([1, 2, 1], 1)
    d.begin()
    assert d.propose_one([3, 4], 2).tokens == []


def test_lookup_alongside_a_model_declares_what_the_model_can_do():
    """WithLookup prefills exactly when its model does (a model that reads its prompt
    on its first drafting round stays so), and says it offers; the loop reads these
    declarations, so a model without prefill is never asked for one."""
    from specgen.drafters.base import Drafter
    from specgen.drafters.model import WithLookup

    class NoPrefill(Drafter):
        name, free, steps = "draft", False, 0

    class WithPrefill(NoPrefill):
        prefills, translated = True, True

        def prefill(self, seq, context):
            return ("read", seq, len(context))

    plain, reading = WithLookup(NoPrefill(), PromptLookup()), WithLookup(WithPrefill(), PromptLookup())
    assert not plain.prefills and plain.offers and not plain.translated
    assert reading.prefills and reading.translated
    assert reading.prefill(0, [1, 2, 3]) == ("read", 0, 3)
