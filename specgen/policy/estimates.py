"""One model's pass costs during a run: its profile, corrected by the passes
observed (the cost policy's estimates, `specgen.policy.cost.CostAware`), and
what those passes were (`Observed`, kept per model by a session's `CostLog`,
merged into the cached profile when it closes: specgen.engine.costs.learn)."""

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

    def __init__(self, profile: dict, provisional=()) -> None:
        self.profile = dict(profile)
        # figures not measured but filled in (a probe's, specgen.engine.costs.block_curve):
        # the first pass observed replaces one as its profile figure, so it may rise
        # above the guess, and it says nothing of the load (the level)
        self.provisional = set(provisional)
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
        if key in self.provisional:
            self.provisional.discard(key)
            self.profile[key] = self.own[key] = seen
            return
        if base <= 0:  # nothing profiled: the first pass observed is the estimate, as before
            self.own[key] = _follow(self.own.get(key, 0.0), seen, 0.0)
            return
        if sets_level:  # a pass faster than the level is taken at once: load only ever adds time
            ratio = seen / base
            self.level = ratio if ratio < self.level else _follow(self.level, ratio, 1.0)
        self.own[key] = _follow(self[key], seen, base)


class Observed:
    """The passes seen on one model, least disturbed first: the fastest pass per
    row count (other processes only ever add time) and per bulk-feed length."""

    def __init__(self) -> None:
        self.verify: dict[int, float] = {}  # rows -> seconds of a pass
        self.feed: dict[int, float] = {}  # tokens fed -> seconds of the feed

    def add_pass(self, rows: int, seconds: float) -> None:
        if seconds > 0 and seconds < self.verify.get(rows, float("inf")):
            self.verify[rows] = seconds

    def add_feed(self, tokens: int, seconds: float) -> None:
        if seconds > 0 and seconds < self.feed.get(tokens, float("inf")):
            self.feed[tokens] = seconds


class CostLog:
    """What the policies of one session observed, per model (by engine): every
    policy a session makes writes here, and the session merges it into each
    model's cached profile when it closes."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, Observed]] = {}

    def of(self, engine) -> Observed:
        got = self._seen.get(id(engine))
        if got is None or got[0] is not engine:
            got = self._seen[id(engine)] = (engine, Observed())
        return got[1]

    def items(self) -> list[tuple[object, Observed]]:
        return list(self._seen.values())

    def clear(self) -> None:
        self._seen.clear()
