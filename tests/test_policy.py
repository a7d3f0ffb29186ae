"""Draft-length policies on synthetic acceptance streams and cost curves."""

import numpy as np
import pytest

from specgen.drafters.base import Draft
from specgen.policy.budget import LOSS_SHARE
from specgen.policy.cost import DRAFT_MODEL_PRIOR, MODEL_KEY, CostAware, Costs, Priors
from specgen.policy.base import (
    FixedK, Heuristic, Situation, expected_tokens_per_round, step_rate, unused_offer_outcome, verify_cost, with_counts,
)

# A CPU-like verify curve: n rows cost 14 ms * (1 + 0.35 (n - 1))
CPU = [0.0] + [0.014 * (1 + 0.35 * (n - 1)) for n in range(1, 33)]
# A GPU-like curve: nearly flat
GPU = [0.0] + [0.010 * (1 + 0.01 * (n - 1)) for n in range(1, 33)]


def feed(policy, alpha, rounds, key=0, limit=16, seed=0, curve=CPU):
    """Simulate rounds where each draft position is accepted with prob alpha. A free
    drafter's offer (key >= 1) that a round leaves unverified is judged against what
    the round emitted, as the loop does (`Policy.observe`)."""
    rng = np.random.default_rng(seed)
    ks = []
    for _ in range(rounds):
        k = policy.choose(key, limit)
        n = k if k or key == 0 else limit
        acc = 0
        while acc < n and rng.random() < alpha:
            acc += 1
        if k:
            policy.update(key, k, acc, curve[k + 1])
        else:
            policy.update(key, 0, 0, curve[1])
            if key:
                policy.observe(key, *((acc + 1, acc) if acc < n else (n, n)))
        ks.append(k)
    return ks


def test_fixed_uses_the_limit():
    assert FixedK().choose(0, 7) == 7


def test_heuristic_grows_on_full_acceptance_and_shrinks_otherwise():
    h = Heuristic(k_max=10, k_start=4)
    h.update(0, 4, 4)
    assert h.choose(0, 16) == 6
    h.update(0, 6, 2)
    assert h.choose(0, 16) == 5
    for _ in range(10):
        h.update(0, 5, 0)
    assert h.choose(0, 16) == 1


def test_cost_chooses_plain_when_drafting_cannot_pay():
    p = CostAware(16, Costs(CPU))
    ks = feed(p, alpha=0.05, rounds=200)
    assert ks[-50:].count(0) >= 45


def test_cost_grows_k_on_long_accepted_runs():
    p = CostAware(16, Costs(CPU))
    ks = feed(p, alpha=0.97, rounds=100)
    assert np.mean(ks[-30:]) >= 6
    # the rate curve is flat near its top: what counts is the rate the choices reach
    rate = [step_rate([0.97] * k, k, CPU, 0.0) for k in range(17)]
    assert np.mean([rate[k] for k in ks[-30:]]) >= 0.95 * max(rate)


def test_cost_recovers_after_a_bad_patch():
    p = CostAware(16, Costs(CPU))
    feed(p, alpha=0.95, rounds=60)
    bad = feed(p, alpha=0.0, rounds=60, seed=1)
    assert bad[-20:].count(0) >= 16  # plain steps, with an occasional probe
    good = feed(p, alpha=0.95, rounds=200, seed=2)
    assert np.mean(good[-30:]) >= 6  # drafting resumed and grew again


def test_cost_keys_are_independent():
    p = CostAware(16, Costs(CPU))
    feed(p, alpha=0.0, rounds=50, key=1)
    feed(p, alpha=0.95, rounds=50, key=3)
    assert p.choose(1, 16) == 0
    assert p.choose(3, 16) >= 4


def test_flat_verify_cost_drafts_long_even_at_modest_acceptance():
    cpu, gpu = CostAware(16, Costs(CPU)), CostAware(16, Costs(GPU))
    feed(cpu, alpha=0.5, rounds=200)
    feed(gpu, alpha=0.5, rounds=200, curve=GPU)
    assert gpu.choose(0, 16) > cpu.choose(0, 16)
    assert cpu.choose(0, 16) <= 2


def test_costly_draft_steps_shorten_drafts():
    cheap = CostAware(16, Costs(CPU, draft_step_s=0.0))
    dear = CostAware(16, Costs(CPU, draft_step_s=0.010))
    for pol in (cheap, dear):
        feed(pol, alpha=0.8, rounds=200)
    assert dear.choose(0, 16) < cheap.choose(0, 16)


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_never_exceeds_limit(limit):
    p = CostAware(16, Costs(CPU))
    feed(p, alpha=1.0, rounds=50)
    assert p.choose(0, limit) <= limit


def test_step_rate_is_leviathans_formula_over_the_measured_curve():
    # one α at every position: E = (1 - α^(k+1)) / (1 - α); cost = verify(k + 1 rows) + k draft steps
    for k in range(0, 8):
        e = (1 - 0.7 ** (k + 1)) / (1 - 0.7)
        assert expected_tokens_per_round(0.7, k) == pytest.approx(e)
        assert step_rate([0.7] * k, k, CPU, 0.002) == pytest.approx(e / (CPU[k + 1] + 0.002 * k))
    # in a shared step the others' rows and tokens count
    s = Situation(others_rows=3, others_tokens=2.5)
    assert step_rate([0.7], 1, CPU, 0.0, s) == pytest.approx((2.5 + 1.7) / CPU[5])
    # with no evidence the estimates are the prior
    assert CostAware(8, Costs(CPU), Priors(prior=0.7)).expected_tokens(0, 3) == pytest.approx(expected_tokens_per_round(0.7, 3))


def test_bench_config_names_policy():
    from specgen.bench import parse_config
    from specgen.errors import SpecgenError

    c = parse_config("lookup:policy=cost")
    assert (c.policy, c.k, c.name) == ("cost", 16, "lookup:k=16,policy=cost")
    assert parse_config("draft=m.gguf:k=3,policy=heuristic").policy == "heuristic"
    assert parse_config("lookup:k=4").policy == "fixed"
    with pytest.raises(SpecgenError, match="policy must be one of"):
        parse_config("lookup:policy=greedy")


def test_pessimistic_start_probes_and_learns():
    # A prior that says "never draft": only the probes can show that drafts pay.
    p = CostAware(16, Costs(CPU), Priors(prior=0.05))
    ks = feed(p, alpha=0.95, rounds=300)
    assert ks[:10] == [0] * 10
    assert np.mean(ks[-30:]) >= 4


# A pair where drafting pays (the F32 target + Q4_0 draft, measured): verify rows
# are cheap next to a 42 ms step, a draft step costs 0.38 of it, acceptance 0.9.
F32 = [0.0] + [0.042 * (1 + 0.05 * (n - 1)) for n in range(1, 33)]
F32_STEP = 0.016


