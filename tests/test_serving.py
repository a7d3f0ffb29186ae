"""Concurrent serving: the multi-sequence bookkeeping on a fake engine, then the real model.

Fake-engine tests check what one shared context enforces: every batch fits
n_batch, each sequence's positions are contiguous, a rollback touches only
its own sequence, the cache pool is never exceeded, and a finished request's
slot is reused (from an empty cache) by the next one waiting.
"""

import numpy as np
import pytest

from fakes import FakeEngine, chain_table
from test_model import PROMPTS, assert_equal_or_near_tie, plain_run
from specgen import bench as B
from specgen.decode.generation import Generation
from specgen.drafters.base import Draft, PerSequence
from specgen.drafters.lookup import PromptLookup
from specgen.errors import SpecgenError
from specgen.rules.sampling import SamplingParams
from specgen.policy.cost import CostAware, Costs, Priors
from specgen.policy.base import Situation
from specgen.serve.scheduler import Job, SchedulerSettings, Server, max_concurrency, need_tokens


class MultiFakeEngine(FakeEngine):
    """FakeEngine whose context is opened for several sequences."""

    def __init__(self, table, n_ctx=256, n_batch=64, eog=None):
        super().__init__(table, n_ctx=n_ctx, eog=eog, n_batch=n_batch)


class WrongAfter(PerSequence):
    """A free drafter proposing the target's chain for `good` tokens, then wrong ones."""

    name = "scripted"
    free = True

    def __init__(self, n_vocab, good, step=1):
        self.n_vocab, self.good, self.step = n_vocab, good, step  # good: a count, or one per sequence

    def propose_one(self, context, k, params=None, rng=None, seq=0):
        last = context[-1]
        good = self.good[seq] if isinstance(self.good, dict) else self.good
        toks = [(last + self.step * (i + 1)) % self.n_vocab for i in range(min(good, k))]
        return Draft((toks + [0] * k)[:k])


def sequential(eng, job, drafter=None, k=0):
    gen = Generation(eng, job.prompt, drafter, draft_max=k, max_tokens=job.max_tokens, seq=0)
    list(gen)
    return gen.tokens


def test_plain_concurrent_equals_sequential_and_positions_are_contiguous():
    eng = MultiFakeEngine(chain_table(50), n_batch=64)
    jobs = [Job(f"r{i}", [i, i + 1, i + 2], max_tokens=5 + i) for i in range(3)]
    out = Server(eng, 3).serve(jobs)
    assert sorted(r.job.id for r in out) == ["r0", "r1", "r2"]
    for r in out:
        assert r.gen.tokens == sequential(FakeEngine(chain_table(50)), r.job)
        assert r.gen.stats.stop_reason == "max_tokens"
    # every part starts where its sequence's cache ended: positions are contiguous per sequence
    end: dict[int, int] = {}
    for batch in eng.batches:
        for seq, pos, toks, _ in batch:
            assert pos == end.get(seq, 0) or pos == 0
            end[seq] = pos + len(toks)
    # the first step prefills all three prompts in one batch; later steps decode the three together
    assert [(s, t) for s, _, t, _ in eng.batches[0]] == [(0, [0, 1, 2]), (1, [1, 2, 3]), (2, [2, 3, 4])]
    assert len(eng.batches[1]) == 3 and all(len(t) == 1 for _, _, t, _ in eng.batches[1])


def test_rollback_is_per_sequence():
    eng = MultiFakeEngine(chain_table(50), n_batch=64)
    # sequence 0's drafter is always right, sequence 1's is right for one token then wrong
    drafter = WrongAfter(50, good={0: 8, 1: 1})
    jobs = [Job("good", [1], max_tokens=12), Job("bad", [20], max_tokens=12)]
    out = {r.job.id: r for r in Server(eng, 2, draft_max=3, drafter=drafter).serve(jobs)}
    assert out["good"].gen.tokens == list(range(2, 14))
    assert out["bad"].gen.tokens == list(range(21, 33))
    assert out["good"].gen.stats.accepted == out["good"].gen.stats.drafted
    bad = out["bad"].gen.stats
    assert bad.accepted < bad.drafted
    rollbacks = [(s, n) for s, n in eng.truncations if n > 0]
    assert rollbacks and {s for s, _ in rollbacks} == {1}  # only the bad sequence rolled back
    # verify batches mix both sequences' rows in one decode
    assert any({s for s, *_ in b} == {0, 1} and max(len(t) for _, _, t, _ in b) == 4 for b in eng.batches)


