"""Suffix index: the automaton and the drafter propose what the brute-force scan does."""

import numpy as np
import pytest

from specgen.drafters.lookup import lookup_draft
from specgen.drafters.automaton import FREQUENT, LATEST, SuffixAutomaton
from specgen.drafters.continuations import KEY_AGREED, KEY_GLOBAL, KEY_SINGLE, KEY_SPLIT, key_bucket, match_bucket
from specgen.drafters.suffix import GlobalIndex, SuffixDrafter, suffix_draft
from specgen.rules.sampling import SamplingParams


def _random_stream(rng, n, alphabet):
    return [int(t) for t in rng.integers(0, alphabet, size=n)]


def test_longest_earlier_match_of_any_length():
    toks = [1, 2, 3, 4, 5, 9, 2, 3, 4, 5, 7, 1, 2, 3, 4, 5]
    # "1 2 3 4 5" (5 tokens) ended earlier at 4, followed by 9; prompt lookup (n <= 4)
    # would take the latest "2 3 4 5", followed by 7
    assert suffix_draft(toks, 2) == ([9, 2], 5, False)
    d = SuffixDrafter().propose_one(toks, 2)
    assert (d.tokens, d.key) == ([9, 2], match_bucket(5) + KEY_SINGLE)
    assert lookup_draft(toks, 2) == [7, 1]


def test_frequent_continuation_beats_latest():
    toks = [5, 1, 5, 1, 5, 2, 5]
    assert suffix_draft(toks, 1, LATEST)[0] == [2]
    assert suffix_draft(toks, 1, FREQUENT)[0] == [1]
    assert SuffixDrafter(choice=FREQUENT).propose_one(toks, 1).tokens == [1]
    assert SuffixDrafter(choice=LATEST).propose_one(toks, 1).tokens == [2]


def test_no_earlier_occurrence_no_draft():
    assert SuffixDrafter().propose_one([1, 2, 3, 4], 4).tokens == []
    assert suffix_draft([1, 2, 3, 4], 4) == ([], 0, False)


def test_min_match_excludes_short_matches():
    toks = [1, 2, 3, 1]
    assert SuffixDrafter(min_match=2).propose_one(toks, 3).tokens == []
    assert SuffixDrafter(min_match=1).propose_one(toks, 3).tokens == [2, 3, 1]


@pytest.mark.parametrize("choice", [LATEST, FREQUENT])
@pytest.mark.parametrize("seed", range(6))
def test_incremental_drafter_matches_reference_scan(seed, choice):
    rng = np.random.default_rng(seed)
    alphabet = 3 + seed % 4
    toks = _random_stream(rng, 20, alphabet)
    d = SuffixDrafter(choice=choice)
    for _ in range(40):  # grow the context like the loop does, a few tokens a round
        k = int(rng.integers(1, 7))
        want = suffix_draft(toks, k, choice)
        got = d.propose_one(toks, k)
        assert got.tokens == want[0]
        if want[0]:
            assert key_bucket(got.key) == match_bucket(want[1]) and got.key < KEY_GLOBAL
        toks += _random_stream(rng, int(rng.integers(1, 4)), alphabet)


@pytest.mark.parametrize("choice", [LATEST, FREQUENT])
@pytest.mark.parametrize("seed", range(6))
def test_global_index_matches_reference_scan(seed, choice):
    rng = np.random.default_rng(100 + seed)
    alphabet = 3 + seed % 3
    min_global = 1 + seed % 3
    d = SuffixDrafter(global_cache=True, choice=choice, min_global_match=min_global)
    docs = []
    for _ in range(3):  # earlier requests, remembered when the next one begins
        d.begin(0)
        doc = _random_stream(rng, int(rng.integers(5, 25)), alphabet)
        d.propose_one(doc, 1)
        docs.append(doc)
    d.begin(0)
    toks = _random_stream(rng, 3, alphabet)
    for _ in range(25):
        k = int(rng.integers(1, 7))
        want, length, from_docs = suffix_draft(toks, k, choice, docs, min_global_match=min_global)
        got = d.propose_one(toks, k)
        assert got.tokens == want
        if want:
            assert key_bucket(got.key) == match_bucket(length) and (got.key >= KEY_GLOBAL) == from_docs
        toks += _random_stream(rng, int(rng.integers(1, 3)), alphabet)


