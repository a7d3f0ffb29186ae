"""benchmarks/round_costs.py and suffix.sparse_curve: a real run's rounds priced by a verify curve."""

import importlib.util
import sys
from pathlib import Path

import pytest

from fakes import FakeEngine, chain_table

ROOT = Path(__file__).resolve().parent.parent


def _load(name):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rc():
    return _load("round_costs")


SAW = [0.0] + [0.010 + 0.012 * (n // 4) + 0.0045 * (n % 4) for n in range(1, 33)]


def test_sparse_curve_prices_in_between_rows_as_sparse_profiles_did():
    sparse = _load("suffix").sparse_curve(SAW)
    for n in (1, 4, 8, 12, 16, 24, 32):
        assert sparse[n] == pytest.approx(SAW[n])
    assert sparse[5] == pytest.approx((SAW[4] + min(SAW[6], SAW[8])) / 2)
    assert sparse[3] == pytest.approx(SAW[4]) and SAW[4] < SAW[3]  # clamped to the next point, as a disturbed one
    assert sparse[6] == pytest.approx(SAW[6]) and SAW[6] < SAW[8]  # 6 is one of the sparse points
    assert sparse[17] < SAW[17]  # a k = 16 round, priced between 16 and 24 rows


def test_each_round_is_priced_by_the_curve_and_measured_over_priced_by_k(rc):
    def rnd(k, acc, scale, pos=200):
        t = SAW[k + 1] * scale
        return {"pos": pos, "k": k, "acc": acc, "wall": t + 0.001, "decode": t, "logits": 0.0, "rm": 0.0, "host": 0.001}

    traces = {"plain": {"a": [rnd(0, 0, 1.0)] * 10},
              "spec": {"a": [rnd(0, 0, 1.0), rnd(3, 3, 1.0), rnd(16, 10, 1.3), rnd(16, 16, 1.3)]}}
    s = rc.summarise(traces, SAW)
    assert s["plain"]["model_over_priced"] == pytest.approx(1.0) and s["plain"]["tokens"] == 10
    assert s["spec"]["tokens"] == 1 + 4 + 11 + 17 and s["spec"]["rounds"] == 4
    assert s["spec"]["by_k"]["8-16"]["model_over_priced"] == pytest.approx(1.3)
    assert s["spec"]["by_k"]["1-3"]["model_over_priced"] == pytest.approx(1.0)
    assert s["spec"]["priced_s"] == pytest.approx(2 * SAW[1] * 0 + SAW[1] + SAW[4] + 2 * SAW[17])
    # a curve measured at context lengths: priced between the two nearest, by position
    at = {100: {1: 0.01, 4: 0.02, 17: 0.05}, 300: {1: 0.03, 4: 0.04, 17: 0.07}}
    s = rc.summarise({"plain": {"a": [rnd(0, 0, 1.0, pos=200)]}}, SAW, at)
    assert s["plain"]["priced_at_s"] == pytest.approx(0.02)


def test_a_plain_trace_has_one_round_per_token_at_growing_positions(rc):
    eng = FakeEngine(chain_table(20), n_ctx=128)
    rounds = rc.trace_one(eng, [1, 2, 3], None, 8, 16)
    assert [r["k"] for r in rounds] == [0] * 7  # the prefill gave the first of 8 tokens
    assert [r["pos"] for r in rounds] == list(range(4, 11))
    assert all(r["wall"] >= r["host"] >= 0 for r in rounds)