def test_an_unlucky_first_round_does_not_end_drafting():
    p = CostAware(8, Costs(F32, F32_STEP))
    k = p.choose(0, 8)
    assert k > 0
    p.update(0, k, 0, F32[k + 1])  # every draft of round one rejected
    ks = feed(p, alpha=0.9, rounds=100, limit=8, curve=F32)
    assert sum(k > 0 for k in ks[:10]) >= 3  # drafting resumes within a few rounds
    assert sum(k > 0 for k in ks[20:]) >= 0.9 * 80
    assert np.mean(ks[-30:]) >= 3


def test_a_draft_that_cannot_pay_settles_at_zero_quickly_and_probes_rarely():
    p = CostAware(8, Costs(CPU, draft_step_s=0.012))  # on CPU, a costly draft: pays only near α = 1
    ks = feed(p, alpha=0.3, rounds=400, limit=8)
    assert ks[10:30].count(0) >= 18
    assert sum(k > 0 for k in ks[30:]) <= 0.04 * 370


def test_catch_up_is_part_of_a_probes_cost():
    p = CostAware(8, Costs(F32, F32_STEP, feed_s=0.002))
    p.acceptance(0).reached[:] = [200.0] * 8
    p.acceptance(0).accepted[:] = [180.0] * 8  # confident: α = 0.9
    assert p.choose(0, 8, Situation(lag=20, remaining=100)) > 0  # a short catch-up pays back
    # 3000 tokens to feed (6 s) for 20 tokens left: plain is faster
    assert p.choose(0, 8, Situation(lag=3000, remaining=20)) == 0
    assert p.choose(0, 8, Situation(lag=3000, remaining=20_000)) > 0


def test_a_catch_up_pays_back_only_over_the_rounds_a_catch_up_bought_before():
    """Beside prompt lookup (a rewrite) the model drafts a round or two after each
    catch-up of its cache, then lookup's long rounds leave it behind again: a catch-up
    is not paid back over the rounds its estimate rests on, only over the rounds the
    model drafted after its earlier catch-ups (replayed on the real pair: the rewrite's
    model rounds fed 700 tokens in all). Where it drafts on after a catch-up, as alone,
    the rule is as before."""
    def taught(runs):
        p = hybrid()
        teach(p, 0, 8, 7, 10)  # the model: α about 0.9
        for run in runs:
            p.update(0, 5, 5, None, Draft([1] * 5, steps=4, step_s=0.06, fed=40, fed_s=0.05))
            for _ in range(run - 1):
                p.update(0, 5, 5, None, Draft([1] * 5, steps=5, step_s=0.075))
        return p
    behind = Situation(lag=60, remaining=500)
    assert taught([1, 1, 1]).choose(0, 8, behind, z=0.0) == 0  # one round a catch-up, each time
    assert taught([12, 12, 12]).choose(0, 8, behind, z=0.0) > 0
    off = taught([1, 1, 1])
    off.cap_by_run = False
    assert off.choose(0, 8, behind, z=0.0) > 0  # the rule before
    assert taught([1, 1, 1]).choose(0, 8, Situation(lag=1, remaining=500), z=0.0) > 0  # in step: no catch-up


def test_draft_steps_and_bulk_feeds_are_learned_apart():
    p = CostAware(8, Costs(F32, 0.016, feed_s=0.002))
    p.update(0, 3, 2, F32[4], Draft([1, 2, 3], steps=2, step_s=0.024, fed=2000, fed_s=2.4))
    # a step at 0.75 of its profile is taken at once (the draft's level: load only adds
    # time); the bulk feed's cost a token is not a step's, and starts from the level
    assert p.draft_step_s == pytest.approx(0.012)
    assert p.feed_s == pytest.approx(0.75 * 0.002 + 0.2 * (0.0012 - 0.75 * 0.002))
    feed = p.feed_s
    # a round in a shared pass (no verify time of its own): its draft step may be a
    # share of a batched catch-up, so it moves the step's own estimate, not the level
    p.update(0, 3, 2, None, Draft([1, 2, 3], steps=1, step_s=0.001))
    assert p.draft_step_s == pytest.approx(0.012 + 0.2 * (0.001 - 0.012))
    assert p.feed_s == feed


def test_cost_estimates_shrug_off_a_busy_machine():
    p = CostAware(8, Costs(F32, 0.016))
    for _ in range(5):  # another process stole the cores: passes took 10x
        p.update(0, 2, 2, 10 * F32[3], Draft([1, 2], steps=2, step_s=0.32))
    assert p.verify_s[3] < 1.3 * F32[3] and p.draft_step_s < 1.3 * 0.016
    for _ in range(10):  # a faster machine than profiled: followed quickly
        p.update(0, 2, 2, 0.5 * F32[3], Draft([1, 2], steps=2, step_s=0.016))
    assert p.verify_s[3] < 0.6 * F32[3] and p.draft_step_s < 0.6 * 0.016


def test_a_policy_prefills_the_draft_only_where_drafting_can_pay_it_back():
    p = CostAware(8, Costs(F32, F32_STEP, feed_s=0.002))
    p.acceptance(0).reached[:] = [200.0] * 8
    p.acceptance(0).accepted[:] = [180.0] * 8
    assert p.prefill_pays(500, 256)  # 1 s of prefill against 256 tokens at ~1.5x
    assert not p.prefill_pays(5000, 32)  # 10 s of prefill for 32 tokens
    assert not CostAware(8, Costs(CPU, 0.014, feed_s=0.002)).prefill_pays(10, 1000)  # a draft that cannot pay
    assert FixedK().prefill_pays(10**6, 1)  # fixed k always drafts


def test_a_busy_machine_does_not_tilt_the_choice_toward_drafting():
    """While drafting is off only the target's passes are observed. If their
    estimates climbed with the machine's load, a draft step still at its profile
    would look ever cheaper, and a draft that cannot pay would be taken up."""
    q4km = [0.0, 0.020, 0.0269, 0.0313, 0.0331, 0.0424] + [0.0424 + 0.005 * n for n in range(1, 28)]
    p = CostAware(8, Costs(q4km, draft_step_s=0.0152, feed_s=0.0017))  # measured: cannot pay at α = 0.75
    rng = np.random.default_rng(0)
    ks = []
    for _ in range(300):
        k = p.choose(0, 8, Situation(lag=2, remaining=1000))
        acc = 0
        while acc < k and rng.random() < 0.75:
            acc += 1
        p.update(0, k, acc, 2.5 * q4km[k + 1], Draft([0] * k, steps=k, step_s=k * 2.5 * 0.0152) if k else None)
        ks.append(k)
    assert sum(k > 0 for k in ks[50:]) <= 0.05 * 250
    assert p.verify_s[1] <= q4km[1]  # estimates never climb past their profile


def test_sampling_work_on_the_host_counts_as_cost():
    """A sampled pick over a 262k vocabulary costs milliseconds: a draft that pays
    greedily (cheap rows, picks free) can stop paying once every drafted token
    and every verified row costs a pick."""
    p = CostAware(8, Costs(F32, F32_STEP))
    p.acceptance(0).reached[:] = [500.0] * 8
    p.acceptance(0).accepted[:] = [300.0] * 8  # α = 0.6: a sampled pair's acceptance
    p.rng = np.random.default_rng(0)
    assert p.choose(0, 8) > 0
    p.sampling(0.010, draft_picks=True)
    assert p.choose(0, 8) == 0
    p.sampling(0.010, draft_picks=False)  # prompt lookup: drafts are not sampled, only the target's rows cost
    assert p.choose(0, 8) > 0


