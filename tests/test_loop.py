"""The draft–verify loop against a fake engine: positions, rollback, accounting."""

import numpy as np
import pytest

from fakes import FakeEngine, chain_table
from specgen.decode.generation import Generation
from specgen.policy.base import FixedK
from specgen.drafters.base import Draft, PerSequence
from specgen.errors import SpecgenError
from specgen.rules.sampling import SamplingParams


class ScriptedDrafter(PerSequence):
    """Proposes tokens from a script: a list per round (cut to k)."""

    name = "scripted"
    free = True

    def __init__(self, rounds):
        self.rounds = list(rounds)
        self.calls = []

    def propose_one(self, context, k, params=None, rng=None, seq=0):
        self.calls.append((list(context), k))
        return Draft(self.rounds.pop(0)[:k] if self.rounds else [])


def run(gen):
    return list(gen)


def test_plain_decoding_one_token_per_round():
    eng = FakeEngine(chain_table(10))
    gen = Generation(eng, [3], None, draft_max=0, max_tokens=5)
    rounds = run(gen)
    assert gen.tokens == [4, 5, 6, 7, 8]
    assert [len(r.tokens) for r in rounds] == [1] * 5
    assert gen.stats.rounds == gen.stats.generated == 5
    assert gen.stats.drafted == 0 and gen.stats.mean_accepted_len == 1.0
    assert gen.stats.stop_reason == "max_tokens"
    # every decode appended one token at the right place; nothing rolled back
    assert eng.kv[0] == [3, 4, 5, 6, 7]


def test_rejection_rolls_back_and_accounts():
    eng = FakeEngine(chain_table(20))
    # prompt [1] -> first token 2; then the target continues 3, 4, 5 ...
    drafter = ScriptedDrafter([[3, 4, 9, 9], [6, 7, 8, 9]])
    gen = Generation(eng, [1], drafter, draft_max=4, max_tokens=11)
    rounds = run(gen)
    # round 2: 3,4 accepted, 9 rejected -> correction 5; round 3: all 4 accepted + bonus 10
    assert [r.tokens for r in rounds[:3]] == [[2], [3, 4, 5], [6, 7, 8, 9, 10]]
    assert [(r.drafted, r.accepted) for r in rounds[:3]] == [(0, 0), (4, 2), (4, 4)]
    assert gen.tokens == list(range(2, 13))
    # the verify of round 2 decoded [2, 3, 4, 9, 9] at positions 1..5, then kept 1 + 2
    assert eng.decodes[1] == (0, [2, 3, 4, 9, 9], 5)
    assert (0, 4) in eng.truncations
    # the cache holds exactly the accepted context (the last token is not yet scored)
    assert eng.kv[0] == [1] + gen.tokens[:-1]
    st = gen.stats
    assert (st.drafted, st.accepted) == (8, 6)
    assert st.drafted_at == [2, 2, 2, 2] and st.accepted_at == [2, 2, 1, 1]
    assert st.per_position == [1.0, 1.0, 0.5, 0.5]
    assert st.mean_accepted_len == pytest.approx(st.generated / st.rounds)
    assert st.generated == len(gen.tokens) == sum(len(r.tokens) for r in rounds)


def test_drafter_sees_accepted_context_and_k_shrinks_near_max_tokens():
    eng = FakeEngine(chain_table(30))
    drafter = ScriptedDrafter([[3, 4, 5, 6, 7, 8, 9, 10]] * 5)
    gen = Generation(eng, [1], drafter, draft_max=8, max_tokens=6)
    run(gen)
    assert drafter.calls[0] == ([1, 2], 4)  # 6 - 1 generated - 1 for the target's token
    assert gen.tokens == [2, 3, 4, 5, 6, 7]
    assert gen.stats.stop_reason == "max_tokens"


def test_eos_inside_accepted_draft_stops_there():
    eng = FakeEngine(chain_table(10), eog=5)
    drafter = ScriptedDrafter([[3, 4, 5, 6]])
    gen = Generation(eng, [1], drafter, draft_max=4, max_tokens=50)
    run(gen)
    assert gen.tokens == [2, 3, 4, 5]
    assert gen.stats.stop_reason == "eos"


def test_ignore_eos_keeps_going():
    eng = FakeEngine(chain_table(10), eog=5)
    gen = Generation(eng, [1], None, draft_max=0, max_tokens=8, params=SamplingParams(ignore_eos=True))
    run(gen)
    assert gen.tokens == [2, 3, 4, 5, 6, 7, 8, 9]


