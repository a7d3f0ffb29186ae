"""`specgen bench --endpoint` against other engines: where each speculative figure comes from.

Stub servers on 127.0.0.1 (tests/helpers.loopback_server, in a thread of
their own) answer as three kinds of server do: one with vLLM's per-request
`metrics.speculative_decoding` in its responses, one with Prometheus
counters only (vLLM's names, or llama-server's), and one started for
speculation that never drafts (llama-server's timings without draft_n).
Every figure names its source in the record; an endpoint named as
speculative whose requests never drafted gets one warning line.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import pytest

from helpers import loopback_server
from specgen.bench.endpoint.measure import Endpoint
from specgen.bench.endpoint.spec_sources import asks_speculation, counter_delta, parse_positions, spec_stats, vllm_request_stats
from specgen.bench.records import speculation_check
from specgen.cli.render_http import speculation_lines

# vLLM's per-request metrics for every request (3 drafts a step, 4 steps; steps accepting 0, 1, 2, 3)
VLLM_SPEC = {"mean_acceptance_length": 2.75, "draft_acceptance_rate": 7 / 12, "acceptance_histogram": [0, 2, 1, 1],
             "num_spec_steps": 4, "num_accepted_draft_tokens": 7, "num_draft_tokens": 12, "num_spec_tokens": 3}
PER_REQUEST = {"rounds": 3, "drafted": 9, "accepted": 4, "per_pos": [2, 1, 1]}  # what a counters-only stub adds


class Stub:
    """A raw HTTP/1.1 OpenAI-style streaming server (keep-alive, Content-Length bodies) in its own thread.

    final(body) → extra keys of the last chunk (usage is always there);
    metrics() → the /metrics text, or None for a 404; on_request(body) runs
    as a request is answered (a counter moves before the response ends).
    """

    def __init__(self, final=None, metrics=None, on_request=None) -> None:
        self.final, self.metrics, self.on_request = final or (lambda body: {}), metrics, on_request
        self.bodies: list[dict] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.server, self.url = self.loop.run_until_complete(loopback_server(self.handle))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def close(self) -> None:
        def stop():
            self.server.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(stop)
        self.thread.join(10)

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.split(b" ", 2)[:2]
                m = re.search(rb"(?i)content-length: *(\d+)", head)
                raw = await reader.readexactly(int(m.group(1))) if m else b""
                status, ctype, data = self.answer(method.decode(), path.decode(), raw)
                writer.write(b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, ctype.encode(), len(data), data))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def answer(self, method: str, path: str, raw: bytes) -> tuple[int, str, bytes]:
        if method == "GET" and path == "/v1/models":
            return 200, "application/json", json.dumps({"object": "list", "data": [{"id": "stub"}]}).encode()
        if method == "GET" and path == "/metrics":
            text = self.metrics() if self.metrics else None
            return (404, "text/plain", b"not found") if text is None else (200, "text/plain; version=0.0.4", text.encode())
        body = json.loads(raw)
        self.bodies.append(body)
        if self.on_request:
            self.on_request(body)
        n = int(body.get("max_tokens", 4))
        events = [{"choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]} for i in range(n)]
        events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3},
                       **self.final(body)})
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return 200, "text/event-stream", data.encode()


class Counters:
    """Prometheus counters that move by PER_REQUEST at each request, in vLLM's or llama-server's names."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.c = {"rounds": 100, "drafted": 1000, "accepted": 500, "per_pos": [300, 150, 50]}  # a server running for a while

    def bump(self, body) -> None:
        for k, v in PER_REQUEST.items():
            self.c[k] = [a + b for a, b in zip(self.c[k], v)] if k == "per_pos" else self.c[k] + v

    def text(self) -> str:
        c = self.c
        if self.family == "vllm":
            lab = 'engine="0",model_name="stub"'
            lines = ["# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} 0.0",
                     "# TYPE vllm:spec_decode_num_drafts_total counter", f"vllm:spec_decode_num_drafts_total{{{lab}}} {c['rounds']}.0",
                     f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {c['drafted']}.0",
                     f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {c['accepted']}.0"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}.0'
                      for i, v in enumerate(c["per_pos"])]
        else:
            lines = ["llamacpp:n_decode_total 7", f"llamacpp:spec_decode_num_drafts_total {c['rounds']}",
                     f"llamacpp:spec_decode_num_draft_tokens_total {c['drafted']}",
                     f"llamacpp:spec_decode_num_accepted_tokens_total {c['accepted']}"]
            lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                      for i, v in enumerate(c["per_pos"])]
        return "\n".join(lines) + "\n"


@pytest.fixture()
def stubs():
    made = []

    def make(**kw) -> Stub:
        made.append(Stub(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def cli(capsys, *args) -> tuple[int, str, str]:
    from specgen.cli import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def write_requests(path: Path, n: int = 2) -> Path:
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n)))
    return path