# -- prompt lookup's free offers alongside a draft model (choose_offer) ---------

F32_LIKE = [0.0] + [0.048 + 0.004 * (n - 1) for n in range(1, 33)]  # a costly target, nearly flat in rows
DRAFT_CURVE = [0.0] + [0.015 + 0.0035 * (n - 1) for n in range(1, 33)]


def hybrid(seed=0):
    return CostAware(8, Costs(F32_LIKE, 0.015, 0.0017, draft_verify_s=DRAFT_CURVE), Priors(model=(0.7, 6.0)), seed=seed)


def teach(policy, key, k, accepted, rounds):
    for _ in range(rounds):
        policy.update(key, k, accepted)


def test_an_offer_that_is_accepted_as_often_as_the_model_wins_for_costing_nothing():
    takes = []
    for seed in range(20):
        p = hybrid(seed)
        teach(p, 0, 8, 8, 10)  # the model: everything accepted
        teach(p, 3, 8, 8, 10)  # lookup's 3-gram matches too
        k, take = p.choose_offer(3, 8, 8, Situation(lag=1))
        takes.append(take and k == 8)
    assert all(takes)


def test_a_model_that_drafts_much_better_wins_over_a_poor_offer():
    choices = []
    for seed in range(20):
        p = hybrid(seed)
        teach(p, 0, 6, 6, 10)  # the model: everything accepted
        teach(p, 1, 4, 0, 10)  # lookup's 1-gram matches: never
        k, take = p.choose_offer(1, 8, 8, Situation(lag=1))
        choices.append((k > 0, take))
    assert choices.count((True, False)) >= 18, choices


def test_an_untried_model_drafts_once_while_its_cache_is_in_step():
    """Before any evidence the free offer would always look better than a model
    at its prior; the model drafts first, where learning its worth costs no catch-up."""
    p = hybrid()
    k, take = p.choose_offer(2, 8, 8, Situation(lag=1))
    assert k > 0 and not take
    teach(p, 0, k, k, 1)
    teach(p, 2, 8, 8, 6)
    assert p.choose_offer(2, 8, 8, Situation(lag=12))[1]  # evidence now: the offer, by its own merit


Q4_LIKE = [0.0, 0.0115, 0.0256, 0.0262, 0.0298] + [0.057 + 0.002 * n for n in range(28)]  # a second row costs 1.2 passes


# the Qwen2.5-Coder 1.5B Q4_K_M's profile on 2 threads (ms): 16 rows cost less than 15
QWEN_Q4 = [0.0] + [m / 1000 for m in (25.3, 50.4, 71.8, 86.2, 106.2, 124.1, 142.0, 147.0, 167.0, 184.9, 202.8,
                                      207.8, 227.8, 245.7, 263.6, 157.9, 288.5, 306.4, 324.3)]


def test_a_free_offer_on_thin_evidence_is_not_drafted_long_where_rows_are_dear():
    """A free key is chosen a little below its estimates (`free_z`): one offer that
    matched whole and one that parted at its third do not buy a 16-row pass that costs
    six plain steps (at the means, each position on its own evidence, they did); a third
    offer that matches whole does."""
    p = CostAware(16, Costs(QWEN_Q4, 0.0))
    p.observe(4, 16, 16)
    p.observe(4, 3, 2)
    assert p.choose(4, 15) == 0
    mean = CostAware(16, Costs(QWEN_Q4, 0.0))
    mean.free_z, mean.pool_positions = 0.0, False
    mean.observe(4, 16, 16)
    mean.observe(4, 3, 2)
    assert mean.choose(4, 15) == 15  # the same evidence at its means
    p.observe(4, 16, 16)
    assert p.choose(4, 15) == 15


def test_plain_steps_judging_an_offer_at_its_first_position_leave_its_later_positions_evidence():
    """Long drafts showed positions 2-15 hold; then a run of plain steps judges each
    passed-over offer at its first position only (4 of 5 held). That evidence says
    nothing of the later positions, so it does not fade theirs: the key still drafts
    long (before, every first-position judgment faded all sixteen, and after about
    thirty plain steps the long draft looked unsafe and was never tried again). Where
    the first position itself fails, drafting stops as before."""
    def taught(first_held):
        p = CostAware(16, Costs(QWEN_Q4, 0.0))
        for acc in (15, 15, 9, 15):
            p.update(4, 15, acc)
        for i in range(40):
            p.observe(4, 1, int(first_held(i)))
        return p
    p = taught(lambda i: i % 5 != 4)
    assert p.choose(4, 15) == 15
    assert p.acceptance(4).rates(16)[8] > 0.99
    assert taught(lambda i: i % 5 == 4).choose(4, 15) == 0


def test_a_key_that_never_drafted_does_not_take_its_later_positions_on_trust_where_other_keys_broke_off():
    """A 4-gram match drafted long and broke off at its fifth token (a copied line the
    reply edits); then a 3-gram's offers held at their first positions, the only ones a
    plain step judges. Its later positions are unseen: taken to hold as its first does,
    they bought a 16-row pass that costs six plain steps (replayed: a chat reply's gains
    lost). Starting from the lower of that and what the drafter's keys met there, it does
    not draft long; its own long drafts that held still count for it."""
    def taught(pool, own_long=False):
        p = CostAware(16, Costs(QWEN_Q4, 0.0))
        p.pool_positions = pool
        p.update(4, 15, 4)
        for _ in range(4):
            p.observe(3, 1, 1)
        if own_long:
            p.update(3, 15, 15)
            p.update(3, 15, 15)
        return p
    assert taught(pool=False).choose(3, 15) == 15  # the rule before
    assert taught(pool=True).choose(3, 15) == 0
    assert taught(pool=True, own_long=True).choose(3, 15) == 15
    assert taught(pool=True).acceptance(3).rates(4)[:1] == taught(pool=False).acceptance(3).rates(4)[:1]


def test_an_untried_model_that_declines_leaves_the_round_to_the_offer():
    """Where rows are dear (a quantized target on a CPU) a model at its prior may not pay
    for one draft; its first round is then the offer's, weighed as lookup alone weighs it,
    not a plain step (before: every round until a lucky draw sent the model drafting)."""
    outcomes = []
    for seed in range(40):
        p = CostAware(16, Costs(Q4_LIKE, 0.0002), Priors(model=(0.42, 4.0)), seed=seed)
        teach(p, 3, 8, 8, 10)  # lookup's 3-gram matches: always accepted
        outcomes.append(p.choose_offer(3, 8, 4, Situation(lag=0)))
    assert outcomes.count((0, False)) == 0, outcomes  # an accepted offer is never dropped for a plain step
    assert sum(take and k >= 4 for k, take in outcomes) >= 30, outcomes
    assert any(not take and k > 0 for k, take in outcomes), outcomes  # a draw still sends the model drafting once


