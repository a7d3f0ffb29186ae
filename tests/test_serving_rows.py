"""Shared steps shaped to whole blocks of SchedulerSettings.row_group rows (llama.cpp's CPU gemm takes rows in fours)."""

from __future__ import annotations

from types import SimpleNamespace

from fakes import FakeEngine, chain_table
from test_serving import MultiFakeEngine, WrongAfter, sequential
from specgen.decode.generation import fit_rows
from specgen.drafters.base import Draft
from specgen.policy.base import MODEL_KEY
from specgen.serve.scheduler import Job, SchedulerSettings, Server


class Marginal:
    """A policy stub: the k-th drafted token adds gains[k-1] expected tokens."""

    def __init__(self, *gains):
        self.gains = gains

    def expected_tokens(self, key, k):
        return 1.0 + sum(self.gains[:k])


def live(*specs):
    """(policy, limit) per sequence, as plan_step's `live` holds them."""
    return [(SimpleNamespace(policy=pol), lim) for pol, lim in specs]


def test_a_step_a_row_short_of_a_block_takes_one_more_offered_token_where_it_adds_most():
    seqs = live((Marginal(0.9, 0.8, 0.7, 0.6), 4), (Marginal(0.9, 0.5, 0.1, 0.1), 4), (Marginal(0.9, 0.9, 0.9, 0.9), 4))
    offers = [Draft([1, 2, 3, 4], key=2), Draft([5, 6, 7], key=1), Draft([8], key=3)]
    picks = [(2, True), (1, True), (1, True)]  # 3 + 2 + 2 = 7 rows
    assert fit_rows(seqs, offers, picks, 0, 4) == [(3, True), (1, True), (1, True)]  # the third's offer has no more


def test_without_offered_tokens_a_step_drops_the_drafted_tokens_that_add_least():
    seqs = live((Marginal(0.9, 0.2), 4), (Marginal(0.9, 0.8), 4), (Marginal(0.9), 4))
    offers = [Draft([1, 2], key=1), Draft([3, 4], key=1), Draft([], key=1)]
    picks = [(2, True), (2, True), (1, False)]  # 3 + 3 + 2 = 8: whole already
    assert fit_rows(seqs, offers, picks, 0, 4) == picks
    picks = [(2, True), (2, True), (0, True)]  # 3 + 3 + 1 = 7, nothing more offered: cut 3
    assert fit_rows(seqs, offers, picks, 0, 4) == [(0, True), (1, True), (0, True)]
    # a draft model's picks (take False) are never lengthened, only cut; prefill rows count
    model = [Draft(), Draft()]
    assert fit_rows(live((Marginal(0.9, 0.5), 4), (Marginal(0.9, 0.5), 4)), model, [(2, False), (1, False)], 28, 4) \
        == [(1, False), (1, False)]
    # a step under one block is left alone
    assert fit_rows(live((Marginal(0.5), 4), (Marginal(0.5), 4)), model, [(1, False), (0, False)], 0, 4) \
        == [(1, False), (0, False)]
    assert MODEL_KEY == 0


def test_shared_drafting_steps_hold_whole_blocks_and_outputs_stay_exact():
    eng = MultiFakeEngine(chain_table(50), n_ctx=512, n_batch=64)
    drafter = WrongAfter(50, good={0: 8, 1: 1, 2: 2})
    jobs = [Job("a", [1], max_tokens=20), Job("b", [20], max_tokens=20), Job("c", [30], max_tokens=20)]
    out = {r.job.id: r for r in Server(eng, 3, draft_max=2, drafter=drafter).serve(jobs)}
    shared = [b for b in eng.batches if len(b) >= 2 and len(b) < sum(len(t) for _, _, t, _ in b) >= 4]
    assert shared  # three sequences drafting 2 each: 9 rows unless shaped
    assert all(sum(len(t) for _, _, t, _ in b) % 4 == 0 for b in shared)
    for job in jobs:
        assert out[job.id].gen.tokens == sequential(FakeEngine(chain_table(50)), job)


def test_row_group_1_leaves_steps_as_planned():
    eng = MultiFakeEngine(chain_table(50), n_ctx=512, n_batch=64)
    jobs = [Job("a", [1], max_tokens=8), Job("b", [20], max_tokens=8), Job("c", [30], max_tokens=8)]
    Server(eng, 3, draft_max=2, drafter=WrongAfter(50, good=8), settings=SchedulerSettings(row_group=1)).serve(jobs)
    assert any(sum(len(t) for _, _, t, _ in b) == 9 for b in eng.batches)


