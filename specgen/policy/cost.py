"""The cost policy: the draft length (0 included) with the most expected tokens per second.

It prices each k from the measured costs (the target's verify curve, the draft
model's step and bulk feed, corrected by the passes it observes) and decides
by optimistic Thompson sampling over its acceptance estimates (see CostAware).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from specgen.policy.base import (
    ALONE, MODEL_KEY, Policy, Situation, expected_tokens, step_rate, verify_cost, with_counts,
)
from specgen.plan import NORMAL_FEED
from specgen.policy.budget import LossBudget
from specgen.policy.estimates import Estimates, Observed
from specgen.policy.evidence import Acceptance
from specgen.policy.trees import size_tree
from specgen.rules.trees import DraftTree


# A draft model's acceptance before evidence: (mean, weight in rounds). A model
# paired with a target varies less from request to request than lookup's
# matches do, so its prior weighs more, and one unlucky round moves it less
# (replayed: docs/notes/2026-11-drafting-and-policy.md).
DRAFT_MODEL_PRIOR = (0.7, 6.0)
# Prediction heads' acceptance before evidence, where their file has no figure
# of its own (`heads_prior`): lower than a draft model's (a head sees one hidden
# state, not the text), and weighing fewer rounds, so a target where they do
# poorly stops drafting soon.
HEADS_PRIOR = (0.5, 4.0)
# The weight, in rounds, of `prior` in a free drafter's pooled prior (`_free_prior`).
FREE_POOL_STRENGTH = 2.0
# The weight of the newest run in `CostAware.model_run`, the running mean of the rounds
# a draft model drafted after each catch-up of its cache.
RUN_RATE = 0.3


def heads_prior(heads) -> tuple[float, float]:
    """Trained heads' acceptance before evidence: the first head's held-out top-1 that
    training measured (kept in the heads file), at HEADS_PRIOR's weight; HEADS_PRIOR
    itself for heads without that figure."""
    info = heads.info if heads is not None else {}
    top1 = (info.get("heldout") or {}).get("top1") or []
    if top1 and isinstance(top1[0], (int, float)):
        return min(max(float(top1[0]), 0.05), 0.95), HEADS_PRIOR[1]
    return HEADS_PRIOR


def _best(rates: Sequence[float]) -> int:
    return max(range(len(rates)), key=rates.__getitem__)


def _explore(drawn: Sequence[float], mean: Sequence[float], k: int, near: bool = True) -> int:
    """The draft length a round explores when its draw favours k (drawn[k] the
    best of `drawn`) and the estimates favour a shorter one, b: the shortest n
    in (b, k] whose drawn rate beats b's. It tests the positions just past the
    evidence, and a long draft costs most when the draw was wrong. (b = 0: a
    probe, the shortest draft that beats a plain step.)"""
    b = _best(mean)
    if k <= b or drawn[k] <= drawn[b] or (b and not near):
        return k
    return next(n for n in range(b + 1, k + 1) if drawn[n] > drawn[b])


@dataclass(frozen=True)
class Costs:
    """What a round costs, as the cost policy starts: the target's verify curve
    (`verify_s[n]`: a pass of n logit rows, index 0 unused), one draft step, a
    bulk catch-up per token of the draft's cache, and the draft's own curve.
    `provisional` (`draft_provisional`): the figures of a probed profile that
    were filled in, not measured: each takes its first observed pass as its
    figure (`Estimates`). `seen` (`draft_seen`): where the passes it times are
    kept (a session's CostLog, merged into the cached profile when it closes)."""

    verify_s: Sequence[float]
    draft_step_s: float = 0.0
    feed_s: float = 0.0
    draft_verify_s: Sequence[float] | None = None
    provisional: Sequence[int] = ()
    draft_provisional: Sequence[int] = ()
    seen: Observed | None = None
    draft_seen: Observed | None = None


@dataclass(frozen=True)
class Priors:
    """Acceptance before evidence, and how evidence fades: `prior` per draft
    position, `model` (mean, strength) for a draft model's rounds (None: as the
    others), counts decayed by `decay` a drafted round (a passed-over offer's
    judgment fades only the positions it reaches) and `idle_decay` a plain one."""

    prior: float = 0.6
    model: tuple[float, float] | None = None
    decay: float = 0.95
    idle_decay: float = 0.98


class CostAware(Policy):
    """Choose k to maximise expected tokens per second, k = 0 (a plain step) included.

    Costs: the target's verify curve (a measured profile, then the round times
    observed), one draft step (the drafter's own step timings, never its
    catch-up), and a catch-up of the draft's cache (a pass of that many rows
    on the draft's curve; the bulk rate per token beyond it): `Costs`.
    Acceptance: a posterior per draft position (per key), from decayed counts;
    a draft model's rounds (MODEL_KEY) start from DRAFT_MODEL_PRIOR; a translated
    model's, while sampling, from `prior` × the target's running top probability
    (`target_top`).
    With prompt lookup alongside a draft model, each round weighs lookup's
    offer against the model (`choose_offer`).

    Each round draws one z ~ N(0, 1), kept only when positive, and scores
    every k with the acceptance estimates shifted up by z standard deviations
    (optimistic Thompson sampling): where the
    evidence is thin (a fresh prior, one unlucky round) draws spread widely and
    some rounds draft anyway, so one rejection cannot end drafting; where it is
    ample, draws sit at the estimates and the choice is the expected-best k.
    While nothing is drafted no evidence arrives, so the counts fade (by
    `idle_decay` a round) and the spread grows back: a drafter that cannot
    pay is probed rarely, one whose acceptance changes is found again. A free
    drafter's offer that a round passes over (k = 0, or the model drafted) is
    the exception: it is judged against what the round emitted (`observe`),
    evidence at no cost; and so it is chosen a little below its estimates
    (`free_z`), not above.

    A draft model whose cache lags (its prompt not yet read, tokens settled
    while it sat out) first pays the catch-up: it drafts only if catch-up +
    the remaining tokens at the drafting rate beat the remaining tokens at the
    plain rate.

    A probe (a round the draw alone sends drafting, the estimates favouring
    k = 0) drafts the shortest k the draw favours: it tests the first
    positions, where the evidence is, and a long draft's rounds cost most
    when the draw was wrong. Likewise a draw that favours a longer draft
    than the estimates' best b drafts the shortest k > b it rates above b:
    the positions past b are often unseen, their estimates inherit b's with
    a wide spread, and one draw lifts them all (a long exploration of a
    break-even draft loses: docs/notes/2026-11-translated-drafts.md). A
    probe's catch-up of the draft's cache is shared by the rounds it is
    expected to open: those the estimate rests on if its draw is right (the
    posterior's chance that drafting pays), its own round alone if not. (A probe
    that paid its whole catch-up in its own round kept a model that fell behind
    once from ever drafting again: simulated, docs/notes/2026-12-06-real-pair.md.)
    Any other round amortises a catch-up over no more rounds than its estimate
    rests on (the first position's decayed count plus the prior's weight):
    evidence faded back to the prior over a long plain stretch does not buy a
    long catch-up. Nor over more rounds than the model drafted, on average,
    after its earlier catch-ups (`model_run`): beside prompt lookup, whose long
    rounds leave it behind again (a rewrite), a catch-up buys a round or two.
    The first catch-up, before any evidence, is amortised over the tokens left,
    as the prior's promise.

    A drafter that reports `Draft.extra_s` (a translated draft) costs more a
    round than k steps and a verify pass: its text is turned into tokens both
    ways, its first pass feeds the re-tokenized tail (often several of its
    own tokens), a translation that comes out short wastes passes. For it,
    `round_scale` learns what its drafting rounds really take (draft and
    verify, observed) over what the estimates say, and scales their cost, so
    its choices see the real per-round cost. Other drafters: 1.

    A loss budget (`policy.budget`) bounds what all this can cost a generation: a
    round stakes no more than drafting has won so far plus a share of the limit's
    plain time. Where rows are dear, a reply's first long draft stakes several
    plain steps on thin evidence, and one that broke early left a short reply
    slower than plain; the budget makes it win smaller drafts first (replayed:
    docs/notes/2026-12-08-loss-budget.md).

    Built from `Costs` (what rounds cost) and `Priors` (what acceptance is
    believed before evidence, and how evidence fades).
    """

    name = "cost"
    TOP_RATE = 0.2  # weight of the newest row in the running mean of the target's top probability
    # The rules, as class attributes a benchmark's subclass may turn off to replay the
    # earlier ones side by side (benchmarks/replaylib/translate.py). explore_near: past a
    # drafting best, a draw explores only as far as it favours (off: the draw's own best).
    # top_prior: while sampling, a point-mass draft model's prior is scaled by the target's
    # running top probability (off: the prior as under greedy).
    explore_near = True
    top_prior = True
    # free_z: a free drafter's offer is chosen on its estimates shifted by this many posterior
    # deviations (below its means): see `choose`.
    free_z = -0.5
    # observe_fades_all: a passed-over offer's judgment fades the evidence of every position,
    # not only of those it reaches (off: see `observe`).
    observe_fades_all = False
    # pool_positions: a free key's thinly seen positions past the first start no higher
    # than all free keys' evidence there (`_free_pool`; off: from the key's own
    # estimate at the position before alone)
    pool_positions = True
    # cap_by_run: a catch-up of the draft's cache pays back within no more rounds than
    # a catch-up bought before (`model_run`; off: the rounds its estimate rests on)
    cap_by_run = True
    # loss_budget: a round stakes no more than the generation's winnings so far and its
    # allowance (`policy.budget`; off: any k the estimates favour)
    loss_budget = True

    def __init__(self, k_max: int, costs: Costs, priors: Priors = Priors(), *, seed: int = 0,
                 shared: dict | None = None) -> None:
        super().__init__()
        self.k_max = k_max
        # the measured profiles, corrected as passes are observed (`Estimates`); the target's
        # and the draft model's apart, as each profile was taken at its own time
        self._target = Estimates(dict(enumerate(costs.verify_s)), costs.provisional)
        self._draft = Estimates({**dict(enumerate(costs.draft_verify_s or [])), "step": costs.draft_step_s,
                                 "feed": costs.feed_s}, costs.draft_provisional)
        # where the passes this policy times are kept (a session's CostLog, for the cache)
        self._seen, self._draft_seen = costs.seen, costs.draft_seen
        self._refresh()
        self.round_scale = 1.0  # real ÷ estimated cost of a drafting round (drafters that report Draft.extra_s)
        # the draft model's rounds since its last catch-up, and their running mean over
        # the runs closed so far (None: none yet): see `_catch_up_pays_back`
        self._run, self.model_run = 0, None
        self._rounds_seen = 0
        self.budget = LossBudget()  # what this generation's rounds may still stake
        self.prior = priors.prior
        self.model_prior = priors.model  # (mean, strength) for a draft model's rounds; None: as the others
        self.decay = priors.decay
        self.idle_decay = priors.idle_decay
        self.rng = np.random.default_rng(seed)
        self.top: float | None = None  # the target's running top probability (sampling; None: not told)
        # key → Acceptance; a server passes one dict to all its requests' policies
        self.stats: dict[int, Acceptance] = shared if shared is not None else {}

    def _refresh(self) -> None:
        """The estimates now, as the lists and figures the choices read."""
        t, d = self._target, self._draft
        self.verify_s = [t[n] for n in range(len(t.profile))]  # a target pass of n logit rows (index 0 unused)
        self.draft_step_s = d["step"]
        self.feed_s = d["feed"]  # seconds per token of a bulk catch-up of the draft's cache
        self.draft_verify_s = [d[n] for n in range(len(d.profile) - 2)]  # the draft's pass of n tokens

    def _counts(self, key: int) -> Acceptance:
        """The key's evidence, to add to (its estimates' priors are refreshed by `acceptance`)."""
        acc = self.stats.get(key)
        if acc is None:
            if key == MODEL_KEY and self.model_prior is not None:
                acc = Acceptance(*self.model_prior)
            else:
                acc = Acceptance(prior=self.prior)
            self.stats[key] = acc
        return acc

    def acceptance(self, key: int) -> Acceptance:
        """The key's evidence with its priors as they stand now, to read estimates from."""
        acc = self._counts(key)
        if key == MODEL_KEY and self.model_prior is None and self.top_prior and self.top is not None \
                and not self.draft_picks:
            acc.prior = self.prior * self.top  # follows the text: see `target_top`
        elif key != MODEL_KEY:
            acc.prior = self._free_prior()
            acc.pool = self._free_pool(acc.prior) if self.pool_positions else ()
        return acc

    def _free_pool(self, first: float) -> list[float | None]:
        """Each position's acceptance pooled over every free key's evidence there (None
        where no key has reached it; `first`: the pooled first position), around
        the pooled estimate at the position before with FREE_POOL_STRENGTH rounds'
        weight: the drafter's own figure for the position, which a key's estimate is
        held to where the key has seen little of it. A key whose offers have held at
        their first positions would otherwise take its later positions to hold as
        well; where long drafts broke off early (copied lines that the reply edits a
        few tokens in), a 16-row draft on that promise lost a reply's gains where
        rows are dear (replayed: docs/notes/2026-12-08-pooled-positions.md)."""
        reached: list[float] = []
        accepted: list[float] = []
        for key, acc in self.stats.items():
            if key == MODEL_KEY:
                continue
            for i, (r, a) in enumerate(zip(acc.reached, acc.accepted)):
                if i < len(reached):
                    reached[i] += r
                    accepted[i] += a
                else:
                    reached.append(r)
                    accepted.append(a)
        out: list[float | None] = [None]  # the first position: `first` itself
        prior = first
        for r, a in zip(reached[1:], accepted[1:]):
            if r > 0:
                prior = (a + FREE_POOL_STRENGTH * prior) / (r + FREE_POOL_STRENGTH)
            out.append(prior if r > 0 else None)
        return out

    def _free_prior(self) -> float:
        """A free drafter's key starts from what all its keys have met so far: the
        first position's acceptance pooled over every free key's evidence, with
        `prior` weighing FREE_POOL_STRENGTH rounds. A match length never seen on
        free text (where lookup's matches are mostly chance) then starts low, not at
        the prior fitted to copying; on copied text the pool is high anyway."""
        reached = accepted = 0.0
        for key, acc in self.stats.items():
            if key != MODEL_KEY and acc.reached:
                reached += acc.reached[0]
                accepted += acc.accepted[0]
        return (accepted + FREE_POOL_STRENGTH * self.prior) / (reached + FREE_POOL_STRENGTH)

    def target_top(self, top: float) -> None:
        """A point-mass draft (a translated model's argmax) at a position is
        accepted with the target's probability of it, at most the target's top
        probability there: on free sampled text (top ≈ 0.4-0.6) far below the
        prior fitted to greedy runs, where a right token is always accepted. So
        while sampling, such a model's prior is `prior` × the running mean of the
        top probability at the rows tokens were emitted from (1 on copied text,
        where nothing changes). Lookup's keys keep theirs: an n-gram match is
        evidence of copying, where the target is surer than the text around it
        (scaling them too lost on copy-heavy requests, replayed:
        docs/notes/2026-11-translated-drafts.md)."""
        self.top = top if self.top is None else self.top + self.TOP_RATE * (top - self.top)

    def rates(self, alphas: Sequence[float], situation: Situation = ALONE) -> list[float]:
        """Expected tokens per second for k = 0 … len(alphas)."""
        step = self.draft_step_s + (self.pick_s if self.draft_picks else 0.0)
        return [step_rate(alphas, k, self.verify_s, step, situation, self.pick_s, self.round_scale)
                for k in range(len(alphas) + 1)]

    def choose(self, key: int, limit: int, situation: Situation = ALONE, z: float | None = None) -> int:
        """k for this round (0: a plain step); `z` fixes the round's upward draw
        (None: drawn, or `free_z` for a free key)."""
        limit = min(limit, self.k_max)
        if limit <= 0:
            return 0
        acc = self.acceptance(key)
        # optimistic Thompson sampling: only upward draws, so noise never cuts
        # a draft the estimates already favour; it only tries k they do not.
        # A free drafter's offer is judged whether or not it is verified
        # (`observe`): drafting it to learn buys nothing, so it is chosen on its
        # estimates with no draw, and they do not fade while it sits out. Its
        # estimates are taken `free_z` deviations below their means: choosing among
        # noisy estimates favours those that noise lifted, and where rows are dear
        # one long draft on thin evidence lost a reply's gains.
        free = key != MODEL_KEY
        if z is None:
            z = self.free_z if free else max(float(self.rng.standard_normal()), 0.0)
        alphas = with_counts(acc.rates(limit, z=z), situation.counts)
        rates = self._within_budget(self.rates(alphas, situation), situation, not free)
        k = _best(rates)
        drawn = k and z and not free
        mean = self._within_budget(self.rates(with_counts(acc.rates(limit), situation.counts), situation),
                                   situation, not free) if drawn else rates
        probe = bool(drawn) and _best(mean) == 0
        k = _explore(rates, mean, k, self.explore_near)  # past the estimates' best: only as far as the draw favours
        if k and situation.lag > 2:
            chance = self._pays_chance(acc, limit, situation, z) if probe else None
            if not self._catch_up_pays_back(acc, k, alphas, rates, situation, chance):
                k = 0
        if k == 0 and not free:
            acc.forget(self.idle_decay)
        return k

    def stake_s(self, k: int, situation: Situation = ALONE, model: bool = False) -> float:
        """What a round of k drafts risks beyond a plain step: its cost over one row's
        pass, were its first draft rejected (it then emits one token, as a plain step
        does); a draft model's round adds its k steps and its cache's catch-up (not its
        first reading of the context: `LossBudget.draft_read`)."""
        stake = verify_cost(self.verify_s, k + 1) - self.verify_s[1]
        if model:
            stake += k * self.draft_step_s + (self.catch_up_s(situation.lag) if self.budget.draft_read else 0.0)
        return stake

    def _within_budget(self, rates: list[float], situation: Situation, model: bool) -> list[float]:
        """`rates` (per k) with those of the drafts whose stake exceeds the budget set to
        0, never chosen; all of them in a shared step (where rows are priced with the
        others') or with the budget off."""
        if not self.loss_budget or situation.others_rows:
            return rates
        budget = self.budget.allowance_s(self.verify_s[1], situation.remaining)
        return [r if k == 0 or self.stake_s(k, situation, model) <= budget else 0.0 for k, r in enumerate(rates)]

    def _catch_up_pays_back(self, acc: Acceptance, k: int, alphas: Sequence[float], rates: Sequence[float],
                            situation: Situation, chance: float | None) -> bool:
        """A round of k drafts, with the draft's cache caught up first, still
        beats plain steps. The catch-up must pay back within the rounds the
        estimate rests on: faded evidence promises few.
        A probe's (`chance`: the posterior's chance that drafting pays) is
        shared by those rounds only if its draw was right, else its own round
        bears it. Before any evidence (a first catch-up: a prompt the draft did
        not prefill) the prior speaks for the whole generation."""
        left = situation.remaining
        if chance is not None or acc.reached:
            rounds = acc.reached[0] + acc.strength if acc.reached else 1.0
            if self.model_run is not None and self.cap_by_run:
                rounds = min(rounds, self.model_run)
            if chance is not None:
                rounds = chance * rounds + 1.0 - chance
            left = min(left, rounds * expected_tokens(alphas[:k]))
        return self._catch_up_pays(situation.lag, left, rates[k], rates[0])

    def _pays_chance(self, acc: Acceptance, limit: int, situation: Situation, z: float) -> float:
        """The posterior's chance that drafting pays: P(Z > z*), z* the least draw (in
        (0, z], bisected) at which some k > 0 beats a plain step."""
        lo, hi = 0.0, z
        for _ in range(12):
            mid = 0.5 * (lo + hi)
            r = self.rates(with_counts(acc.rates(limit, z=mid), situation.counts), situation)
            if _best(r):
                hi = mid
            else:
                lo = mid
        return 0.5 * math.erfc(hi / math.sqrt(2.0))

    def shape_tree(self, tree: DraftTree, k: int, width: int) -> DraftTree:
        """The extra branches that raise expected tokens per second on this
        policy's verify curve (`policy.trees.size_tree`), the main branch reached
        with the key's acceptance estimates."""
        reach, r = [], 1.0
        for a in self.acceptance(tree.key).rates(k):
            r *= a
            reach.append(r)
        return size_tree(tree, reach, self.verify_s, width=width)

    def choose_offer(self, key: int, offered: int, limit: int, situation: Situation = ALONE) -> tuple[int, bool]:
        """The offer or the model, whichever promises more tokens per second
        under the round's upward draw: the offer's drafts cost no draft steps, the
        model's cost its steps and, when its cache lags, the bulk feed first.
        An option whose estimates favour a plain step, drafting only by its
        draw, is probed as in `choose`: at the shortest k its draw favours."""
        limit, offered = min(limit, self.k_max), min(offered, self.k_max)
        counts, situation = situation.counts, replace(situation, counts=())  # the offer's, not the model's
        if offered <= 0 or (limit > 0 and situation.lag <= NORMAL_FEED and not self.acceptance(MODEL_KEY).reached):
            # no offer, or the model has not drafted yet and its cache is in
            # step: it drafts once now, while learning what it is worth is cheap.
            # Before any evidence its draw is at least one deviation above the
            # prior, as its prefill was judged (`prefill_pays`): a lower draw that
            # declines leaves its cache to fall behind, and the catch-up then
            # keeps a model that was never tried from ever drafting.
            z = max(float(self.rng.standard_normal()), 1.0) if not self.acceptance(MODEL_KEY).reached else None
            k = self.choose(MODEL_KEY, limit, situation, z=z) if limit > 0 else 0
            if k or offered <= 0:
                return k, False
            limit = 0  # the model declines at its prior (its rows cost more than it promises): the offer alone
        if limit <= 0:  # lookup alone: nothing to weigh it against
            return self.choose(key, offered, replace(situation, counts=counts)), True
        # one upward draw for the round, for the model: scored that many of its
        # posterior deviations above its estimate, it is still tried now and then
        # where rated lower. The offer is judged at no cost whether or not it is
        # verified (`observe`), so it is scored on its estimates alone, as in `choose`.
        z = max(float(self.rng.standard_normal()), 0.0)
        offer, model = self.acceptance(key), self.acceptance(MODEL_KEY)
        take = self._within_budget(
            [step_rate(with_counts(offer.rates(offered, z=self.free_z), counts), k, self.verify_s, 0.0, situation,
                       self.pick_s) for k in range(offered + 1)], situation, False)
        k_take = _best(take)
        alphas = model.rates(limit, z=z)
        rates = self._within_budget(self.rates(alphas, situation), situation, True)
        k = 1 + _best(rates[1:])
        if not rates[k]:  # no draft of the model's within the budget
            return k_take, True
        if z:  # and the model
            k = _explore(rates, self._within_budget(self.rates(model.rates(limit), situation), situation, True),
                         k, self.explore_near)
        # this round pays the model's catch-up, if its cache lags
        rate = 1.0 / (1.0 / rates[k] + self.catch_up_s(situation.lag) / expected_tokens(alphas[:k]))
        if rate > take[k_take] and (situation.lag <= NORMAL_FEED or
                                    self._catch_up_pays(situation.lag, situation.remaining, rate, rates[0])):
            return k, False
        if k_take == 0:
            model.forget(self.idle_decay)
        return k_take, True

    def _learn_round(self, k: int, draft, verify_s: float | None) -> None:
        """A drafting round's time (its draft work and its verify pass) over what the
        estimates say for k tokens (k: those it delivered, fewer than its passes
        where a translation came out short), from rounds alone in their pass and
        without a bulk catch-up (that is learned apart, as feed_s)."""
        if draft.extra_s is None or not k or draft.fed or not draft.steps or not verify_s:
            return
        said = verify_cost(self.verify_s, k + 1) + k * self.draft_step_s
        seen = (verify_s + draft.step_s + draft.extra_s) / said
        self._rounds_seen += 1
        self.round_scale = seen if self._rounds_seen == 1 else self.round_scale + 0.2 * (seen - self.round_scale)

    def _count_run(self, caught_up: bool) -> None:
        """A draft model's round: one that caught its cache up first opens a run of
        rounds, and closes the one before into `model_run`, the running mean of how
        many rounds a catch-up bought before the model fell behind again."""
        if caught_up:
            if self._run:
                self.model_run = self._run if self.model_run is None else \
                    self.model_run + RUN_RATE * (self._run - self.model_run)
            self._run = 1
        elif self._run:
            self._run += 1

    def _catch_up_pays(self, lag: int, remaining: int, rate_k: float, rate_0: float) -> bool:
        """Catching up `lag` tokens, then drafting the rest, beats not drafting."""
        left = max(remaining, 1)
        return self.catch_up_s(lag) + left / rate_k < left / rate_0

    def catch_up_s(self, lag: int) -> float:
        """Seconds to feed a lagging draft cache `lag` tokens beyond its usual
        first step: a pass of `lag` rows on the draft's measured curve where it
        reaches (a few tokens cost far more each than a prompt's bulk rate), the
        bulk rate per token beyond."""
        if lag <= NORMAL_FEED:  # the first draft step feeds them
            return 0.0
        curve = self.draft_verify_s
        if not curve:
            return lag * self.feed_s
        top = min(lag, len(curve) - 1)
        return max(curve[top] - self.draft_step_s, 0.0) + (lag - top) * self.feed_s

    def prefill_pays(self, lag: int, remaining: int, key: int = 0) -> bool:
        """Decided once, so optimistically: acceptance one posterior standard
        deviation above its estimate (the draws of `choose` reach that often;
        a draft left unread would be caught up a few rounds later anyway)."""
        rates = self.rates(self.acceptance(key).rates(self.k_max, z=1.0))
        k = max(range(len(rates)), key=rates.__getitem__)
        return k > 0 and self._catch_up_pays(lag, remaining, rates[k], rates[0])

    def observe(self, key: int, reached: int, accepted: int) -> None:
        """A passed-over offer of `key`, judged against what the round emitted: its
        first `reached` positions. The evidence of the positions past them does not
        fade: a run of plain steps judges each offer at its first position only, and
        that says nothing of the later ones (fading them let a long stretch of plain
        steps erase what long drafts had shown, and a rewrite stopped drafting long)."""
        if reached > 0:
            self._counts(key).add(reached, accepted, self.decay, fade_unseen=self.observe_fades_all)

    def _bank(self, key: int, k: int, accepted: int, verify_s: float | None, draft) -> None:
        """A round's outcome into the loss budget: its pass's estimate and, alone in its
        pass, its time as timed (the estimates never rise above the profile a quiet
        machine measured, so on a busy one a timed pass against an estimated plain step
        would count every round a loss); its draft work as timed (shared: estimated).
        A draft model's prefill (k = 0, its prompt fed) emits nothing."""
        fed = draft is not None and self.budget.fed_counts(draft.fed)
        if not k:
            if draft is None or not draft.fed or draft.steps:
                self.budget.plain()
            return
        said = verify_cost(self.verify_s, k + 1)
        if draft is None:
            draft_s = 0.0
        elif verify_s is None:
            draft_s = k * self.draft_step_s + (self.catch_up_s(draft.fed) if fed else 0.0)
        else:
            draft_s = draft.step_s + (draft.fed_s if fed else 0.0) + (draft.extra_s or 0.0)
        seen = None if verify_s is None else verify_s - (accepted + 1) * self.pick_s
        self.budget.round(accepted + 1, self.verify_s[1], said, seen, draft_s)

    def update(self, key: int, k: int, accepted: int, verify_s: float | None = None, draft=None) -> None:
        super().update(key, k, accepted)
        self._bank(key, k, accepted, verify_s, draft)
        if k > 0:
            self._counts(key).add(k, accepted, self.decay)
        if key == MODEL_KEY and k > 0:
            self._count_run(draft is not None and draft.fed > 0)
        # a pass's own time, as profiled: the picks the acceptance rule (and a sampling
        # draft) made are priced apart (`step_rate`), so they are taken out
        if verify_s:
            verify_s = verify_s - (accepted + 1) * self.pick_s
        if draft is not None:
            pick = self.pick_s if self.draft_picks else 0.0
            if draft.steps and draft.step_s > 0:
                # only a round alone in its passes sets the draft's level: a share of a
                # batched catch-up is no measure of one sequence's step
                step = draft.step_s / draft.steps - pick
                self._draft.observe("step", step, sets_level=verify_s is not None)
                if self._draft_seen is not None and verify_s is not None and draft.extra_s is None:
                    self._draft_seen.add_pass(1, step)  # a step is a one-row pass of the draft model
            if draft.fed and draft.fed_s > 0:
                self._draft.observe("feed", draft.fed_s / draft.fed, sets_level=False)
                if self._draft_seen is not None and draft.extra_s is None:
                    self._draft_seen.add_feed(draft.fed, draft.fed_s)
        rows = k + 1
        if verify_s and verify_s > 0 and rows < len(self.verify_s):
            self._target.observe(rows, verify_s)
            if self._seen is not None:
                self._seen.add_pass(rows, verify_s)
        self._refresh()
        if draft is not None:  # against the estimates this round's passes corrected
            self._learn_round(k, draft, verify_s)

    def expected_tokens(self, key: int, k: int) -> float:
        return expected_tokens(self.acceptance(key).rates(k))