@pytest.mark.parametrize("offer, emitted, outcome", [
    ([5, 6, 7], [5, 6, 9], (3, 2)),  # parts at the third: rejected there
    ([5, 6, 7], [8], (1, 0)),  # the first already differs
    ([5, 6, 7], [5, 6, 7, 8], (3, 3)),  # all of it matches what the round emitted
    ([5, 6, 7, 8, 9], [5, 6], (2, 2)),  # runs past the round: nothing known beyond
])
def test_an_unused_offer_is_judged_against_what_the_round_emitted(offer, emitted, outcome):
    assert unused_offer_outcome(offer, emitted) == outcome


def test_an_offer_passed_over_teaches_its_key_for_free():
    """A key that once lost a round would never be tried against a good model
    again; the offers it makes while the model drafts say what it is worth."""
    p = hybrid()
    teach(p, 0, 4, 4, 10)  # the model: everything accepted
    teach(p, 4, 4, 0, 1)  # lookup's 4-gram matches: one unlucky round
    before = p.acceptance(4).rates(1)[0]
    for _ in range(10):
        p.observe(4, 4, 4)  # its offers matched what the model's rounds emitted
    assert p.acceptance(4).rates(1)[0] > before + 0.2
    takes = 0
    for _ in range(20):
        k, take = p.choose_offer(4, 16, 8, Situation(lag=1))
        takes += take and k >= 4
    assert takes >= 18  # its offers now beat the model's drafts
    assert p._drafted == 10 * 4 + 4  # observations are not drafts: the tally counts verified ones only


def test_policies_without_a_cost_model_take_an_offer_first():
    assert FixedK().choose_offer(2, 5, 8) == (5, True)
    assert FixedK().choose_offer(0, 0, 8) == (8, False)
    assert FixedK().choose_offer(0, 0, 0) == (0, False)  # lookup alone, nothing offered


def test_a_short_catch_up_costs_a_pass_on_the_drafts_curve_and_a_prompt_its_bulk_rate():
    p = hybrid()
    assert p.catch_up_s(2) == 0.0  # the usual lag: the first draft step feeds it
    assert p.catch_up_s(6) == pytest.approx(DRAFT_CURVE[6] - 0.015)
    assert p.catch_up_s(6) > 6 * p.feed_s  # a few tokens cost far more each than in bulk
    assert p.catch_up_s(1000) == pytest.approx(DRAFT_CURVE[32] - 0.015 + (1000 - 32) * 0.0017)


# A translated draft (SmolLM2 135M drafting for the all-F32 Gemma 3 270M, measured
# here): the target's verify curve, a 12 ms draft step, 5 ms a token of bulk
# catch-up; a drafting round's first pass feeds the re-tokenized tail (two of the
# draft's tokens: one step and one fed token) and translation takes 0.6 ms.
F32_TARGET = [0.0, 0.0480, 0.0582, 0.0622, 0.0627, 0.0662, 0.0698, 0.0721, 0.0744]
F32_TARGET += [F32_TARGET[-1] + 0.0023 * n for n in range(1, 25)]
SMOL_STEP, SMOL_FEED, TRANSLATE_S = 0.012, 0.005, 0.0006


def translated_run(policy, alpha, tokens=300, seed=0, truth=F32_TARGET):
    """One generation with a translated draft: the draft's cache lags one token a
    plain round, and a round after more than two is a bulk catch-up first (as
    DraftModel reports it). Its target passes take `truth` (the policy's profile
    may say otherwise). Returns the k chosen per round and the speed vs plain."""
    rng = np.random.default_rng(seed)
    ks, seconds, emitted, lag = [], 0.0, 0, 1
    while emitted < tokens:
        k = policy.choose(0, 8, Situation(lag=lag, remaining=tokens - emitted))
        acc = 0
        while acc < k and rng.random() < alpha:
            acc += 1
        draft = None
        if k and lag > 2:
            draft = Draft([0] * k, steps=k - 1, step_s=(k - 1) * SMOL_STEP, fed=lag, fed_s=lag * SMOL_FEED)
        elif k:
            draft = Draft([0] * k, steps=k, step_s=k * SMOL_STEP + SMOL_FEED)
        if draft is not None:
            draft.extra_s = TRANSLATE_S
            seconds += draft.step_s + draft.fed_s + draft.extra_s
        lag = 1 if k else lag + 1
        seconds += truth[k + 1]
        policy.update(0, k, acc, truth[k + 1], draft)
        ks.append(k)
        emitted += acc + 1
    return ks, emitted * truth[1] / seconds  # speed vs plain


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_translated_draft_that_cannot_pay_settles_at_zero_and_stops_probing(seed):
    """Acceptance 0.35 cannot pay for a translated round (its first pass and its
    translation cost more than a step), nor for the catch-ups its probes need."""
    p = CostAware(8, Costs(F32_TARGET, SMOL_STEP, SMOL_FEED))
    ks, speed = translated_run(p, alpha=0.35, seed=seed)
    assert ks[20:40].count(0) >= 18
    assert sum(k > 0 for k in ks[30:]) <= 0.04 * len(ks[30:])
    assert p.round_scale > 1.03  # the per-round excess was learned
    assert speed >= 0.9


