"""Tree drafting in the single-sequence loop: `TreeGeneration` verifies a draft tree
(specgen.rules.trees) in one target pass and keeps the accepted path.

Each round the drafter (one with `propose_tree`, the suffix index) proposes a
main branch and up to width - 1 alternatives; the policy cuts the main branch
to k as for a single draft (k = 0: a plain step); `Policy.shape_tree` keeps the
extra nodes that pay (the cost policy: expected tokens per second on its verify
curve). A tree of one branch verifies as a plain draft does. Opt-in (`--tree-width`):
on a CPU every extra row costs most of a pass (docs/notes/2026-11-drafting-and-policy.md).
"""

from __future__ import annotations

import time
from typing import Iterator

from specgen.decode.generation import Generation, argmax, LazyRows
from specgen.decode.stats import Round
from specgen.errors import SpecgenError
from specgen.policy.base import unused_offer_outcome
from specgen.rules.sampling import support
from specgen.rules.trees import DraftTree, accept_tree_greedy, accept_tree_sampled


def main_length(tree: DraftTree) -> int:
    """Nodes 0 … n-1 that form the leading chain (branch 0)."""
    n = 0
    while n < len(tree) and tree.parents[n] == n - 1:
        n += 1
    return n


def cut_depth(tree: DraftTree, k: int) -> DraftTree:
    """The nodes at depth <= k, with the main branch cut to k."""
    depth = tree.depths()
    return tree.keep([i for i in range(len(tree)) if depth[i] <= k])


class TreeGeneration(Generation):
    """`Generation` drafting trees of up to `tree_width` branches; the scratch
    sequences seq + 1 … seq + width - 1 hold the other branches during a pass
    (the target needs kv_unified and n_seq_max >= seq + width)."""

    def __init__(self, target, prompt, drafter=None, *, tree_width: int = 2, **kw) -> None:
        super().__init__(target, prompt, drafter, **kw)
        if tree_width < 1:
            raise SpecgenError(f"--tree-width must be >= 1 (got {tree_width})")
        if self.drafter is not None and not self.drafter.trees:
            raise SpecgenError(f"the {self.drafter.name} drafter cannot propose trees (use --suffix)")
        self.tree_width = tree_width
        self.scratch = list(range(self.seq + 1, self.seq + tree_width))
        if tree_width > 1 and (not getattr(target, "kv_unified", False) or target.n_seq_max < self.seq + tree_width):
            raise SpecgenError("draft trees need the target opened with kv_unified and n_seq_max >= seq + width")
        self.tree_rounds = 0  # rounds that verified more than one branch
        self.tree_accepts = 0  # ... whose accepted path left the main branch

    def plan_tree(self) -> tuple[DraftTree, int, float, tuple | None] | None:
        """This round's tree (cut and sized), its main length k, the drafting time, and
        an offer passed over (k = 0: its key and tokens, for `settle_tree`)."""
        lim = self.limit()
        if lim is None:
            return None
        t0 = time.perf_counter()
        tree = DraftTree()
        if lim > 0:
            tree = self.drafter.propose_tree(self.context, lim, self.tree_width, self.seq)
        n_main = min(main_length(tree), lim)
        k = self.policy.choose(tree.key, n_main, self.situation()) if n_main > 0 else 0
        # an offer passed over (k = 0) still teaches its key, as in the chain loop (`plan_step`)
        passed_over = (tree.key, tree.tokens[:n_main]) if n_main and not k else None
        tree = cut_depth(tree, k) if k else DraftTree(key=tree.key)
        if len(tree) > k:
            tree = self.policy.shape_tree(tree, k, self.tree_width)
        return tree, k, time.perf_counter() - t0, passed_over

    def settle_tree(self, tree: DraftTree, k: int, draft_s: float, passed_over: tuple | None = None) -> Round:
        target, seq = self.target, self.seq
        base = len(self.context) - 1
        last = self.context[-1]
        t0 = time.perf_counter()
        branched = len(tree) > k
        if branched:
            rows, ids = target.decode_tree(seq, self.scratch, last, tree.tokens, tree.parents)
        else:
            rows = target.decode(seq, [last, *tree.tokens], len(tree) + 1)
        if self.params.greedy:
            path, nxt = accept_tree_greedy(tree, LazyRows(rows, argmax))
        else:
            path, nxt = accept_tree_sampled(tree, LazyRows(rows, lambda x: support(x, self.params)), self.rng)
        n_acc = len(path)
        if branched:
            via = seq
            if path:
                leaves = tree.leaves()
                via = next(ids[j] for j, leaf in enumerate(leaves) if path[-1] in tree.path(leaf))
            target.keep_path(seq, self.scratch, via, base, n_acc)
            self.tree_rounds += 1
            self.tree_accepts += any(i >= k for i in path)
        elif n_acc < len(tree):
            target.truncate(seq, base + 1 + n_acc)
        emitted = self._emit([tree.tokens[i] for i in path] + [nxt])
        self.context.extend(emitted)
        verify_s = time.perf_counter() - t0
        on_main = 0
        while on_main < n_acc and path[on_main] < k:
            on_main += 1
        # the policy learns the main branch; a wider pass is not the k + 1-row cost it tracks
        self.policy.update(tree.key, k, on_main, None if branched else verify_s, None)
        if passed_over is not None:
            self.policy.observe(passed_over[0], *unused_offer_outcome(passed_over[1], emitted))
        return self._account(Round(emitted, len(tree), n_acc, draft_s, verify_s))

    def __iter__(self) -> Iterator[Round]:
        self.begin()
        try:
            yield self.first(self.read_prompt())
            while (plan := self.plan_tree()) is not None:
                yield self.settle_tree(*plan)
        except KeyboardInterrupt:
            self.interrupt()
            raise
