"""Sizing a draft tree on the target's verify curve: which extra branches raise
expected tokens per second (the acceptance math of a tree is specgen.rules.trees)."""

from __future__ import annotations

from typing import Sequence

from specgen.policy.base import verify_cost
from specgen.rules.trees import DraftTree


def tree_gain(reach: Sequence[float]) -> float:
    """Expected tokens of a round verifying nodes reached with these probabilities:
    1 (the target's own) + Σ P(node accepted)."""
    return 1.0 + float(sum(reach))


def size_tree(tree: DraftTree, main_reach: Sequence[float], curve: Sequence[float], *,
              width: int, others_rows: int = 0, others_tokens: float = 0.0) -> DraftTree:
    """Keep the nodes that raise expected tokens per second of the round.

    The main branch (nodes 0 … len(main_reach)-1, as the policy cut it) is
    kept, reached with `main_reach[j]` (the policy's Π α). An extra node is
    reached with its parent's reach times its own share of the drafter's
    frequencies (tree.probs[i] / tree.probs[parent], the parent's reach 1 for
    the root's children). Extra nodes are taken in decreasing reach while the
    rate (others_tokens + 1 + Σ reach) / verify(others_rows + rows) grows and
    the tree has at most `width` leaves. k = 0 stays k = 0.
    """
    n_main = len(main_reach)
    if n_main == 0 or width <= 1 or len(tree) == n_main:
        return tree.keep(range(n_main))
    reach = list(main_reach) + [0.0] * (len(tree) - n_main)
    for i in range(n_main, len(tree)):
        par = tree.parents[i]
        share = tree.probs[i] / tree.probs[par] if par >= 0 and tree.probs[par] > 0 else tree.probs[i]
        reach[i] = (reach[par] if par >= 0 else 1.0) * share
    kept = set(range(n_main))
    leaves = 1
    tokens = others_tokens + tree_gain(main_reach)
    rows = others_rows + n_main + 1
    rate = tokens / verify_cost(curve, rows)
    for i in sorted(range(n_main, len(tree)), key=lambda j: -reach[j]):
        par = tree.parents[i]
        if par >= 0 and par not in kept:
            continue  # its parent did not pay: neither can it (reach falls along a path)
        new_leaf = any(tree.parents[j] == par for j in kept)  # else it extends a leaf
        if new_leaf and leaves >= width:
            continue
        new_rate = (tokens + reach[i]) / verify_cost(curve, rows + 1)
        if new_rate <= rate:
            break
        kept.add(i)
        tokens, rows, rate = tokens + reach[i], rows + 1, new_rate
        leaves += 1 if new_leaf else 0
    return tree.keep(kept)
