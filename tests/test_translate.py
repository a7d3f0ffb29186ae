"""Translation between vocabularies: the text/token boundary on hand-made tokenizers,
and the loop with translated drafts on fake engines (both caches roll back)."""

import random

import numpy as np
import pytest

from faketok import TokEngine, WordTok, text_table
from specgen.decode.generation import Generation
from specgen.drafters.base import Want
from specgen.rules.sampling import SamplingParams
from specgen.drafters.translated import (
    Stream, TranslatedDraftModel, continue_tokens, proposal_text, to_target, translatable, valid_utf8_prefix,
)
from dataclasses import replace

WORDS_T = ["Hello", " world", " wor", "lo", "He", " the", " cat", " sat", " on", " mat", "ll", " ", "  ", "\n",
           "é", "日本", " 日", "ing", " sing", "abc"]
WORDS_D = ["Hel", "lo", " w", "orld", " th", "e", " ca", "t", " sa", " o", "n", " ma", " mat", "ll", "o w", "\n",
           "\xc3", "日", "本", "ab", "c"]
SAMPLES = [
    "Hello world",
    "Hello  world the cat sat on the mat\n",
    "héllo 日本 wörld, ça va?\n\tend",
    "  leading spaces and trailing   ",
    "abcabc singing\n\n\nthe end.",
]


def target_tok(**kw):
    return WordTok(WORDS_T, **kw)


def draft_tok(**kw):
    return WordTok(WORDS_D, specials=("<s>", "</s>", "<|im_end|>", "<|im_start|>"), **kw)


def joined(tok, ids):
    return b"".join(tok.piece(t) for t in ids)


# -- the boundary ----------------------------------------------------------------


def test_valid_utf8_prefix():
    s = "aé日😀".encode()
    assert valid_utf8_prefix(s) == len(s)
    for cut, whole in [(2, 1), (3, 3), (4, 3), (5, 3), (6, 6), (7, 6), (9, 6), (10, 10)]:
        assert valid_utf8_prefix(s[:cut]) == whole, cut


@pytest.mark.parametrize("tok", [target_tok(), draft_tok(), target_tok(dummy_prefix=True)], ids=["t", "d", "spm"])
def test_continue_tokens_is_byte_exact_at_every_cut(tok):
    for text in SAMPLES:
        data = text.encode()
        for cut in range(1, len(data)):
            ids = continue_tokens(tok, data[:cut], data[cut:])
            if valid_utf8_prefix(data[:cut]) != cut:
                # the cut splits a character: the right side alone is not text, but
                # with its left context it is, and the split must still be exact
                assert ids is None or joined(tok, ids) == data[cut:]
                continue
            assert ids is not None, (text, cut)
            assert joined(tok, ids) == data[cut:], (text, cut)


def test_straddling_token_is_split_at_the_boundary():
    t = target_tok()
    # "Hello" would be one token; the context already ends in "Hel"+"l": continue with "o"
    ids = continue_tokens(t, b"Hell", b"o world")
    assert joined(t, ids) == b"o world" and ids[-1] == t.ids[b" world"]
    # a space joins the word after it: "Hello " + "world" is tokenized as " world" across the cut
    ids = continue_tokens(t, b"Hello ", b"world")
    assert joined(t, ids) == b"world"
    # the natural split is kept where one exists
    assert continue_tokens(t, b"Hello", b" world") == [t.ids[b" world"]]


def test_dummy_prefix_is_not_added_after_context():
    t = target_tok(dummy_prefix=True)
    assert joined(t, t.tokenize("Hello", add_special=False)) == b" Hello"
    assert joined(t, continue_tokens(t, b"x", b"Hello")) == b"Hello"
    assert joined(t, continue_tokens(t, b"", b"Hello")) == b" Hello"  # the start of a text keeps it


def test_proposal_stops_at_a_control_token():
    d = draft_tok()
    ids = d.tokenize("Hello world", add_special=False) + [2] + d.tokenize(" more", add_special=False)
    assert proposal_text(d, ids) == b"Hello world"


