"""Draft-length policies on synthetic acceptance streams and cost curves."""

import numpy as np
import pytest

from specgen.policy import CostAware, FixedK, Heuristic

# A CPU-like verify curve: n rows cost 14 ms * (1 + 0.35 (n - 1))
CPU = [0.0] + [0.014 * (1 + 0.35 * (n - 1)) for n in range(1, 33)]
# A GPU-like curve: nearly flat
GPU = [0.0] + [0.010 * (1 + 0.01 * (n - 1)) for n in range(1, 33)]


def feed(policy, alpha, rounds, key=0, limit=16, seed=0, curve=CPU):
    """Simulate rounds where each draft position is accepted with prob alpha."""
    rng = np.random.default_rng(seed)
    ks = []
    for _ in range(rounds):
        k = policy.choose(key, limit)
        acc = 0
        while acc < k and rng.random() < alpha:
            acc += 1
        policy.update(key, k, acc, curve[k + 1], 0.0)
        ks.append(k)
    return ks


def test_fixed_uses_the_limit():
    assert FixedK().choose(0, 7) == 7


def test_heuristic_grows_on_full_acceptance_and_shrinks_otherwise():
    h = Heuristic(k_max=10, k_start=4)
    h.update(0, 4, 4, 0, 0)
    assert h.choose(0, 16) == 6
    h.update(0, 6, 2, 0, 0)
    assert h.choose(0, 16) == 5
    for _ in range(10):
        h.update(0, 5, 0, 0, 0)
    assert h.choose(0, 16) == 1


def test_cost_chooses_plain_when_drafting_cannot_pay():
    p = CostAware(16, CPU)
    ks = feed(p, alpha=0.05, rounds=200)
    assert ks[-50:].count(0) >= 45


def test_cost_grows_k_on_long_accepted_runs():
    p = CostAware(16, CPU)
    ks = feed(p, alpha=0.97, rounds=100)
    assert np.mean(ks[-30:]) >= 10


def test_cost_recovers_after_a_bad_patch():
    p = CostAware(16, CPU)
    feed(p, alpha=0.95, rounds=60)
    bad = feed(p, alpha=0.0, rounds=60, seed=1)
    assert bad[-20:].count(0) >= 16  # plain steps, with an occasional probe
    good = feed(p, alpha=0.95, rounds=200, seed=2)
    assert np.mean(good[-30:]) >= 6  # drafting resumed and grew again


def test_cost_keys_are_independent():
    p = CostAware(16, CPU)
    feed(p, alpha=0.0, rounds=50, key=1)
    feed(p, alpha=0.95, rounds=50, key=3)
    assert p.choose(1, 16) == 0
    assert p.choose(3, 16) >= 4


def test_flat_verify_cost_drafts_long_even_at_modest_acceptance():
    cpu, gpu = CostAware(16, CPU), CostAware(16, GPU)
    feed(cpu, alpha=0.5, rounds=200)
    feed(gpu, alpha=0.5, rounds=200, curve=GPU)
    assert gpu.choose(0, 16) > cpu.choose(0, 16)
    assert cpu.choose(0, 16) <= 2


def test_costly_draft_steps_shorten_drafts():
    cheap = CostAware(16, CPU, draft_step_s=0.0)
    dear = CostAware(16, CPU, draft_step_s=0.010)
    for pol in (cheap, dear):
        feed(pol, alpha=0.8, rounds=200)
    assert dear.choose(0, 16) < cheap.choose(0, 16)


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_never_exceeds_limit(limit):
    p = CostAware(16, CPU)
    feed(p, alpha=1.0, rounds=50)
    assert p.choose(0, limit) <= limit


def test_expected_rate_matches_formula():
    p = CostAware(8, CPU, prior=0.7)
    # with no evidence every α is the prior: E = (1 - α^(k+1)) / (1 - α)
    for k in range(0, 8):
        e = (1 - 0.7 ** (k + 1)) / (1 - 0.7)
        assert p.expected_rate(0, k) == pytest.approx(e / CPU[k + 1])


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
    p = CostAware(16, CPU, prior=0.05)
    ks = feed(p, alpha=0.95, rounds=300)
    assert ks[:10] == [0] * 10
    assert np.mean(ks[-30:]) >= 4


def test_costly_drafter_never_probes():
    p = CostAware(16, CPU, draft_step_s=0.012, prior=0.05)
    assert feed(p, alpha=0.0, rounds=128) == [0] * 128
