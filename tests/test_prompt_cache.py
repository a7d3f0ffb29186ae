"""The server's prompt cache: a finished request's cache stays in its slot and a
later prompt sharing its prefix prefills only the rest.

Fake-engine tests check the bookkeeping (which slot, how much is kept, what
is decoded where, the pool never exceeded, the draft model's cache); real
HTTP tests on 127.0.0.1 check that cached and uncached requests give the same
greedy output (near-tie rule of test_model) and that usage and /metrics say
how many prompt tokens the cache served.
"""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeEngine, chain_table
from test_serving import MultiFakeEngine, WrongAfter, sequential
from specgen.serve.scheduler import Job, SchedulerSettings, Server


def _one(server: Server, job: Job):
    [res] = server.serve([job])
    return res


def _first_part(eng, seq: int, since: int):
    """(first position, tokens) of seq's first part in the batches after index `since`."""
    for batch in eng.batches[since:]:
        for s, pos, toks, _ in batch:
            if s == seq:
                return pos, toks
    raise AssertionError(f"sequence {seq} was not decoded")


def _holds(eng, res) -> bool:
    """The slot's cache is exactly the request's prompt and output (the last token is never decoded)."""
    return eng.kv[res.seq] == res.job.prompt + res.gen.tokens[:-1]


# =========================================================== the scheduler (fake engine)


def test_a_repeated_prompt_prefills_only_its_last_token():
    eng = MultiFakeEngine(chain_table(50))
    server = Server(eng, 2)
    first = _one(server, Job("a", [1, 2, 3, 4, 5], max_tokens=6))
    mark = len(eng.batches)
    again = _one(server, Job("b", [1, 2, 3, 4, 5], max_tokens=6))
    assert first.cached_tokens == 0 and again.cached_tokens == 4 == again.record()["cached_tokens"]
    assert again.seq == first.seq
    assert _first_part(eng, again.seq, mark) == (4, [5])
    assert again.gen.tokens == first.gen.tokens == sequential(FakeEngine(chain_table(50)), again.job)
    assert server.cached_tokens == 4 and _holds(eng, again)


def test_a_multi_turn_conversation_prefills_only_the_new_turn():
    eng = MultiFakeEngine(chain_table(50))
    server = Server(eng, 2)
    turn1 = _one(server, Job("t1", [1, 2, 3], max_tokens=5))
    history = turn1.job.prompt + turn1.gen.tokens + [30, 31]  # the reply, then the user's next message
    mark = len(eng.batches)
    turn2 = _one(server, Job("t2", history, max_tokens=5))
    assert turn2.cached_tokens == len(turn1.job.prompt) + len(turn1.gen.tokens) - 1
    assert _first_part(eng, turn2.seq, mark) == (turn2.cached_tokens, history[turn2.cached_tokens:])
    assert turn2.gen.tokens == sequential(FakeEngine(chain_table(50)), turn2.job)
    assert _holds(eng, turn2)


def test_a_slot_partly_reused_after_another_prompt_drops_the_rest_of_its_cache():
    eng = MultiFakeEngine(chain_table(50))
    server = Server(eng, 1)
    _one(server, Job("long", list(range(1, 13)), max_tokens=4))
    mark = len(eng.batches)
    other = _one(server, Job("other", [1, 2, 3, 4, 40, 41, 42], max_tokens=4))
    assert other.cached_tokens == 4
    assert _first_part(eng, 0, mark) == (4, [40, 41, 42])
    assert other.gen.tokens == sequential(FakeEngine(chain_table(50)), other.job)
    assert _holds(eng, other)  # nothing of the first prompt's tail is left behind


def test_a_prompt_goes_to_the_slot_sharing_its_longest_prefix():
    eng = MultiFakeEngine(chain_table(50))
    server = Server(eng, 2)
    a, b = server.serve([Job("a", [1, 2, 3, 4], max_tokens=3), Job("b", [20, 21, 22, 23], max_tokens=3)])
    by_id = {r.job.id: r for r in (a, b)}
    more_b = _one(server, Job("b2", [20, 21, 22, 23, 9], max_tokens=3))
    assert more_b.seq == by_id["b"].seq and more_b.cached_tokens == 4
    more_a = _one(server, Job("a2", [1, 2, 3, 7], max_tokens=3))
    assert more_a.seq == by_id["a"].seq and more_a.cached_tokens == 3


