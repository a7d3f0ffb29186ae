"""benchmarks/replay.py suffix: its configs, and the ceilings on the suffix drafter's choice of continuation."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from specgen.policy.cost import CostAware, Costs
from specgen.drafters.suffix import SuffixDrafter

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def replay_mod():
    """The suffix mode (benchmarks/replaylib/suffix.py), as benchmarks/replay.py loads it."""
    spec = importlib.util.spec_from_file_location("bench_replay", ROOT / "benchmarks" / "replay.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_replay"] = mod
    spec.loader.exec_module(mod)
    return mod.MODES["suffix"]


def test_configs_are_drafters_build_drafter_makes(replay_mod):
    lookup = replay_mod.config_drafter("lookup:shared=0")
    assert lookup.name == "lookup" and (lookup.ngram_max, lookup.ngram_min) == (4, 1)
    d = replay_mod.config_drafter("current:cut_at_split=0,choice=frequent,min_match=2,local_at_split=0,hindsight=1")
    assert isinstance(d, SuffixDrafter) and d.global_index is not None and d.policy_stats == {}
    assert (d.cut_at_split, d.choice, d.min_match, d.local_at_split) == (0, "frequent", 2, 0)
    assert replay_mod.config_drafter("local:shared=0").global_index is None
    assert replay_mod.config_drafter("current:shared=0").policy_stats is None  # a fresh policy per request
    for bad in ("current:nothing=1", "current:choice=bogus", "current:global_cache=0", "other"):
        with pytest.raises(SystemExit):
            replay_mod.config_drafter(bad)


def test_accepted_counts_the_agreeing_prefix(replay_mod):
    assert replay_mod.accepted([1, 2, 3], [1, 2, 4, 5]) == 2
    assert replay_mod.accepted([1, 2], [1]) == 1  # plain's text ends
    assert replay_mod.accepted([], [1]) == 0


def test_pool_holds_every_continuation_the_indexes_offer(replay_mod):
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    d.local_at_split = False
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


def test_a_keyed_ceiling_copies_only_after_a_shared_context(replay_mod):
    text = [1, 2, 3, 4, 9, 9, 5, 2, 3, 4]
    # position 7 (token 2) follows 5; the earlier 2 3 4 follows 1: a copy of 3 without a key,
    # none with one token of shared context (no earlier 2 follows a 5)
    assert replay_mod.longest_continuations(text, 7, [])[0] == 3
    assert replay_mod.longest_continuations(text, 7, [], context=1)[0] == 0
    assert replay_mod.longest_continuations(text, 7, [[7, 5, 2, 3]], context=1)[0] == 2  # another document's


def test_tree_replay_follows_plain_and_prices_every_row(replay_mod):
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    plain = [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6]
    curve = [0.0] + [0.02 + 0.001 * n for n in range(1, 40)]
    rng = np.random.default_rng(5)  # a text that copies its period, now and then a new token
    mixed = [int(t) if rng.random() < 0.7 else int(rng.integers(20, 99)) for t in np.tile(np.arange(1, 9), 12)]
    lens = {"r": replay_mod.longest_continuations(prompt + mixed, len(prompt), [])}

    def run(width):  # the real cost policy, priced on the virtual clock (the tree loop's too)
        return replay_mod.replay([("r", prompt, mixed)], SuffixDrafter(), 8, curve, lambda: CostAware(8, Costs(curve)),
                                 lengths=lens, host=False, tree_width=width)[0]  # asserts plain's tokens

    chain, one, wide = run(0), run(1), run(3)
    assert one["tokens_per_s"] == chain["tokens_per_s"] and one["k_hist"] == chain["k_hist"]  # no branch: a chain
    assert wide["accepted"] > 0
    target = replay_mod.ReplayTarget(prompt + plain, curve, replay_mod.Clock(False))
    target.sync(0, prompt)
    # the root is plain's first token (9); plain goes on 1 2 3: nodes 1 -> 2 on its path, 7 and 5 off it
    rows, ids = target.decode_tree(0, [1, 2], 9, [1, 2, 7, 5], [-1, 0, 0, -1])
    assert [r.argmax() for r in rows] == [1, 2, 3, -1, -1]  # off plain's path: never reached
    assert ids == [0, 1, 2]  # a sequence per leaf
    target.keep_path(0, [1, 2], 0, len(prompt), 2)
    assert target.kv_tokens() == prompt + [9, 1, 2]
    assert target.clock.offset == pytest.approx(curve[1] + curve[5])  # the prompt's one row, the tree's five
    assert target.trace[-1][:3] == (len(prompt) + 1, 4, 2)
