"""The acceptance rules: exact bookkeeping (greedy) and exact distributions (sampled)."""

import numpy as np
import pytest
from scipy.stats import chisquare

from specgen.rules.acceptance import accept_greedy, accept_point_mass, accept_sampled, prob_at, residual
from specgen.rules.sampling import Support, sample

VOCAB = 6
DRAWS = 100_000


def test_greedy_accepts_prefix_then_corrects():
    assert accept_greedy([4, 5, 6], [4, 5, 9, 1]) == (2, 9)


def test_greedy_all_accepted_gives_bonus_token():
    assert accept_greedy([4, 5, 6], [4, 5, 6, 7]) == (3, 7)


def test_greedy_first_rejected_gives_target_token():
    assert accept_greedy([1, 2], [3, 2, 2]) == (0, 3)


def test_greedy_empty_draft_is_a_plain_step():
    assert accept_greedy([], [8]) == (0, 8)


def test_greedy_reads_rows_lazily():
    seen = []

    class Rows:
        def __getitem__(self, i):
            seen.append(i)
            return [7, 1, 1, 1][i]

    assert accept_greedy([7, 2, 3], Rows()) == (1, 1)
    assert seen == [0, 1, 1]  # row 2 and 3 never computed


def _random_dists(rng, n):
    return [rng.dirichlet(np.full(VOCAB, 0.7)) for _ in range(n)]


def _first_tokens(k, p, q, seed, rule=accept_sampled):
    """Emitted first token and acceptance of position 1 over DRAWS rounds."""
    rng = np.random.default_rng(seed)
    drafts = np.stack([rng.choice(VOCAB, size=DRAWS, p=qi) for qi in q], axis=1) if q else None
    firsts = np.empty(DRAWS, dtype=np.int64)
    accepted_first = 0
    for t in range(DRAWS):
        d = list(drafts[t])
        n, nxt = rule(d, p, q, rng)
        firsts[t] = d[0] if n > 0 else nxt
        accepted_first += n > 0
    return firsts, accepted_first / DRAWS


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("case", [0, 1])
def test_sampled_first_token_is_distributed_as_target(k, case):
    rng = np.random.default_rng(1000 * k + case)
    p = _random_dists(rng, k + 1)
    q = _random_dists(rng, k)
    firsts, acc = _first_tokens(k, p, q, seed=case)
    counts = np.bincount(firsts, minlength=VOCAB)
    _, pvalue = chisquare(counts, DRAWS * p[0])
    assert pvalue > 1e-4, (counts, DRAWS * p[0])
    expected = np.minimum(p[0], q[0]).sum()  # Σ min(p, q)
    sigma = np.sqrt(expected * (1 - expected) / DRAWS)
    assert abs(acc - expected) < 5 * sigma


def _sparse(rng, n, keep=4):
    """Dirichlet rows with VOCAB - keep tokens zeroed (different ones per row), as Supports."""
    out = []
    for _ in range(n):
        ids = np.sort(rng.choice(VOCAB, size=keep, replace=False))
        out.append(Support(ids, rng.dirichlet(np.full(keep, 0.7)), VOCAB))
    return out


def test_supports_give_the_dense_rules_tokens():
    """Rows as Supports (the tokens they keep) and as dense rows: the same (n, next) for
    the same generator, draft after draft, rejections (residuals) included."""
    rng = np.random.default_rng(4)
    outcomes = set()
    for t in range(3000):
        k = 1 + t % 4
        p, q = _sparse(rng, k + 1), _sparse(rng, k)
        d = [int(rng.choice(qi.ids, p=qi.probs)) for qi in q]
        seed = int(rng.integers(1 << 30))
        sparse = accept_sampled(d, p, q, np.random.default_rng(seed))
        dense = accept_sampled(d, [x.dense() for x in p], [x.dense() for x in q], np.random.default_rng(seed))
        mixed = accept_sampled(d, [x.dense() for x in p], q, np.random.default_rng(seed))
        assert sparse == dense == mixed, (t, sparse, dense, mixed)
        outcomes.add(sparse[0])
    assert outcomes == {0, 1, 2, 3, 4}  # rejections at every position, and whole drafts kept


def test_residual_of_supports():
    p = Support(np.array([1, 3, 4]), np.array([0.5, 0.3, 0.2]), 6)
    q = Support(np.array([0, 3, 4]), np.array([0.2, 0.5, 0.3]), 6)
    r = residual(p, q)
    assert list(r.ids) == [1, 3, 4] and np.allclose(r.probs, [0.5, 0.0, 0.0])
    assert np.allclose(prob_at(q, [0, 1, 4, 5]), [0.2, 0.0, 0.3, 0.0])
    assert residual(p, p) is p  # nothing left: p itself


