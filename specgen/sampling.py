"""Logits → processed probability vector (temperature, top-k, top-p, min-p).

The same transform is applied to the target's rows (p) and the draft model's
rows (q): rejection sampling is exact only for the distributions it compares.
Order, as in Hugging Face transformers: temperature, then top-k, top-p, min-p.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Candidates kept before an exact nucleus search when top-k is off: a full
# sort of a 262k vocabulary costs ~15 ms, a partition ~1 ms.
_NUCLEUS_PREFILTER = 1024


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None

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


def probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Processed distribution over the whole vocabulary (float64, sums to 1).

    Tokens removed by top-k / top-p / min-p get exactly zero probability;
    temperature 0 gives a point mass on the argmax.
    """
    x = np.asarray(logits, dtype=np.float64)
    n = x.shape[0]
    out = np.zeros(n, dtype=np.float64)
    if params.greedy:
        out[int(np.argmax(x))] = 1.0
        return out
    if params.top_k and params.top_k < n:
        cand = np.argpartition(x, n - params.top_k)[n - params.top_k :]
    else:
        cand = np.arange(n)
    z = x[cand] / params.temperature
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
    if params.min_p > 0.0:
        keep = w >= params.min_p * w.max()
        cand, w = cand[keep], w[keep]
    out[cand] = w / w.sum()
    return out


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a probability vector."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))
