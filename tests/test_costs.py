"""Cost profiles: measured once, cached per model file and thread count, re-measured when either changes."""

import os

import numpy as np
import pytest

from fakes import FakeEngine, chain_table
from specgen.engine.costs import cost_profile, measure_verify
from specgen.decode.generation import Generation
from specgen.drafters.lookup import PromptLookup
from specgen.policy.cost import CostAware, Costs, Priors


class TimedFake(FakeEngine):
    """A fake whose passes are 'timed': it counts decodes; rows cost nothing real."""

    def __init__(self, path, threads=2):
        super().__init__(chain_table(50), n_ctx=512)
        self.path = path
        self.n_threads = threads

    def tokenize(self, text):
        return [hash(w) % 50 for w in text.split()]


@pytest.fixture
def model_file(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(100))
    return f


def test_verify_curve_covers_1_to_32_rows(model_file):
    curve = measure_verify(TimedFake(model_file), repeats=2)
    assert len(curve) == 33 and curve[0] == 0.0
    assert all(t > 0 for t in curve[1:])


def test_profile_is_cached_and_invalidated(model_file, tmp_path):
    cache = tmp_path / "costs"
    e = TimedFake(model_file)
    first = cost_profile(e, cache=cache)
    n = len(e.decodes)
    again = cost_profile(e, cache=cache)
    assert again == first and len(e.decodes) == n  # read from the cache, nothing measured
    # another thread count is another profile
    cost_profile(TimedFake(model_file, threads=1), cache=cache)
    assert len(list(cache.glob("*.json"))) == 2
    # a changed model file is measured afresh
    model_file.write_bytes(b"GGUF" + bytes(200))
    os.utime(model_file, (1, 1))
    e2 = TimedFake(model_file)
    cost_profile(e2, cache=cache)
    assert len(e2.decodes) > 0 and len(list(cache.glob("*.json"))) == 3
    # refresh re-measures; a damaged entry is measured again, not trusted
    e3 = TimedFake(model_file)
    cost_profile(e3, cache=cache, refresh=True)
    assert len(e3.decodes) > 0
    for f in cache.glob("*.json"):
        f.write_text("{not json")
    e4 = TimedFake(model_file)
    assert cost_profile(e4, cache=cache)["verify_s"] and len(e4.decodes) > 0


def test_a_profile_taken_on_a_busy_machine_is_measured_again_once(model_file, tmp_path):
    """A cached profile whose one-row pass is far slower than a pass now was
    inflated by other processes: it is retaken. One faster than now is kept
    (being busy now says nothing against it). Each file is checked once per process."""
    import json

    from specgen.engine import costs

    cache = tmp_path / "costs"
    prof = cost_profile(TimedFake(model_file), cache=cache)
    f = next(cache.glob("*.json"))
    costs._checked.discard(f)
    f.write_text(json.dumps({**prof, "verify_s": [0.0] + [100.0] * 32}))  # 100 s a pass: a busy machine
    e = TimedFake(model_file)
    retaken = cost_profile(e, cache=cache)
    assert retaken["verify_s"][1] < 1.0 and len(e.decodes) > 10  # spot check, then a probe
    assert json.loads(f.read_text())["verify_s"][1] < 1.0  # and the cache holds the new one
    costs._checked.discard(f)
    fast = {**prof, "verify_s": [0.0] + [1e-12] * 32}
    f.write_text(json.dumps(fast))
    e2 = TimedFake(model_file)
    assert cost_profile(e2, cache=cache) == fast  # faster than any pass now: kept
    n = len(e2.decodes)
    assert 0 < n < 10  # only the spot check ran
    cost_profile(e2, cache=cache)
    assert len(e2.decodes) == n  # checked once per process


class ClockedFake(TimedFake):
    """A fake whose passes take `cost(rows)` seconds on a fake clock, for costs'
    timer (`clocked`): a machine whose every figure is known."""

    def __init__(self, path, cost, clock):
        super().__init__(path)
        self.cost, self.clock = cost, clock

    def decode_batch(self, parts):
        self.clock[0] += self.cost(sum(len(t) for _, t, _ in parts))
        return super().decode_batch(parts)


def quiet(rows):
    return 0.010 + 0.004 * rows


@pytest.fixture
def clocked(monkeypatch):
    import time
    from types import SimpleNamespace

    from specgen.engine import costs

    clock = [0.0]
    monkeypatch.setattr(costs, "time", SimpleNamespace(perf_counter=lambda: clock[0], time=time.time))
    return clock


def _cache_profile(model_file, cache, clock, curve, feed=None):
    """Measure a full profile on the quiet fake (`refresh`: every row count, as `specgen
    tune` does), then overwrite the cached one with `curve` (index 0 unused; a
    function of rows), as if measured so; forget it was checked."""
    import json

    from specgen.engine import costs

    prof = cost_profile(ClockedFake(model_file, quiet, clock), cache=cache, refresh=True)
    f = next(cache.glob("*.json"))
    bad = {**prof, "verify_s": [0.0] + [curve(n) for n in range(1, len(prof["verify_s"]))]}
    if feed is not None:
        bad["feed_s"] = feed
    f.write_text(json.dumps(bad))
    costs._checked.discard(f)
    return f, prof


