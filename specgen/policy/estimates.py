"""One model's pass costs during a run: its measured profile, corrected by the
passes observed (the cost policy's estimates, `specgen.policy.cost.CostAware`)."""

from __future__ import annotations


def _follow(estimate: float, seen: float, ceiling: float) -> float:
    """Move a cost estimate toward a new observation: quickly down, slowly up,
    never above its profile (`ceiling`). Other processes only ever add time,
    and they slow every pass alike; but only the passes in use are observed
    (the target's alone while drafting is off), so estimates allowed to climb
    with the load would drift apart and skew every comparison. A faster pass
    is evidence of the true cost; a slower one is only let back up to the
    profile, which a quiet machine measured (`costs` retakes inflated ones)."""
    if estimate <= 0:
        return seen
    if seen < estimate:
        return estimate + 0.2 * (seen - estimate)
    return min(estimate + 0.05 * (seen - estimate), max(ceiling, estimate))


class Estimates:
    """One model's costs now: its measured profile (figures by row count or
    name), corrected by the passes observed. A figure observed follows its
    own observations (`_follow`); every other one is its profile × the
    model's `level`, the ratio its observed passes ran at against their
    profile (taken at once when lower, let up slowly, never above 1). Other processes slow every pass
    alike, so a pass faster than its profile at one row count shows the
    profile inflated at the others too (taken on a busy machine): without the
    level, a figure never observed (a plain step while drafting is on) would
    keep an inflated price, and every comparison with it would tilt. An
    underestimated figure gets chosen, observed, and corrected; an
    overestimated one might never be."""

    def __init__(self, profile: dict) -> None:
        self.profile = dict(profile)
        self.own: dict = {}  # figure -> its estimate, once observed
        self.level = 1.0

    def __getitem__(self, key) -> float:
        own = self.own.get(key)
        return own if own is not None else self.profile[key] * self.level

    def observe(self, key, seen: float, sets_level: bool = True) -> None:
        """A pass of figure `key` took `seen` seconds. `sets_level`: False for a
        kind of pass whose cost departs from its profile's by its size (a bulk
        feed of more or fewer tokens than profiled), not only by the load."""
        base = self.profile.get(key, 0.0)
        if seen <= 0:
            return
        if base <= 0:  # nothing profiled: the first pass observed is the estimate, as before
            self.own[key] = _follow(self.own.get(key, 0.0), seen, 0.0)
            return
        if sets_level:  # a pass faster than the level is taken at once: load only ever adds time
            ratio = seen / base
            self.level = ratio if ratio < self.level else _follow(self.level, ratio, 1.0)
        self.own[key] = _follow(self[key], seen, base)
