"""Cost profiles: measured once, cached per model file and thread count, re-measured when either changes."""

import os

import numpy as np
import pytest

from fakes import FakeEngine, chain_table
from specgen.costs import cost_profile, measure_verify
from specgen.decoding import Generation
from specgen.drafters import PromptLookup
from specgen.policy import CostAware


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


def test_verify_curve_covers_1_to_32_rows_and_never_falls(model_file):
    curve = measure_verify(TimedFake(model_file), repeats=2)
    assert len(curve) == 33 and curve[0] == 0.0
    assert all(b >= a for a, b in zip(curve[1:], curve[2:]))


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


def test_adaptive_k_never_exceeds_what_the_context_allows():
    eng = FakeEngine(chain_table(8), n_ctx=40)  # a short cycle: lookup always matches
    flat = [0.0] + [0.01] * 33  # verifying is free: the policy wants the longest draft
    gen = Generation(eng, [1, 2, 3, 4, 5, 6, 7, 0, 1, 2], PromptLookup(), draft_max=32, max_tokens=100,
                     policy=CostAware(32, flat, prior=0.99))
    rounds = list(gen)  # FakeEngine raises if a verify would overflow the context
    assert gen.stats.stop_reason == "context_full"
    assert max(r.drafted for r in rounds) > 4
    assert len(eng.kv[0]) <= eng.n_ctx
