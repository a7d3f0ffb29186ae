"""benchmarks/suffix_replay.py: the ceilings on the suffix drafter's choice of continuation."""

import importlib.util
import sys
from pathlib import Path

import pytest

from specgen.suffix import SuffixDrafter

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def replay_mod():
    spec = importlib.util.spec_from_file_location("suffix_replay", ROOT / "benchmarks" / "suffix_replay.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["suffix_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_accepted_counts_the_agreeing_prefix(replay_mod):
    assert replay_mod.accepted([1, 2, 3], [1, 2, 4, 5]) == 2
    assert replay_mod.accepted([1, 2], [1]) == 1  # plain's text ends
    assert replay_mod.accepted([], [1]) == 0


def test_pool_holds_every_continuation_the_indexes_offer(replay_mod):
    d = SuffixDrafter(global_cache=True, min_global_match=1, local_at_split=False)
    for doc in ([5, 6, 7, 20, 8], [5, 6, 7, 20, 9], [5, 6, 7, 21, 4]):
        d.remember(doc)
    ctx = [3, 5, 6, 7]
    own = d.propose_one(ctx, 3).tokens
    pool = replay_mod.pool_candidates(d, 0, 3)
    assert own[:1] == [21]  # the latest occurrence
    assert [21, 4] in pool  # ... its continuation
    assert [20, 9] in pool  # the most frequent next token, with its latest continuation
    assert [20, 8] not in pool and all(len(c) <= 3 for c in pool)  # an older occurrence behind a newer one
    assert replay_mod.pool_candidates(d, 7, 3) == []  # a sequence the drafter has not seen


def _replay(mod, drafter, pick="", host=False):
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    plain = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6]
    curve = [0.0] + [0.02 + 0.01 * n for n in range(1, 40)]
    lens = {"r": mod.longest_continuations(prompt + plain, len(prompt), [])}
    return mod.replay([("r", prompt, plain)], drafter, 8, curve, lambda: None, pick=pick, lengths=lens, host=host)[0]


def test_replay_without_host_cost_repeats_exactly(replay_mod):
    a = _replay(replay_mod, SuffixDrafter())
    b = _replay(replay_mod, SuffixDrafter())
    assert a["tokens_per_s"] == b["tokens_per_s"] and a["rounds"] == b["rounds"]


def test_oracle_pick_drafts_only_what_plain_accepts(replay_mod):
    got = _replay(replay_mod, SuffixDrafter(), pick="oracle")
    assert got["accepted"] == got["drafted"] > 0
    assert got["rounds"] <= _replay(replay_mod, SuffixDrafter())["rounds"]