def test_context_limit_caps_draft_and_stops():
    eng = FakeEngine(chain_table(50), n_ctx=8)
    drafter = ScriptedDrafter([[k for k in range(3 + i, 50)] for i in range(0, 40, 1)])
    gen = Generation(eng, [1, 2], drafter, draft_max=8, max_tokens=100)
    run(gen)  # FakeEngine raises if the cache would exceed n_ctx
    assert gen.stats.stop_reason == "context_full"
    assert len(eng.kv[0]) == 8


def test_prompt_longer_than_context_is_refused():
    eng = FakeEngine(chain_table(10), n_ctx=4)
    with pytest.raises(SpecgenError, match="prompt has 5 tokens"):
        Generation(eng, [1, 2, 3, 4, 5], None)


def test_sampled_loop_is_reproducible_with_seed():
    rng = np.random.default_rng(0)
    eng = FakeEngine(rng.normal(size=(12, 12)).astype(np.float32))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    outs = []
    for _ in range(2):
        eng.kv.clear()
        gen = Generation(eng, [1], ScriptedDrafter([[2, 3, 4]] * 20), draft_max=3, max_tokens=20, params=params)
        run(gen)
        outs.append(gen.tokens)
    assert outs[0] == outs[1]


def test_interrupt_marks_stats():
    eng = FakeEngine(chain_table(10))
    gen = Generation(eng, [1], None, draft_max=0, max_tokens=50)
    it = iter(gen)
    next(it)
    next(it)
    with pytest.raises(KeyboardInterrupt):
        it.throw(KeyboardInterrupt)
    assert gen.stats.stop_reason == "interrupted"
    assert gen.stats.generated == 2


def test_stats_merge_adds_counters_and_per_position_tallies():
    from specgen.decode.stats import Round, Stats

    a, b = Stats(), Stats()
    a.add(Round([1], 0, 0, 0.0, 0.1))
    b.add(Round([1, 2, 3], 3, 2, 0.05, 0.2))
    b.add(Round([4, 5], 4, 1, 0.05, 0.2))
    a.merge(b)
    assert (a.rounds, a.generated, a.drafted, a.accepted) == (3, 6, 7, 3)
    assert a.drafted_at == [2, 2, 2, 1] and a.accepted_at == [2, 1, 0, 0]
    assert a.k_chosen == {0: 1, 3: 1, 4: 1}
    assert a.draft_s == pytest.approx(0.1) and a.verify_s == pytest.approx(0.5)


def test_a_draft_model_reads_the_prompt_before_the_first_token_when_drafting_can_pay():
    from specgen.drafters.model import DraftModel
    from specgen.policy.cost import CostAware, Costs

    table = chain_table(50)
    prompt = [i % 50 for i in range(300)]
    target, draft = FakeEngine(table, n_ctx=512), FakeEngine(table, n_ctx=512)
    gen = Generation(target, prompt, DraftModel(draft, 50, 50), draft_max=4, max_tokens=20)
    rounds = iter(gen)
    next(rounds)  # the first token: the draft has read the prompt already
    assert draft.kv_tokens(0) == prompt
    assert gen.stats.draft_fed == 300 and gen.stats.draft_prefill_s > 0
    assert len(draft.decodes) == 5  # the prompt in n_batch chunks, nothing else yet
    list(rounds)
    plain = Generation(FakeEngine(table, n_ctx=512), prompt, None, max_tokens=20)
    list(plain)
    assert gen.tokens == plain.tokens and gen.stats.accepted > 0
    # a cost policy that expects no pay-back (a costly feed, few tokens) leaves the draft unread
    draft2 = FakeEngine(table, n_ctx=512)
    policy = CostAware(4, Costs([0.0] + [0.01 * n for n in range(1, 33)], 0.005, feed_s=1.0))
    gen2 = Generation(FakeEngine(table, n_ctx=512), prompt, DraftModel(draft2, 50, 50), draft_max=4,
                      max_tokens=20, policy=policy)
    next(iter(gen2))
    assert draft2.kv_tokens(0) == [] and gen2.stats.draft_fed == 0


