"""The loss budget: what a generation's drafting rounds may still stake against plain steps.

Pure bookkeeping, kept by the cost policy (`CostAware.loss_budget`). A round's
stake is its cost beyond a plain step were its first draft rejected; it may not
pass what drafting has won in this generation so far plus LOSS_SHARE of the plain
time of the generation's token limit. So the generation's net loss against plain
steps stays within that share however its drafts turn out.
"""

from __future__ import annotations

from dataclasses import dataclass

# The share of a generation's plain time (its token limit's) that its drafting may lose.
LOSS_SHARE = 0.03


@dataclass
class LossBudget:
    """`banked`: seconds drafting has won (lost: < 0) against plain steps in this
    generation; `emitted`: its tokens so far; `draft_read`: whether a draft model
    has read the context once (that first reading, its prefill or its first
    round's catch-up, is judged apart as an investment in the whole generation,
    neither staked nor banked)."""

    share: float = LOSS_SHARE
    banked: float = 0.0
    emitted: int = 0
    draft_read: bool = False

    def allowance_s(self, step_s: float, remaining: int) -> float:
        """What a round may stake now: the winnings so far plus `share` of `step_s` (a
        plain step) for each token of the limit (those emitted and those `remaining`)."""
        return self.banked + self.share * step_s * (self.emitted + min(remaining, 1 << 20))

    def fed_counts(self, fed: int) -> bool:
        """A round fed `fed` tokens to a draft model's cache first: whether that feed
        counts against the budget (not the model's first reading of the context)."""
        if not fed:
            return False
        counts, self.draft_read = self.draft_read, True
        return counts

    def plain(self) -> None:
        self.emitted += 1

    def round(self, tokens: int, step_s: float, said_s: float, seen_s: float | None, draft_s: float) -> None:
        """A drafting round emitted `tokens`: worth a plain step (`step_s`, an estimate)
        each, against its pass (`said_s`, the estimate), both taken at the load its pass
        ran under (`seen_s`, as timed; None: a shared pass, the estimates alone), and
        its draft work (`draft_s`)."""
        self.emitted += tokens
        won = tokens * step_s - said_s
        if seen_s is not None and said_s > 0:
            won *= seen_s / said_s
        self.banked += won - draft_s
