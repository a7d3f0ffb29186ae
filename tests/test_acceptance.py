"""The acceptance rules: exact bookkeeping (greedy) and exact distributions (sampled)."""

import numpy as np
import pytest
from scipy.stats import chisquare

from specgen.acceptance import accept_greedy, accept_sampled

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
