"""The real model (Gemma 3 270M): speculative greedy output equals plain greedy output.

llama.cpp computes a row inside a batch with other kernels than the same row
alone (measured below: identical for batches of <= 3 rows, up to ~2 logits
apart from 4 rows on, against a logit scale of ~30). So greedy speculative
output may part from plain output where the target's top two candidates are
that close (and the cache then holds keys and values computed in batches, so
later rows differ too). The plain run records the target's top two candidates
at every position; at the first difference the tests require exactly a
near-tie: the target's top-2 margin there, and the gap between its best token
and the speculative one, are both within the measured batch discrepancy.
"""

import numpy as np
from fakes import RowRecorder
import pytest

from specgen.decode.generation import Generation
from specgen.rules.sampling import SamplingParams
from specgen.drafters.model import DraftModel
from specgen.drafters.lookup import PromptLookup
from specgen.engine.llama import Engine
from dataclasses import replace

pytestmark = pytest.mark.model

# Largest batch-vs-alone logit difference seen on this model (see
# test_batched_rows_differ_only_numerically), with a little headroom.
TIE_MARGIN = 2.5

PROMPTS = [
    # copy-heavy: code to repeat with a small change
    "Rename the function add to plus:\n\ndef add(a, b):\n    return a + b\n\nprint(add(1, 2))\n\nRenamed:\n\ndef plus(a, b):\n",
    # open-ended
    "Once upon a time, in a small village by the sea,",
    "The three most important ideas in computer science are",
]


class TopTwo(RowRecorder):
    """Wraps an engine; remembers the top candidates (ids, logits) of every row read."""

    def __init__(self, engine):
        self.engine = engine
        self.at: dict[int, tuple[list[int], list[float]]] = {}

    def _record(self, first_pos, rows):
        for j, row in enumerate(rows):
            ids = np.argsort(row)[-8:][::-1]
            self.at[first_pos + j] = ([int(t) for t in ids], [float(row[t]) for t in ids])



class VerifyRecorder(RowRecorder):
    """Wraps the target; keeps every verify pass: the tokens fed and the rows read."""

    def __init__(self, engine):
        super().__init__(engine)
        self.passes: list[tuple[int, list[int], np.ndarray]] = []

    def _record(self, first_pos, rows):  # the prompt's row: no draft to judge
        pass

    def decode(self, seq, tokens, n_logits=1):
        rows = self.engine.decode(seq, tokens, n_logits)
        self.passes.append((len(self.engine.kv_tokens(seq)) - len(tokens), list(tokens), np.array(rows)))
        return rows

    def rejections(self) -> list[tuple[int, float]]:
        """(position, logit gap between the row's best and the drafted token) of each rejected draft."""
        out = []
        for first, tokens, rows in self.passes:
            for j, drafted in enumerate(tokens[1:]):
                best = int(rows[j].argmax())
                if best != drafted:
                    out.append((first + j, float(rows[j][best] - rows[j][drafted])))
                    break
        return out


def greedy(target, prompt, drafter=None, k=0, n=48):
    gen = Generation(target, prompt, drafter, draft_max=k, max_tokens=n, params=SamplingParams(ignore_eos=True))
    for _ in gen:
        pass
    return gen


def plain_run(target, prompt, n=48):
    """Plain greedy tokens and the target's top two at each generated position."""
    rec = TopTwo(target)
    tokens = greedy(rec, prompt, n=n).tokens
    return tokens, [rec.at[len(prompt) - 1 + i] for i in range(len(tokens))]


def assert_equal_or_near_tie(plain, top2, spec):
    if plain == spec:
        return
    i = next(j for j, (a, b) in enumerate(zip(plain, spec)) if a != b)
    ids, vals = top2[i]
    assert ids[0] == plain[i]
    assert vals[0] - vals[1] < TIE_MARGIN, f"position {i}: top-2 margin {vals[0] - vals[1]:.3f} is no near-tie"
    assert spec[i] in ids, f"position {i}: speculative token {spec[i]} is not among the target's top candidates"
    gap = vals[0] - vals[ids.index(spec[i])]
    assert gap < TIE_MARGIN, f"position {i}: speculative token is {gap:.3f} below the best"


