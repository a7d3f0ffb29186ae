"""No blocking measurement before the first token: a model never seen is probed
(a few passes), the rest of its curve is filled by the CPU kernels' block shape
and learned from the passes its runs observe, merged into the cache at close."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fakes import FakeEngine, chain_table
from specgen import notes
from specgen.engine import costs
from specgen.engine.costs import PROBE_PASSES, PROBE_REPEATS, PROBE_ROWS, block_curve, cost_profile, learn, merge_seen
from specgen.policy.cost import CostAware, Costs
from specgen.policy.estimates import CostLog, Estimates, Observed
from specgen.plan import resolve
from specgen.session import Session

# Gemma 3 270M Q4_K_M, 2 threads, ms: the curve measured at every row count
# (docs/notes/2026-12-cost-profiles.md, "Why the wall clock lagged the replay")
MEASURED = {1: 19.3, 2: 25.4, 3: 29.3, 4: 33.0, 5: 48.9, 6: 52.5, 7: 56.9, 8: 48.9, 9: 66.1, 11: 75.0,
            12: 65.1, 13: 83.1, 15: 94.2, 16: 81.7, 17: 99.0, 20: 99.1}


class TimedFake(FakeEngine):
    """A fake engine with a model file and a thread count, as profiles are keyed."""

    def __init__(self, path, threads=2, cost=None, clock=None):
        super().__init__(chain_table(50), n_ctx=512)
        self.path, self.n_threads = path, threads
        self.cost, self.clock = cost, clock

    def tokenize(self, text):
        return [hash(w) % 50 for w in text.split()]

    def decode_batch(self, parts):
        if self.clock is not None:
            self.clock[0] += self.cost(sum(len(t) for _, t, _ in parts))
        return super().decode_batch(parts)

    def close(self):
        pass


def table_cost(rows):
    """A pass on the machine of MEASURED (in between: the next multiple of 4, plus a row's 4 ms each)."""
    if rows in MEASURED:
        return MEASURED[rows] / 1000
    return (MEASURED.get(4 * (rows // 4 + 1), 33.0 + 16.3 * (rows // 4)) + 4.0 * (rows % 4 - 1)) / 1000 \
        if rows % 4 else (33.0 + 16.3 * (rows // 4 - 1)) / 1000


@pytest.fixture
def model_file(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(100))
    return f


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cost cache (profiles under $SPECGEN_CACHE/costs), nothing checked yet."""
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(costs, "_checked", set())
    return tmp_path / "cache" / "costs"


@pytest.fixture
def clock(monkeypatch):
    import time
    from types import SimpleNamespace

    now = [0.0]
    monkeypatch.setattr(costs, "time", SimpleNamespace(perf_counter=lambda: now[0], time=time.time))
    return now


def test_a_session_with_no_cached_costs_times_only_the_probe(model_file, cache):
    target, draft = TimedFake(model_file), TimedFake(model_file, threads=1)
    s = Session(target, model_file, resolve("lookup", k=8, policy="cost"))
    policy = s.new_policy(draft_engine=draft)
    assert isinstance(policy, CostAware)
    assert len(target.decodes) == PROBE_PASSES and len(draft.decodes) == PROBE_PASSES
    # a warm-up, then each round the prompt's bulk feed and the passes
    assert PROBE_PASSES == 1 + PROBE_REPEATS * (1 + len(PROBE_ROWS)) <= 13
    per_round = 1 + len(PROBE_ROWS)
    rounds = [target.decodes[1 + i * per_round: 1 + (i + 1) * per_round] for i in range(PROBE_REPEATS)]
    prompt = target.tokenize("Measuring the cost of a verify pass. " * 4)
    for r in rounds:
        assert r[0][1] == prompt and r[0][2] == 1  # the prefill: logits on its last row only
        assert [n for _, _, n in r[1:]] == list(PROBE_ROWS)
    prof = json.loads(next(cache.glob("*.json")).read_text())
    assert prof["provisional"] == [n for n in range(1, 33) if n not in PROBE_ROWS] and prof["feed_provisional"]
    n = len(target.decodes)
    s.new_policy()
    assert len(target.decodes) == n  # cached now, and checked once per process


def test_the_probes_feed_is_the_least_disturbed_prefill_and_no_more_than_its_widest_pass(model_file, cache, clock):
    """A burst of load in one prefill does not price the feed (each round times one,
    the lesser kept); and a feed per token is never above the widest pass's time
    per row (feeding n tokens costs no more than returning logits for all n)."""
    from specgen.engine.costs import probe

    prompt_len = len(TimedFake(model_file).tokenize("Measuring the cost of a verify pass. " * 4))
    prefills = []

    def cost(rows, slow=(10.0, 1.0)):  # the first prefill ×10, the second as it is
        if rows == prompt_len:
            prefills.append(rows)
            return rows * 0.001 * slow[len(prefills) - 1]
        return table_cost(rows)

    e = TimedFake(model_file, cost=cost, clock=clock)
    assert probe(e)["feed_s"] == pytest.approx(0.001)
    assert len(prefills) == PROBE_REPEATS
    prefills.clear()
    e = TimedFake(model_file, cost=lambda rows: rows * 0.05 if rows == prompt_len else table_cost(rows), clock=clock)
    assert probe(e)["feed_s"] == pytest.approx(MEASURED[8] / 1000 / 8)  # both prefills slow: the 8-row pass bounds it


def test_the_provisional_curve_has_the_kernels_block_shape():
    curve = block_curve({n: MEASURED[n] for n in PROBE_ROWS})
    assert len(curve) == 33 and curve[0] == 0.0
    assert curve[5] > curve[4] and curve[5] == pytest.approx(curve[8])  # a 5th row costs about a block
    assert curve[7] > curve[8] and curve[9] >= curve[12] and curve[15] > curve[16]  # the sawtooth
    for n, ms in MEASURED.items():  # within 7 % of every row count measured on the real machine
        assert curve[n] == pytest.approx(ms, rel=0.07), n
    line = block_curve({n: 0.010 + 0.004 * n for n in PROBE_ROWS})  # a straight line (unrepacked weights, GPU)
    assert line[1:] == pytest.approx([0.010 + 0.004 * n for n in range(1, 33)])


def test_a_probe_on_the_measured_machine_prices_every_row_count_near_the_truth(model_file, cache, clock):
    prof = cost_profile(TimedFake(model_file, cost=table_cost, clock=clock))
    for n, ms in MEASURED.items():
        assert prof["verify_s"][n] == pytest.approx(ms / 1000, rel=0.07), n
    assert [n for n in PROBE_ROWS if n in prof["provisional"]] == []


def _session_with_probe(model_file, cache, clock, cost=table_cost):
    target = TimedFake(model_file, cost=cost, clock=clock)
    s = Session(target, model_file, resolve("lookup", k=8, policy="cost"))
    return s, s.new_policy(), next(cache.glob("*.json"))


def test_observed_passes_are_merged_into_the_cache_at_close(model_file, cache, clock):
    s, policy, f = _session_with_probe(model_file, cache, clock)
    probed = json.loads(f.read_text())
    # rounds of k = 2 (3 rows: provisional) and k = 3 (4 rows: measured), two of each
    for k, seconds in [(2, 0.040), (2, 0.031), (3, 0.050), (3, 0.030)]:
        policy.update(0, k, 0, verify_s=seconds + policy.pick_s)  # the policy takes its pick out
    other = s.new_policy()  # a second generation's policy: the session knows it too
    other.update(0, 6, 0, verify_s=0.055 + other.pick_s)
    s.close()
    prof = json.loads(f.read_text())
    assert prof["verify_s"][3] == pytest.approx(0.031)  # provisional: the least disturbed pass seen, now measured
    assert 3 not in prof["provisional"] and 7 not in prof["provisional"]
    assert prof["verify_s"][7] == pytest.approx(0.055)  # even above the guess
    assert prof["verify_s"][4] == pytest.approx(min(0.030, probed["verify_s"][4]))  # measured: the lower
    assert prof["verify_s"][2] == probed["verify_s"][2]  # not observed: as it was
    # a later run merges further; a measured figure never rises
    s2, p2, _ = _session_with_probe(model_file, cache, clock)
    p2.update(0, 2, 0, verify_s=0.100 + p2.pick_s)
    p2.update(0, 9, 0, verify_s=0.070 + p2.pick_s)
    s2.close()
    again = json.loads(f.read_text())
    assert again["verify_s"][3] == pytest.approx(0.031) and again["verify_s"][10] == pytest.approx(0.070)


def test_a_draft_models_steps_and_bulk_feeds_are_learned(model_file, tmp_path):
    from types import SimpleNamespace

    cache = tmp_path / "costs"
    draft = TimedFake(model_file)
    prof = cost_profile(draft, cache=cache)
    seen = Observed()
    policy = CostAware(8, Costs(prof["verify_s"], prof["verify_s"][1], prof["feed_s"], draft_verify_s=prof["verify_s"], draft_seen=seen))
    step = SimpleNamespace(steps=2, step_s=0.004, fed=0, fed_s=0.0, extra_s=None)
    policy.update(0, 2, 2, verify_s=0.02, draft=step)
    policy.update(0, 0, 0, None, SimpleNamespace(steps=0, step_s=0.0, fed=64, fed_s=0.064, extra_s=None))  # a prefill
    policy.update(0, 0, 0, None, SimpleNamespace(steps=0, step_s=0.0, fed=5, fed_s=0.050, extra_s=None))  # a catch-up
    assert seen.verify == {1: pytest.approx(0.002)} and seen.feed == {64: 0.064, 5: 0.050}
    merged = learn(draft, seen, cache=cache)
    assert merged["feed_s"] == pytest.approx(0.001) and "feed_provisional" not in merged  # bulk: per token
    assert merged["verify_s"][1] == min(prof["verify_s"][1], 0.002)


def test_a_cached_full_profile_is_read_as_it_is(model_file, cache, clock):
    """Today's format (version 2, every row count measured) is used unchanged: no
    probe, nothing provisional, and the policy over it prices as before."""
    full = cost_profile(TimedFake(model_file, cost=table_cost, clock=clock), refresh=True)
    assert "provisional" not in full
    costs._checked.clear()
    e = TimedFake(model_file, cost=table_cost, clock=clock)
    assert cost_profile(e) == full
    assert len(e.decodes) == 2 + 3 * len(costs.SPOT_ROWS)  # only the spot check: its prompt, a warm-up, 3 passes each
    assert CostAware(8, Costs(full["verify_s"])).verify_s == CostAware(8, Costs(full["verify_s"], provisional=())).verify_s


def test_a_damaged_cache_entry_does_not_crash(model_file, cache, clock):
    s, policy, f = _session_with_probe(model_file, cache, clock)
    policy.update(0, 2, 0, verify_s=0.03)
    f.write_text('{"verify_s": [0.0, "x"')  # a crash or another program mid-write
    s.close()  # nothing to merge into: nothing written, nothing raised
    assert f.read_text() == '{"verify_s": [0.0, "x"'
    costs._checked.clear()
    e = TimedFake(model_file)
    prof = cost_profile(e)  # probed again
    assert len(e.decodes) == PROBE_PASSES and json.loads(f.read_text()) == prof
    for bad in ('[1, 2]', '{"version": 2, "verify_s": [0.0, 0.01], "feed_s": 0.001, "provisional": ["a"]}', "null"):
        f.write_text(bad)
        costs._checked.clear()
        assert cost_profile(TimedFake(model_file))["verify_s"][1] >= 0
    seen = Observed()
    seen.add_pass(2, 0.01)
    f.write_text("garbage")
    assert learn(TimedFake(model_file), seen) is None


def test_the_note_says_a_probe_is_running_and_nothing_for_a_cached_profile(model_file, cache, clock):
    said = []
    before = notes.to(said.append)
    try:
        Session(TimedFake(model_file, cost=table_cost, clock=clock), model_file,
                resolve("lookup", k=8, policy="cost")).new_policy()
        assert len(said) == 1 and "m.gguf" in said[0] and "first use" in said[0], said
        costs._checked.clear()
        Session(TimedFake(model_file, cost=table_cost, clock=clock), model_file,
                resolve("lookup", k=8, policy="cost")).new_policy()
        assert len(said) == 1, said  # cached: nothing to say
    finally:
        notes.to(before)
    cost_profile(TimedFake(model_file, threads=3))  # the Python API: silent (nothing routed, nothing raised)
    assert len(said) == 1


def test_a_provisional_figure_takes_its_first_observed_pass_and_leaves_the_level_alone():
    est = Estimates({1: 0.010, 2: 0.020, 3: 0.025}, provisional={3})
    est.observe(3, 0.040)  # the guess was low: the pass is the figure (a measured one never rises above its profile)
    assert est[3] == 0.040 and est.level == 1.0
    est.observe(3, 0.060)
    assert est[3] == pytest.approx(0.040 + 0.0)  # then as any measured figure: up no further than its figure
    est.observe(2, 0.030)
    assert est[2] < 0.030 + 1e-9 and est[2] <= 0.020


def test_an_observation_merge_replaces_provisional_and_keeps_measured_at_the_min():
    prof = {"version": 2, "verify_s": [0.0, 0.01, 0.02, 0.03], "feed_s": 0.002, "provisional": [2, 3],
            "feed_provisional": True}
    seen = Observed()
    for rows, t in [(1, 0.012), (1, 0.009), (2, 0.025), (5, 0.05)]:
        seen.add_pass(rows, t)
    seen.add_feed(8, 0.001)  # too short to price the bulk rate
    out = merge_seen(prof, seen)
    assert out["verify_s"] == [0.0, 0.009, 0.025, 0.03] and out["provisional"] == [3]
    assert out["feed_s"] == 0.002 and out["feed_provisional"]
    seen.add_feed(40, 0.04)
    assert merge_seen(prof, seen)["feed_s"] == pytest.approx(0.001)


def test_a_session_log_keeps_one_record_per_model():
    log, a, b = CostLog(), object(), object()
    assert log.of(a) is log.of(a) and log.of(a) is not log.of(b)
    assert len(log.items()) == 2


CONCURRENT = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_cost_probe import TimedFake
from specgen.engine.costs import learn
from specgen.policy.estimates import Observed
rows = [int(r) for r in sys.argv[1].split(",")]
for _ in range(15):
    for r in rows:
        seen = Observed()
        seen.add_pass(r, 1e-6 * r)
        learn(TimedFake(Path({model!r})), seen, cache=Path({cache!r}))
"""


def test_concurrent_processes_merge_into_one_file_without_losing_figures(model_file, tmp_path):
    cache = tmp_path / "costs"
    prof = cost_profile(TimedFake(model_file), cache=cache)
    code = CONCURRENT.format(tests=str(Path(__file__).parent), model=str(model_file), cache=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", code, rows]) for rows in ("3,6,7,9", "10,11,13,14")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    out = json.loads(next(cache.glob("*.json")).read_text())
    for r in (3, 6, 7, 9, 10, 11, 13, 14):
        assert out["verify_s"][r] == pytest.approx(1e-6 * r) and r not in out["provisional"], r
    assert len(out["provisional"]) == len(prof["provisional"]) - 8
    assert not list(cache.glob("*.tmp"))


@pytest.mark.model
def test_the_real_model_is_probed_in_a_few_passes_and_learns_at_close(gemma_path, tmp_path, monkeypatch):
    """With no cache, a session over the embedded model times the probe's passes
    only (llama_decode calls counted), and its run's passes reach the cache at close."""
    from specgen.engine.llama import Engine

    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path))
    monkeypatch.setattr(costs, "_checked", set())
    s = Session(Engine(gemma_path, n_ctx=512, n_threads=2), gemma_path, resolve("lookup", k=8, policy="cost"))
    s.drafter = s.new_drafter()
    with s:
        before = s.target.n_decodes
        policy = s.new_policy()
        assert s.target.n_decodes - before == PROBE_PASSES
        f = next((tmp_path / "costs").glob("*.json"))
        probed = json.loads(f.read_text())
        gen = s.generate("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=32,
                         ignore_eos=True, policy=policy)
        rounds = list(gen)[1:]  # after the prompt's round: each a verify pass of drafted + 1 rows
        seen = s.costs_seen.of(s.target)
        assert seen.verify and set(seen.verify) <= {r.drafted + 1 for r in rounds}
        seen.add_pass(3, 1e-4)  # and one pass of a provisional row count, to see it land
        expected = merge_seen(probed, seen)
    assert json.loads(f.read_text()) == expected  # merged at close
    assert expected["verify_s"][3] == 1e-4 and 3 not in expected["provisional"]


@pytest.mark.model
def test_the_cli_says_it_probes_on_first_use_only(gemma_path, tmp_path, monkeypatch, capsys):
    from specgen.cli import main

    import io

    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path))
    monkeypatch.setattr(costs, "_checked", set())
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    args = ["run", "-m", str(gemma_path), "-n", "4", "-t", "2", "-c", "512", "--json", "Hello"]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 0
    first = capsys.readouterr().err
    assert "timing " in first and "first use" in first, first
    with pytest.raises(SystemExit):
        main(args)
    assert "timing " not in capsys.readouterr().err


def test_a_probed_pass_slowed_by_a_burst_of_load_does_not_overprice_the_rows_filled_from_it(model_file, cache, clock):
    """Each probed row count is timed twice, the lesser kept; and once a probed figure
    is corrected (an observed pass), the figures filled from it follow."""
    passes = []

    def bursty(rows):  # the first pass of 5 rows (after the warm-up) meets a burst of load: 60x
        passes.append(rows)
        return table_cost(rows) * (60 if rows == 5 and passes.count(5) == 1 else 1)

    prof = cost_profile(TimedFake(model_file, cost=bursty, clock=clock))
    assert prof["verify_s"][6] == pytest.approx(MEASURED[6] / 1000, rel=0.07)  # the second pass of 5 rows priced it
    # had both passes met it: the observed 5-row pass brings the remainder rows back down at close
    f = next(cache.glob("*.json"))
    slowed = set(prof["provisional"]) | {5}
    f.write_text(json.dumps({**prof, "verify_s": [t * 60 if n in slowed else t for n, t in enumerate(prof["verify_s"])]}))
    seen = Observed()
    seen.add_pass(5, MEASURED[5] / 1000)
    merged = learn(TimedFake(model_file), seen)
    for n in (6, 7, 9, 11, 13, 15):
        assert merged["verify_s"][n] == pytest.approx(MEASURED[n] / 1000, rel=0.07), n


def test_a_sessions_later_policies_start_from_what_its_earlier_passes_filled_in(model_file, cache, clock):
    """A first run's later generations (a bench's, a server's requests) start from the
    probe with its provisional figures replaced by the session's observed passes;
    measured figures, and a full profile, stay as they are until the session closes."""
    s, first, f = _session_with_probe(model_file, cache, clock)
    probed = json.loads(f.read_text())
    first.update(0, 2, 0, verify_s=0.5 + first.pick_s)  # 3 rows: provisional
    first.update(0, 3, 0, verify_s=0.001 + first.pick_s)  # 4 rows: measured
    later = s.new_policy()
    assert later.verify_s[3] == pytest.approx(0.5) and later.verify_s[4] == probed["verify_s"][4]
    assert json.loads(f.read_text()) == probed  # the cache: at close
    full = {"verify_s": [0.0] + [0.01] * 32, "feed_s": 0.001, "version": 2}
    seen = Observed()
    seen.add_pass(3, 0.002)
    assert costs.with_seen(full, seen) is full