def _stream_after(contexts, t, d):
    s = Stream(fixed=[0] if d.add_bos else [])
    for ctx in contexts:
        s.update(t, d, ctx)
        assert s.text == joined(t, ctx)
        assert joined(d, s.draft) == s.text[: s.covered]
        assert s.covered == valid_utf8_prefix(s.text)
    return s


def test_stream_follows_growth_rollback_and_replacement():
    t, d = target_tok(), draft_tok(add_bos=True)
    rng = random.Random(0)
    for text in SAMPLES:
        full = t.tokenize(text, add_special=False)
        contexts, n = [], 1
        while n <= len(full):
            contexts.append(full[:n])
            whole = valid_utf8_prefix(joined(t, full[:n])) == len(joined(t, full[:n]))
            if rng.random() < 0.3 and n > 2 and whole:  # another text after this prefix, then back
                contexts.append(full[:n] + t.tokenize(" the cat", add_special=False)[: rng.randint(1, 3)])
            n += rng.randint(1, 4)
        contexts.append(full)
        contexts.append(t.tokenize("Hello the mat", add_special=False))  # a new generation
        s = _stream_after(contexts, t, d)
        assert s.draft_context()[0] == 0  # the draft's BOS stays in front


def test_stream_skips_control_tokens_of_the_target():
    t, d = target_tok(), draft_tok()
    ctx = t.tokenize("<bos>Hello<eot> world", add_special=False)
    assert ctx[0] == 0 and 2 in ctx
    s = _stream_after([ctx], t, d)
    assert s.text == b"Hello world"


def test_character_split_across_target_tokens():
    t, d = target_tok(), draft_tok()
    e_acute = "é".encode()
    # the target has emitted the first byte of "é" as a byte token
    ctx = t.tokenize("caf", add_special=False) + [t.ids[e_acute[:1]]]
    s = _stream_after([ctx], t, d)
    assert s.text[s.covered :] == e_acute[:1]
    # the draft's proposal must continue the pending character...
    assert to_target(t, s, b"xyz", 4) == []
    # ...and then the rest of it follows (the second byte as its own token)
    ids = to_target(t, s, e_acute + b" world", 4)
    assert joined(t, ids) == e_acute[1:] + b" world"


def test_proposal_cut_before_an_unfinished_character():
    t, d = target_tok(), draft_tok()
    s = _stream_after([t.tokenize("Hello", add_special=False)], t, d)
    ids = to_target(t, s, " 日本".encode()[:-1], 8)
    assert joined(t, ids) == " 日".encode()
    assert len(to_target(t, s, b" the cat sat on the mat", 3)) == 3


def test_translatable_needs_byte_exact_text():
    assert translatable(target_tok(), draft_tok(), "Hello world") == ""

    class Lossy(WordTok):
        def piece(self, t, special=False):
            return super().piece(t, special).lower()

    assert "draft" in translatable(target_tok(), Lossy(WORDS_D), "Hello world")


# -- the loop on fake engines -----------------------------------------------------

CYCLE = "Hello world the cat sat on the mat\n"


def engines(draft_text=CYCLE, n_ctx=512):
    t, d = target_tok(add_bos=True), draft_tok()
    target = TokEngine(t, text_table(t, CYCLE), n_ctx=n_ctx)
    draft = TokEngine(d, text_table(d, draft_text), n_ctx=n_ctx)
    return target, draft


def run(target, drafter, prompt, k, n=40, params=SamplingParams(), seq=0):
    gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, params=replace(params, ignore_eos=True), seq=seq)
    rounds = list(gen)
    return gen, rounds


def test_translated_greedy_equals_plain_and_drafts_are_accepted():
    target, draft = engines()
    prompt = target.tokenize(CYCLE + "Hello")
    plain, _ = run(target, None, prompt, 0)
    target.kv.clear()
    drafter = TranslatedDraftModel(target, draft)
    gen, rounds = run(target, drafter, prompt, 4)
    assert gen.tokens == plain.tokens
    # the fake draft continues "sat" with " sat" (its next token hangs on the last only)
    assert gen.stats.accepted > 0.4 * gen.stats.drafted > 0
    assert len(rounds) < 0.6 * len(plain.tokens)
    assert target.kv_tokens(0) == (prompt + gen.tokens)[: len(target.kv_tokens(0))]