def test_an_offer_the_round_passes_over_is_judged_against_what_it_emitted():
    """The policy hears what a free offer it left unverified would have met."""
    from specgen.policy.base import FixedK

    class PlainRounds(FixedK):  # always passes the offer over
        def __init__(self):
            super().__init__()
            self.seen = []

        def choose_offer(self, key, offered, limit, situation=None):
            return 0, True

        def observe(self, key, reached, accepted):
            self.seen.append((key, reached, accepted))

    class Keyed(ScriptedDrafter):
        def propose_one(self, context, k, params=None, rng=None, seq=0):
            d = super().propose_one(context, k, params, rng, seq)
            d.key = 7
            return d

    eng = FakeEngine(chain_table(20))
    policy = PlainRounds()
    # prompt [1] -> first token 2; plain rounds then emit 3, 4, 5
    gen = Generation(eng, [1], Keyed([[3, 4, 9], [9, 5], []]), draft_max=4, max_tokens=4, policy=policy)
    run(gen)
    assert gen.tokens == [2, 3, 4, 5]
    # [3, 4, 9] against the emitted [3]: matched as far as known; [9, 5] against [4]: rejected at once
    assert policy.seen == [(7, 1, 1), (7, 1, 0)]


def test_the_policy_reads_a_free_drafts_counts_cut_to_the_round():
    """A free drafter's per-token evidence (Draft.counts) reaches the policy with its offer."""
    from specgen.policy.base import FixedK

    class Recording(FixedK):
        def __init__(self):
            super().__init__()
            self.seen = []

        def choose_offer(self, key, offered, limit, situation=None):
            self.seen.append(situation.counts)
            return offered, True

    class Counted(ScriptedDrafter):
        def propose_one(self, context, k, params=None, rng=None, seq=0):
            d = super().propose_one(context, k, params, rng, seq)
            d.counts = tuple((i + 1, 5) for i in range(len(d.tokens) + 1))  # one more than its tokens
            return d

    policy = Recording()
    gen = Generation(FakeEngine(chain_table(20)), [1], Counted([[3, 4, 5], [7, 8]]), draft_max=2, max_tokens=10,
                     policy=policy)
    run(gen)
    assert policy.seen[:2] == [((1, 5), (2, 5)), ((1, 5), (2, 5))]
    assert gen.tokens[:4] == [2, 3, 4, 5]


class TopsHeard(FixedK):
    def __init__(self):
        super().__init__()
        self.tops = []

    def target_top(self, top):
        self.tops.append(top)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_sampled_run_tells_its_policy_the_targets_top_probability_of_each_row_it_emitted_from(temperature):
    eng = FakeEngine(chain_table(10))  # every row: 5.0 on the next token, 0 elsewhere
    params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    policy = TopsHeard()
    gen = Generation(eng, [1], ScriptedDrafter([[2, 3, 9], [7, 7]] * 10), draft_max=3, max_tokens=12,
                     params=params, policy=policy)
    run(gen)
    if temperature == 0:
        assert policy.tops == []  # greedy: nothing to tell
    else:
        top = np.exp(5.0) / (np.exp(5.0) + 9)
        assert len(policy.tops) >= len(gen.tokens) and policy.tops == pytest.approx([top] * len(policy.tops))


class CountingRng:
    """Wraps a Generator; counts the uniforms drawn from it."""

    def __init__(self, rng):
        self.rng, self.draws = rng, 0

    def random(self, *a, **kw):
        self.draws += 1
        return self.rng.random(*a, **kw)

    def __getattr__(self, name):
        raise AssertionError(f"the loop drew {name} from the generation's rng")


class SamplingDrafter(ScriptedDrafter):
    """Proposes point masses (a script, or noise from the rng it is handed) and draws from that rng."""

    def propose_one(self, context, k, params=None, rng=None, seq=0):
        noise = [int(x) for x in rng.integers(0, 12, size=k)]  # a drafter's own draws must not move the text
        d = super().propose_one(context, k, params, rng, seq)
        return d if d.tokens else Draft(noise)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_point_mass_drafts_emit_the_plain_sampled_text(seed):
    """Sample-and-compare: one uniform from the generation's rng per emitted token, in order,
    so a seeded run emits plain's text, whatever the drafter proposed or drew itself."""
    table = np.random.default_rng(0).normal(size=(12, 12)).astype(np.float32) * 2
    params = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
    plain = Generation(FakeEngine(table), [1], None, draft_max=0, max_tokens=40, params=params)
    run(plain)
    right = [plain.tokens[i:i + 4] for i in (1, 6, 11)]  # three right drafts, then noise
    gen = Generation(FakeEngine(table), [1], SamplingDrafter(right), draft_max=4, max_tokens=40, params=params)
    gen.rng = CountingRng(gen.rng)
    run(gen)
    assert gen.tokens == plain.tokens
    assert gen.rng.draws == len(gen.tokens)
    st = gen.stats
    assert st.accepted > 0 and st.accepted < st.drafted and st.rounds < len(gen.tokens)