def test_batched_rows_differ_only_numerically(target):
    prompt = target.tokenize(PROMPTS[0])
    plain = greedy(target, prompt, n=9).tokens
    alone = []
    for i in range(9):
        alone.append(target.sync(0, prompt + plain[:i]).copy())
    target.truncate(0, len(prompt) - 1)
    rows = target.decode(0, [prompt[-1]] + plain[:8], 9).copy()
    diffs = np.abs(rows - np.stack(alone)).max(axis=1)
    # (whether a batch's first row equals the single row bit for bit depends on the CPU's kernels)
    assert diffs.max() < TIE_MARGIN
    assert [int(r.argmax()) for r in rows] == plain


@pytest.mark.parametrize("prompt_text", PROMPTS)
def test_lookup_greedy_equals_plain(target, prompt_text):
    prompt = target.tokenize(prompt_text)
    plain, top2 = plain_run(target, prompt)
    spec = greedy(target, prompt, PromptLookup(), k=8)
    assert len(spec.tokens) == len(plain)
    assert_equal_or_near_tie(plain, top2, spec.tokens)
    st = spec.stats
    assert st.generated == st.rounds + st.accepted  # each round: its accepted drafts and one token of the target's
    if prompt_text is PROMPTS[0]:  # copy-heavy: lookup drafts and saves target passes
        assert st.accepted > 0 and st.rounds < len(plain)


@pytest.fixture(scope="module")
def self_draft(gemma_path):
    with Engine(gemma_path, n_ctx=1024, n_threads=2) as e:
        yield e


@pytest.fixture(scope="module")
def q4_draft(draft_path):
    with Engine(draft_path, n_ctx=1024, n_threads=2) as e:
        yield e


@pytest.mark.parametrize("which", ["self", "q4_0"])
def test_draft_model_greedy_equals_plain(target, self_draft, q4_draft, which):
    draft_engine = self_draft if which == "self" else q4_draft
    prompt = target.tokenize(PROMPTS[1])
    plain, top2 = plain_run(target, prompt, n=32)
    drafter = DraftModel(draft_engine, min(target.n_vocab, draft_engine.n_vocab), target.n_vocab)
    passes = VerifyRecorder(target)
    spec = greedy(passes, prompt, drafter, k=4, n=32)
    assert_equal_or_near_tie(plain, top2, spec.tokens)
    st = spec.stats
    if which == "self":
        # The target drafting for itself (one row at a time) is rejected only where the
        # verify batch's row puts the drafted token within the batch discrepancy of its best.
        rejected = passes.rejections()
        assert len(rejected) <= st.drafted - st.accepted and (not rejected) == (st.accepted == st.drafted)
        for pos, gap in rejected:
            assert gap < TIE_MARGIN, f"position {pos}: a self-draft rejected {gap:.3f} below the best: no near-tie"
    assert st.drafted > 0 and 0 < st.accepted <= st.drafted
    # The draft's cache holds the accepted context, never a rejected token
    kv = draft_engine.kv_tokens(0)
    assert kv == (prompt + spec.tokens)[: len(kv)]