def test_automaton_statistics_are_exact():
    rng = np.random.default_rng(7)
    toks = _random_stream(rng, 200, 3)
    sam = SuffixAutomaton()
    sam.extend(toks)
    assert sam.n_states <= 2 * len(toks)
    assert sum(len(t) for t in sam.nxt) <= 3 * len(toks)
    for start in range(0, 190, 7):  # every substring's state holds its count and latest end
        for n in (1, 2, 4, 8):
            pat = toks[start : start + n]
            v = 0
            for t in pat:
                v = sam.nxt[v][t]
            ends = [e for e in range(n - 1, len(toks)) if toks[e - n + 1 : e + 1] == pat]
            assert sam.count[v] == len(ends)
            assert sam.last_end[v] == max(ends)


def test_a_match_never_crosses_documents():
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    d.remember([1, 2, 3])
    d.remember([4, 5, 6])
    # "3 4" spans the two documents: no match; "3" alone ends its document: nothing follows
    assert d.propose_one([9, 3], 2).tokens == []
    assert d.propose_one([9, 3, 4], 2).tokens == [5, 6]


def test_prefers_longer_global_match_and_local_on_ties():
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    d.remember([7, 1, 2, 3, 8, 8])
    ctx = [1, 2, 5, 6, 1, 2, 3]  # local "1 2" (2 tokens) < global "1 2 3" (3)
    got = d.propose_one(ctx, 2)
    assert (got.tokens, got.key) == ([8, 8], KEY_GLOBAL + 3)
    got = d.propose_one([9, 1, 2, 3, 4, 9, 1, 2, 3], 2, seq=2)  # local "9 1 2 3" (4) beats global (3)
    assert (got.tokens, got.key) == ([4, 9], 4)
    got = d.propose_one([1, 2, 3, 6, 0, 1, 2, 3], 2, seq=3)  # a tie at 3: the local one
    assert (got.tokens, got.key) == ([6, 0], 3)


def test_global_cache_off_never_carries_a_request_over():
    d = SuffixDrafter(global_cache=False)
    d.begin(0)
    d.propose_one([1, 2, 3, 4, 5], 1)
    d.begin(0)
    assert d.propose_one([1, 2, 3], 3).tokens == []
    assert d.global_index is None


def test_finished_generation_is_remembered_when_the_next_begins():
    d = SuffixDrafter(global_cache=True)
    d.begin(0)
    d.propose_one([1, 2, 3, 4, 5, 6, 7], 1)
    assert d.propose_one([1, 2, 3, 4, 5, 6, 7], 1).tokens == []  # a request never drafts from itself
    d.begin(0)
    assert d.propose_one([1, 2, 3, 4, 5], 2).tokens == [6, 7]


def test_eviction_bounds_memory_and_keeps_recent_documents():
    g = GlobalIndex(max_tokens=200)
    rng = np.random.default_rng(3)
    docs = [_random_stream(rng, int(rng.integers(10, 60)), 50) for _ in range(60)]
    for doc in docs:
        g.add(doc)
        assert len(g.sam) <= 200  # tokens and separators
        assert g.sam.n_states <= 2 * 200
        assert list(g.docs)[-1] == doc  # the newest is always kept
    kept = list(g.docs)
    assert kept == docs[-len(kept):]  # a suffix of the history, in order
    # the index holds exactly the kept documents: it drafts as a fresh one over them
    fresh = GlobalIndex(max_tokens=10_000)
    for doc in kept:
        fresh.add(doc)
    assert g.sam.tokens == fresh.sam.tokens


def test_oversized_document_keeps_its_tail():
    g = GlobalIndex(max_tokens=20)
    g.add(list(range(100)))
    assert list(g.docs) == [list(range(91, 100))]
    assert len(g.sam) == 10  # and its separator


def test_drafter_rejects_unknown_choice():
    with pytest.raises(ValueError):
        SuffixDrafter(choice="best")


def test_statistics_walk_is_short_on_ordinary_text():
    rng = np.random.default_rng(11)
    sam = SuffixAutomaton()
    sam.extend(_random_stream(rng, 20_000, 1000))
    assert sam.walked / len(sam) < 4


def test_walk_cap_bounds_work_on_periodic_runs():
    run = [i % 7 for i in range(3000)]  # a model repeating itself: paths grow as n / period
    uncapped = SuffixAutomaton(max_walk=1 << 30)
    uncapped.extend(run)
    capped = SuffixAutomaton(max_walk=16)
    capped.extend(run)
    assert uncapped.walked / len(run) > 100
    assert capped.walked <= 16 * len(run)


def _copy_after(toks, e, k):
    """What followed position e, the copy going on with itself past the end."""
    out = []
    for i in range(e + 1, e + 1 + k):
        out.append(toks[i] if i < len(toks) else out[i - len(toks)])
    return out


