"""Logit transforms: each filter removes exactly what it should."""

import numpy as np
import pytest

from specgen.errors import SpecgenError
from specgen.sampling import SamplingParams, probs, sample


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))


def test_plain_temperature_one_is_softmax():
    p = probs(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    assert np.allclose(p, [0.5, 0.2, 0.15, 0.1, 0.05])


def test_temperature_sharpens():
    p = probs(LOGITS, SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0))
    assert np.allclose(p, softmax(LOGITS / 0.5))


def test_greedy_is_point_mass_on_argmax():
    p = probs(LOGITS, SamplingParams(temperature=0.0))
    assert p.tolist() == [1.0, 0, 0, 0, 0]


def test_top_k():
    p = probs(LOGITS, SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0))
    assert np.allclose(p, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])


def test_top_p_keeps_smallest_prefix_reaching_mass():
    p = probs(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0))
    assert np.allclose(p, np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85)


def test_min_p_relative_to_top():
    p = probs(LOGITS, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3))
    assert np.allclose(p, np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_nucleus_prefilter_is_exact_on_large_vocab(top_p):
    rng = np.random.default_rng(0)
    x = rng.normal(size=50_000) * 3
    fast = probs(x, SamplingParams(temperature=1.0, top_k=0, top_p=top_p, min_p=0.0))
    w = softmax(x)
    order = np.argsort(-w)
    cut = np.searchsorted(np.cumsum(w[order]), top_p - 1e-12) + 1
    ref = np.zeros_like(w)
    ref[order[:cut]] = w[order[:cut]]
    assert np.allclose(fast, ref / ref.sum())


def test_sample_follows_distribution():
    rng = np.random.default_rng(1)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(p, rng) for _ in range(20_000)], minlength=4) / 20_000
    assert draws[1] == 0
    assert np.allclose(draws, p, atol=0.015)


@pytest.mark.parametrize(
    "kw, word",
    [({"temperature": -1}, "--temp"), ({"top_p": 0.0}, "--top-p"), ({"top_p": 1.5}, "--top-p"), ({"min_p": 1.0}, "--min-p"), ({"top_k": -2}, "--top-k")],
)
def test_invalid_params_rejected(kw, word):
    with pytest.raises(SpecgenError, match=word):
        SamplingParams(**kw).validate()
