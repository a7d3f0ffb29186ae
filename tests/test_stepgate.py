"""The shared-step gate: synthetic step timings decide whether shared steps draft.

A simulated machine answers each step with tokens settled and seconds taken,
with noise; the gate must switch drafting off where it loses, keep it where
it pays, and leave steps of one sequence alone.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from fakes import chain_table
from test_serving import MultiFakeEngine, WrongAfter, sequential
from specgen.serve.scheduler import Job, SchedulerSettings, Server
from specgen.policy.stepgate import Tally, StepGate, bucket


def simulate(gate: StepGate, steps: int, sequences: int, draft: tuple[float, float], plain: tuple[float, float],
             seed: int = 1, noise: float = 0.15) -> list[bool]:
    """Run `steps` shared steps; each arm's step yields (tokens, seconds) around its means,
    tokens Poisson-like and seconds with relative noise. The arms chosen, in order."""
    rng = np.random.default_rng(seed)
    chosen = []
    for _ in range(steps):
        d = gate.drafts(sequences)
        tok, sec = draft if d else plain
        tokens = max(sequences, int(rng.poisson(tok))) if d else sequences
        seconds = sec * float(np.exp(noise * rng.standard_normal()))
        gate.observe(sequences, d, tokens, seconds)
        chosen.append(d)
    return chosen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drafting_that_loses_in_shared_steps_switches_off(seed):
    # 4 sequences: plain 4 tokens in 50 ms (80 tok/s); drafting 6.5 tokens in 110 ms (59 tok/s)
    gate = StepGate(seed=seed)
    chosen = simulate(gate, 300, 4, draft=(6.5, 0.110), plain=(4, 0.050), seed=seed)
    assert sum(chosen[:40]) <= 25  # it tried drafting: the warm-up and some draws
    assert sum(chosen[40:]) / len(chosen[40:]) < 0.12  # then rarely: probes only
    assert sum(chosen[-100:]) >= 1 or gate.tallies[bucket(4)][0].n < 1.0  # probed, or the evidence has faded


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drafting_that_pays_in_shared_steps_stays_on(seed):
    # copy-heavy: drafting 12 tokens in 90 ms (133 tok/s) against plain 80 tok/s
    gate = StepGate(seed=seed)
    chosen = simulate(gate, 300, 4, draft=(12.0, 0.090), plain=(4, 0.050), seed=seed)
    assert sum(chosen[40:]) / len(chosen[40:]) > 0.88


def test_drafting_switched_off_is_found_again_when_the_workload_changes():
    gate = StepGate(seed=3)
    first = simulate(gate, 200, 4, draft=(6.5, 0.110), plain=(4, 0.050), seed=3)
    assert sum(first[-100:]) < 15
    # the requests turn copy-heavy: drafting now pays twice over
    then = simulate(gate, 300, 4, draft=(16.0, 0.100), plain=(4, 0.050), seed=4)
    assert sum(then[-100:]) > 85


def test_buckets_learn_apart_and_a_sequence_alone_is_never_gated():
    gate = StepGate(seed=5)
    simulate(gate, 200, 4, draft=(6.5, 0.110), plain=(4, 0.050), seed=5)  # loses at 4
    two = simulate(gate, 200, 2, draft=(6.0, 0.050), plain=(2, 0.040), seed=6)  # pays at 2
    assert sum(two[-100:]) > 85
    assert all(gate.drafts(1) for _ in range(50))
    gate.observe(1, False, 1, 0.01)  # a lone step teaches nothing
    assert bucket(1) == -1 and [b for b in gate.summary()] == ["2", "3"]
    assert gate.summary()["3"]["plain_tok_s"] > gate.summary()["3"]["draft_tok_s"]


def test_tally_rate_is_the_ratio_of_sums_and_its_spread_shrinks_with_evidence():
    t = Tally()
    t.add(4, 0.1)
    t.add(8, 0.1)
    assert t.rate == pytest.approx(60.0)
    one = t.spread()
    for _ in range(20):
        t.add(4, 0.1)
        t.add(8, 0.1)
    assert 0 < t.spread() < one / 2
    t.fade(0.5)
    assert t.rate == pytest.approx(60.0) and t.n == pytest.approx(21.0)


class TimedEngine(MultiFakeEngine):
    """A fake engine whose passes cost `per_row` seconds a row on a clock the gate reads."""

    def __init__(self, table, clock, per_row, **kw):
        super().__init__(table, **kw)
        self.clock, self.per_row = clock, per_row

    def decode_batch(self, parts):
        self.clock[0] += 0.001 + self.per_row * sum(len(t) for _, t, _ in parts)
        return super().decode_batch(parts)


@pytest.mark.parametrize("per_row, expect_drafting", [(0.010, False), (0.0001, True)])
def test_the_server_stops_drafting_shared_steps_only_where_rows_cost(monkeypatch, per_row, expect_drafting):
    """Four requests whose drafts are half wrong: on a machine where each row costs
    the same (every extra row a full step's cost) the gate turns shared steps plain;
    where rows are nearly free it keeps drafting. Outputs stay the sequential ones."""
    import specgen.serve.scheduler as serving

    clock = [0.0]
    monkeypatch.setattr(serving, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    eng = TimedEngine(chain_table(32), clock, per_row, n_ctx=4096, n_batch=64)
    gate = StepGate(seed=0)
    server = Server(eng, 4, draft_max=4, drafter=WrongAfter(32, good=2), gate=gate)
    jobs = [Job(f"r{i}", [1 + i, 2 + i, 3 + i], 150) for i in range(4)]
    results = server.serve(jobs)
    shared = gate.steps[bucket(4)]
    late = server.step_log[len(server.step_log) // 2 :]
    drafting_late = sum(1 for n, rows, pre in late if n >= 2 and rows > n) / len(late)
    if expect_drafting:
        assert drafting_late > 0.8, shared
    else:
        assert drafting_late < 0.2, shared
        assert shared[1] > shared[0]
    for r in results:  # the same tokens either way: greedy, chain table
        assert r.gen.tokens == sequential(MultiFakeEngine(chain_table(32), n_ctx=4096), r.job)


def test_a_step_that_prefills_drafts_nothing():
    gate = StepGate(seed=0)
    assert gate.drafts(1) and not gate.drafts(1, prefill=True) and not gate.drafts(4, prefill=True)
    assert gate.steps[bucket(4)] == [0, 0]  # not a gated choice: no arm's step


@pytest.mark.parametrize("gated,prefill_drafts", [(True, True), (True, False), (False, True)])
def test_steps_that_prefill_draft_first_and_the_chunk_takes_the_rest(monkeypatch, gated, prefill_drafts):
    """Requests admitted while others generate: their prompt's chunks share steps
    with verify rows. Under a gate the drafts are planned first (as in a shared
    step without the prompt) and the chunk fills the step up to
    shared_step_rows, so the prompt never starves; with prefill_drafts off those
    steps are plain. Without a gate the policies draft there too."""
    import specgen.serve.scheduler as serving

    clock = [0.0]
    monkeypatch.setattr(serving, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    eng = TimedEngine(chain_table(32), clock, 0.0001, n_ctx=4096, n_batch=64)
    settings = SchedulerSettings(prefill_drafts=prefill_drafts)
    server = Server(eng, 2, draft_max=4, drafter=WrongAfter(32, good=4), gate=StepGate(seed=0) if gated else None,
                    settings=settings)
    jobs = [Job(f"r{i}", [(i + j) % 32 for j in range(40 + 30 * i)], 20 + 7 * i) for i in range(5)]
    results = server.serve(jobs)
    mixed = [(n, rows, pre) for n, rows, pre in server.step_log if pre and rows]  # prefill beside verify rows
    assert mixed, "no step prefilled beside a generating sequence"
    verify_only = [rows for n, rows, pre in server.step_log if not pre and rows]
    assert max(verify_only) > 2  # drafting happens elsewhere
    if gated and not prefill_drafts:
        assert all(rows == 1 for _, rows, _ in mixed), mixed  # one generating sequence, one plain row
    else:
        assert any(rows > 1 for _, rows, _ in mixed), mixed
    if gated and prefill_drafts:  # the drafts first, then a chunk that fills the step to its cap
        assert all(rows + pre <= settings.shared_step_rows for _, rows, pre in mixed), mixed
        assert any(rows > 1 and rows + pre >= settings.shared_step_rows - 3 for _, rows, pre in mixed), mixed
    for r in results:
        assert r.gen.tokens == sequential(MultiFakeEngine(chain_table(32), n_ctx=4096), r.job)
