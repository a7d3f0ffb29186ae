"""Logit transforms: each filter removes exactly what it should."""

import numpy as np
import pytest

from specgen.errors import SpecgenError
from specgen.rules.sampling import SamplingParams, Support, probs, sample, support, top_ids


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


@pytest.mark.parametrize("case", ["spread", "peaked", "ties at the top", "ties everywhere", "short", "k near n"])
def test_top_ids_are_the_k_largest(case):
    """top_ids' cut by a sample's floor keeps the row's own k largest: the same values as a
    whole-row partition, on rows where the sample misleads (ties, a few peaks, short rows)."""
    rng = np.random.default_rng(1)
    n, k = (262_144, 40) if case not in ("short", "k near n") else (300, 40) if case == "short" else (2000, 490)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    if case == "peaked":
        x[rng.integers(n, size=25)] += 40.0  # fewer peaks than k, none where the sample looks
    elif case == "ties at the top":
        x[rng.integers(n, size=5000)] = x.max()
    elif case == "ties everywhere":
        x = np.round(x).astype(np.float32)
    got = top_ids(x, k)
    assert len(got) == k == len(set(got.tolist()))
    assert np.array_equal(np.sort(x[got]), np.sort(x)[-k:])


def test_sample_follows_distribution():
    rng = np.random.default_rng(1)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(p, rng) for _ in range(20_000)], minlength=4) / 20_000
    assert draws[1] == 0
    assert np.allclose(draws, p, atol=0.015)


class Uniforms:
    """A generator stand-in that hands out the given uniforms, in order."""

    def __init__(self, us):
        self.us = list(us)

    def random(self):
        return self.us.pop(0)


def full_cdf_token(p, u):
    """The inverse-CDF draw over the whole vector, zeros included: the token `sample`
    must give for the uniform u (a seed's text depends on it)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, u * c[-1], side="right"), len(p) - 1))


def _vectors():
    rng = np.random.default_rng(3)
    row = (rng.normal(size=5000) * 3).astype(np.float32)
    yield probs(row, SamplingParams(temperature=0.8))  # the defaults: top-k 40, top-p, min-p
    yield probs(row, SamplingParams(temperature=1.5, top_k=0, top_p=0.9, min_p=0.0))
    dense = rng.dirichlet(np.full(300, 0.2)) * (rng.random(300) < 0.3)
    yield dense
    yield np.array([0.0, 0.25, 0.0, 0.0, 0.5, 0.25, 0.0])
    yield np.zeros(6)  # nothing kept: the last id, as the whole-vector rule gives


@pytest.mark.parametrize("p", list(_vectors()), ids=["defaults", "nucleus", "dirichlet", "small", "zeros"])
def test_sample_draws_the_whole_vector_inverse_cdf_token_for_every_uniform(p):
    c = np.cumsum(p)
    edges = [x / c[-1] for x in c] if c[-1] > 0 else []  # uniforms landing on a cumulative boundary
    us = list(np.linspace(0, 1, 400, endpoint=False)) + edges + [np.nextafter(e, 0) for e in edges]
    us = [u for u in us if 0 <= u < 1] + [np.nextafter(1.0, 0)]
    for u in us:
        want = full_cdf_token(p, u)
        assert sample(p, Uniforms([u])) == want, u
        ids = np.flatnonzero(p)
        assert sample(Support(ids, p[ids], len(p)), Uniforms([u])) == want, u


def test_sample_sums_over_the_kept_tokens_only(monkeypatch):
    """The cumulative sum covers the tokens with probability, not the vocabulary
    (~1 ms a row at Gemma's 262k)."""
    row = (np.random.default_rng(4).normal(size=50_000) * 3).astype(np.float32)
    params = SamplingParams(temperature=0.8)
    p, kept = probs(row, params), support(row, params)
    sizes, cumsum = [], np.cumsum
    monkeypatch.setattr(np, "cumsum", lambda a, *args, **kw: (sizes.append(len(a)), cumsum(a, *args, **kw))[1])
    rng = np.random.default_rng(0)
    assert sample(p, rng) in set(np.flatnonzero(p).tolist())
    assert sample(kept, rng) in set(kept.ids.tolist())
    assert sizes and max(sizes) <= np.count_nonzero(p) <= 40


@pytest.mark.parametrize("params", [SamplingParams(0.8), SamplingParams(0.0),
                                    SamplingParams(1.0, top_k=0, top_p=0.5, min_p=0.0),
                                    SamplingParams(1.0, top_k=0, top_p=1.0, min_p=0.0),
                                    SamplingParams(1.0, top_k=0, top_p=1.0, min_p=0.1)])
def test_support_is_the_processed_row_without_its_zeros(params):
    row = (np.random.default_rng(5).normal(size=3000) * 3).astype(np.float32)
    kept, p = support(row, params), probs(row, params)
    assert kept.n_vocab == len(p) and np.all(np.diff(kept.ids) > 0)
    assert np.array_equal(kept.ids, np.flatnonzero(p)) and np.array_equal(kept.probs, p[kept.ids])
    assert kept.max() == p.max()
    for seed in range(20):  # the same token as the dense row for the same generator
        assert sample(kept, np.random.default_rng(seed)) == sample(p, np.random.default_rng(seed))


def test_an_unfiltered_support_is_already_in_id_order_and_not_sorted_again(monkeypatch):
    """Without top-k or top-p the kept ids are the vocabulary (min-p masks it, in
    order): sorting 262k ids again would cost ~2 ms a row."""
    row = (np.random.default_rng(6).normal(size=5000) * 3).astype(np.float32)
    calls, argsort = [], np.argsort
    monkeypatch.setattr(np, "argsort", lambda a, *args, **kw: (calls.append(len(a)), argsort(a, *args, **kw))[1])
    for min_p in (0.0, 0.1):
        kept = support(row, SamplingParams(0.7, top_k=0, top_p=1.0, min_p=min_p))
        z = row.astype(np.float64) / 0.7
        ref = np.exp(z - z.max())
        ref /= ref.sum()
        keep = ref >= min_p * ref.max()
        assert np.array_equal(kept.ids, np.flatnonzero(keep))
        assert np.allclose(kept.probs, ref[keep] / ref[keep].sum(), rtol=1e-12, atol=0)
    assert calls == []


@pytest.mark.parametrize(
    "kw, word",
    [({"temperature": -1}, "--temp"), ({"top_p": 0.0}, "--top-p"), ({"top_p": 1.5}, "--top-p"), ({"min_p": 1.0}, "--min-p"), ({"top_k": -2}, "--top-k")],
)
def test_invalid_params_rejected(kw, word):
    with pytest.raises(SpecgenError, match=word):
        SamplingParams(**kw).validate()
