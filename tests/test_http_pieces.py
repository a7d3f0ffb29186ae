"""The HTTP app's pieces without a model: SSE framing of a request's events,
strict JSON bodies, and the /metrics gauges (the app end to end: test_server.py)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from specgen.serve.http import schema as S
from specgen.serve.http.app import gauges
from specgen.serve.http.intake import parse_json
from specgen.serve.http.responses import DONE, sse_lines

RECORD = {"prompt_tokens": 3, "generated_tokens": 2, "cached_tokens": 1, "rounds": 1, "drafted": 4, "accepted": 1,
          "acceptance_rate": 0.25, "mean_accepted_len": 1.0, "k_hist": {"4": 1}, "queue_s": 0.0, "ttft_s": 0.1,
          "latency_s": 0.2, "tokens_per_s": 10.0, "tokens": [7, 8]}


def _lines(kind: str, events: list[tuple], include_usage: bool = False) -> tuple[list[str], object]:
    async def run():
        req = SimpleNamespace(job=SimpleNamespace(id="cmpl-x"), spec=S.Spec("lookup", 4, "fixed"),
                              events=asyncio.Queue(), ended=False)
        for ev in events:
            req.events.put_nowait(ev)
        return [line async for line in sse_lines(req, kind, "m", include_usage)], req

    return asyncio.run(run())


def _objects(lines: list[str]) -> list[dict]:
    assert lines[-1] == DONE == "data: [DONE]\n\n"
    for line in lines:
        assert line.startswith("data: ") and line.endswith("\n\n") and "\n" not in line[:-2]
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_a_completion_streams_its_text_then_a_finish_chunk_with_usage():
    lines, req = _lines("completion", [("text", "a"), ("text", "é"), ("done", "max_tokens", RECORD, "aé")])
    first, second, last = _objects(lines)
    assert req.ended
    assert [c["choices"][0]["text"] for c in (first, second)] == ["a", "é"] and "é" in lines[1]  # not \u-escaped
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"] == S.usage(3, 2, 1) and last["speculative"]["drafted"] == 4


def test_include_usage_puts_the_blocks_on_a_chunk_without_choices():
    *_, finish, tail = _objects(_lines("completion", [("done", "eos", RECORD, "")], include_usage=True)[0])
    assert finish["choices"][0]["finish_reason"] == "stop" and "usage" not in finish
    assert tail["choices"] == [] and tail["usage"]["total_tokens"] == 5 and tail["speculative"]["k_max"] == 4


def test_a_chat_opens_with_the_role_and_an_error_ends_the_stream():
    err = S.ApiError(500, "boom", code="engine_error", type="server_error")
    role, text, error = _objects(_lines("chat", [("text", "hi"), ("error", err)])[0])
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert text["choices"][0]["delta"] == {"content": "hi"}
    assert error == err.body()


@pytest.mark.parametrize("data, what", [(b'{"a": NaN}', "NaN is not valid JSON"), (b"\xff", "not UTF-8"),
                                        (b"{", "not valid JSON")])
def test_bodies_must_be_strict_utf8_json(data, what):
    with pytest.raises(S.ApiError) as e:
        parse_json(data)
    assert e.value.status == 400 and e.value.code == "invalid_json" and what in e.value.message


def test_gauges_add_the_store_and_the_gate_only_when_the_server_has_them():
    server = SimpleNamespace(steps=5, prompt_cache=True)
    engine = SimpleNamespace(running=1, waiting=2, inflight=3, parallel=4, lingers=(1, 2, 0.5), server=server)
    plain = gauges(engine)
    assert plain["specgen_decode_steps_total"][1] == 5 and plain["specgen_prompt_cache_enabled"][1] == 1
    assert not any("store" in k or "shared" in k for k in plain)
    server.store = type("Store", (), {"bytes": 100, "loaded": 2, "__len__": lambda self: 3})()
    server.gate = SimpleNamespace(steps=[(1, 2), (3, 4)])
    full = gauges(engine)
    assert full["specgen_prompt_store_states"][1] == 3 and full["specgen_prompt_store_bytes"][1] == 100
    assert full["specgen_shared_steps_drafting_total"][1] == 4 and full["specgen_shared_steps_plain_total"][1] == 6