def test_a_chunk_beside_generating_sequences_ends_on_a_whole_block():
    eng = MultiFakeEngine(chain_table(50), n_ctx=1024, n_batch=256)
    server = Server(eng, 3)
    done = {}
    for name, prompt in (("s1", [1, 2]), ("s2", [7, 8])):
        server.submit(Job(name, prompt, max_tokens=40), on_finish=lambda r: done.setdefault(r.job.id, r))
    server.step()  # the short prompts alone: they generate from now on
    first = len(eng.batches)
    long_prompt = [i % 50 for i in range(200)]
    server.submit(Job("long", long_prompt, max_tokens=3), on_finish=lambda r: done.setdefault(r.job.id, r))
    while server.busy:
        server.step()
    chunks = [b for b in eng.batches[first:] if any(s == 2 and n == 0 and len(t) > 1 for s, _, t, n in b)]
    assert len(chunks) >= 3  # 200 prompt rows beside two decode rows, under 64 rows a step
    for b in chunks:  # 2 decode rows + a chunk that does not end the prompt: 60 rows, not 63
        assert sum(len(t) for _, _, t, _ in b) % 4 == 0 and sum(len(t) for _, _, t, _ in b) < 64
    assert done["long"].gen.tokens == sequential(FakeEngine(chain_table(50)), Job("x", long_prompt, max_tokens=3))
    assert done["s1"].gen.tokens == sequential(FakeEngine(chain_table(50)), Job("x", [1, 2], max_tokens=40))


class PlainGate:
    """A gate whose every shared step is plain (its draws always favour not drafting)."""

    def drafts(self, sequences, prefill=False):
        return sequences < 2

    def observe(self, *args):
        pass


def test_a_plain_shared_step_of_three_fills_its_block_from_free_offers():
    eng = MultiFakeEngine(chain_table(50), n_ctx=512, n_batch=64)
    jobs = [Job("a", [1], max_tokens=12), Job("b", [20], max_tokens=12), Job("c", [30], max_tokens=12)]
    server = Server(eng, 3, draft_max=4, drafter=WrongAfter(50, good=8), gate=PlainGate())
    out = {r.job.id: r for r in server.serve(jobs)}
    shared = [b for b in eng.batches[1:] if len(b) == 3]
    assert shared and all(sum(len(t) for _, _, t, _ in b) == 4 for b in shared)  # 3 rows + 1 drafted: one block
    for job in jobs:
        assert out[job.id].gen.tokens == sequential(FakeEngine(chain_table(50)), job)
    # four sequences already fill the block: a plain step stays plain
    eng = MultiFakeEngine(chain_table(50), n_ctx=512, n_batch=64)
    four = jobs + [Job("d", [40], max_tokens=12)]
    Server(eng, 4, draft_max=4, drafter=WrongAfter(50, good=8), gate=PlainGate()).serve(four)
    assert all(sum(len(t) for _, _, t, _ in b) == 4 for b in eng.batches[1:] if len(b) == 4)


def test_a_prompt_tail_beside_drafting_sequences_ends_the_step_on_a_whole_block():
    from specgen.policy.stepgate import StepGate

    eng = MultiFakeEngine(chain_table(50), n_ctx=1024, n_batch=64)
    server = Server(eng, 4, draft_max=3, drafter=WrongAfter(50, good=8), gate=StepGate(seed=0))
    done = {}
    for name, prompt in (("s1", [1, 2]), ("s2", [7, 8]), ("s3", [12, 13])):
        server.submit(Job(name, prompt, max_tokens=40), on_finish=lambda r: done.setdefault(r.job.id, r))
    server.step()
    first = len(eng.batches)
    server.submit(Job("tail", [30, 31, 32, 33, 34], max_tokens=3), on_finish=lambda r: done.setdefault(r.job.id, r))
    while server.busy:
        server.step()
    [mixed] = [b for b in eng.batches[first:] if any(s == 3 and pos == 0 for s, pos, _, _ in b)]  # the whole prompt
    assert len(mixed) == 4 and sum(len(t) for _, _, t, _ in mixed) % 4 == 0  # 5 prompt rows + drafts: whole blocks
    assert any(len(t) > 1 for s, _, t, _ in mixed if s != 3)  # the generating sequences drafted beside it
    for job_id, prompt, n in (("tail", [30, 31, 32, 33, 34], 3), ("s1", [1, 2], 40)):
        assert done[job_id].gen.tokens == sequential(FakeEngine(chain_table(50)), Job("x", prompt, max_tokens=n))