@pytest.mark.parametrize("choice", [LATEST, FREQUENT])
@pytest.mark.parametrize("seed", range(4))
def test_capped_walk_still_drafts_a_true_continuation(seed, choice):
    # Past the cap a state may keep an older occurrence, never a wrong one:
    # the draft is what followed some earlier occurrence of the longest match.
    rng = np.random.default_rng(200 + seed)
    toks = _random_stream(rng, 30, 2)
    d = SuffixDrafter(choice=choice, max_walk=2)  # whole copies: what the capped states kept
    d.cut_at_split = False
    for _ in range(30):
        k = int(rng.integers(1, 5))
        got = d.propose_one(toks, k)
        want, length, _ = suffix_draft(toks, k, choice)
        assert match_bucket(length) == key_bucket(got.key) if want else not got.tokens
        n = len(toks)
        pat = toks[n - length:]
        if choice == LATEST:
            ends = [e for e in range(length - 1, n - 1) if toks[e - length + 1 : e + 1] == pat]
            assert any(_copy_after(toks, e, k) == got.tokens for e in ends)
        else:  # each step follows a path that occurred
            s = pat + got.tokens
            assert any(toks[e - len(s) + 1 : e + 1] == s for e in range(len(s) - 1, n))
        toks += _random_stream(rng, int(rng.integers(1, 4)), 2)


def test_match_bucket():
    assert [match_bucket(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 500)] == [1, 2, 3, 4, 4, 5, 5, 6, 6]


def test_short_global_matches_do_not_draft():
    d = SuffixDrafter(global_cache=True)  # MIN_GLOBAL_MATCH = 5
    d.remember([1, 2, 3, 4, 9, 9])
    assert d.propose_one([5, 1, 2, 3, 4], 2).tokens == []
    d.remember([1, 2, 3, 4, 6, 8, 8])
    assert d.propose_one([5, 1, 2, 3, 4, 6], 2, seq=1).tokens == [8, 8]


# -- with the real model -------------------------------------------------------

COPY = "Rename the function add to plus:\n\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\n\nRenamed:\n\ndef plus(a, b):\n"


def _greedy(target, prompt, drafter=None, k=0, n=40):
    from specgen.decode.generation import Generation

    gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, params=SamplingParams(ignore_eos=True))
    for _ in gen:
        pass
    return gen


@pytest.mark.model
def test_suffix_greedy_equals_plain_and_the_global_index_helps_a_repeat(target):
    from test_model import assert_equal_or_near_tie, plain_run

    prompt = target.tokenize(COPY)
    plain, top2 = plain_run(target, prompt, n=40)
    d = SuffixDrafter(global_cache=True)
    first = _greedy(target, prompt, d, k=8)
    assert_equal_or_near_tie(plain, top2, first.tokens)  # greedy: drafts leave the output as it was
    st = first.stats
    assert st.generated == st.rounds + st.accepted
    again = _greedy(target, prompt, d, k=8)  # begin() remembered the first request
    assert_equal_or_near_tie(plain, top2, again.tokens)
    assert again.stats.rounds < first.stats.rounds
    assert again.stats.accepted >= len(plain) - 8


@pytest.mark.model
def test_run_suffix_json(gemma_path):
    from typer.testing import CliRunner

    from specgen.cli import app

    res = CliRunner().invoke(app, ["run", COPY, "-m", str(gemma_path), "--suffix", "-n", "12", "--json", "-c", "512", "-t", "2"])
    assert res.exit_code == 0, res.output
    import json

    obj = json.loads(res.stdout)
    assert obj["mode"] == "suffix" and obj["generated_tokens"] == 12


def test_open_models_refuses_suffix_with_lookup():
    from specgen.errors import SpecgenError
    from specgen.session import ModelOptions

    with pytest.raises(SpecgenError, match="--lookup, --suffix"):
        ModelOptions(lookup=True, drafter="suffix").validate()
    with pytest.raises(SpecgenError, match="frequent"):
        ModelOptions(drafter="suffix", suffix_choice="best").validate()


def test_loader_builds_the_suffix_drafter():
    from specgen.drafters.build import build_drafter
    from specgen.session import ModelOptions

    def make_suffix_drafter(opts):
        return build_drafter(opts.plan("suffix").drafting)

    d = make_suffix_drafter(ModelOptions(drafter="suffix", global_cache=True, suffix_choice=FREQUENT))
    assert isinstance(d, SuffixDrafter) and d.global_index is not None and d.choice == FREQUENT
    assert make_suffix_drafter(ModelOptions(drafter="suffix")).global_index is None


