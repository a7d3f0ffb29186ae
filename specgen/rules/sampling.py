"""Logits → processed probability vector (temperature, top-k, top-p, min-p).

The same transform is applied to the target's rows (p) and the draft model's
rows (q): rejection sampling is exact only for the distributions it compares.
Order, as in Hugging Face transformers: temperature, then top-k, top-p, min-p.
A pick needs only the tokens the filters keep (`support`, `sample`); the dense
vector (`probs`) is for rejection sampling, which compares p and q entrywise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# Candidates kept before an exact nucleus search when top-k is off: a full
# sort of a 262k vocabulary costs ~15 ms, a partition ~1 ms.
_NUCLEUS_PREFILTER = 1024
# top-k's sample of a long row: every 16th entry (`top_ids`)
_TOP_STRIDE = 16


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    # Go on past an end-of-generation token to max_tokens (fixed-length comparisons):
    # a request's setting, kept with its sampling as vLLM's SamplingParams and
    # llama.cpp's common_params_sampling keep it.
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        from specgen.errors import SpecgenError

        if self.temperature < 0:
            raise SpecgenError(f"--temp must be >= 0 (got {self.temperature})")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecgenError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if not 0.0 <= self.min_p < 1.0:
            raise SpecgenError(f"--min-p must be in [0, 1) (got {self.min_p})")
        if self.top_k < 0:
            raise SpecgenError(f"--top-k must be >= 0, 0 = off (got {self.top_k})")


class Support(NamedTuple):
    """A processed distribution by the tokens it keeps: `ids` ascending, their
    `probs`, over a vocabulary of `n_vocab` (every other token has probability 0).
    A sampled pick reads the kept tokens only: a dense row costs a pass or two
    over the vocabulary (262k for Gemma) on top of the filters'."""

    ids: np.ndarray
    probs: np.ndarray
    n_vocab: int

    def dense(self) -> np.ndarray:
        out = np.zeros(self.n_vocab, dtype=np.float64)
        out[self.ids] = self.probs
        return out

    def max(self) -> float:
        """The largest probability (as a dense row's `max()`)."""
        return float(self.probs.max())


def probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Processed distribution over the whole vocabulary (float64, sums to 1).

    Tokens removed by top-k / top-p / min-p get exactly zero probability;
    temperature 0 gives a point mass on the argmax.
    """
    return support(logits, params).dense()


def top_ids(x: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest entries of x, in no order (as `np.argpartition`'s top k).

    A long row is first cut to the entries at least as large as the k-th largest
    of every _TOP_STRIDE-th entry: at least k entries pass (that sample's top k
    do), so the row's own top k are among them, and only they are partitioned
    (a 262k row: ~0.5 ms, against ~2 ms partitioning it whole)."""
    n = x.shape[0]
    sub = x[::_TOP_STRIDE]
    if len(sub) > 4 * k:
        floor = np.partition(sub, len(sub) - k)[len(sub) - k]
        cand = np.flatnonzero(x >= floor)
        if len(cand) < n // 4:  # many ties at the floor gain nothing: partition the row
            return cand[np.argpartition(x[cand], len(cand) - k)[len(cand) - k :]] if len(cand) > k else cand
    return np.argpartition(x, n - k)[n - k :]


def support(logits: np.ndarray, params: SamplingParams) -> Support:
    """`probs` as the tokens it keeps and their probabilities (the same values)."""
    x = np.asarray(logits)
    n = x.shape[0]
    if params.greedy:
        return Support(np.array([int(np.argmax(x))]), np.ones(1), n)
    ascending = not (params.top_k and params.top_k < n)  # cand in id order (no selection yet)
    if not ascending:
        cand = top_ids(x, params.top_k)
    else:
        cand = np.arange(n)
    z = x[cand].astype(np.float64) / params.temperature
    w = np.exp(z - z.max())
    w /= w.sum()
    if params.top_p < 1.0:
        if len(cand) > _NUCLEUS_PREFILTER:
            # The nucleus is a top prefix: if the top 1024 already reach top_p
            # it lies inside them, and only they need sorting.
            sub = np.argpartition(w, len(w) - _NUCLEUS_PREFILTER)[-_NUCLEUS_PREFILTER:]
            if w[sub].sum() >= params.top_p:
                cand, w = cand[sub], w[sub]
        order = np.argsort(-w, kind="stable")
        cut = int(np.searchsorted(np.cumsum(w[order]), params.top_p - 1e-12)) + 1
        cand, w = cand[order[:cut]], w[order[:cut]]
        ascending = False
    if params.min_p > 0.0:
        keep = w >= params.min_p * w.max()
        cand, w = cand[keep], w[keep]
    w = w / w.sum()
    if ascending:  # the whole vocabulary, min-p's mask at most: already in id order (sorting 262k ids: ~2 ms)
        return Support(cand, w, n)
    order = np.argsort(cand)
    return Support(cand[order], w[order], n)


def sample(p: np.ndarray | Support, rng: np.random.Generator) -> int:
    """Draw one token id from a probability vector (or a `Support`), by inverse CDF
    with one uniform."""
    if isinstance(p, Support):
        return draw(p.ids, p.probs, rng, p.n_vocab)
    ids = np.flatnonzero(p > 0)
    return draw(ids, p[ids], rng, len(p))


def draw(ids: np.ndarray, weights: np.ndarray, rng: np.random.Generator, n: int) -> int:
    """`sample` of the vector of length n holding `weights` at `ids` (ascending) and
    zeros elsewhere: the same token for the same uniform, for a cumulative sum
    over the support alone (a zero adds exactly nothing, so the vector's sums
    at the support are these; the first one above the uniform is at the support)
    rather than over a 262k vocabulary (~1 ms a row)."""
    u = rng.random()
    if not len(ids):
        return n - 1
    c = np.cumsum(weights)
    i = int(np.searchsorted(c, u * c[-1], side="right"))
    return int(ids[i]) if i < len(ids) else n - 1