def test_rejections_roll_back_both_caches():
    # the draft believes "... the cat sat on a hat": its drafts go wrong at "a hat"
    target, draft = engines(draft_text="Hello world the cat sat on a hat\n")
    prompt = target.tokenize(CYCLE + "Hello")
    plain, _ = run(target, None, prompt, 0)
    target.kv.clear()
    drafter = TranslatedDraftModel(target, draft)
    gen = Generation(target, prompt, drafter, draft_max=4, max_tokens=40, params=SamplingParams(ignore_eos=True))
    for r in gen:
        # the target's cache holds the accepted tokens but the unscored last one
        assert target.kv_tokens(0) == gen.context[:-1]
        # the draft's cache holds its stream of the text it drafted from, then its own drafts
        s = drafter._streams.get(0)
        if r.drafted:
            assert draft.kv_tokens(0)[: len(s.draft_context())] == s.draft_context()
            assert joined(draft, s.draft) == s.text[: s.covered]
    assert gen.tokens == plain.tokens
    assert 0 < gen.stats.accepted < gen.stats.drafted
    assert any(seq == 0 and n > 0 for seq, n in target.truncations)  # rejected tails dropped
    assert draft.truncations, "the draft's cache was never rolled back"


def record_proposals(drafter) -> list:
    """The drafts `drafter` proposes from now on, in order (its propose wrapped)."""
    seen, inner = [], drafter.propose

    def spy(wants):
        out = inner(wants)
        seen.extend(out)
        return out

    drafter.propose = spy
    return seen


def test_sampled_translated_drafts_are_point_masses():
    target, draft = engines()
    prompt = target.tokenize(CYCLE + "Hello")
    drafter = TranslatedDraftModel(target, draft)
    seen = record_proposals(drafter)
    gen, _ = run(target, drafter, prompt, 4, params=SamplingParams(temperature=0.8, seed=1))
    assert seen and all(d.q is None for d in seen)
    assert any(d.tokens for d in seen)
    assert gen.stats.accepted > 0


def test_several_sequences_are_drafted_together():
    target, draft = engines()
    drafter = TranslatedDraftModel(target, draft)
    a = target.tokenize(CYCLE + "Hello")
    b = target.tokenize(CYCLE + CYCLE + "Hello world the")
    wants = [Want(0, a, 3), Want(1, b, 3)]
    before = len(draft.batches)
    drafts = drafter.propose(wants)
    # three draft tokens each (" w" "orld" " th", " ca" "t" " sa"), as at most 3 target tokens
    assert all(len(d.tokens) == 3 for d in drafts)
    assert b" world the cat".startswith(joined(target, drafts[0].tokens))
    assert b" cat sat on".startswith(joined(target, drafts[1].tokens))
    assert all(len(batch) == 2 for batch in draft.batches[before:])  # one decode for both each step
    assert all(d.q is None for d in drafts)
    assert drafts[0].fed > 0 and drafts[0].fed_s > 0  # the prompt: a bulk catch-up, reported apart


def test_costs_include_translation():
    target, draft = engines()
    drafter = TranslatedDraftModel(target, draft)
    ctx = target.tokenize(CYCLE + "Hello")
    drafter.propose([Want(0, ctx, 4)])
    d = drafter.propose([Want(0, ctx + target.tokenize(" world", add_special=False), 4)])[0]
    assert d.steps >= 1 and d.step_s > 0 and d.fed == 0
    assert drafter.translate_s > 0 and drafter.proposals == 2
    assert drafter.lag(0, ctx + target.tokenize(" world", add_special=False) + d.tokens) == 0


def test_a_context_without_text_gets_no_draft_beside_one_with_text():
    target, draft = engines()  # the draft adds no BOS: an empty text gives it nothing to read
    drafter = TranslatedDraftModel(target, draft)
    a = target.tokenize(CYCLE + "Hello")
    empty, full = drafter.propose([Want(0, target.tokenize(""), 3), Want(1, a, 3)])
    assert empty.tokens == [] and empty.steps == 0
    assert len(full.tokens) == 3 and full.step_s + full.fed_s > 0