@pytest.mark.parametrize("max_tokens", [1, 7, 12])
def test_a_finished_generation_is_remembered_with_its_final_round(max_tokens):
    # chain model: 0 1 2 … 9 0 1 …; the prompt repeats so the drafter drafts and the
    # last round settles several tokens the drafter never saw in a proposal
    from fakes import FakeEngine, chain_table
    from specgen.decode.generation import Generation

    d = SuffixDrafter(global_cache=True)
    prompt = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    gen = Generation(FakeEngine(chain_table(10)), prompt, d, draft_max=4, max_tokens=max_tokens, params=SamplingParams(ignore_eos=True))
    for _ in gen:
        pass
    assert len(gen.tokens) == max_tokens
    d.begin(0)  # the next request on the sequence
    assert list(d.global_index.docs) == [prompt + gen.tokens]


def test_a_periodic_run_drafts_past_one_period():
    toks = [9, 1, 2, 3, 1, 2, 3, 1, 2]  # period 3: the latest "1 2 3 1 2" ended 3 tokens back
    assert suffix_draft(toks, 7) == ([3, 1, 2, 3, 1, 2, 3], 5, False)
    assert SuffixDrafter().propose_one(toks, 7).tokens == [3, 1, 2, 3, 1, 2, 3]
    assert lookup_draft(toks, 7) == [3, 1, 2]  # prompt lookup stops at the context's end
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    d.remember([5, 6, 5, 6])
    assert d.propose_one([7, 5, 6, 5], 5).tokens == [6]  # an earlier document's end stops the copy


def test_key_tells_fixed_text_from_a_varying_field():
    # a form seen three times: "5 6" always goes on with 7 (fixed text); "7" with a
    # different value each time (a field)
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    d.cut_at_split = False
    for value in (20, 21, 22):
        d.remember([5, 6, 7, value, 8, 9])
    got = d.propose_one([1, 5, 6], 3, seq=1)
    assert (got.tokens, got.key) == ([7, 22, 8], KEY_GLOBAL + KEY_AGREED + match_bucket(2))
    got = d.propose_one([1, 5, 6, 7], 2, seq=2)
    assert (got.tokens, got.key) == ([22, 8], KEY_GLOBAL + KEY_SPLIT + match_bucket(3))
    got = d.propose_one([1, 5, 6, 7, 23, 8], 2, seq=3)  # "23 8" is new; "8" went on with 9 three times
    assert got.tokens == [9] and got.key == KEY_GLOBAL + KEY_AGREED + match_bucket(1)
    # locally: a match followed once before is single
    got = SuffixDrafter().propose_one([3, 4, 5, 3, 4], 1)
    assert (got.tokens, got.key) == ([5], KEY_SINGLE + match_bucket(2))


def test_a_draft_ends_before_a_varying_field():
    # a form seen three times: "5 6 7" is fixed text, the token after it a field with
    # a different value each time, then "8 9" fixed again
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    for value in (20, 21, 22):
        d.remember([5, 6, 7, value, 8, 9])
    assert d.propose_one([1, 5, 6], 4, seq=1).tokens == [7]  # the target's own token fills the field
    assert d.propose_one([1, 5], 4, seq=2).tokens == [6, 7]
    assert suffix_draft([1, 5], 4, docs=[[5, 6, 7, v, 8, 9] for v in (20, 21, 22)], min_global_match=1)[0] == [6, 7]
    # a field's first token is drafted (a guess, keyed as split); past the field the copy goes on
    assert d.propose_one([1, 5, 6, 7], 3, seq=3).tokens == [22, 8, 9]
    assert d.propose_one([1, 5, 6, 7, 21], 3, seq=4).tokens == [8, 9]
    # a field that nearly always takes one value is fixed text (>= AGREED_SHARE of 4)
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    for value in (21, 20, 20, 20):
        d.remember([5, 6, 7, value, 8, 9])
    assert d.propose_one([1, 5, 6], 4, seq=1).tokens == [7, 20, 8, 9]
    d.remember([5, 6, 7, 21, 8, 9])  # now the latest value (21) is 2 of 5: a guess, not drafted
    assert d.propose_one([1, 5, 6], 4, seq=2).tokens == [7]
    # a match seen once has nothing to compare: the copy is whole
    assert SuffixDrafter().propose_one([5, 6, 7, 8, 9, 5, 6], 3).tokens == [7, 8, 9]
    # off: the whole copy, as before
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    d.cut_at_split = False
    for value in (20, 21, 22):
        d.remember([5, 6, 7, value, 8, 9])
    assert d.propose_one([1, 5, 6], 4, seq=1).tokens == [7, 22, 8, 9]