def test_more_requests_than_slots_queue_and_reuse_slots():
    eng = MultiFakeEngine(chain_table(50), n_batch=64)
    jobs = [Job(f"r{i}", [i], max_tokens=3 if i % 2 else 6) for i in range(5)]
    server = Server(eng, 2)
    order = []
    out = server.serve(jobs, on_finish=lambda r: order.append((r.job.id, r.seq)))
    assert len(out) == 5 and {s for _, s in order} == {0, 1}
    by_id = {r.job.id: r for r in out}
    assert by_id["r0"].seq == 0 and by_id["r1"].seq == 1
    assert by_id["r2"].seq == 1  # r1 (3 tokens) finished first: r2 took its slot
    for r in out:
        assert r.gen.tokens == sequential(FakeEngine(chain_table(50)), r.job)
        assert r.queue_s >= 0 and r.ttft_s >= r.queue_s and r.latency_s >= r.ttft_s
    assert by_id["r2"].queue_s > 0 and by_id["r0"].queue_s < by_id["r2"].queue_s
    # a reused slot starts from an empty cache
    assert (1, 0) in eng.truncations
    assert max(len(b) for b in eng.batches) == 2  # never more sequences than slots in one step


def test_long_prompts_are_prefilled_in_chunks_beside_decode_rows():
    eng = MultiFakeEngine(chain_table(50), n_batch=16)
    jobs = [Job("short", [1, 2], max_tokens=8), Job("long", list(range(40)), max_tokens=2)]
    out = {r.job.id: r for r in Server(eng, 2).serve(jobs)}
    assert out["long"].gen.tokens == [40 % 50, 41 % 50]
    long_parts = [(pos, len(t), n) for b in eng.batches for s, pos, t, n in b if s == 1]
    # 40 prompt tokens in chunks that leave a row for the short request's decode; logits on the last only
    assert long_parts == [(0, 14, 0), (14, 15, 0), (29, 11, 1), (40, 1, 1)]
    assert [len(b) for b in eng.batches[:3]] == [2, 2, 2]  # decode rows and prefill chunks share steps


def test_a_prompt_beside_generating_sequences_is_prefilled_in_steps_under_64_rows():
    eng = MultiFakeEngine(chain_table(50), n_ctx=1024, n_batch=256)
    server = Server(eng, 2)
    done = {}
    long_prompt = [i % 50 for i in range(200)]
    server.submit(Job("short", [1, 2], max_tokens=40), on_finish=lambda r: done.setdefault(r.job.id, r))
    server.step()  # the short prompt alone: it generates from now on
    first = len(eng.batches)
    server.submit(Job("long", long_prompt, max_tokens=3), on_finish=lambda r: done.setdefault(r.job.id, r))
    while server.busy:
        server.step()
    steps = [b for b in eng.batches[first:] if any(s == 1 and n == 0 for s, _, _, n in b) or
             any(s == 1 and pos < len(long_prompt) for s, pos, _, _ in b)]
    # the 200 prompt tokens went in several steps, each under llama.cpp's tiled-attention threshold
    assert len(steps) >= 4
    assert all(sum(len(t) for _, _, t, _ in b) < 64 for b in steps)
    assert all(any(s == 0 for s, *_ in b) for b in steps)  # the short request decoded in each of them
    assert done["long"].gen.tokens == sequential(FakeEngine(chain_table(50)), Job("x", long_prompt, max_tokens=3))
    assert done["short"].gen.tokens == sequential(FakeEngine(chain_table(50)), Job("x", [1, 2], max_tokens=40))
    # alone, a prompt takes the whole batch in one step
    eng2 = MultiFakeEngine(chain_table(50), n_ctx=1024, n_batch=256)
    Server(eng2, 2).serve([Job("long", long_prompt, max_tokens=3)])
    assert [len(t) for _, _, t, _ in eng2.batches[0]] == [200]


def test_cache_pool_admission_queues_instead_of_failing():
    eng = MultiFakeEngine(chain_table(50), n_ctx=40, n_batch=64)
    jobs = [Job(f"r{i}", [i] * 10, max_tokens=8) for i in range(3)]  # 19 tokens each: two fit in 40
    out = Server(eng, 3).serve(jobs)
    assert len(out) == 3
    assert max(len(b) for b in eng.batches) == 2  # the third waited for room in the cache
    assert need_tokens(10, 8, 0) == 19 and max_concurrency(40, 19) == 2