def test_a_prompt_sharing_a_running_requests_prefix_copies_it_and_prefills_the_rest():
    eng = MultiFakeEngine(chain_table(50), n_ctx=512)
    server = Server(eng, 2)
    passage = list(range(1, 31))
    first, second = Job("q1", passage + [40, 41], max_tokens=12), Job("q2", passage + [45], max_tokens=4)
    done = []
    server.submit(first, on_finish=done.append)
    server.step()  # q1's prompt is in its slot, and q1 is generating
    server.submit(second, on_finish=done.append)
    mark = len(eng.batches)
    server.step()
    assert eng.copies == [(0, 1, 30)]  # the passage, shared from the running request's slot
    assert _first_part(eng, 1, mark) == (30, [45])
    while server.busy:
        server.step()
    by_id = {r.job.id: r for r in done}
    assert by_id["q2"].cached_tokens == 30 and server.cached_tokens == 30
    for r in done:
        assert r.gen.tokens == sequential(FakeEngine(chain_table(50), n_ctx=512), r.job) and _holds(eng, r)
    # a match shorter than SchedulerSettings.min_copy is prefilled, not copied
    server.submit(Job("q3", list(range(5, 17)) + [44] * 8, max_tokens=8), on_finish=done.append)
    server.step()
    server.submit(Job("q4", list(range(5, 17)) + [46] * 8, max_tokens=2), on_finish=done.append)
    while server.busy:
        server.step()
    assert eng.copies == [(0, 1, 30)] and {r.job.id: r for r in done}["q4"].cached_tokens == 0


def test_a_slight_match_takes_the_least_recently_used_slot():
    eng = MultiFakeEngine(chain_table(50), n_ctx=512)
    server = Server(eng, 2)
    old = _one(server, Job("old", [1] + [5] * 30, max_tokens=2))
    recent = _one(server, Job("recent", [2] + [6] * 30, max_tokens=2))
    assert old.seq != recent.seq
    slight = _one(server, Job("slight", [2] + [7] * 30, max_tokens=2))  # one token in 31 shared with `recent`
    assert slight.seq == old.seq and slight.cached_tokens == 0
    assert _holds(eng, recent)  # the recent conversation's cache is still there


def test_idle_caches_are_evicted_when_a_request_needs_their_room():
    eng = MultiFakeEngine(chain_table(50), n_ctx=64)  # the fake raises if the pool is ever exceeded
    server = Server(eng, 2)
    a = _one(server, Job("a", list(range(1, 21)), max_tokens=10))
    assert len(eng.kv[a.seq]) == 29
    big = _one(server, Job("big", list(range(30, 45)) * 2, max_tokens=20))  # needs 51 of 64 cells
    assert big.seq != a.seq and eng.kv[a.seq] == []
    assert big.gen.tokens == sequential(FakeEngine(chain_table(50), n_ctx=64), big.job)
    small = _one(server, Job("small", list(range(30, 45)) * 2 + [1], max_tokens=3))  # room now: big's cache is kept
    assert small.seq == big.seq and small.cached_tokens == 30


def test_a_cancelled_request_leaves_what_it_settled_for_the_next():
    eng = MultiFakeEngine(chain_table(50))
    server = Server(eng, 1)
    job = Job("long", [1, 2, 3], max_tokens=40)
    done = []
    server.submit(job, on_finish=done.append)
    for _ in range(4):
        server.step()
    server.cancel(job)
    server.step()
    [cut] = done
    assert cut.gen.stats.stop_reason == "interrupted" and _holds(eng, cut)
    retry = _one(server, Job("retry", [1, 2, 3], max_tokens=5))
    assert retry.cached_tokens == 2 and retry.gen.tokens == sequential(FakeEngine(chain_table(50)), retry.job)


