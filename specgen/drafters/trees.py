"""Draft trees: several branches of draft tokens verified in one target pass.

A tree is a flat list of nodes in topological order: `tokens[i]` and
`parents[i]` (-1: a child of the root, the context's last token, which the
target has not scored yet). The verify pass holds the root in row 0 and node
i in row i + 1, each row attending to its ancestors only; row r scores the
position after its token. Branch 0 (nodes 0 … n0-1, a chain) is the drafter's
single-branch draft, so a tree never accepts less than that draft would.

Pure functions: the acceptance rules (greedy: the longest path the target's
argmax follows; sampled: the path the target's own sampled tokens follow,
the law of SpecInfer's multi-draft rejection sampling with point-mass
drafts, lossless) and the sizing (which extra nodes pay, by
expected tokens per second on the target's row-cost curve).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specgen.rules.sampling import sample


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)  # the drafter's estimate that each node is reached
    key: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self) -> list[list[int]]:
        """children[0]: the root's; children[i + 1]: node i's (in node order)."""
        out: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, p in enumerate(self.parents):
            out[p + 1].append(i)
        return out

    def depths(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def leaves(self) -> list[int]:
        has_child = set(self.parents)
        return [i for i in range(len(self.tokens)) if i not in has_child]

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def keep(self, nodes: Sequence[int]) -> "DraftTree":
        """The subtree of `nodes` (closed under parents), renumbered in the same order."""
        nodes = sorted(set(nodes))
        index = {n: i for i, n in enumerate(nodes)}
        parents = []
        for n in nodes:
            p = self.parents[n]
            if p >= 0 and p not in index:
                raise ValueError("a kept node's parent must be kept")
            parents.append(index[p] if p >= 0 else -1)
        probs = [self.probs[n] for n in nodes] if self.probs else []
        return DraftTree([self.tokens[n] for n in nodes], parents, probs, self.key)

    def validate(self) -> None:
        if len(self.parents) != len(self.tokens) or (self.probs and len(self.probs) != len(self.tokens)):
            raise ValueError("tokens, parents and probs must have one entry per node")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError("nodes must come after their parents")
        for kids in self.children():
            toks = [self.tokens[c] for c in kids]
            if len(set(toks)) != len(toks):
                raise ValueError("siblings must carry distinct tokens")


def chain(tokens: Sequence[int], key: int = 0) -> DraftTree:
    """A single-branch draft as a tree."""
    return DraftTree(list(tokens), list(range(-1, len(tokens) - 1)), [], key)


# -- acceptance ----------------------------------------------------------------

def accept_tree_greedy(tree: DraftTree, target_tokens) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree.

    target_tokens[r]: the argmax at row r (row 0 the root, row i + 1 node i).
    Returns (accepted node indices along one path, next token): the emitted
    tokens are exactly plain greedy decoding's.
    """
    kids = tree.children()
    path: list[int] = []
    row = 0
    while True:
        t = int(target_tokens[row])
        nxt = next((c for c in kids[row] if tree.tokens[c] == t), None)
        if nxt is None:
            return path, t
        path.append(nxt)
        row = nxt + 1


def accept_tree_sampled(tree: DraftTree, p, rng: np.random.Generator) -> tuple[list[int], int]:
    """Point-mass siblings by sample-and-compare: at each reached node draw the
    target's own token s from its row (`sample`: one uniform) and follow the
    child carrying s; with none, s is the next token.

    p[r]: the target's distribution at row r. The same law as SpecInfer's
    multi-draft rejection sampling (Miao et al. 2024) with point-mass drafts
    (child c tried in turn with probability residual(c) / mass is reached
    with probability p(c) in all), so every emitted token is distributed
    exactly as the target's; and each costs one uniform, in output order, as
    in plain sampling: the same seed gives plain's text.
    """
    kids = tree.children()
    path: list[int] = []
    row = 0
    while True:
        s = sample(p[row], rng)
        nxt = next((c for c in kids[row] if tree.tokens[c] == s), None)
        if nxt is None:
            return path, s
        path.append(nxt)
        row = nxt + 1


# -- sizing ----------------------------------------------------------------------

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
    from specgen.policy.base import verify_cost

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