def test_bad_input_is_refused_clearly():
    eng = MultiFakeEngine(chain_table(50), n_ctx=32, n_batch=16)
    with pytest.raises(SpecgenError, match="concurrency must be in 1..256"):
        Server(eng, 0)
    with pytest.raises(SpecgenError, match="exceed the batch of 16 rows"):
        Server(eng, 4, draft_max=4, drafter=PromptLookup())
    with pytest.raises(SpecgenError, match="do not fit a context of 32"):
        Server(eng, 1).serve([Job("big", list(range(30)), max_tokens=8)])
    eng.n_seq_max, eng.kv_unified = 2, False
    with pytest.raises(SpecgenError, match="opened for 2 sequences, not 3"):
        Server(eng, 3)
    with pytest.raises(SpecgenError, match="needs a unified KV cache"):
        Server(eng, 2)


def test_sampled_requests_keep_their_own_seeded_generators():
    table = np.random.default_rng(0).normal(size=(30, 30)).astype(np.float32)
    params = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 1)]
    jobs = [Job(f"r{i}", [3], max_tokens=10, params=p) for i, p in enumerate(params)]
    out = {r.job.id: r.gen.tokens for r in Server(MultiFakeEngine(table), 3).serve(jobs)}
    alone = []
    for p in params:
        gen = Generation(FakeEngine(table), [3], None, max_tokens=10, params=p)
        list(gen)
        alone.append(gen.tokens)
    assert [out["r0"], out["r1"], out["r2"]] == alone
    assert out["r0"] == out["r2"] != out["r1"]


def test_a_seeded_sampled_request_has_plain_text_with_or_without_lookup():
    """Point-mass drafts are verified by sample-and-compare (one uniform per emitted
    token, from each request's own generator): lookup moves no request's text."""
    table = np.random.default_rng(4).normal(size=(30, 30)).astype(np.float32) * 3
    params = [SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=s) for s in (1, 2, 3)]
    prompts = [[3, 4, 5, 3, 4, 5, 3, 4], [7, 8, 7, 8, 7], [1, 2, 3, 1, 2]]
    jobs = [Job(f"r{i}", pr, max_tokens=24, params=p) for i, (pr, p) in enumerate(zip(prompts, params))]
    spec = {r.job.id: r.gen for r in Server(MultiFakeEngine(table), 3, draft_max=4, drafter=PromptLookup()).serve(jobs)}
    plain = {r.job.id: r.gen for r in Server(MultiFakeEngine(table), 3).serve(jobs)}
    for j in jobs:
        assert spec[j.id].tokens == plain[j.id].tokens
    assert sum(g.stats.accepted for g in spec.values()) > 0
    assert any(g.stats.accepted < g.stats.drafted for g in spec.values())  # rejections happened


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_draft_model_equals_the_sequential_draft_model(temperature):
    """Same tokens, drafts and acceptance as DraftModel run one request at a time (each rng its own;
    steps left as planned: shaping them to whole row blocks changes draft lengths, test_serving_rows)."""
    from specgen.drafters.model import DraftModel

    rng = np.random.default_rng(1)
    target_table = rng.normal(size=(40, 40)).astype(np.float32) * 2
    draft_table = target_table + rng.normal(size=(40, 40)).astype(np.float32)  # a different, related model
    params = [SamplingParams(temperature=temperature, seed=s) for s in (5, 6, 7, 8)]
    jobs = [Job(f"r{i}", [i + 1, i + 2], max_tokens=12, params=p) for i, p in enumerate(params)]
    draft = MultiFakeEngine(draft_table, n_batch=64)
    batched = DraftModel(draft, 40, 40)
    server = Server(MultiFakeEngine(target_table), 2, draft_max=3, drafter=batched,
                    settings=SchedulerSettings(row_group=1))
    out = {r.job.id: r for r in server.serve(jobs)}
    for j in jobs:
        gen = Generation(FakeEngine(target_table), j.prompt, DraftModel(FakeEngine(draft_table), 40, 40),
                         draft_max=3, max_tokens=12, params=j.params)
        list(gen)
        got = out[j.id].gen
        assert got.tokens == gen.tokens
        assert (got.stats.drafted, got.stats.accepted) == (gen.stats.drafted, gen.stats.accepted)
    assert all(r.gen.stats.drafted > 0 for r in out.values())
    assert any(r.gen.stats.accepted < r.gen.stats.drafted for r in out.values())  # rejections happened
    # drafting steps carried both sequences at once
    assert any(len(b) == 2 and all(len(t) == 1 for _, _, t, _ in b) for b in draft.batches)


