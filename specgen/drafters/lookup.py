"""Prompt lookup: draft the tokens that followed the latest earlier match of the context's last n-gram."""

from __future__ import annotations

from typing import Sequence

from specgen.drafters.base import Draft, PerSequence
from specgen.plan import NGRAM_MAX


def lookup_draft(tokens: Sequence[int], k: int, ngram_max: int = NGRAM_MAX, ngram_min: int = 1) -> list[int]:
    """Reference n-gram lookup (linear scan), the specification of PromptLookup.

    For n from ngram_max down to ngram_min: find the latest earlier occurrence
    of the last n tokens and propose the (up to k) tokens that followed it.
    """
    size = len(tokens)
    for n in range(ngram_max, ngram_min - 1, -1):
        if size <= n:
            continue
        suffix = list(tokens[size - n :])
        for start in range(size - n - 1, -1, -1):
            if list(tokens[start : start + n]) == suffix:
                return list(tokens[start + n : start + n + k])
    return []


class _NgramIndex:
    """Each n-gram → the end of its latest occurrence that has a following token."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, ...], int] = {}
        self.tokens: list[int] = []


class PromptLookup(PerSequence):
    """Prompt-lookup decoding with an incremental n-gram index per sequence (O(k) a round).

    A lookup of the context's own suffix finds the previous occurrence, never
    itself, because an n-gram is indexed only once a token follows it.
    """

    name = "lookup"

    def __init__(self, ngram_max: int = NGRAM_MAX, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self._seqs: dict[int, _NgramIndex] = {}

    def begin(self, seq: int = 0) -> None:
        self._seqs[seq] = _NgramIndex()

    def _extend(self, state: _NgramIndex, context: Sequence[int]) -> None:
        seen = len(state.tokens)
        if len(context) < seen:  # not an extension: index afresh
            state.index.clear()
            state.tokens.clear()
            seen = 0
        state.tokens.extend(context[seen:])
        toks, index = state.tokens, state.index
        # Index n-grams ending at positions seen-1 … len-1 (exclusive ends
        # `end` with a continuation token toks[end] now known).
        for end in range(max(seen, 1), len(toks)):
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                index[tuple(toks[end - n : end])] = end

    def propose_one(self, context, k, params=None, rng=None, seq=0) -> Draft:  # noqa: ARG002
        state = self._seqs.get(seq)
        if state is None:
            state = self._seqs[seq] = _NgramIndex()
        self._extend(state, context)
        toks = state.tokens
        size = len(toks)
        if k <= 0:
            return Draft()
        for n in range(min(self.ngram_max, size - 1), self.ngram_min - 1, -1):
            end = state.index.get(tuple(toks[size - n :]))
            if end is not None:
                return Draft(toks[end : end + k], key=n)
        return Draft()
