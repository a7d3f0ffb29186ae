"""Acceptance rules: which drafted tokens to keep, and the token that follows.

Row i of the target's verify pass scores the position after the first i
drafted tokens, so `k` drafted tokens come with `k + 1` target rows. Both rules
return `(n_accepted, next_token)`: the first `n_accepted` drafted tokens are
kept and `next_token` (the target's correction, or its bonus token when every
draft was accepted) follows them. A round therefore settles 1 … k+1 tokens.

Sampled drafts with a distribution q (a draft model of the target's
vocabulary) keep rejection sampling (accept with min(1, p/q)); point-mass
drafts (q None) are verified by sample-and-compare, which emits, token for
token, what plain sampling with the same generator emits.

Row arguments are indexed lazily (`rows[i]`), so a caller can compute a row's
argmax or distribution only when the rule reaches it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specgen.rules.sampling import sample


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
    The emitted tokens are distributed exactly as the target's.
    """
    if q is None:
        return accept_point_mass(draft, p, rng)
    for i, d in enumerate(draft):
        p_i = p[i]
        q_d = float(q[i][d])
        # Accept with probability min(1, p/q), without dividing by q.
        if rng.random() * q_d < p_i[d]:
            continue
        residual = np.maximum(p_i - q[i], 0.0)
        if residual.sum() <= 0.0:  # p == q up to rounding: nothing to correct
            residual = p_i
        return i, sample(residual, rng)
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