def test_a_profile_inflated_by_a_fifth_is_measured_again_one_within_the_scatter_is_kept(model_file, tmp_path, clocked):
    import json

    cache = tmp_path / "costs"
    f, prof = _cache_profile(model_file, cache, clocked, lambda n: 1.2 * quiet(n))  # a pass now: 0.83x
    e = ClockedFake(model_file, quiet, clocked)
    assert cost_profile(e, cache=cache)["verify_s"] == pytest.approx(prof["verify_s"])
    assert json.loads(f.read_text())["verify_s"] == pytest.approx(prof["verify_s"])
    f, _ = _cache_profile(model_file, cache, clocked, lambda n: 1.1 * quiet(n))  # 0.91x: a quiet machine's scatter
    e = ClockedFake(model_file, quiet, clocked)
    assert cost_profile(e, cache=cache)["verify_s"][1] == pytest.approx(1.1 * quiet(1))
    assert len(e.decodes) < 15  # only the spot check ran


def test_a_profile_inflated_only_past_one_row_is_measured_again(model_file, tmp_path, clocked):
    cache = tmp_path / "costs"
    _, prof = _cache_profile(model_file, cache, clocked, lambda n: quiet(n) if n == 1 else 1.3 * quiet(n))
    retaken = cost_profile(ClockedFake(model_file, quiet, clocked), cache=cache)
    assert retaken["verify_s"] == pytest.approx(prof["verify_s"])


def test_a_retake_never_makes_a_profile_worse(model_file, tmp_path, clocked):
    """The machine got busy during the retake, for the passes of many rows: the old
    profile's lower figures are kept (each figure is the truth plus what other
    processes added), so the retake leaves the profile no worse anywhere."""
    import json

    cache = tmp_path / "costs"
    f, prof = _cache_profile(model_file, cache, clocked, lambda n: 1.5 * quiet(n) if n <= 4 else quiet(n),
                             feed=0.5 * quiet(64) / 64)
    busy_past_4 = lambda rows: quiet(rows) if rows <= 4 else 2 * quiet(rows)  # noqa: E731
    retaken = cost_profile(ClockedFake(model_file, busy_past_4, clocked), cache=cache)
    assert retaken["verify_s"] == pytest.approx(prof["verify_s"])  # the better of both, everywhere
    assert retaken["feed_s"] == pytest.approx(0.5 * quiet(64) / 64)
    assert json.loads(f.read_text()) == retaken


def test_adaptive_k_never_exceeds_what_the_context_allows():
    eng = FakeEngine(chain_table(8), n_ctx=40)  # a short cycle: lookup always matches
    flat = [0.0] + [0.01] * 33  # verifying is free: the policy wants the longest draft
    gen = Generation(eng, [1, 2, 3, 4, 5, 6, 7, 0, 1, 2], PromptLookup(), draft_max=32, max_tokens=100,
                     policy=CostAware(32, Costs(flat), Priors(prior=0.99)))
    rounds = list(gen)  # FakeEngine raises if a verify would overflow the context
    assert gen.stats.stop_reason == "context_full"
    assert max(r.drafted for r in rounds) > 4
    assert len(eng.kv[0]) <= eng.n_ctx


def sawtooth(rows):
    """llama.cpp's CPU kernels for repacked quantized weights: rows in blocks of 4,
    the rest one by one at nearly a single row's cost (so 7 rows cost more than 8)."""
    return 0.010 + 0.012 * (rows // 4) + 0.0045 * (rows % 4)


def test_every_row_count_is_measured_so_a_sawtooth_curve_is_priced_as_it_is(model_file, clocked):
    """Interpolating between sparse row counts priced 5 and 17 rows (k = 4, 16) as
    if between their neighbours, and a non-decreasing clamp hid that 7 rows cost
    more than 8: real rounds took 16-44 % more than such a curve said."""
    curve = measure_verify(ClockedFake(model_file, sawtooth, clocked), repeats=2)
    assert curve[1:] == pytest.approx([sawtooth(n) for n in range(1, 33)])
    assert curve[7] > curve[8] and curve[17] > curve[16]


def test_a_profile_of_the_old_version_is_probed_again_keeping_only_what_it_measured(model_file, tmp_path, clocked):
    """A cached profile from before PROFILE_VERSION (interpolated between sparse
    row counts, so too low in between) is probed again: its in-between figures do
    not survive as a merge's minima (they come from the probe, provisional but for
    the probed 5 rows); the rows it measured at the sawtooth's low points (1-4,
    multiples of 4) are kept where lower (the probe was busier)."""
    import json

    from specgen.engine import costs

    cache = tmp_path / "costs"
    cost_profile(ClockedFake(model_file, sawtooth, clocked), cache=cache, refresh=True)
    f = next(cache.glob("*.json"))
    old = json.loads(f.read_text())
    assert old["version"] == costs.PROFILE_VERSION
    old.pop("version")
    old["verify_s"] = [0.0] + [0.5 * sawtooth(n) for n in range(1, 33)]  # a quiet machine's, or interpolated
    f.write_text(json.dumps(old))
    costs._checked.discard(f)
    retaken = cost_profile(ClockedFake(model_file, sawtooth, clocked), cache=cache)
    assert retaken["version"] == costs.PROFILE_VERSION
    kept = [n for n in range(1, 33) if n <= 4 or n % 4 == 0]
    assert [retaken["verify_s"][n] for n in kept] == pytest.approx([0.5 * sawtooth(n) for n in kept])
    others = [n for n in range(5, 33) if n % 4]
    assert retaken["verify_s"][5] == pytest.approx(sawtooth(5))  # probed
    assert all(retaken["verify_s"][n] > 0.55 * sawtooth(n) for n in others)  # not the old 0.5x
    assert retaken["provisional"] == [n for n in others if n != 5]