def test_the_cache_off_prefills_every_prompt_and_frees_the_slot():
    eng = MultiFakeEngine(chain_table(50))
    server = Server(eng, 2, settings=SchedulerSettings(prompt_cache=False))
    _one(server, Job("a", [1, 2, 3, 4], max_tokens=4))
    assert all(kv == [] for kv in eng.kv.values())  # released at once
    mark = len(eng.batches)
    again = _one(server, Job("b", [1, 2, 3, 4], max_tokens=4))
    assert again.cached_tokens == 0 and _first_part(eng, again.seq, mark) == (0, [1, 2, 3, 4])
    # on a caching server, one request may still ask for a fresh prefill (llama-server's cache_prompt: false)
    eng = MultiFakeEngine(chain_table(50))
    on = Server(eng, 1)
    _one(on, Job("a", [1, 2, 3, 4], max_tokens=4))
    mark = len(eng.batches)
    fresh = _one(on, Job("b", [1, 2, 3, 4], max_tokens=4, cache_prompt=False))
    assert fresh.cached_tokens == 0 and _first_part(eng, fresh.seq, mark) == (0, [1, 2, 3, 4])


def test_a_slot_cache_saved_to_the_store_is_loaded_back_for_its_prompt():
    from specgen.serve.promptstore import PromptStore

    eng = MultiFakeEngine(chain_table(50), n_ctx=512)
    store = PromptStore(1 << 20)
    server = Server(eng, 1, store=store)
    first = _one(server, Job("a", [1] * 40, max_tokens=5))
    held = first.job.prompt + first.gen.tokens[:-1]
    _one(server, Job("b", [2] * 40, max_tokens=5))  # overwrites the slot: a's cache is saved first
    assert len(store) == 1 and store.best(held) == (tuple(held), len(held))
    mark = len(eng.batches)
    again = _one(server, Job("c", held + [7, 8], max_tokens=5))
    assert again.cached_tokens == len(held) and store.loaded == 1
    assert _first_part(eng, 0, mark) == (len(held), [7, 8])
    assert again.gen.tokens == sequential(FakeEngine(chain_table(50), n_ctx=512), again.job) and _holds(eng, again)
    # a cache too short to be worth saving, and a server without the cache, store nothing
    _one(server, Job("d", [3] * 10, max_tokens=2))
    assert len(store) == 2  # c's cache was saved when d took the slot; d's own will not be
    off = Server(MultiFakeEngine(chain_table(50)), 1, store=PromptStore(1 << 20), settings=SchedulerSettings(prompt_cache=False))
    assert off.store is None


def test_the_store_keeps_its_byte_budget_and_the_longest_states():
    from specgen.serve.promptstore import PromptStore

    store = PromptStore(100)
    store.put(list(range(40)), b"x" * 40)
    store.put(list(range(50)), b"x" * 50)  # extends the first: replaces it
    assert len(store) == 1 and store.bytes == 50
    store.put(list(range(45)), b"x" * 45)  # already held by a longer one
    assert len(store) == 1
    store.put(list(range(100, 140)), b"y" * 40)
    store.put(list(range(200, 240)), b"z" * 40)  # over budget: the oldest goes
    assert store.bytes <= 100 and store.best(list(range(60)))[1] == 0
    assert store.best(list(range(200, 210)) + [1])[1] == 10


def test_drafters_stay_exact_on_a_reused_slot():
    """Prompt lookup re-indexes each generation; a draft model's cache of the slot
    keeps only the prefix that agrees with the new prompt."""
    from specgen.drafters.model import DraftModel

    eng = MultiFakeEngine(chain_table(50))
    server = Server(eng, 1, draft_max=3, drafter=WrongAfter(50, good=2))
    first = _one(server, Job("a", [1, 2, 3], max_tokens=8))
    again = _one(server, Job("b", first.job.prompt + first.gen.tokens + [9], max_tokens=8))
    assert again.cached_tokens > 0 and again.gen.tokens == list(range(10, 18))

    rng = np.random.default_rng(3)
    target_table = rng.normal(size=(40, 40)).astype(np.float32) * 2
    draft_table = target_table + rng.normal(size=(40, 40)).astype(np.float32)
    draft = MultiFakeEngine(draft_table)
    server = Server(MultiFakeEngine(target_table), 1, draft_max=3, drafter=DraftModel(draft, 40, 40))
    outs = []
    for prompt in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9]):
        res = _one(server, Job("r", prompt, max_tokens=10))
        kv = draft.kv.get(0, [])
        assert kv == (res.job.prompt + res.gen.tokens)[: len(kv)]  # the draft's cache: a prefix of this context
        ref = Generation_run(target_table, draft_table, prompt)
        assert (res.gen.tokens, res.gen.stats.drafted, res.gen.stats.accepted) == ref
        outs.append(res)
    assert outs[1].cached_tokens == 5 and outs[2].cached_tokens == 3