@pytest.mark.parametrize("drafted", [False, True])
def test_sampled_picks_of_the_target_never_build_a_dense_row(monkeypatch, drafted):
    """Plain sampling and point-mass drafts only draw from the target's rows: they read
    the kept tokens (`support`), not a whole-vocabulary vector (a pass or two over
    262k entries per row at Gemma's vocabulary)."""
    from specgen.rules.sampling import Support

    table = np.random.default_rng(0).normal(size=(12, 12)).astype(np.float32) * 2
    params = SamplingParams(temperature=0.8, seed=1)
    plain = Generation(FakeEngine(table), [1], None, draft_max=0, max_tokens=30, params=params)
    run(plain)

    def dense(self):
        raise AssertionError("a dense row was built for a target's pick")

    monkeypatch.setattr(Support, "dense", dense)
    drafter = SamplingDrafter([plain.tokens[1:5], plain.tokens[9:12]]) if drafted else None
    gen = Generation(FakeEngine(table), [1], drafter, draft_max=4 if drafted else 0, max_tokens=30, params=params)
    run(gen)
    assert gen.tokens == plain.tokens
    assert (gen.stats.accepted > 0) == drafted


def test_a_sampling_draft_model_draws_from_q_without_building_its_row_twice(monkeypatch):
    """A same-vocabulary draft model keeps q (its processed row over the shared ids,
    zeros beyond) for rejection sampling, and draws its token by the inverse CDF of q
    with one uniform of its generator, from the kept tokens (no second dense row)."""
    from specgen.drafters.model import DraftModel
    from specgen.drafters.base import Want
    from specgen.rules.sampling import Support, probs

    table = np.random.default_rng(2).normal(size=(12, 12)).astype(np.float32) * 2
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, min_p=0.0)
    q_after = {}
    for t in range(12):
        q_after[t] = np.zeros(12)
        q_after[t][:10] = probs(table[t][:10], params)
    monkeypatch.setattr(Support, "dense", lambda self: pytest.fail("a dense row was built for a draft's pick"))
    uniforms = np.random.default_rng(9)
    d = DraftModel(FakeEngine(table), 10, 12).propose([Want(0, [1, 2], 4, params, np.random.default_rng(9))])[0]
    assert len(d.tokens) == len(d.q) == 4
    prev = 2
    for tok, q in zip(d.tokens, d.q):
        assert isinstance(q, Support) and np.array_equal(q.ids, np.flatnonzero(q_after[prev]))
        assert np.array_equal(q.probs, q_after[prev][q.ids])
        c = np.cumsum(q_after[prev])
        assert tok == min(np.searchsorted(c, uniforms.random() * c[-1], side="right"), 11)
        prev = tok


def test_a_long_prompt_is_read_in_chunks_that_are_reported_and_the_cache_kept(monkeypatch):
    import specgen.decode.generation as generation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    eng = FakeEngine(chain_table(50), n_ctx=256, n_batch=64)
    prompt = [i % 50 for i in range(70)]
    seen = []
    plain = Generation(FakeEngine(chain_table(50), n_ctx=256, n_batch=64), prompt, max_tokens=5)
    list(plain)
    gen = Generation(eng, prompt, max_tokens=5)
    gen.on_prefill = lambda done, total: seen.append((done, total))
    list(gen)
    assert seen == [(16, 70), (32, 70), (48, 70), (64, 70), (70, 70)]
    assert gen.tokens == plain.tokens
    assert sum(len(t) for _, t, _ in eng.decodes[:5]) == 70  # each prompt token read once
    # a second request sharing the first 40 tokens reads only the rest, still reported
    seen.clear()
    eng.decodes.clear()
    again = Generation(eng, prompt[:40] + [3] * 30, max_tokens=2)
    again.on_prefill = lambda d, t: seen.append((d, t))
    list(again)
    assert seen == [(56, 70), (70, 70)]
    assert eng.decodes[0][1] == [3] * 16