def test_global_drafts_only_where_it_knows_more_than_the_request():
    from specgen.drafters.continuations import global_drafts

    assert global_drafts(2, 6, False, min_global_match=4)  # longer, fixed text: the form
    assert not global_drafts(6, 6, False, min_global_match=4)  # a tie: the request's own
    assert not global_drafts(2, 3, False, min_global_match=4)  # too short to trust
    assert not global_drafts(2, 6, True, min_global_match=4)  # a varying field: the request's own match
    assert global_drafts(0, 6, True, min_global_match=4)  # ... when it has one
    assert global_drafts(1, 6, True, min_match=2, min_global_match=4)  # (of at least min_match)
    assert global_drafts(2, 6, True, min_global_match=4, local_at_split=False)  # off: the longer, as before


def test_a_varying_field_is_drafted_from_the_request_itself():
    # earlier requests: a form whose field after "5 6 7" took a different value each
    # time; this request wrote "7 30" before (its own value): the field is copied from
    # it, and the form's fixed text still comes from the global index
    docs = [[5, 6, 7, v, 8, 9] for v in (20, 21, 22)]
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    for doc in docs:
        d.remember(doc)
    ctx = [7, 30, 1, 5, 6, 7]  # local "7" (1 token) < global "5 6 7" (3), whose next token varies
    got = d.propose_one(ctx, 3)
    assert got.tokens == [30, 1, 5] and got.key < KEY_GLOBAL
    assert suffix_draft(ctx, 3, docs=docs, min_global_match=1) == ([30, 1, 5], 1, False)
    assert d.propose_one([1, 5, 6], 3, seq=1).tokens == [7]  # fixed text: global (cut before the field)
    assert d.propose_one([2, 1, 5, 6, 7], 3, seq=2).tokens == [22, 8, 9]  # no own match: the latest value
    off = SuffixDrafter(global_cache=True, min_global_match=1)
    off.local_at_split = False
    for doc in docs:
        off.remember(doc)
    assert off.propose_one(ctx, 3).tokens == [22, 8, 9]
    assert suffix_draft(ctx, 3, docs=docs, min_global_match=1, local_at_split=False)[0] == [22, 8, 9]


def _counts_by_scan(pattern, draft, docs):
    """path_counts by counting occurrences: at step i, (how often pattern + draft[:i + 1]
    occurred, how often pattern + draft[:i] occurred and went on); none past a step never seen."""
    from specgen.drafters.suffix import _ends

    out = []
    for i in range(len(draft)):
        s, seen = list(pattern) + draft[:i], list(pattern) + draft[: i + 1]
        n_seen = sum(len(_ends(seen, d)) for d in docs)
        if not n_seen or (out and out[-1] == (0, 0)):
            out.append((0, 0))
            continue
        total = sum(1 for d in docs for e in _ends(s, d) if e + 1 < len(d) and d[e + 1] >= 0)
        out.append((n_seen, total))
    return tuple(out)


@pytest.mark.parametrize("seed", range(8))
def test_draft_counts_are_the_index_evidence_along_the_drafted_path(seed):
    rng = np.random.default_rng(seed)
    alphabet = 2 + seed % 3
    toks = _random_stream(rng, 40, alphabet)
    d = SuffixDrafter(max_walk=1 << 20)  # uncapped walk: exact counts
    d.cut_at_split = False
    d.counts = True
    checked = 0
    for _ in range(30):
        got = d.propose_one(toks, 6)
        draft, length, _ = suffix_draft(toks, 6, cut_at_split=False)
        assert got.tokens == draft
        if draft:
            # the local index holds the stream itself; its last occurrence goes on with nothing yet
            assert got.counts == _counts_by_scan(toks[len(toks) - length:], draft, [toks])
            checked += 1
        toks += _random_stream(rng, int(rng.integers(1, 3)), alphabet)
    assert checked > 10
    assert SuffixDrafter().propose_one(toks, 6).counts == ()  # off by default


def test_draft_counts_of_a_global_match_stop_at_a_document_end():
    docs = [[5, 6, 7]] + [[5, 6, 7, v, 8, 9] for v in (20, 21, 22)]
    d = SuffixDrafter(global_cache=True, min_global_match=1)
    d.cut_at_split = False
    d.counts = True
    for doc in docs:
        d.remember(doc)
    got = d.propose_one([1, 5, 6], 4, seq=1)
    # "5 6" went on with 7 four times; "5 6 7" went on three times (the first document
    # ends after it), once with each value; past the value the copy agrees
    assert got.tokens == [7, 22, 8, 9]
    assert got.counts == ((4, 4), (1, 3), (1, 1), (1, 1))
    assert got.counts == _counts_by_scan([5, 6], got.tokens, [doc + [-1] for doc in docs])