def bench(capsys, tmp_path, base: Stub, spec: Stub, *extra) -> tuple[dict, list[dict], str]:
    """Sequential bench of two endpoints (base the baseline); (--json object, records, stderr)."""
    out = tmp_path / "rec.jsonl"
    code, stdout, err = cli(capsys, "bench", write_requests(tmp_path / "r.jsonl"), "--endpoint", f"base={base.url}",
                            "--endpoint", f"spec={spec.url}", "--baseline", "base", "-n", "4", "--out", out, "--json",
                            *extra)
    assert code == 0, err
    assert "Traceback" not in err
    return json.loads(stdout), [json.loads(x) for x in out.read_text().splitlines()[1:]], err


def runs_of(recs: list[dict], name: str) -> list[dict]:
    return [x for r in recs for x in r["runs"] if x["config"] == name]


# =========================================================== pure parts


def test_vllm_per_request_metrics_in_the_benchs_names():
    s = vllm_request_stats(VLLM_SPEC)
    assert (s["spec_source"], s["rounds"], s["drafted"], s["accepted"], s["draft_max"]) == ("vllm", 4, 12, 7, 3)
    assert s["per_position"] == [1.0, 0.5, 0.25] and s["k_hist"] == {"3": 4}
    assert s["spec_sources"] == {"rounds": "vllm", "drafted": "vllm", "accepted": "vllm", "per_position": "vllm"}
    # the response's own figures come first: specgen's block, then vLLM's metrics, then llama-server's timings
    assert spec_stats(None, {"predicted_n": 4, "prompt_ms": 1, "predicted_ms": 2}, {"speculative_decoding": VLLM_SPEC})["spec_source"] == "vllm"
    t = spec_stats(None, {"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": 4, "predicted_ms": 2.0})
    assert (t["spec_source"], t["drafted"], t["accepted"]) == ("llama-server", 0, 0)  # llama-server omits draft_n at 0
    assert t["spec_sources"]["rounds"] is None and t["spec_sources"]["drafted"] == "llama-server"
    assert spec_stats(None, None, {"other": 1})["spec_source"] is None