class DecliningGate:
    """A shared-step gate that keeps every shared step plain (as StepGate does where
    drafting beside other sequences was measured not to pay)."""

    def __init__(self):
        self.asked = 0

    def drafts(self, sequences, prefill=False):
        self.asked += 1
        return sequences <= 1

    def observe(self, *args):
        pass


def test_a_gated_plain_step_beside_a_draft_model_verifies_one_row_each():
    """A draft model's sequences, in a shared step the gate keeps plain, each get one
    row (it failed: the plan asked the draft model the step had not been given)."""
    from specgen.drafters.model import DraftModel

    rng = np.random.default_rng(2)
    target_table = rng.normal(size=(40, 40)).astype(np.float32) * 2
    draft_table = target_table + rng.normal(size=(40, 40)).astype(np.float32) * 0.3
    jobs = [Job(f"r{i}", [i + 1, i + 2], max_tokens=10) for i in range(3)]
    gate = DecliningGate()
    server = Server(MultiFakeEngine(target_table), 3, draft_max=3,
                    drafter=DraftModel(MultiFakeEngine(draft_table, n_batch=64), 40, 40), gate=gate)
    out = {r.job.id: r.gen for r in server.serve(jobs)}
    plain = {r.job.id: r.gen for r in Server(MultiFakeEngine(target_table), 3).serve(jobs)}
    assert gate.asked > 0
    for j in jobs:
        assert out[j.id].tokens == plain[j.id].tokens
    shared = [(seqs, rows) for seqs, rows, prefill in server.step_log if seqs > 1 and not prefill]
    assert shared and all(rows == seqs for seqs, rows in shared), shared


def test_batch_aware_policy_stops_drafting_on_a_saturated_step():
    linear = [0.0] + [0.01 * n for n in range(1, 33)]  # every row costs the same: no spare arithmetic
    flat = [0.0] + [0.01 + 0.0005 * n for n in range(1, 33)]  # rows nearly free: a GPU
    def mean_choice(curve, others):  # the estimate-best k: confident estimates (many rounds seen)
        p = CostAware(8, Costs(curve), Priors(prior=0.8))
        p.update(0, 8, 6)
        p.acceptance(0).reached[:] = [1000.0] * 8
        p.acceptance(0).accepted[:] = [800.0] * 8
        return p.choose(0, 8, Situation(others_rows=others, others_tokens=others))

    for curve, others, expect_draft in ((flat, 0, True), (flat, 7, True), (linear, 0, False), (linear, 7, False)):
        assert (mean_choice(curve, others) > 0) == expect_draft, (curve is flat, others)
    # a sublinear CPU-like curve: drafting pays alone, not beside 15 other rows
    cpu = [0.0] + [0.01 * n ** 0.6 if n <= 8 else 0.01 * 8 ** 0.6 + 0.008 * (n - 8) for n in range(1, 33)]
    assert mean_choice(cpu, 0) > 0 and mean_choice(cpu, 15) == 0


# =========================================================== the real model (Gemma 3 270M)

N_REAL = 16


@pytest.fixture(scope="module")
def shared(gemma_path):
    from specgen.engine.llama import Engine

    with Engine(gemma_path, n_ctx=1024, n_threads=2, n_seq_max=3, kv_unified=True) as e:
        yield e


@pytest.fixture(scope="module")
def sequential_runs(target):
    """Each prompt alone on a single-sequence engine: tokens and the target's top candidates."""
    return [plain_run(target, target.tokenize(p), n=N_REAL) for p in PROMPTS]


def _jobs(engine):
    return [Job(f"p{i}", engine.tokenize(p), max_tokens=N_REAL, params=SamplingParams(ignore_eos=True))
            for i, p in enumerate(PROMPTS)]


@pytest.mark.model
@pytest.mark.parametrize("mode", ["plain", "lookup"])
def test_three_requests_at_concurrency_3_match_sequential_greedy(shared, sequential_runs, mode):
    kw = {} if mode == "plain" else {"draft_max": 4, "drafter": PromptLookup()}
    server = Server(shared, 3, **kw)
    out = {r.job.id: r for r in server.serve(_jobs(shared))}
    for i, (tokens, top) in enumerate(sequential_runs):
        r = out[f"p{i}"]
        assert len(r.gen.tokens) == N_REAL
        assert_equal_or_near_tie(tokens, top, r.gen.tokens)
    # the three were decoded together: some step carried all three sequences
    assert max(n for n, _, _ in server.step_log) == 3