def test_prefill_reads_the_prompt_before_the_first_round():
    """A translated draft reads the prompt's text with the target's prompt (its own
    tokens, one batched feed), so its first drafting round feeds only what is new;
    the prefill's cost is reported apart from draft steps."""
    target, draft = engines()
    prompt = target.tokenize(CYCLE + CYCLE + "Hello")
    plain, _ = run(target, None, prompt, 0, n=24)
    target.kv.clear()
    drafter = TranslatedDraftModel(target, draft)
    gen = Generation(target, prompt, drafter, draft_max=4, max_tokens=24, params=SamplingParams(ignore_eos=True))
    seen = record_proposals(drafter)
    it = iter(gen)
    next(it)  # round 1: the target's prompt and the draft's, before the first token
    s = drafter._streams[0]
    assert draft.kv_tokens(0) == s.draft_context() and joined(draft, s.draft) == joined(target, prompt)
    assert len(draft.batches) == 1 and len(draft.batches[0][0][2]) == len(s.draft_context()) > 8
    n_read = len(s.draft_context())
    assert gen.stats.draft_fed == n_read and gen.stats.draft_prefill_s > 0
    assert not seen and drafter.lag(0, gen.context) == 1
    rest = list(it)
    assert gen.tokens == plain.tokens
    first = next(d for d in seen if d.tokens)
    # the first drafting round feeds the new token in its first step: no catch-up, no prompt re-read
    assert first.fed == 0 and first.fed_s == 0 and first.steps >= 1
    (seq, start, toks, _), = draft.batches[1]
    assert start == n_read and len(toks) <= 2
    assert sum(r.drafted for r in rest) > 0


def test_lag_counts_what_the_drafts_cache_lost():
    """A stream that still knows the prompt does not mean the draft's cache does:
    after the cache is emptied, the same prompt is read again in the prefill."""
    target, draft = engines()
    prompt = target.tokenize(CYCLE + CYCLE + "Hello")
    drafter = TranslatedDraftModel(target, draft)
    list(Generation(target, prompt, drafter, draft_max=4, max_tokens=8, params=SamplingParams(ignore_eos=True)))
    assert drafter.lag(0, prompt) == 0  # the cache holds the prompt's text
    target.kv.clear()
    draft.kv.clear()
    assert drafter.lag(0, prompt) >= len(prompt)
    gen = Generation(target, prompt, drafter, draft_max=4, max_tokens=8, params=SamplingParams(ignore_eos=True))
    next(iter(gen))
    read = drafter._streams[0].draft_context()
    assert gen.stats.draft_fed == len(read) > 8 and draft.kv_tokens(0) == read
    # another prompt on an emptied cache: only its own text is to read, not the last one's too
    draft.kv.clear()
    other = target.tokenize("the cat sat on the mat\n")
    assert len(other) - 1 <= drafter.lag(0, other) <= len(other)


def test_sampled_translated_drafts_cost_no_sampled_pick():
    """A translated draft proposes its argmax whatever the sampling: a cost policy
    charges the target's sampled picks, not one per drafted token."""
    from specgen.drafters.model import DraftModel
    from specgen.policy.cost import CostAware, Costs

    target, draft = engines()
    prompt = target.tokenize(CYCLE + "Hello")
    hot = SamplingParams(temperature=0.8, seed=1)
    picks = {}
    for name, drafter in (("translated", TranslatedDraftModel(target, draft)),
                          ("same vocabulary", DraftModel(target, target.n_vocab, target.n_vocab))):
        policy = CostAware(4, Costs([0.0] + [0.01] * 8, 0.002))
        Generation(target, prompt, drafter, draft_max=4, params=hot, policy=policy)
        picks[name] = (policy.pick_s > 0, policy.draft_picks)
    assert picks == {"translated": (True, False), "same vocabulary": (True, True)}