def test_sampled_draft_run_is_reproducible_and_varies_with_seed(target, q4_draft):
    from specgen.rules.sampling import SamplingParams

    prompt = target.tokenize(PROMPTS[2])
    outs = []
    for seed in (1, 1, 2):
        params = SamplingParams(temperature=1.0, seed=seed)
        drafter = DraftModel(q4_draft, target.n_vocab, target.n_vocab)
        gen = Generation(target, prompt, drafter, draft_max=3, max_tokens=24, params=replace(params, ignore_eos=True))
        for _ in gen:
            pass
        outs.append(gen.tokens)
        assert 0 < gen.stats.accepted < gen.stats.drafted
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_chunked_prefill_and_cache_reuse(gemma_path):
    with Engine(gemma_path, n_ctx=1024, n_threads=2, n_batch=16) as e:
        prompt = e.tokenize(PROMPTS[0] * 2)
        assert len(prompt) > 40
        row = e.sync(0, prompt).copy()
        assert e.n_decodes == -(-len(prompt) // 16)
        # the same prompt again costs one decode (the last token, for its logits)
        again = e.sync(0, prompt)
        assert e.n_decodes == -(-len(prompt) // 16) + 1
        assert int(again.argmax()) == int(row.argmax())
        assert e.kv_tokens(0) == prompt


def test_default_policy_drafts_on_a_pair_where_drafting_pays(f32_path, draft_path, tmp_path, monkeypatch):
    """F32 target + Q4_0 draft (drafting pays here, measured): the default cost
    policy drafts in most rounds, books the draft's prompt prefill apart from its
    steps, and emits the plain greedy tokens. Its cost profiles are measured
    afresh, as on a new user's first run."""
    from specgen.session import make_policy

    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path))
    with Engine(f32_path, n_ctx=1024, n_threads=2) as target, Engine(draft_path, n_ctx=1024, n_threads=2) as draft:
        prompt = target.tokenize(PROMPTS[0])
        plain, top2 = plain_run(target, prompt, n=40)
        policy = make_policy("cost", 8, target, draft)
        gen = Generation(target, prompt, DraftModel(draft, target.n_vocab, target.n_vocab), draft_max=8,
                         max_tokens=40, policy=policy, params=SamplingParams(ignore_eos=True))
        for _ in gen:
            pass
    assert_equal_or_near_tie(plain, top2, gen.tokens)
    st = gen.stats
    decode_rounds = st.rounds - 1  # the prefill round never drafts
    assert st.k_chosen[0] - 1 < 0.5 * decode_rounds, st.k_chosen  # drafts in most rounds
    assert st.acceptance_rate > 0.5
    assert st.draft_fed >= len(prompt) and st.draft_prefill_s > 0  # the draft's prompt prefill, on its own line
    # and not booked as a draft step: the prompt's 45 tokens cost about 3.5 of the
    # draft's one-row steps here (a 4-row pass costs little more than one row)
    assert policy.draft_step_s < st.draft_prefill_s / 2


@pytest.mark.parametrize("policy_name", ["fixed", "cost"])
def test_lookup_alongside_a_draft_model_keeps_greedy_output_and_the_drafts_cache(
        policy_name, target, q4_draft, f32_path, draft_path):
    """Rounds take lookup's free offer or the model's draft; the output is still
    the plain greedy text, and the draft's cache, skipped by lookup rounds, is
    caught up before every draft: the model never drafts from a cache that holds
    a rejected token (it drops them lazily, at its next catch-up, so between
    rounds its cache may still hold one: `DraftModel.begin`). Fixed k: the offer first
    (llama.cpp's order), on the Q4_K_M target; cost: by expected speed, on the
    F32 target, where the model pays too."""
    if policy_name == "fixed":
        _alongside(target, q4_draft, "fixed")
        return
    with Engine(f32_path, n_ctx=1024, n_threads=2) as f32, Engine(draft_path, n_ctx=1024, n_threads=2) as draft:
        _alongside(f32, draft, "cost")


def _alongside(target, draft, policy_name):
    from specgen.drafters.model import WithLookup
    from specgen.session import make_policy

    prompt = target.tokenize(PROMPTS[0])
    plain, top2 = plain_run(target, prompt, n=40)
    policy = make_policy(policy_name, 8, target, draft)
    sources = []
    update = policy.update

    def record(key, k, accepted, verify_s=None, draft=None):
        if k:
            sources.append("lookup" if key else "model")
        update(key, k, accepted, verify_s, draft)

    policy.update = record
    model = DraftModel(draft, target.n_vocab, target.n_vocab)
    caught_up, catch_up = [], model._catch_up

    def checked(wants, drafts):  # the cache right after each catch-up: exactly the context it drafts after
        rows = catch_up(wants, drafts)
        caught_up.extend((draft.kv_tokens(w.seq), list(w.context)) for w in wants)
        return rows

    model._catch_up = checked
    drafter = WithLookup(model, PromptLookup())
    gen = Generation(target, prompt, drafter, draft_max=8, max_tokens=40, policy=policy, params=SamplingParams(ignore_eos=True))
    for _ in gen:
        pass
    assert_equal_or_near_tie(plain, top2, gen.tokens)
    assert "lookup" in sources and "model" in sources, sources
    assert caught_up and all(kv == ctx for kv, ctx in caught_up)
    assert all(ctx == (prompt + gen.tokens)[: len(ctx)] for _, ctx in caught_up)  # drafted from settled text only
