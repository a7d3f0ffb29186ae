"""Acceptance rules: which drafted tokens to keep, and the token that follows.

Row i of the target's verify pass scores the position after the first i
drafted tokens, so `k` drafted tokens come with `k + 1` target rows. Both rules
return `(n_accepted, next_token)`: the first `n_accepted` drafted tokens are
kept and `next_token` (the target's correction, or its bonus token when every
draft was accepted) follows them. A round therefore settles 1 … k+1 tokens.

Row arguments are indexed lazily (`rows[i]`), so a caller can compute a row's
argmax or distribution only when the rule reaches it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specgen.sampling import sample


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
    for a drafter without one (prompt lookup): q is then a point mass on the
    drafted token. The emitted tokens are distributed exactly as the target's.
    """
    for i, d in enumerate(draft):
        p_i = p[i]
        q_d = 1.0 if q is None else float(q[i][d])
        # Accept with probability min(1, p/q), without dividing by q.
        if rng.random() * q_d < p_i[d]:
            continue
        if q is None:
            residual = p_i.copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(p_i - q[i], 0.0)
        if residual.sum() <= 0.0:  # p == q up to rounding: nothing to correct
            residual = p_i
        return i, sample(residual, rng)
    return len(draft), sample(p[len(draft)], rng)