def test_sparse_first_token_is_distributed_as_target():
    """The chi-square check of the dense rule, with Supports whose kept tokens differ."""
    rng = np.random.default_rng(17)
    p, q = _sparse(rng, 2), _sparse(rng, 1)
    r = np.random.default_rng(5)
    firsts = np.empty(DRAWS // 2, dtype=np.int64)
    for t in range(len(firsts)):
        d = [int(r.choice(q[0].ids, p=q[0].probs))]
        n, nxt = accept_sampled(d, p, q, r)
        firsts[t] = d[0] if n else nxt
    counts = np.bincount(firsts, minlength=VOCAB)
    assert counts[np.setdiff1d(np.arange(VOCAB), p[0].ids)].sum() == 0  # nothing outside p's support
    _, pvalue = chisquare(counts[p[0].ids], len(firsts) * p[0].probs)
    assert pvalue > 1e-4, (counts, p[0])


def test_sampled_bonus_token_follows_last_row():
    # q == p everywhere: every draft is accepted, the bonus comes from p[k].
    rng = np.random.default_rng(7)
    p = _random_dists(rng, 3)
    q = p[:2]
    out = []
    for _ in range(20_000):
        d = [int(rng.choice(VOCAB, p=qi)) for qi in q]
        n, nxt = accept_sampled(d, p, q, rng)
        assert n == 2
        out.append(nxt)
    _, pvalue = chisquare(np.bincount(out, minlength=VOCAB), 20_000 * p[2])
    assert pvalue > 1e-4


def test_point_mass_draft_keeps_target_distribution():
    # Prompt lookup: q is a point mass on the drafted token.
    rng = np.random.default_rng(3)
    p = _random_dists(rng, 2)
    out, acc = [], 0
    for _ in range(DRAWS // 2):
        n, nxt = accept_sampled([2], p, None, rng)
        out.append(2 if n else nxt)
        acc += n
    _, pvalue = chisquare(np.bincount(out, minlength=VOCAB), DRAWS // 2 * p[0])
    assert pvalue > 1e-4
    assert abs(acc / (DRAWS // 2) - p[0][2]) < 0.01


def test_chi_square_catches_a_wrong_residual():
    """Negative control: the test above has the power to reject a broken rule."""

    def broken(draft, p, q, rng):  # resamples from p instead of norm(max(0, p - q))
        for i, d in enumerate(draft):
            if rng.random() * q[i][d] < p[i][d]:
                continue
            return i, int(rng.choice(VOCAB, p=p[i]))
        return len(draft), int(rng.choice(VOCAB, p=p[len(draft)]))

    rng = np.random.default_rng(11)
    p = _random_dists(rng, 2)
    q = _random_dists(rng, 1)
    firsts, _ = _first_tokens(1, p, q, seed=5, rule=broken)
    _, pvalue = chisquare(np.bincount(firsts, minlength=VOCAB), DRAWS * p[0])
    assert pvalue < 1e-6


def test_point_mass_drafts_emit_the_targets_joint_distribution():
    """k = 3 point-mass drafts: P(n accepted, then t) = Π_{i<n} p_i(d_i) · p_n(t), t != d_n (n < k),
    and p_k(t) for the bonus; every outcome (n, t) checked at once."""
    rng = np.random.default_rng(21)
    p = _random_dists(rng, 4)
    draft = [int(np.argmax(pi)) for pi in p[:3]]  # likely drafts, so deep outcomes are seen
    expected = np.zeros((4, VOCAB))
    reach = 1.0
    for n in range(4):
        expected[n] = reach * p[n]
        if n < 3:
            expected[n, draft[n]] = 0.0
            reach *= p[n][draft[n]]
    seen = np.zeros((4, VOCAB))
    for _ in range(DRAWS):
        n, nxt = accept_sampled(draft, p, None, rng)
        seen[n, nxt] += 1
    keep = expected.ravel() > 0
    assert seen.ravel()[~keep].sum() == 0  # never the rejected draft as its own correction
    _, pvalue = chisquare(seen.ravel()[keep], DRAWS * expected.ravel()[keep])
    assert pvalue > 1e-4


class CountingRng:
    """A seeded generator that counts the uniforms drawn from it."""

    def __init__(self, seed):
        self.rng, self.draws = np.random.default_rng(seed), 0

    def random(self):
        self.draws += 1
        return self.rng.random()


@pytest.mark.parametrize("seed", range(20))
def test_point_mass_drafts_emit_what_plain_sampling_draws(seed):
    """One uniform per emitted token, in output order, as plain sampling (`sample`)
    draws them: the same seed emits plain's tokens whatever was drafted."""
    rng = np.random.default_rng(seed)
    p = [rng.dirichlet(np.full(VOCAB, 0.3)) for _ in range(6)]
    plain_rng = np.random.default_rng(seed)
    plain = [sample(pi, plain_rng) for pi in p]
    draft = plain[:2] + [(plain[2] + 1) % VOCAB, plain[3]] if seed % 2 else plain[:5]
    counting = CountingRng(seed)
    n, nxt = accept_sampled(draft, p, None, counting)
    emitted = draft[:n] + [nxt]
    assert emitted == plain[: len(emitted)]
    assert n == (2 if seed % 2 else 5)
    assert counting.draws == len(emitted)
    assert accept_point_mass(draft, p, np.random.default_rng(seed)) == (n, nxt)