def test_counters_parse_per_position_and_differ_position_by_position():
    text = ('vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 1.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0 1700000000\n')
    assert parse_positions(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total") == [9.0, 5.0]
    assert counter_delta({"drafted": 10.0, "per_pos": [1.0]}, {"drafted": 13.0, "per_pos": [2.0, 1.0]}) == {
        "drafted": 3, "per_pos": [1, 1]}


def test_which_endpoints_are_named_as_speculative():
    assert asks_speculation({"speculative": {"mode": "none"}}) is False and asks_speculation({"speculative": {"k": 0}}) is False
    assert asks_speculation({"speculative": {"k": 2}}) is True and asks_speculation({"speculative.n_max": 8}) is True
    assert asks_speculation({"speculative.n_max": 0}) is False and asks_speculation({"top_k": 1}) is None
    base, other = Endpoint("b", "http://x", kind="plain"), Endpoint("o", "http://x")
    asked = Endpoint("a", "http://x", body={"speculative": {"k": 4}}, kind="plain")
    off = Endpoint("f", "http://x", body={"speculative": {"mode": "none"}})
    assert [e.speculative for e in (base, other, asked, off)] == [False, True, True, False]
    recs = [{"type": "request", "runs": [{"config": "o", "spec_source": "llama-server", "drafted": 0},
                                         {"config": "a", "spec_source": None, "drafted": 0},
                                         {"config": "b", "spec_source": "llama-server", "drafted": 0}]}]
    checks = speculation_check(recs, [base, other, asked, off])
    assert [c["engaged"] for c in checks] == [False, False, None, None]
    lines = speculation_lines(checks)
    assert lines[0] == "warning: endpoint o: speculation did not engage: none of its 1 request drafted a token (from llama-server)"
    assert lines[1].startswith("note: endpoint a is compared as speculative but reports no speculative statistics")
    assert len(lines) == 2  # the baseline and the endpoint that turned speculation off: nothing to say


# =========================================================== against stub servers


def test_a_server_with_vllm_per_request_metrics(stubs, tmp_path, capsys):
    base = stubs()
    spec = stubs(final=lambda body: {"metrics": {"speculative_decoding": VLLM_SPEC}})
    obj, recs, err = bench(capsys, tmp_path, base, spec)
    runs = runs_of(recs, "spec")
    assert len(runs) == 2
    for x in runs:
        assert (x["spec_source"], x["rounds"], x["drafted"], x["accepted"]) == ("vllm", 4, 12, 7)
        assert x["spec_sources"]["drafted"] == "vllm" and x["per_position"] == [1.0, 0.5, 0.25]
        assert x["server_spec"] == VLLM_SPEC
    assert all(x["spec_source"] is None for x in runs_of(recs, "base"))  # a stub that reports nothing
    check = {c["endpoint"]: c for c in obj["speculation"]}
    assert check["spec"]["engaged"] is True and check["spec"]["sources"] == ["vllm"] and check["spec"]["drafted"] == 24
    assert obj["warnings"] == [] and "did not engage" not in err


@pytest.mark.parametrize("family", ["vllm", "llamacpp"])
def test_a_server_with_counters_only_is_read_by_counter_deltas_one_request_at_a_time(stubs, tmp_path, capsys, family):
    counters = Counters(family)
    base = stubs()
    spec = stubs(metrics=counters.text, on_request=counters.bump)
    obj, recs, err = bench(capsys, tmp_path, base, spec)
    assert f"spec counters: /metrics ({family})" in err
    runs = runs_of(recs, "spec")
    assert len(runs) == 2
    for x in runs:  # each request ran alone: the difference is this request's, not the server's lifetime
        assert x["spec_source"] == f"metrics-delta:{family}"
        assert (x["rounds"], x["drafted"], x["accepted"]) == (3, 9, 4)
        assert x["per_position"] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
        assert set(x["spec_sources"].values()) == {f"metrics-delta:{family}"}
    assert obj["speculation"][1]["engaged"] is True and obj["warnings"] == []


def test_counters_are_not_split_per_request_when_requests_overlap(stubs, tmp_path, capsys):
    counters = Counters("vllm")
    base, spec = stubs(), stubs(metrics=counters.text, on_request=counters.bump)
    out = tmp_path / "rec.jsonl"
    code, stdout, err = cli(capsys, "bench", write_requests(tmp_path / "r.jsonl", 3), "--endpoint", f"base={base.url}",
                            "--endpoint", f"spec={spec.url}", "--baseline", "base", "-n", "4", "--concurrency", "2",
                            "--count", "4", "--out", out, "--json")
    assert code == 0, err
    batch = next(json.loads(x) for x in out.read_text().splitlines()[1:] if json.loads(x)["config"] == "spec")
    assert all(r["spec_source"] is None for r in batch["requests"])  # two in flight: no per-request delta
    c = batch["server_counters"]
    assert c["source"] == "metrics-delta:vllm" and (c["rounds"], c["drafted"], c["accepted"]) == (12, 36, 16)
    assert c["per_pos"] == [8, 4, 4]
    assert json.loads(stdout)["warnings"] == []


def test_a_speculative_config_that_never_drafts_gets_one_warning(stubs, tmp_path, capsys):
    never = {"timings": {"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": 4, "predicted_ms": 4.0}}  # no draft_n: 0
    base, spec = stubs(final=lambda body: never), stubs(final=lambda body: never)
    obj, recs, err = bench(capsys, tmp_path, base, spec, "--endpoint-body", 'spec={"speculative.n_max": 8}')
    assert all(b.get("speculative.n_max") == 8 for b in spec.bodies)
    assert all(x["spec_source"] == "llama-server" and x["drafted"] == 0 for x in runs_of(recs, "spec"))
    line = "warning: endpoint spec: speculation did not engage: none of its 2 requests drafted a token (from llama-server)"
    assert obj["warnings"] == [line]
    assert err.count(line) == 1 and err.count("did not engage") == 1  # the baseline is not named as speculative
    assert obj["speculation"][1]["engaged"] is False and obj["speculation"][0]["speculative"] is False


def test_a_baseline_asked_to_speculate_is_checked_too_and_a_silent_server_gets_a_note(stubs, tmp_path, capsys):
    never = {"metrics": {"speculative_decoding": {**VLLM_SPEC, "num_spec_steps": 0, "num_draft_tokens": 0,
                                                  "num_accepted_draft_tokens": 0, "acceptance_histogram": [0, 0, 0, 0]}}}
    base, spec = stubs(final=lambda body: never), stubs()
    obj, _, err = bench(capsys, tmp_path, base, spec, "--endpoint-body", 'base={"speculative": {"k": 4}}')
    assert obj["warnings"][0] == ("warning: endpoint base: speculation did not engage: none of its 2 requests "
                                  "drafted a token (from vllm)")
    assert obj["warnings"][1].startswith("note: endpoint spec is compared as speculative but reports no speculative")
    assert len(obj["warnings"]) == 2 and all(w in err for w in obj["warnings"])


def test_a_level_at_concurrency_one_counts_its_drafts_once():
    reqs = [{"spec_source": "metrics-delta:vllm", "drafted": 9}, {"spec_source": "metrics-delta:vllm", "drafted": 9}]
    recs = [{"type": "serve", "config": "o", "requests": reqs, "server_counters": {"drafted": 18, "source": "metrics-delta:vllm"}},
            {"type": "serve", "config": "o", "requests": [{"spec_source": None, "drafted": 0}],
             "server_counters": {"drafted": 5, "source": "metrics-delta:vllm"}}]
    [check] = speculation_check(recs, [Endpoint("o", "http://x")])
    assert (check["drafted"], check["requests"], check["engaged"]) == (23, 3, True)
    assert check["sources"] == ["metrics-delta:vllm"]
