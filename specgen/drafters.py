"""Drafters: cheap proposers of the next few tokens.

A drafter has one job: given the accepted context (prompt + generated tokens,
the last of which the target has not scored yet) and a length k, propose up to
k tokens. `Draft.q` carries, for a drafter that samples, the distribution
each token was drawn from (rejection sampling needs it); None means the
drafter had no distribution (a point mass on each proposed token).

To add a drafter, implement `propose` and `begin` (called before each
generation, so a drafter that indexes its context can start afresh).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from specgen.sampling import SamplingParams, probs, sample


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] | None = None
    key: int = 0  # groups rounds of alike acceptance for a policy (lookup: match length)

    def cut(self, k: int) -> "Draft":
        return Draft(self.tokens[:k], None if self.q is None else self.q[:k], self.key)


class Drafter(Protocol):
    name: str
    free: bool  # proposing costs (next to) nothing: draft first, then choose k

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft: ...

    def begin(self) -> None:
        """A new generation starts (its context may not extend the last one)."""


# -- prompt lookup -----------------------------------------------------------

NGRAM_MAX = 4  # as llama.cpp's lookup: measured better than 3 on copy-heavy prompts


def lookup_draft(tokens: Sequence[int], k: int, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
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


class PromptLookup:
    """Prompt-lookup decoding with an incremental n-gram index (O(k) a round).

    The index maps each n-gram to the end of its latest occurrence that has
    at least one following token, so a lookup of the context's own suffix
    finds the previous occurrence, never itself.
    """

    name = "lookup"
    free = True

    def __init__(self, ngram_max: int = NGRAM_MAX, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.begin()

    def begin(self) -> None:
        self._index: dict[tuple[int, ...], int] = {}
        self._tokens: list[int] = []
        self.last_match = 0  # n-gram length of the last proposal (0: none)

    def _extend(self, context: Sequence[int]) -> None:
        seen = len(self._tokens)
        if len(context) < seen:  # not an extension: index afresh
            self.begin()
            seen = 0
        self._tokens.extend(context[seen:])
        toks = self._tokens
        # Index n-grams ending at positions seen-1 … len-1 (exclusive ends
        # `end` with a continuation token toks[end] now known).
        for end in range(max(seen, 1), len(toks)):
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self._index[tuple(toks[end - n : end])] = end

    def propose(self, context, k, params=None, rng=None) -> Draft:  # noqa: ARG002
        self._extend(context)
        toks = self._tokens
        size = len(toks)
        self.last_match = 0
        if k <= 0:
            return Draft()
        for n in range(min(self.ngram_max, size - 1), self.ngram_min - 1, -1):
            end = self._index.get(tuple(toks[size - n :]))
            if end is not None:
                self.last_match = n
                return Draft(toks[end : end + k], key=n)
        return Draft()


# -- draft model -------------------------------------------------------------


class DraftModel:
    """A second, smaller GGUF model with its own context and KV cache.

    Its cache follows the accepted tokens: each round `sync` keeps the prefix
    that still agrees (dropping rejected drafts) and feeds what is new (the
    target's correction or bonus token), then k tokens are drafted one step at
    a time. The last drafted token is never fed: nothing would read its logits.
    """

    name = "draft"
    free = False

    def __init__(self, engine, n_shared: int, n_target_vocab: int, seq: int = 0, p_min: float = 0.0) -> None:
        self.engine = engine
        self.n_shared = n_shared  # ids both vocabularies have; rows are cut to it
        self.n_target_vocab = n_target_vocab  # q is padded to the target's p
        self.seq = seq
        self.p_min = p_min  # stop drafting once the draft's top probability falls below this
        self.steps = 0  # draft-model forward passes, for cost accounting

    def begin(self) -> None:
        """Nothing to do: `sync` keeps whatever cached prefix still agrees."""

    def propose(self, context, k, params, rng) -> Draft:
        if k <= 0:
            return Draft()
        row = self.engine.sync(self.seq, context)
        self.steps += 1
        tokens: list[int] = []
        qs: list[np.ndarray] | None = None if params.greedy else []
        for i in range(k):
            logits = row[: self.n_shared]
            if self.p_min > 0.0 and i > 0 and _top_prob(logits) < self.p_min:
                break
            if qs is None:
                tok = int(np.argmax(logits))
            else:
                q = np.zeros(self.n_target_vocab)
                q[: self.n_shared] = probs(logits, params)
                tok = sample(q, rng)
                qs.append(q)
            tokens.append(tok)
            if i + 1 < k:
                row = self.engine.decode(self.seq, [tok], 1)[0]
                self.steps += 1
        return Draft(tokens, qs)


def _top_prob(logits: np.ndarray) -> float:
    """Probability of the most likely token under plain softmax."""
    m = float(logits.max())
    return 1.0 / float(np.exp(logits - m, dtype=np.float32).sum())