@pytest.mark.model
def test_batched_draft_model_at_concurrency_3_matches_sequential_greedy(gemma_path, shared, sequential_runs):
    from specgen.engine.llama import Engine
    from specgen.drafters.model import DraftModel

    with Engine(gemma_path, n_ctx=1024, n_threads=2, n_seq_max=3, kv_unified=True) as draft:
        batched = DraftModel(draft, draft.n_vocab, shared.n_vocab)
        server = Server(shared, 3, draft_max=3, drafter=batched)
        out = {r.job.id: r for r in server.serve(_jobs(shared))}
        for i, (tokens, top) in enumerate(sequential_runs):
            r = out[f"p{i}"]
            assert_equal_or_near_tie(tokens, top, r.gen.tokens)
            # the target drafting for itself: accepted except at batch near-ties
            assert r.gen.stats.drafted > 0 and r.gen.stats.acceptance_rate > 0.7
            kv = draft.kv_tokens(r.seq)
            assert kv == (r.job.prompt + r.gen.tokens)[: len(kv)]  # no rejected token left in a draft cache
        # all three sequences drafted together: fewer draft decodes than drafted tokens
        drafted = sum(r.gen.stats.drafted for r in out.values())
        assert batched.steps < drafted


# =========================================================== the sweep (`specgen bench --concurrency`)


@pytest.mark.parametrize(
    "text, message",
    [
        ("0,2", "--concurrency: levels must be >= 1 (got 0)"),
        ("-1", "--concurrency: levels must be >= 1 (got -1)"),
        ("1,x", "--concurrency: 'x' is not an integer"),
        ("300", "--concurrency: at most 256 sequences share a llama.cpp context (got 300)"),
    ],
)
def test_concurrency_levels_are_checked(text, message):
    with pytest.raises(SpecgenError) as e:
        B.parse_concurrency(text)
    assert str(e.value).startswith(message)


def test_concurrency_levels_parse_sorted_and_distinct():
    assert B.parse_concurrency("8, 1,2,4,2") == [1, 2, 4, 8]


def test_a_level_the_context_cannot_hold_names_the_limit():
    p = [B.Prepared(B.Request("a", "x"), 0, [1] * 100, 50, SamplingParams())]
    B.check_concurrency([1, 2, 6], p, 1024, 8)  # 100 + 50 + 8 + 1 = 159 tokens: 6 fit in 1024
    with pytest.raises(SpecgenError) as e:
        B.check_concurrency([1, 8], p, 1024, 8)
    assert str(e.value) == (
        "--concurrency 8: a context of 1024 tokens holds at most 6 requests of up to 159 tokens "
        "(prompt + max_tokens + draft) at once; raise -c/--ctx-size to at least 1272"
    )
    p = [B.Prepared(B.Request("a", "x"), 0, [1] * 10, 10, SamplingParams())]
    with pytest.raises(SpecgenError, match="32 sequences × 17 verify rows exceed a batch of 512 rows; at most 30"):
        B.check_concurrency([32], p, 100000, 16, 512)


def _serve_record(level, config, tput, lats, drafted=0, accepted=0, k_hist=None):
    reqs = [
        {"latency_s": x, "service_s": x, "ttft_s": x / 4, "queue_s": 0.0, "tokens_per_s": 10.0, "drafted": drafted, "accepted": accepted,
         "matches_plain": None if config == "plain" else True}
        for x in lats
    ]
    return {"concurrency": level, "config": config, "throughput_tokens_per_s": tput, "mean_rows_per_step": 1.0,
            "k_hist": k_hist or {"0": 5}, "requests": reqs}


