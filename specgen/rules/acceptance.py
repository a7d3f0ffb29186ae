"""Acceptance rules: which drafted tokens to keep, and the token that follows.

Row i of the target's verify pass scores the position after the first i
drafted tokens, so `k` drafted tokens come with `k + 1` target rows. Both rules
return `(n_accepted, next_token)`: the first `n_accepted` drafted tokens are
kept and `next_token` (the target's correction, or its bonus token when every
draft was accepted) follows them. A round therefore settles 1 … k+1 tokens.

Sampled drafts with a distribution q (a draft model of the target's
vocabulary, prediction heads) keep rejection sampling (accept with
min(1, p/q)); p and q come as dense rows or as `Support`s (the tokens a
distribution keeps): with Supports the rule never touches the whole
vocabulary (a dense 262k row costs milliseconds to build and compare); point-mass
drafts (q None) are verified by sample-and-compare, which emits, token for
token, what plain sampling with the same generator emits.

Row arguments are indexed lazily (`rows[i]`), so a caller can compute a row's
argmax or distribution only when the rule reaches it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specgen.rules.sampling import Support, sample


def prob_at(dist: np.ndarray | Support, ids) -> np.ndarray:
    """dist's probabilities at `ids` (0 where a Support keeps no such token)."""
    ids = np.asarray(ids)
    if not isinstance(dist, Support):
        return np.asarray(dist, dtype=np.float64)[ids]
    j = np.minimum(np.searchsorted(dist.ids, ids), len(dist.ids) - 1)
    return np.where(dist.ids[j] == ids, dist.probs[j], 0.0) if len(dist.ids) else np.zeros(ids.shape)


def residual(p: np.ndarray | Support, q: np.ndarray | Support) -> np.ndarray | Support:
    """max(p − q, 0), the distribution a rejection draws from (unnormalised: the
    sampler normalises); p itself where nothing is left (p == q up to rounding).
    A Support p gives a Support over p's own tokens (outside them p − q ≤ 0)."""
    if isinstance(p, Support):
        r = np.maximum(p.probs - prob_at(q, p.ids), 0.0)
        return Support(p.ids, r, p.n_vocab) if r.sum() > 0.0 else p
    dense_q = q.dense() if isinstance(q, Support) else q
    r = np.maximum(p - dense_q, 0.0)
    return r if r.sum() > 0.0 else p


def accept_greedy(draft: Sequence[int], target_tokens: Sequence[int]) -> tuple[int, int]:
    """Keep drafts while they equal the target's argmax at their position.

    `target_tokens[i]` is the target's argmax at row i (len(draft) + 1 rows).
    """
    n = 0
    while n < len(draft) and draft[n] == target_tokens[n]:
        n += 1
    return n, int(target_tokens[n])


def accept_sampled(
    draft: Sequence[int],
    p: Sequence[np.ndarray],
    q: Sequence[np.ndarray] | None,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Rejection sampling (Leviathan et al. 2023, Chen et al. 2023).

    p[i]: target distribution at row i (len(draft) + 1 rows).
    q[i]: the drafter's distribution that draft[i] was sampled from, or None
    for a drafter without one (prompt lookup, suffix, a translated draft): q
    is then a point mass on the drafted token, and `accept_point_mass` applies.
    Rows dense or `Support`s (the same law, the same tokens for the same uniforms).
    The emitted tokens are distributed exactly as the target's.
    """
    if q is None:
        return accept_point_mass(draft, p, rng)
    for i, d in enumerate(draft):
        p_i = p[i]
        q_d = float(prob_at(q[i], [d])[0])
        # Accept with probability min(1, p/q), without dividing by q.
        if rng.random() * q_d < float(prob_at(p_i, [d])[0]):
            continue
        return i, sample(residual(p_i, q[i]), rng)
    return len(draft), sample(p[len(draft)], rng)


def accept_point_mass(draft: Sequence[int], p: Sequence[np.ndarray], rng: np.random.Generator) -> tuple[int, int]:
    """Point-mass drafts by sample-and-compare: draw the target's own token s from
    p[i] (`sample`: one uniform); keep draft[i] while s equals it, else s is the
    correction.

    The same law as accepting d with probability p(d) and else drawing from p
    without d, renormalised (s == d has probability p(d); s given s != d is
    that residual). Every emitted token costs exactly one uniform, in output
    order, drawn as plain sampling draws it: with the same seed (and the same
    rows) a speculative run emits the text of the plain run, whatever was drafted.
    """
    for i, d in enumerate(draft):
        s = sample(p[i], rng)
        if s != d:
            return i, s
    return len(draft), sample(p[len(draft)], rng)
