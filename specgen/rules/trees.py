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
drafts, lossless). Which extra nodes pay is the policy's (specgen.policy.trees).
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