def test_sweep_summary_finds_the_crossovers():
    recs = [
        _serve_record(1, "plain", 10.0, [1.0, 1.0]), _serve_record(1, "lookup:k=8", 12.0, [0.8, 0.8], 10, 6, {"4": 5}),
        _serve_record(2, "plain", 18.0, [1.2, 1.2]), _serve_record(2, "lookup:k=8", 17.0, [1.1, 1.1], 10, 6, {"4": 5}),
        _serve_record(4, "plain", 30.0, [1.5, 1.5]), _serve_record(4, "lookup:k=8", 25.0, [1.7, 1.7], 10, 6, {"0": 5}),
    ]
    s = B.summarize_sweep(recs, ["plain", "lookup:k=8"])
    assert s["levels"] == [1, 2, 4]
    lv = s["per_level"]["4"]["lookup:k=8"]
    assert lv["throughput_tokens_per_s"] == 25.0 and lv["p50_latency_s"] == pytest.approx(1.7)
    assert lv["mean_k"] == 0.0 and s["per_level"]["1"]["lookup:k=8"]["mean_k"] == 4.0
    assert s["per_level"]["1"]["lookup:k=8"]["acceptance_rate"] == pytest.approx(0.6)
    x = s["crossover"]["lookup:k=8"]
    assert x["cuts_latency_at"] == [1, 2]
    assert x["stops_cutting_latency_at"] == 4
    assert x["costs_throughput_from"] == 2
    assert x["throughput_ratio"]["1"] == pytest.approx(1.2)


def test_sweep_summary_says_when_a_crossover_does_not_hold():
    recs = [
        _serve_record(1, "plain", 10.0, [1.0]), _serve_record(1, "lookup:k=8", 20.0, [0.5]),
        _serve_record(4, "plain", 30.0, [2.0]), _serve_record(4, "lookup:k=8", 27.0, [2.1]),
        _serve_record(8, "plain", 40.0, [3.0]), _serve_record(8, "lookup:k=8", 39.0, [2.5]),
    ]
    x = B.summarize_sweep(recs, ["plain", "lookup:k=8"])["crossover"]["lookup:k=8"]
    assert (x["stops_cutting_latency_at"], x["cuts_again_at"]) == (4, [8])
    assert (x["costs_throughput_from"], x["recovers_at"]) == (4, [8])  # 0.975× at 8 is within the noise band
    from specgen.cli.render_bench import crossover_lines

    line = crossover_lines(B.summarize_sweep(recs, ["plain", "lookup:k=8"]), [B.PLAIN, B.parse_config("lookup:k=8")])[0]
    assert line.startswith("lookup:k=8: stops cutting p50 latency at concurrency 4 (yet cuts it again at 8); "
                           "costs total throughput from concurrency 4 (not at 8).")


@pytest.mark.model
def test_sweep_records_carry_the_level_and_throughput(tmp_path):
    import json

    from typer.testing import CliRunner

    from specgen.cli import app

    reqs = tmp_path / "r.jsonl"
    reqs.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    out = tmp_path / "sweep.jsonl"
    args = ["bench", str(reqs), "--concurrency", "1,3", "-n", "6", "-c", "1024", "-t", "2", "--no-warmup",
            "-C", "lookup:k=4", "--out", str(out), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert obj["concurrency"] == [1, 3] and set(obj["summary"]["per_level"]) == {"1", "3"}
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["type"] == "meta" and lines[0]["concurrency"] == [1, 3]
    serves = lines[1:]
    assert sorted((r["concurrency"], r["config"]) for r in serves) == [
        (1, "lookup:k=4"), (1, "plain"), (3, "lookup:k=4"), (3, "plain")]
    for r in serves:
        assert r["type"] == "serve" and r["throughput_tokens_per_s"] > 0 and r["generated_tokens"] > 0
        assert len(r["requests"]) == 3
        for x in r["requests"]:
            assert x["concurrency"] == r["concurrency"] and x["config"] == r["config"]
            assert 0 <= x["queue_s"] <= x["ttft_s"] <= x["latency_s"]
            assert {"tokens_per_s", "drafted", "accepted", "acceptance_rate", "k_hist"} <= set(x)
    c1 = next(r for r in serves if r["concurrency"] == 1 and r["config"] == "plain")
    first, second, third = sorted(c1["requests"], key=lambda x: x["queue_s"])
    assert second["queue_s"] >= first["latency_s"] and third["queue_s"] >= second["latency_s"]  # one slot: they wait
    assert "p50 latency" in result.stderr and "lookup:k=4:" in result.stderr


@pytest.mark.model
def test_a_level_above_the_context_is_one_line(capsys):
    from specgen.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--concurrency", "1,16", "-c", "1024", "-n", "64", "--limit", "2", "--no-warmup"])
    assert e.value.code != 0
    err = capsys.readouterr().err
    assert err.startswith("specgen: error: --concurrency 16: a context of 1024 tokens holds at most") and err.count("\n") == 1