def Generation_run(target_table, draft_table, prompt):
    from specgen.decode.generation import Generation
    from specgen.drafters.model import DraftModel

    gen = Generation(FakeEngine(target_table), prompt, DraftModel(FakeEngine(draft_table), 40, 40), draft_max=3,
                     max_tokens=10)
    list(gen)
    return gen.tokens, gen.stats.drafted, gen.stats.accepted


# =========================================================== real HTTP, real model (Gemma 3 270M)

N = 16


@pytest.fixture(scope="module")
def srv(gemma_path):
    from test_server import Running

    s = Running(gemma_path, parallel=2)
    yield s
    s.close()


@pytest.fixture()
def client(srv):
    import openai

    from test_server import KEY

    return openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _complete(client, srv, prompt, **extra):
    r = client.completions.create(model=srv.model, prompt=prompt, max_tokens=N, temperature=0,
                                  extra_body={"return_tokens": True, **extra})
    return r.choices[0].model_extra["tokens"], r.usage


def _cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


def _same_or_near(target, prompt_tokens, a, b):
    """Equal greedy outputs, or both part from plain greedy only at a near-tie."""
    if a == b:
        return
    from test_model import assert_equal_or_near_tie, plain_run

    plain, top = plain_run(target, prompt_tokens, n=N)
    assert_equal_or_near_tie(plain[: len(a)], top, a)
    assert_equal_or_near_tie(plain[: len(b)], top, b)


PROMPT = "The history of the printing press began in the fifteenth century, when"
LONGER = (" Johannes Gutenberg, a goldsmith of Mainz, combined movable metal type, an oil-based ink and a"
          " screw press adapted from the presses of wine makers. Within fifty years, printers in")


@pytest.mark.model
def test_a_repeated_prompt_is_served_from_the_cache_with_the_same_output(srv, client, target):
    first, u1 = _complete(client, srv, PROMPT)
    again, u2 = _complete(client, srv, PROMPT)
    fresh, u3 = _complete(client, srv, PROMPT, cache_prompt=False)
    assert _cached(u2) == u2.prompt_tokens - 1 and _cached(u3) == 0
    prompt = target.tokenize(PROMPT)
    _same_or_near(target, prompt, again, fresh)
    _same_or_near(target, prompt, first, fresh)


@pytest.mark.model
def test_a_multi_turn_chat_reuses_the_history_and_keeps_the_output(srv, client, target):
    from specgen.apps.chat import encode, format_for, render

    messages = [{"role": "user", "content": "Name three rivers of Europe."}]
    r1 = client.chat.completions.create(model=srv.model, messages=messages, max_tokens=N, temperature=0)
    messages += [{"role": "assistant", "content": r1.choices[0].message.content},
                 {"role": "user", "content": "Which of them is the longest?"}]

    def turn2(**extra):
        r = client.chat.completions.create(model=srv.model, messages=messages, max_tokens=N, temperature=0,
                                           extra_body={"return_tokens": True, **extra})
        return r.choices[0].model_extra["tokens"], r.usage

    cached, u = turn2()
    fresh, u_fresh = turn2(cache_prompt=False)
    assert _cached(u) >= r1.usage.prompt_tokens and _cached(u_fresh) == 0  # the whole first turn came from the cache
    prompt = encode(target, render(format_for(target), messages), [m["content"] for m in messages])
    assert len(prompt) == u.prompt_tokens
    _same_or_near(target, prompt, cached, fresh)


@pytest.mark.model
def test_a_slot_reused_after_a_different_prompt_is_exact(srv, client, target):
    head = "A list of the planets of the solar system, in order from the sun:"
    one, _ = _complete(client, srv, head + " Mercury, Venus,")
    other = head + " the largest of them is"
    a, b = target.tokenize(head + " Mercury, Venus,"), target.tokenize(other)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    got, u = _complete(client, srv, other)
    assert _cached(u) == shared  # the first prompt's tail (and its output) dropped, the rest reused
    fresh, _ = _complete(client, srv, other, cache_prompt=False)
    _same_or_near(target, b, got, fresh)
    back, u_back = _complete(client, srv, head + " Mercury, Venus,")  # the slot now holds the other prompt
    assert _cached(u_back) >= shared
    _same_or_near(target, a, back, one)


