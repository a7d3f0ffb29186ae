"""benchmarks/suffix.py: its configs (built by build_drafter, or variants of it), repeated runs treated alike for
every side, and the sparse verify curve it replays."""

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from specgen.drafters.build import DrafterOptions, build_drafter
from specgen.drafters.suffix import SuffixDrafter

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    """The command, benchmarks/suffix.py; its modules (benchmarks/suffixlib/) stay importable."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("suffix_bench", ROOT / "benchmarks" / "suffix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def repeats(bench):  # noqa: ARG001 - loaded through the command
    return importlib.import_module("suffixlib.stats")  # the repeated runs' figures


@pytest.fixture(scope="module")
def llama(bench):  # noqa: ARG001
    return importlib.import_module("suffixlib.llama")  # llama.cpp's side


@pytest.fixture(scope="module")
def runs(bench):  # noqa: ARG001
    return importlib.import_module("suffixlib.runs")  # specgen's side


def test_suffix_variants_turn_the_switches_and_arguments_they_name(runs):
    opts = DrafterOptions("suffix", global_cache=True, suffix_choice="frequent", ngram_min=2)
    d = runs.suffix_variant(opts, cut_at_split=False, min_global_match=5, local_at_split=False, counts=True)
    assert isinstance(d, SuffixDrafter) and d.global_index is not None
    assert (d.choice, d.min_match, d.cut_at_split, d.min_global_match, d.local_at_split, d.counts) == (
        "frequent", 2, False, 5, False, True)
    plain = build_drafter(DrafterOptions("suffix"))  # the product's: SuffixDrafter's own rules
    assert type(plain) is SuffixDrafter and (plain.cut_at_split, plain.counts, plain.local_at_split) == (True, False, True)
    assert type(runs.suffix_variant(opts)) is SuffixDrafter  # built by build_drafter, variant or not
    assert SuffixDrafter.cut_at_split and not SuffixDrafter.counts  # a variant turns its own instance, not the class
    with pytest.raises(TypeError):
        runs.suffix_variant(opts, nothing=1)
    with pytest.raises(TypeError):
        runs.suffix_variant(opts, max_walk=8)  # shapes the index build_drafter already built: refused


def test_every_config_is_built_by_build_drafter(runs):
    assert runs.make_drafter("plain") is None
    assert runs.make_drafter("lookup").name == "lookup"
    want = {  # config: (global index, choice, cut_at_split, counts, carried statistics)
        "suffix": (False, "latest", True, False, False),
        "suffix+global": (True, "latest", True, False, True),
        "suffix+global:frequent": (True, "frequent", True, False, True),
        "suffix+global:old": (True, "latest", False, False, False),
        "suffix+global:counts": (True, "latest", True, True, True),
        "suffix+global:sparse": (True, "latest", True, False, True),
    }
    assert set(want) | {"plain", "lookup"} == set(runs.CONFIGS)
    for name, (glob, choice, cut, counts, stats) in want.items():
        d = runs.make_drafter(name)
        got = (d.global_index is not None, d.choice, d.cut_at_split, d.counts, d.policy_stats is not None)
        assert got == (glob, choice, cut, counts, stats), name
    assert runs.config_drafter("suffix+global@w3")[1] == 3 and runs.config_drafter_width("lookup") == 1


def test_every_repeat_puts_each_config_elsewhere(bench, llama):
    names = ["plain", "lookup", "suffix+global"] + [f"llama:{t}" for t in llama.LLAMA_TYPES]
    for i in range(4):
        orders = [bench.run_order(names, i, rep, 3) for rep in range(3)]
        assert all(sorted(o) == sorted(names) for o in orders)
        for c in names:  # a config's place differs in every repeat
            assert len({o.index(c) for o in orders}) == 3


def test_best_of_single_runs_is_biased_up_the_cross_validated_best_is_not(repeats):
    # two types alike in truth, each with one fast run: one run per config always finds the fast one
    per_type = {"a": [10.0, 14.0, 10.0], "b": [14.0, 10.0, 10.0]}
    assert [repeats.single_run_best(per_type, r) for r in range(3)] == [14.0, 14.0, 10.0]
    assert repeats.best_type(per_type)[1] == 10.0
    assert repeats.cross_validated_best(per_type) == 10.0
    # a type that is really faster is still found without the judged run
    assert repeats.cross_validated_best({"a": [20.0, 21.0, 19.0], "b": [10.0, 11.0, 12.0]}) == 20.0


def test_spread_and_outliers(repeats):
    assert repeats.spread([10.0]) == 0.0
    assert repeats.spread([10.0, 12.0, 8.0]) == pytest.approx(0.4)
    assert repeats.outliers([10.0, 10.5, 20.0]) == 1
    assert repeats.outliers([10.0, 11.0, 9.5]) == 0
    assert repeats.runner_up_gap({"a": [12.0], "b": [10.0]}) == pytest.approx(0.2)


def _run(tps, **kw):
    return {"tokens_per_s": tps, "rounds": 10, "drafted": 0, "accepted": 0, "generated": 10, "draft_s": 0.0,
            "decode_s": 1.0, "same_as_plain": True, **kw}


def test_summary_takes_medians_for_every_side_and_reports_their_noise(repeats):
    results = {
        "r0": {"plain": [_run(10.0), _run(10.0), _run(10.0)],
               "lookup": [_run(20.0), _run(40.0), _run(20.0)],  # one outlier run
               "llama:lookup": [{"tokens_per_s": 15.0}, {"error": "crashed"}, {"tokens_per_s": 15.0}],
               "llama:ngram-mod": [{"tokens_per_s": 30.0}, {"tokens_per_s": 12.0}, {"tokens_per_s": 12.0}]},
    }
    names = ["plain", "lookup", "llama:lookup", "llama:ngram-mod"]
    s = repeats.summarise("t", ["r0"], results, names)
    rows = s["configs"]
    assert "llama:lookup" in rows  # a failed run leaves the type in, judged by its other runs
    assert rows["lookup"]["geomean_vs_plain"] == pytest.approx(2.0)  # the median, not the fast run
    assert rows["lookup"]["geomean_vs_llama_best"] == pytest.approx(20.0 / 15.0)  # best type by median
    assert rows["lookup"]["outlier_runs"] == pytest.approx(1 / 3)
    assert rows["lookup"]["noisy_requests"] == 1
    assert rows["plain"]["outlier_runs"] == 0
    assert s["llama_best_type"] == {"llama:lookup": 1}
    assert rows["llama:best"]["geomean_vs_plain"] == pytest.approx(1.5)
    # one run per config: repeat 0 alone saw ngram-mod at 30 tok/s
    assert rows["lookup"]["single_runs_vs_llama_best"].split("/")[0] == f"{20.0 / 30.0:.3g}"


def test_llama_cpp_is_timed_over_the_tokens_specgen_counts(llama):
    # llama-speculative-simple decoded 176 tokens for 128 asked (-n 127) in 2 s: printed 88 tok/s
    r = {"generated": 176, "decode_s": 2.0, "tokens_per_s_raw": 88.0}
    assert llama.same_count_rate(r, 128, "ngram-simple") == pytest.approx(64.0)
    # llama-lookup's first token comes from the prompt's logits inside its clock: not counted
    assert llama.same_count_rate({"generated": 130, "decode_s": 2.0}, 128, "lookup") == pytest.approx(63.5)
    # old records: the printed figure moves to tokens_per_s_raw, specgen's stay as they are
    results = {"r0": {"llama:ngram-mod": [{"tokens_per_s": 96.0, "generated": 192}],
                      "plain": [{"tokens_per_s": 40.0}]}}
    llama.same_counts(results, 128)
    assert results["r0"]["llama:ngram-mod"][0]["tokens_per_s"] == pytest.approx(64.0)
    assert results["r0"]["llama:ngram-mod"][0]["tokens_per_s_raw"] == 96.0
    assert results["r0"]["plain"][0] == {"tokens_per_s": 40.0, "tokens_per_s_raw": 40.0}


def test_llama_cpp_text_is_checked_against_plain(llama, repeats):
    prompt = "Continue the story: the lighthouse keeper saw a ship"
    out = prompt + "\n\nThe ship was a 100-foot-long, 10-ton"
    got = llama.generated_text(out, prompt)
    assert got == "\n\nThe ship was a 100-foot-long, 10-ton"
    again = "ugh! " + prompt + " and then" + prompt[-45:] + " again"  # the output repeats the prompt's end
    assert llama.generated_text(again, prompt) == " and then" + prompt[-45:] + " again"
    assert llama.follows(got, "\n\nThe ship was a 100-foot") is None  # llama.cpp decodes past n
    assert llama.follows(got, "\n\nThe ship was a 12-metre (36-foot) fishing vessel") == 18  # "1" in both
    assert llama.follows("", "\n\nThe") == 0
    results = {"r0": {"plain": [_run(10.0)], "llama:lookup": [{"tokens_per_s": 15.0, "same_as_plain": False}],
                      "llama:ngram-mod": [{"tokens_per_s": 12.0, "same_as_plain": True}]}}
    s = repeats.summarise("t", ["r0"], results, ["plain", "llama:lookup", "llama:ngram-mod"])
    assert s["configs"]["llama:best"]["differs_from_plain"] == 1
    assert s["configs"]["llama:ngram-mod"]["differs_from_plain"] == 0


SAW = [0.0] + [0.010 + 0.012 * (n // 4) + 0.0045 * (n % 4) for n in range(1, 33)]


def test_sparse_curve_prices_in_between_rows_as_sparse_profiles_did(runs):
    sparse = runs.sparse_curve(SAW)
    for n in (1, 4, 8, 12, 16, 24, 32):
        assert sparse[n] == pytest.approx(SAW[n])
    assert sparse[5] == pytest.approx((SAW[4] + min(SAW[6], SAW[8])) / 2)
    assert sparse[3] == pytest.approx(SAW[4]) and SAW[4] < SAW[3]  # clamped to the next point, as a disturbed one
    assert sparse[6] == pytest.approx(SAW[6]) and SAW[6] < SAW[8]  # 6 is one of the sparse points
    assert sparse[17] < SAW[17]  # a k = 16 round, priced between 16 and 24 rows


def test_a_near_tie_is_read_from_plain_run_again(runs):
    # plain and a speculative run part at position 1; plain again agrees with plain there
    plain, mine = [5, 6, 7], [5, 8, 7]
    rows = [([5, 9], [10.0, 9.0]), ([6, 8], [10.0, 9.5]), ([7, 1], [10.0, 2.0])]
    got = runs.parting(plain, mine, (plain, rows))
    assert got["at"] == 1 and got["margin"] == pytest.approx(0.5) and got["gap"] == pytest.approx(0.5)
    assert got["near_tie"]
    far = runs.parting(plain, [5, 1, 7], (plain, [rows[0], ([6, 1], [10.0, 1.0]), rows[2]]))
    assert not far["near_tie"]  # 9 logits below plain's best: no tie, a bug


def test_top_rows_records_every_row_an_engine_returns(runs):
    from fakes import FakeEngine, chain_table

    rec = runs.TopRows(FakeEngine(chain_table(20), n_ctx=64))
    rec.sync(0, [1, 2, 3])
    rec.decode(0, [4, 5], 2)
    assert sorted(rec.at) == [2, 3, 4]  # the prompt's last row, then both decoded rows
    assert rec.at[3][0][0] == 5  # a chain: the row after token 4 ranks 5 first