# The same target's passes on a quiet machine: F32_TARGET is a profile a busy one inflated
F32_QUIET = [0.0, 0.0388, 0.0490, 0.0572, 0.0572, 0.0629, 0.0687, 0.0758, 0.0829]
F32_QUIET += [F32_QUIET[-1] + 0.0023 * n for n in range(1, 25)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_inflated_profile_does_not_keep_a_draft_that_cannot_pay(seed):
    """Acceptance 0.6 pays for k = 1 under the inflated profile's plain step (48 ms)
    but not under the 38.8 ms a plain step takes: drafting, the policy sees only
    its drafting rounds' passes, and those run faster than their profile, so a
    plain step (never observed) is priced faster too, and drafting stops."""
    p = CostAware(8, Costs(F32_TARGET, SMOL_STEP, SMOL_FEED))
    ks, speed = translated_run(p, alpha=0.6, seed=seed, truth=F32_QUIET)
    assert sum(k > 0 for k in ks[60:]) <= 0.1 * len(ks[60:])
    assert speed >= 0.95
    assert p.verify_s[1] < 1.05 * F32_QUIET[1]


def test_a_pass_faster_than_its_profile_lowers_the_estimates_of_rows_not_observed():
    inflated = [1.25 * c for c in F32_QUIET]
    p = CostAware(8, Costs(inflated, SMOL_STEP))
    p.update(0, 1, 0, F32_QUIET[2], Draft([0], steps=1, step_s=SMOL_STEP))  # a 2-row pass at its quiet cost
    assert p.verify_s[1] == pytest.approx(F32_QUIET[1])  # at once: other processes can only have slowed it
    for _ in range(30):  # only 2-row passes observed
        p.update(0, 1, 0, F32_QUIET[2], Draft([0], steps=1, step_s=SMOL_STEP))
    assert p.verify_s[1] == pytest.approx(F32_QUIET[1], rel=0.03)  # never observed
    assert p.verify_s[5] == pytest.approx(F32_QUIET[5], rel=0.03)
    # a row count observed follows its own passes, not the level
    p.update(0, 3, 0, 1.1 * inflated[4], Draft([0] * 3, steps=3, step_s=3 * SMOL_STEP))
    assert F32_QUIET[4] < p.verify_s[4] <= inflated[4]
    assert p.verify_s[1] == pytest.approx(F32_QUIET[1], rel=0.03)  # a slower pass moves the level only slowly up
    # and never above the profile, however slow the machine becomes
    for _ in range(200):
        p.update(0, 0, 0, 3 * inflated[1])
    assert p.verify_s[1] <= inflated[1] and p.verify_s[5] <= inflated[5]


def test_a_passs_estimate_leaves_out_the_picks_priced_apart():
    """Sampling, a round's time holds the picks of the rows the acceptance rule read,
    which the rates price apart (pick_s a token): the estimate is the pass alone."""
    p = CostAware(8, Costs([1.25 * c for c in F32_QUIET], SMOL_STEP))
    p.sampling(0.003, draft_picks=True)
    for _ in range(30):
        p.update(0, 1, 1, F32_QUIET[2] + 2 * 0.003, Draft([0], steps=1, step_s=SMOL_STEP + 0.003))
    assert p.verify_s[2] == pytest.approx(F32_QUIET[2], rel=0.01)
    assert p.verify_s[1] == pytest.approx(F32_QUIET[1], rel=0.01)
    assert p.draft_step_s == pytest.approx(SMOL_STEP, rel=0.01)


def test_a_draft_step_faster_than_its_profile_lowers_its_catch_up_estimates_too():
    """The draft model's profile has its own level (it was measured at its own time):
    its steps, observed, price its catch-up passes and bulk feeds, not observed;
    a bulk feed (its cost per token depends on its length) does not move the level."""
    p = CostAware(8, Costs(F32_LIKE, 0.015, 0.0017, draft_verify_s=DRAFT_CURVE))
    before = p.catch_up_s(10), p.feed_s
    for _ in range(30):
        p.update(0, 2, 1, F32_LIKE[3], Draft([0, 0], steps=2, step_s=2 * 0.6 * 0.015))
    assert p.draft_step_s == pytest.approx(0.6 * 0.015, rel=0.03)
    assert p.catch_up_s(10) == pytest.approx(0.6 * before[0], rel=0.03)
    assert p.feed_s == pytest.approx(0.6 * before[1], rel=0.03)
    assert p.verify_s == pytest.approx(F32_LIKE)  # the target's level is its own
    q = CostAware(8, Costs(F32_LIKE, 0.015, 0.0017, draft_verify_s=DRAFT_CURVE))
    for _ in range(30):
        q.update(0, 2, 1, None, Draft([0, 0], steps=1, step_s=0.015, fed=500, fed_s=500 * 0.5 * 0.0017))
    assert q.feed_s == pytest.approx(0.5 * 0.0017, rel=0.03) and q.draft_step_s == pytest.approx(0.015)


def test_a_translated_draft_that_pays_keeps_drafting():
    p = CostAware(8, Costs(F32_TARGET, SMOL_STEP, SMOL_FEED))
    ks, speed = translated_run(p, alpha=0.85)
    assert sum(k > 0 for k in ks[20:]) >= 0.9 * len(ks[20:])
    assert speed > 1.2


def test_only_drafters_that_report_extra_work_pay_a_per_round_excess():
    p = CostAware(8, Costs(F32_TARGET, SMOL_STEP, SMOL_FEED))
    p.update(0, 2, 1, F32_TARGET[3], Draft([1, 2], steps=2, step_s=2 * SMOL_STEP + SMOL_FEED))
    assert p.round_scale == 1.0  # a same-vocabulary draft model: unchanged
    d = Draft([1, 2], steps=2, step_s=2 * SMOL_STEP + SMOL_FEED)
    d.extra_s = TRANSLATE_S
    p.update(0, 2, 1, 1.1 * F32_TARGET[3], d)  # its verify rows took 10 % more than profiled too
    said = F32_TARGET[3] + 2 * SMOL_STEP
    real = 1.1 * F32_TARGET[3] + 2 * SMOL_STEP + SMOL_FEED + TRANSLATE_S
    assert p.round_scale == pytest.approx(real / said)
    # a round after a bulk catch-up says nothing of it (its feed is learned apart), nor one in a shared pass
    d = Draft([1, 2], steps=1, step_s=SMOL_STEP, fed=20, fed_s=0.1)
    d.extra_s = 0.1
    p.update(0, 2, 1, F32_TARGET[3], d)
    d = Draft([1, 2], steps=2, step_s=1.0)
    d.extra_s = 0.1
    p.update(0, 2, 1, None, d)
    assert p.round_scale == pytest.approx(real / said)
    assert step_rate([0.5], 1, F32_TARGET, SMOL_STEP, round_scale=1.2) == pytest.approx(1.5 / (1.2 * (F32_TARGET[2] + SMOL_STEP)))
    assert step_rate([0.5], 0, F32_TARGET, SMOL_STEP, round_scale=1.2) == pytest.approx(1 / F32_TARGET[1])


def test_a_probe_is_short():
    """Where the estimates favour plain steps, a draw that favours drafting
    tries the shortest draft it favours, never a long one."""
    p = CostAware(8, Costs(F32_TARGET, SMOL_STEP), Priors(idle_decay=1.0))
    p.round_scale = (F32_TARGET[2] + SMOL_STEP + SMOL_FEED + TRANSLATE_S) / (F32_TARGET[2] + SMOL_STEP)
    p.acceptance(0).reached[:] = [4.0]
    p.acceptance(0).accepted[:] = [1.4]  # α = 0.35 at the first position; later ones unseen
    ks = [p.choose(0, 8) for _ in range(400)]
    assert ks.count(0) >= 250 and ks.count(1) > 0 and max(ks) <= 2


def test_a_first_catch_up_is_paid_back_over_the_generation_a_faded_one_is_not():
    """A translated draft reads the prompt in its first drafting round: with no
    evidence yet the prior promises the whole generation. Evidence faded back to
    the prior over a long plain stretch promises only a few rounds."""
    fresh = CostAware(8, Costs(F32, F32_STEP, feed_s=0.002))
    assert fresh.choose(0, 8, Situation(lag=150, remaining=200)) > 0
    faded = CostAware(8, Costs(F32, F32_STEP, feed_s=0.002))
    faded.acceptance(0).reached[:] = [0.5] * 8
    faded.acceptance(0).accepted[:] = [0.3] * 8
    assert faded.choose(0, 8, Situation(lag=150, remaining=200)) == 0
    assert faded.choose(0, 8, Situation(lag=2, remaining=200)) > 0  # no catch-up: it drafts


def test_a_probe_is_of_the_model_and_short_never_of_a_free_offer():
    """With prompt lookup alongside a model: where the estimates favour plain steps,
    a draw that favours drafting tries the model's shortest draft it favours. The
    free offer is never drafted to learn: it is judged at no cost whether or not
    it is verified (`observe`), so its estimates alone decide, and they say no."""
    for offer_rounds, model_rounds in ((3, 3), (10, 1)):
        p = CostAware(16, Costs(CPU, 0.004), Priors(idle_decay=1.0), seed=3)
        teach(p, 1, 4, 0, offer_rounds)  # lookup's 1-gram matches: rejected at the first position
        teach(p, 0, 4, 0, model_rounds)  # and the model's drafts
        picks = [p.choose_offer(1, 16, 8, Situation(lag=1)) for _ in range(400)]
        ks = [k for k, _ in picks]
        assert ks.count(0) >= 200 and max(ks) <= 2, sorted(set(ks))
        assert any(k and not take for k, take in picks)  # the model is probed
        assert not any(k and take for k, take in picks)  # the offer never


def test_past_a_drafting_best_a_draw_explores_only_the_next_positions():
    """Where the estimates favour drafting (k = 3 here) and the positions past the
    evidence are unseen (their estimates inherit the last one's, with a wide
    spread), an upward draw tries one more position, never the whole ceiling:
    a long draft costs most when the draw was wrong. The same with prompt
    lookup alongside, for the model's drafts."""
    p = CostAware(8, Costs(F32_TARGET, SMOL_STEP), Priors(idle_decay=1.0))
    p.acceptance(0).reached[:] = [10.0]
    p.acceptance(0).accepted[:] = [7.0]  # α = 0.68 at the first position; later ones unseen
    ks = [p.choose(0, 8, Situation(lag=1)) for _ in range(400)]
    assert set(ks) == {3, 4}, sorted(set(ks))
    teach(p, 2, 4, 0, 10)  # lookup's 2-gram matches: always rejected at once, so the model drafts
    picks = [p.choose_offer(2, 16, 8, Situation(lag=1)) for _ in range(400)]
    assert {k for k, take in picks if not take} == {3, 4}


def test_with_counts_weighs_the_index_counts_against_the_measured_rate():
    rates = [0.6, 0.5, 0.4]
    assert with_counts(rates, ()) == rates
    assert with_counts(rates, [(0, 0)] * 3) == rates  # steps without evidence keep their rate
    assert with_counts(rates, [(3, 3), (1, 4), (0, 0)], strength=1.0) == pytest.approx([3.6 / 4, 1.5 / 5, 0.4])
    assert with_counts(rates, [(3, 3)], strength=2.0) == pytest.approx([4.2 / 5, 0.5, 0.4])
    assert with_counts([0.5], [(1, 4)], strength=0.0) == [0.25]  # no weight on the rate: the index's share
    # ample evidence outweighs the measured rate either way; counts past the rates are ignored
    assert with_counts([0.5], [(1000, 1000)])[0] > 0.99 and with_counts([0.5], [(0, 1000)])[0] < 0.01
    assert with_counts([0.5], [(1, 1), (1, 1)]) == [0.75]


def test_a_draft_length_follows_the_index_counts():
    """One key, one measured acceptance: a draft whose every step the index saw go on
    alike many times is verified long, one it saw go on in different ways not at all."""
    p = CostAware(16, Costs(CPU), seed=0)
    feed(p, alpha=0.7, rounds=300)
    sure = Situation(counts=((30, 30),) * 16)
    split = Situation(counts=((1, 4),) * 16)
    plain = [p.choose(0, 16) for _ in range(30)]
    assert 1 <= np.median(plain) <= 3
    assert min(p.choose(0, 16, sure) for _ in range(30)) >= 12
    assert max(p.choose(0, 16, split) for _ in range(30)) <= 1
    # the same through choose_offer with no model, and only the counts given are read
    assert min(p.choose_offer(0, 16, 0, sure)[0] for _ in range(30)) >= 12
    assert min(p.choose(0, 16, Situation(counts=((30, 30),) * 2)) for _ in range(30)) <= 3


def test_an_offers_counts_never_speak_for_the_draft_model():
    p = CostAware(8, Costs(CPU, draft_step_s=0.002), seed=0)
    split = Situation(lag=1, counts=((0, 50),) * 8)
    for _ in range(40):  # the model drafts well
        k, take = p.choose_offer(1, 0, 8, split)
        p.update(0, k, k, CPU[k + 1])
    # no offer: the model's k is not cut by counts meant for an offer
    assert np.median([p.choose_offer(1, 0, 8, split)[0] for _ in range(20)]) >= 4


def test_verify_cost_beyond_a_sawtooth_curve_grows_by_its_last_period():
    """CPU curves are sawtooths of period 4 rows (costs.ROW_POINTS): 32 rows cost
    less than 31, so a slope from the last two points alone would price the
    rows beyond the curve (a shared step's) as ever cheaper."""
    saw = [0.0] + [0.010 + 0.012 * (n // 4) + 0.0045 * (n % 4) for n in range(1, 33)]
    assert saw[32] < saw[31]
    beyond = [verify_cost(saw, n) for n in range(33, 45)]
    assert beyond[0] > saw[32] and all(b > a for a, b in zip(beyond, beyond[1:]))
    assert verify_cost(saw, 36) == pytest.approx(saw[32] + 0.012)  # one more block of 4 rows
    assert verify_cost(CPU, 40) == pytest.approx(0.014 * (1 + 0.35 * 39))  # a straight curve stays straight
    assert verify_cost([0.0, 0.01, 0.03], 4) == pytest.approx(0.07)  # two points: their slope
    assert verify_cost([0.0, 0.01], 3) == pytest.approx(0.03)  # one: a line through 0


class FlatPrior(CostAware):
    top_prior = False  # the earlier rule: the prior as under greedy


def sampling_policy(draft_picks=False, model_prior=None, top_prior=True):
    p = (CostAware if top_prior else FlatPrior)(8, Costs(F32_TARGET, SMOL_STEP, SMOL_FEED), Priors(model=model_prior))
    p.sampling(0.002, draft_picks=draft_picks)
    return p


def test_a_point_mass_models_prior_follows_the_targets_top_probability_when_sampling():
    p = sampling_policy()
    assert p.expected_tokens(0, 1) == pytest.approx(1.6)  # not told yet: the prior as under greedy
    for top in (0.5, 0.3, 0.3, 0.3):
        p.target_top(top)
    top = 0.5 + 0.2 * (0.3 - 0.5)
    top += 0.2 * (0.3 - top)
    top += 0.2 * (0.3 - top)  # the running mean of what it was told
    assert p.expected_tokens(0, 1) == pytest.approx(1 + 0.6 * top)
    # evidence weighs against the scaled prior as it did against the flat one
    p.update(0, 2, 2)
    mean = (1 + 2 * 0.6 * top) / 3
    assert p.expected_tokens(0, 1) == pytest.approx(1 + mean, rel=1e-3)
    # on copied text (top 1) nothing changes
    q = sampling_policy()
    q.target_top(1.0)
    assert q.expected_tokens(0, 3) == pytest.approx(expected_tokens_per_round(0.6, 3))


def test_a_low_top_probability_keeps_a_point_mass_model_from_drafting_where_the_flat_prior_would():
    # on free sampled text (top 0.4) the flat prior 0.6 has the first round draft; scaled, it does not
    ks = {}
    for scaled in (True, False):
        p = sampling_policy(top_prior=scaled)
        p.target_top(0.4)
        ks[scaled] = p.rates(p.acceptance(0).rates(8))
    assert max(range(9), key=ks[False].__getitem__) >= 1
    assert max(range(9), key=ks[True].__getitem__) == 0


def test_the_top_probability_leaves_lookup_keys_a_sampling_draft_model_and_a_switched_off_policy_alone():
    flat = expected_tokens_per_round(0.6, 3)
    p = sampling_policy()
    p.target_top(0.2)
    assert p.expected_tokens(3, 3) == pytest.approx(flat)  # lookup's key 3: a match is evidence of copying
    for q in (sampling_policy(draft_picks=True), sampling_policy(model_prior=(0.6, 2.0))):  # the draft samples
        q.target_top(0.2)
        assert q.expected_tokens(0, 3) == pytest.approx(flat)
    off = sampling_policy(top_prior=False)
    off.target_top(0.2)
    assert off.expected_tokens(0, 3) == pytest.approx(flat)


def test_a_shared_step_brought_to_whole_blocks_is_priced_between_them_not_on_the_sawtooth():
    from specgen.policy.base import Situation, shaped_cost, step_rate
    # a CPU curve of period 4: 4 rows 33 ms, 5 rows 52 ms, 8 rows 54 ms
    curve = [0.0, 0.020, 0.027, 0.032, 0.033, 0.052, 0.057, 0.062, 0.054]
    assert shaped_cost(curve, 5, 4) == pytest.approx(0.033 + (0.054 - 0.033) / 4)
    assert shaped_cost(curve, 8, 4) == curve[8] and shaped_cost(curve, 3, 4) == curve[3]
    assert shaped_cost(curve, 5, 1) == curve[5]
    # three other sequences' rows beside this one: one drafted row makes 5 rows
    alphas = [0.8] * 4
    raw = Situation(others_rows=3, others_tokens=3.0)
    shaped = Situation(others_rows=3, others_tokens=3.0, row_group=4)
    # on the sawtooth the first drafted row loses to plain; shaped, it pays
    assert step_rate(alphas, 1, curve, 0.0, raw) < step_rate(alphas, 0, curve, 0.0, raw)
    assert step_rate(alphas, 1, curve, 0.0, shaped) > step_rate(alphas, 0, curve, 0.0, shaped)
    # alone (no others), nothing is shaped
    alone = Situation(row_group=4)
    assert step_rate(alphas, 1, curve, 0.0, alone) == step_rate(alphas, 1, curve, 0.0, Situation())


def test_a_new_free_key_starts_from_what_the_other_free_keys_met():
    """Lookup's match lengths share what free text taught: a length never seen
    starts from the pooled first-position acceptance, not from the prior fitted
    to copying, so on free text no fresh key buys a losing draft."""
    fresh = CostAware(16, Costs(CPU))
    assert fresh.acceptance(2).rates(1)[0] == pytest.approx(0.6)
    assert fresh.choose(2, 4) > 0  # the prior alone pays on this curve
    p = CostAware(16, Costs(CPU))
    feed(p, alpha=0.0, rounds=40, key=1)
    assert p.acceptance(2).rates(1)[0] < 0.15
    assert p.choose(2, 4) == 0
    assert p.acceptance(0).rates(1)[0] == pytest.approx(0.6)  # a draft model's key keeps its own prior
    copying = CostAware(16, Costs(CPU))
    feed(copying, alpha=0.95, rounds=40, key=1)
    assert copying.acceptance(2).rates(1)[0] > 0.8


def test_an_untried_model_whose_prefill_paid_drafts_its_first_round():
    """Rows that cost a third more each (F16 on 2 cores: 4 rows about 2x one): at its
    prior's mean the model does not pay, one deviation above it does, so its prompt
    was prefilled (`prefill_pays`). Its first round then drafts for every seed: a
    fresh draw that declined left its cache to lag and the catch-up kept it out
    for good (measured: 77 plain rounds of 87, none by the model)."""
    curve = [0.0, 0.0675, 0.115, 0.129, 0.133, 0.144, 0.147, 0.202, 0.207]
    for seed in range(30):
        p = CostAware(8, Costs(curve, 0.0183), Priors(model=DRAFT_MODEL_PRIOR), seed=seed)
        mean = p.rates(p.acceptance(MODEL_KEY).rates(8))
        assert max(mean[1:]) < mean[0]  # the prior's mean alone would never draft it
        assert p.prefill_pays(60, 96, MODEL_KEY)
        k, take = p.choose_offer(0, 0, 8, Situation(lag=1, remaining=96))
        assert k > 0 and not take, (seed, k, take)
    rows_dear = [0.0, 0.0277, 0.0533, 0.0814, 0.0895, 0.110, 0.150, 0.165, 0.206]  # Q4_K_M here: 4 rows 3.2x
    p = CostAware(8, Costs(rows_dear, 0.0183), Priors(model=DRAFT_MODEL_PRIOR), seed=0)
    assert not p.prefill_pays(60, 96, MODEL_KEY)
    assert all(p.choose_offer(0, 0, 8, Situation(lag=1, remaining=96))[0] == 0 for _ in range(30))


# The real pair's curves on this machine (F16 1.5B target: 2 rows 1.7x one, 4 rows 2.0x;
# the 0.5B Q4_K_M draft's own passes), as in test_an_untried_model_whose_prefill_paid...
F16_PAIR = [0.0, 0.0675, 0.115, 0.129, 0.133, 0.144, 0.147, 0.202, 0.207]
DRAFT_PAIR = [0.0, 0.0183, 0.0351, 0.0419, 0.0487, 0.0664, 0.0732, 0.080, 0.0819]


def pair_policy(seed=0):
    return CostAware(8, Costs(F16_PAIR, 0.0183, feed_s=0.00394, draft_verify_s=DRAFT_PAIR),
                     Priors(model=DRAFT_MODEL_PRIOR), seed=seed)


def lagging_run(policy, alpha, tokens, seed):
    """tok/s of a draft model under `policy`, its cache falling a token behind each
    plain round and caught up (`catch_up_s`) when it next drafts, as the loop does."""
    rng = np.random.default_rng(1000 + seed)
    lag, t, made = 1, 0.0, 0
    while made < tokens:
        k, _ = policy.choose_offer(0, 0, 8, Situation(lag=lag, remaining=tokens - made))
        k = min(k, tokens - made - 1)
        if k <= 0:
            t, made, lag = t + F16_PAIR[1], made + 1, lag + 1
            policy.update(MODEL_KEY, 0, 0)
            continue
        acc = 0
        while acc < k and rng.random() < alpha:
            acc += 1
        t += policy.catch_up_s(lag) + k * 0.0183 + F16_PAIR[k + 1]
        made, lag = made + acc + 1, 2 if acc == k else 1
        policy.update(MODEL_KEY, k, acc)
    return tokens / t


def test_a_probe_shares_its_catch_up_with_the_rounds_it_is_expected_to_open():
    """After one accepted round the estimate (0.74) sits below break-even, the cache
    falls behind while the model sits out, and a probe must catch it up. Paid in the
    probe's own round, the catch-up outgrew every draw within a few rounds (the real
    pair's code request: 74 plain rounds of 87, the model never drafting again). A
    draw one deviation up now probes at a lag of 10; evidence that the model is poor
    still keeps it out."""
    p = pair_policy()
    acc = p.acceptance(MODEL_KEY)
    acc.reached[:], acc.accepted[:] = [1.0, 1.0], [1.0, 1.0]
    mean = p.rates(acc.rates(8))
    assert max(mean[1:]) < mean[0]  # a probe: the estimates alone say plain
    assert p.choose(MODEL_KEY, 8, Situation(lag=10, remaining=90), z=1.0) > 0
    poor = pair_policy()
    acc = poor.acceptance(MODEL_KEY)
    acc.reached[:], acc.accepted[:] = [20.0, 8.0], [8.0, 3.0]
    assert poor.choose(MODEL_KEY, 8, Situation(lag=10, remaining=90), z=1.0) == 0
    assert poor.choose(MODEL_KEY, 8, Situation(lag=2, remaining=90), z=3.0) > 0  # no catch-up: the draw decides


def test_a_lagging_model_that_pays_keeps_drafting_and_one_that_does_not_costs_little():
    """Simulated rounds on the real pair's curves, 256 tokens, 10 seeds: at acceptance
    0.92 (the 0.5B on code) a fixed k = 5 reads about 1.38x plain; the policy whose
    probes paid their whole catch-up read 1.15x, this one about 1.34x. At 0.4 it
    still reads about plain."""
    plain = 1.0 / F16_PAIR[1]
    good = np.mean([lagging_run(pair_policy(s), 0.92, 256, s) for s in range(10)]) / plain
    poor = np.mean([lagging_run(pair_policy(s), 0.4, 256, s) for s in range(10)]) / plain
    assert good > 1.25, good
    assert poor > 0.95, poor


def _against(policy, curve, breaks_at, keys=(4,), n=96):
    """A generation of n tokens whose offers (of `keys` in turn) hold for their first
    `breaks_at` tokens and fail at the next; a plain step judges an offer at its first
    position only, where it looks sound. The seconds it took beyond n plain steps."""
    spent, emitted, i = 0.0, 0, 0
    while emitted < n:
        key = keys[i % len(keys)]
        i += 1
        k = policy.choose(key, 15, Situation(remaining=n - emitted))
        if k:
            accepted = min(k, breaks_at)
            policy.update(key, k, accepted, verify_cost(curve, k + 1))
            spent += verify_cost(curve, k + 1)
            emitted += accepted + 1
        else:
            policy.update(key, 0, 0, curve[1])
            policy.observe(key, 1, 1 if breaks_at else 0)
            spent += curve[1]
            emitted += 1
    return spent - emitted * curve[1]


@pytest.mark.parametrize("keys", [(4,), (1, 2, 3, 4), tuple(range(1, 9))])
def test_a_generation_never_loses_more_than_its_budget_however_the_drafts_turn_out(keys):
    """Where rows are dear, one long draft on thin evidence costs several plain steps:
    replayed on the real pair, a 96-token reply's first 16-row bet left it slower than plain.
    A round stakes no more than what drafting has won so far plus LOSS_SHARE of the
    limit's plain time, so however the drafts turn out the generation loses at most that."""
    budget = LOSS_SHARE * 96 * QWEN_Q4[1]
    for breaks_at in (0, 1, 2, 3, 5):
        for seed in range(4):
            assert _against(CostAware(16, Costs(QWEN_Q4, 0.0), seed=seed), QWEN_Q4, breaks_at, keys) <= budget + 1e-9
    off = CostAware(16, Costs(QWEN_Q4, 0.0))
    off.loss_budget = False
    assert _against(off, QWEN_Q4, 1, keys) > budget  # the rule before: offers that break at their second token

def test_winnings_buy_longer_drafts_and_a_shared_step_is_not_held_to_the_budget():
    """A fresh generation's first 16-row draft on a dear curve stakes more than its
    allowance; drafts that paid make room for it. In a shared step, rows are priced with
    the other sequences' (the budget is one sequence's alone)."""
    def sure():
        p = CostAware(16, Costs(QWEN_Q4, 0.0))
        for _ in range(12):
            p.observe(4, 16, 15)  # the offers held at every position plain steps judged
        return p
    fresh = Situation(remaining=96)
    assert sure().stake_s(15) > sure().budget.allowance_s(QWEN_Q4[1], fresh.remaining)
    assert 0 < sure().choose(4, 15, fresh) < 15
    off = sure()
    off.loss_budget = False
    assert off.choose(4, 15, fresh) == 15  # the rule before
    won = sure()
    for _ in range(2):
        won.update(4, 15, 15, QWEN_Q4[16])
    assert won.choose(4, 15, Situation(remaining=64)) == 15
    assert sure().choose(4, 15, Situation(remaining=96, others_rows=8, others_tokens=8.0)) > 3


def test_what_drafting_won_is_priced_at_the_load_its_passes_ran_under():
    """The estimates never rise above the profile a quiet machine measured. On a busy
    machine every pass runs slower: a timed 4-row pass against a plain step at its
    estimate counted each fully accepted round a loss, and the budget stopped a live
    edit request's long drafts (wall clock on the real pair). Its tokens are priced at
    the same load as its pass."""
    p = CostAware(16, Costs(QWEN_Q4, 0.0))
    for _ in range(4):
        p.update(4, 3, 3, 1.3 * QWEN_Q4[4])
    assert p.budget.banked == pytest.approx(4 * 1.3 * (4 * QWEN_Q4[1] - QWEN_Q4[4]))
    assert p.budget.emitted == 16
    p.update(4, 3, 0, 1.3 * QWEN_Q4[4])  # a round that lost: its stake at that load
    assert p.budget.banked == pytest.approx(4 * 1.3 * (4 * QWEN_Q4[1] - QWEN_Q4[4]) - 1.3 * (QWEN_Q4[4] - QWEN_Q4[1]))


def test_a_draft_models_first_reading_of_the_context_is_not_held_against_the_budget():
    """Its prefill (or its first round's catch-up) is judged once, as an investment in
    the whole generation; the catch-ups after it are a round's own cost."""
    from specgen.policy.budget import LossBudget
    b = LossBudget()
    assert b.fed_counts(0) is False and b.draft_read is False
    assert b.fed_counts(47) is False and b.draft_read is True  # the prompt
    assert b.fed_counts(12) is True  # a catch-up after lookup rounds
    b.round(4, 0.025, 0.086, None, 0.0)
    assert b.emitted == 4 and b.banked == pytest.approx(4 * 0.025 - 0.086)
    assert b.allowance_s(0.025, 92) == pytest.approx(b.banked + 0.03 * 0.025 * 96)