@pytest.mark.model
def test_a_prompt_whose_slot_was_taken_is_loaded_from_host_memory(srv, client, target):
    from test_server import _metrics

    long = PROMPT + LONGER
    assert len(target.tokenize(long)) > 40  # longer than promptstore.MIN_SAVE: worth saving
    first, _ = _complete(client, srv, long)
    for other in ("Rain fell on the old stone bridge while", "Seven ways to cook rice, from the simplest:",
                  "In 1969 the first humans walked on the moon, and"):  # two slots: the first prompt's is taken
        _complete(client, srv, other)
    loads = _metrics(srv)["specgen_prompt_store_loads_total"]
    again, u = _complete(client, srv, long)
    assert _metrics(srv)["specgen_prompt_store_loads_total"] == loads + 1
    assert _cached(u) == u.prompt_tokens - 1
    fresh, _ = _complete(client, srv, long, cache_prompt=False)
    _same_or_near(target, target.tokenize(long), again, fresh)
    _same_or_near(target, target.tokenize(long), first, fresh)


@pytest.mark.model
def test_metrics_count_cached_prompt_tokens(srv, client):
    from test_server import _metrics

    before = _metrics(srv)
    _, u1 = _complete(client, srv, PROMPT + " the")
    _, u2 = _complete(client, srv, PROMPT + " the")
    after = _metrics(srv)
    assert after["specgen_prompt_cache_enabled"] == 1
    moved = after["specgen_prompt_tokens_cached_total"] - before["specgen_prompt_tokens_cached_total"]
    assert moved == _cached(u1) + _cached(u2) and _cached(u2) > 0


@pytest.mark.model
def test_no_prompt_cache_prefills_every_prompt(gemma_path, target):
    import openai

    from test_server import KEY, Running, _metrics

    s = Running(gemma_path, parallel=1, prompt_cache=False)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        first, u1 = _complete(c, s, PROMPT)
        again, u2 = _complete(c, s, PROMPT)
        assert _cached(u1) == _cached(u2) == 0
        assert _metrics(s)["specgen_prompt_cache_enabled"] == 0
        assert _metrics(s)["specgen_prompt_tokens_cached_total"] == 0
        _same_or_near(target, target.tokenize(PROMPT), first, again)
    finally:
        s.close()


def test_serve_has_the_prompt_cache_switch():
    from typer.testing import CliRunner

    from specgen.cli import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert out.exit_code == 0 and "--no-prompt-cache" in out.output


@pytest.mark.model
def test_a_copied_prefix_reads_as_its_prefill_and_outlives_its_source(gemma_path):
    from specgen.engine.llama import Engine
    from test_model import TIE_MARGIN

    with Engine(gemma_path, n_ctx=512, n_threads=2, n_seq_max=2, kv_unified=True) as eng:
        passage = eng.tokenize("The ferry leaves the harbour at 7:15, 9:40 and 13:05; tickets cost 4 euros.\n")
        tail = eng.tokenize("Question: when does the second ferry leave?\nAnswer:", add_special=False)
        fresh = eng.sync(0, passage + tail).copy()  # the whole prompt prefilled in one sequence
        eng.truncate(0, 0)
        eng.sync(0, passage + eng.tokenize("Question: what do tickets cost?", add_special=False))
        eng.copy_prefix(0, 1, len(passage))
        assert eng.kv_tokens(1) == passage
        eng.truncate(0, 0)  # the source goes; its cells are taken by another prompt as long
        eng.sync(0, eng.tokenize("An unrelated text " * 12))
        row = eng.decode(1, tail, 1)[0]
        assert eng.kv_tokens(1) == passage + tail
        assert np.abs(row - fresh).max() < TIE_MARGIN  # batch-shape noise only: the copied cells were kept
        top = np.sort(fresh)[-2:]
        assert int(row.argmax()) == int(fresh.argmax()) or top[1] - top[0] < TIE_MARGIN
