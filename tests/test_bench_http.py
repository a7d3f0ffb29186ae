"""`specgen bench --endpoint`: the bench over HTTP.

Pure parts first (endpoint options, request bodies, the Poisson schedule,
the servers' speculative counters), then a stub OpenAI server on 127.0.0.1
for every failure path (HTTP 500, timeouts, malformed SSE, a connection cut
mid-stream, a stream without [DONE], an unreachable port, a 401, a server
that is not OpenAI-compatible, Ctrl-C), then a real `specgen serve` (the
embedded Gemma 3 270M, in a thread) as both configurations: speculation on,
and off through a body override.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import loopback_server, read_request, sigint_default
from openai_stub import StubServer
from specgen.bench.endpoint.measure import (
    Endpoint, Sampling, error_text, merge, parse_endpoints, request_body, run_measures, stream_one,
)
from specgen.bench.endpoint.spec_sources import parse_counters, spec_stats
from specgen.bench.endpoint.load import parse_levels, poisson_arrivals
from specgen.bench.requests import Request
from specgen.bench.endpoint.client import SseLines, StreamPool
from specgen.errors import SpecgenError

ROOT = Path(__file__).resolve().parent.parent
OFF = '{"speculative": {"mode": "none"}}'


def cli(capsys, *args) -> tuple[int, str, str]:
    from specgen.cli import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def records(path: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return lines[0], lines[1:]


def write_requests(path: Path, prompts: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"id": k, "prompt": v}) + "\n" for k, v in prompts.items()))
    return path


# =========================================================== pure parts


def test_endpoints_parse_with_the_baseline_first_and_their_options(monkeypatch):
    monkeypatch.setenv("BENCH_KEY", "k1")
    eps = parse_endpoints(
        ["spec=http://127.0.0.1:8080/v1/", "plain=https://h.example:9000"],
        models=["plain=m7"], key_envs=["spec=BENCH_KEY"],
        bodies=[f"plain={OFF}", 'plain={"speculative": {"k": 2}, "top_k": 1}'], baseline="plain",
    )
    assert [(e.name, e.kind) for e in eps] == [("plain", "plain"), ("spec", "http")]
    assert eps[1].url == "http://127.0.0.1:8080" and eps[0].url == "https://h.example:9000"
    assert eps[0].model == "m7" and eps[1].model is None
    assert eps[0].body == {"speculative": {"mode": "none", "k": 2}, "top_k": 1}  # merged key by key
    assert eps[1].headers == {"Authorization": "Bearer k1"} and eps[0].headers == {}
    assert "k1" not in json.dumps([e.meta() for e in eps])  # the key never reaches the records


@pytest.mark.parametrize("kw, message", [
    ({"endpoints": ["a=http://x:1"]}, "at least two --endpoint"),
    ({"endpoints": ["a=http://x:1", "a=http://x:2"]}, "--endpoint a given twice"),
    ({"endpoints": ["a=ftp://x", "b=http://x:2"]}, "expected an http:// or https:// URL"),
    ({"endpoints": ["a", "b=http://x:2"]}, "expected NAME=VALUE"),
    ({"endpoints": ["a=http://x:1", "b=http://x:2"], "models": ["c=m"]}, "--endpoint-model c: no --endpoint named c"),
    ({"endpoints": ["a=http://x:1", "b=http://x:2"], "bodies": ["a=[1]"]}, "expected a JSON object"),
    ({"endpoints": ["a=http://x:1", "b=http://x:2"], "bodies": ["a={x"]}, "invalid JSON"),
    ({"endpoints": ["a=http://x:1", "b=http://x:2"], "key_envs": ["a=SPECGEN_SURELY_UNSET"]}, "is not set"),
    ({"endpoints": ["a=http://x:1", "b=http://x:2"], "baseline": "z"}, "--baseline z: no --endpoint named z"),
])
def test_bad_endpoint_options_are_one_clear_error(kw, message):
    with pytest.raises(SpecgenError, match=message):
        parse_endpoints(kw.pop("endpoints"), **kw)


def test_levels_parse_sorted_and_bounded():
    assert parse_levels("16,1,4,4", "--concurrency", integer=True) == [1, 4, 16]
    assert parse_levels("5/s, 0.5,2", "--rate", integer=False) == [0.5, 2, 5]
    for bad in ("0", "x", "-1", "2000"):
        with pytest.raises(SpecgenError, match="--concurrency"):
            parse_levels(bad, "--concurrency", integer=True)


def test_request_bodies_stream_and_take_the_overrides_last():
    ep = Endpoint("p", "http://h", model="m", body={"speculative": {"mode": "none"}, "temperature": 0.5})
    s = Sampling(max_tokens=9, temperature=0.0, seed=3, ignore_eos=True)
    path, body = request_body(ep, Request("a", prompt="hi", max_tokens=5), s)
    assert path == "/v1/completions" and body["prompt"] == "hi" and body["model"] == "m"
    assert body["max_tokens"] == 5 and body["seed"] == 3 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.5 and body["speculative"] == {"mode": "none"}
    path, body = request_body(Endpoint("q", "http://h"), Request("b", messages=(("user", "yo"),), seed=8), s)
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "yo"}]
    assert body["max_tokens"] == 9 and body["seed"] == 8 and "model" not in body
    assert merge({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}


def test_poisson_schedule_has_the_rate_and_stays_in_bounds():
    t = poisson_arrivals(5.0, 4000, seed=1)
    gaps = [b - a for a, b in zip([0.0, *t], t)]
    assert len(t) == 4000 and all(g > 0 for g in gaps)
    assert abs(sum(gaps) / len(gaps) - 0.2) < 0.01  # mean gap 1/rate
    assert abs(sum(g < 0.2 for g in gaps) / len(gaps) - (1 - 2.718281828 ** -1)) < 0.03  # exponential: P(gap < mean)
    cut = poisson_arrivals(5.0, 4000, duration=10.0, seed=1)
    assert cut == t[: len(cut)] and cut[-1] < 10.0 <= t[len(cut)] and 30 < len(cut) < 75
    assert poisson_arrivals(5.0, 3, seed=2) == poisson_arrivals(5.0, 3, seed=2) != poisson_arrivals(5.0, 3, seed=3)


def test_speculative_counters_of_each_server_kind():
    block = {"mode": "lookup", "k_max": 8, "rounds": 5, "drafted": 20, "accepted": 12, "k_hist": {"0": 1, "8": 4},
             "queue_s": 0.01, "latency_s": 0.3}
    s = spec_stats(block, None)
    assert (s["spec_source"], s["rounds"], s["drafted"], s["accepted"], s["draft_max"]) == ("specgen", 5, 20, 12, 8)
    ls = spec_stats(None, {"prompt_ms": 10.0, "predicted_ms": 90.0, "draft_n": 30, "draft_n_accepted": 21})
    assert (ls["spec_source"], ls["drafted"], ls["accepted"], ls["rounds"]) == ("llama-server", 30, 21, 0)
    assert ls["server_latency_s"] == pytest.approx(0.1)
    assert spec_stats(None, {"prompt_ms": 1, "predicted_ms": 2})["spec_source"] is None
    text = ('# HELP x\nvllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} 40.0\n'
            'vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="1"} 2\n'
            'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 30\nother 5\n')
    c = parse_counters(text, ["vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"])
    assert c == {"vllm:spec_decode_num_draft_tokens_total": 42.0, "vllm:spec_decode_num_accepted_tokens_total": 30.0}


def test_measures_from_a_stream():
    raw = {"status": 200, "ttft_s": 0.1, "total_s": 0.5, "chunk_s": [0.1, 0.2, 0.3, 0.5], "text": "abcd",
           "usage": {"completion_tokens": 9, "prompt_tokens": 4}, "speculative": None, "timings": None,
           "finish_reason": "length"}
    m = run_measures(raw)
    assert m["generated_tokens"] == 9 and m["tokens_from"] == "usage" and m["prompt_tokens"] == 4
    assert m["decode_s"] == pytest.approx(0.4) and m["tpot_s"] == pytest.approx(0.05)
    assert m["itl_p50_s"] == pytest.approx(0.1) and m["chunks"] == 4
    assert run_measures({**raw, "usage": None})["generated_tokens"] == 4  # no usage: chunks counted
    assert error_text(b'{"error": {"message": "nope"}}') == "nope" and error_text(b"plain words") == "plain words"


# =========================================================== a stub server: failures


@pytest.fixture(scope="module")
def stub():
    s = StubServer(delay=0.001)
    yield s
    s.close()


def test_failed_requests_are_recorded_and_counted_and_the_run_goes_on(stub, tmp_path, capsys):
    reqs = write_requests(tmp_path / "r.jsonl", {
        "ok": "fine", "e500": "!500", "slow": "!slow", "bad-sse": "!malformed", "cut": "!disconnect",
        "no-done": "!nodone", "ok2": "also fine",
    })
    out = tmp_path / "rec.jsonl"
    code, stdout, err = cli(capsys, "bench", reqs, "--endpoint", f"a={stub.url}", "--endpoint", f"b={stub.url}",
                            "-n", "4", "--timeout", "1", "--out", out, "--json")
    assert code == 0, err
    _, recs = records(out)
    by_id = {r["id"]: r for r in recs}
    assert list(by_id) == ["ok", "e500", "slow", "bad-sse", "cut", "no-done", "ok2"]
    for rid in ("ok", "ok2"):
        assert not by_id[rid]["failed"] and len(by_id[rid]["runs"]) == 2 and "b" in by_id[rid]["speedup"]
        assert all(x["generated_tokens"] == 4 and x["spec_source"] == "llama-server" for x in by_id[rid]["runs"])
    expect = {"e500": "HTTP 500: the stub failed on purpose", "slow": "timed out after 1 s",
              "bad-sse": "malformed SSE", "cut": "closed the connection mid-response",
              "no-done": "ended without data: [DONE]"}
    for rid, text in expect.items():
        r = by_id[rid]
        assert r["runs"] == [] and r["speedup"] == {} and len(r["failed"]) == 2, rid
        assert all(text in f["error"] for f in r["failed"]), (rid, r["failed"])
    assert by_id["e500"]["failed"][0]["status"] == 500
    obj = json.loads(stdout)
    assert obj["latency"]["a"]["failed"] == obj["latency"]["b"]["failed"] == 5
    assert obj["latency"]["a"]["runs"] == 2 and obj["summary"]["b"]["overall"]["requests"] == 2
    assert "failed" in err and "Traceback" not in err


def test_unreachable_port_is_one_line(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before use: nothing listens there
    code, _, err = cli(capsys, "bench", "--endpoint", f"a=http://127.0.0.1:{port}", "--endpoint", f"b=http://127.0.0.1:{port}")
    assert code == 2 and err.count("\n") == 1
    assert f"endpoint a (http://127.0.0.1:{port}): connection refused" in err


def test_missing_key_is_one_line_and_the_key_from_the_environment_works(tmp_path, capsys, monkeypatch):
    s = StubServer(key="sekrit")
    try:
        code, _, err = cli(capsys, "bench", "--endpoint", f"a={s.url}", "--endpoint", f"b={s.url}")
        assert code == 2 and err.count("\n") == 1 and "authentication failed (HTTP 401" in err
        assert "--endpoint-key-env a=VAR" in err
        monkeypatch.setenv("STUB_KEY", "sekrit")
        reqs = write_requests(tmp_path / "r.jsonl", {"x": "hello"})
        code, out, err = cli(capsys, "bench", reqs, "--endpoint", f"a={s.url}", "--endpoint", f"b={s.url}",
                             "--endpoint-key-env", "a=STUB_KEY", "--endpoint-key-env", "b=STUB_KEY", "-n", "3", "--json")
        assert code == 0, err
        assert json.loads(out)["latency"]["b"]["runs"] == 1
    finally:
        s.close()


def test_a_server_that_is_not_openai_compatible_is_one_line(stub, capsys):
    code, _, err = cli(capsys, "bench", "--endpoint", f"a={stub.url}/elsewhere", "--endpoint", f"b={stub.url}")
    assert code == 2 and err.count("\n") == 1
    assert "not an OpenAI-compatible server: GET /v1/models answered HTTP 404" in err


def test_http_only_options_need_an_endpoint(capsys):
    code, _, err = cli(capsys, "bench", "--rate", "2")
    assert code == 2 and "--rate needs --endpoint" in err
    code, _, err = cli(capsys, "bench", "--endpoint", "a=http://x:1", "--endpoint", "b=http://x:2", "-C", "lookup")
    assert code == 2 and "-C/--config configures the in-process bench" in err


def test_ctrl_c_keeps_finished_records_and_resume_finishes(tmp_path):
    s = StubServer(delay=0.04)
    try:
        reqs = write_requests(tmp_path / "r.jsonl", {f"q{i}": f"prompt {i}" for i in range(12)})
        out = tmp_path / "rec.jsonl"
        args = [sys.executable, "-m", "specgen", "bench", str(reqs), "--endpoint", f"a={s.url}", "--endpoint",
                f"b={s.url}", "-n", "5", "--out", str(out), "--no-warmup"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=sigint_default)
        t0 = time.monotonic()
        while not (out.exists() and out.read_text().count("\n") >= 3):  # meta + two requests
            assert time.monotonic() - t0 < 300 and p.poll() is None, p.stderr.read().decode() if p.poll() is not None else "slow"
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 130, err.decode()
        assert "interrupted:" in err.decode() and "Traceback" not in err.decode()
        _, kept = records(out)
        assert 2 <= len(kept) < 12 and all(len(r["runs"]) == 2 for r in kept)
        sent = s.stats.requests
        done = subprocess.run(args + ["--resume"], capture_output=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr.decode()
        _, finished = records(out)
        assert [r["id"] for r in finished] == [f"q{i}" for i in range(12)]
        assert finished[: len(kept)] == kept
        assert s.stats.requests - sent == 2 * (12 - len(kept))  # only what was missing was sent
    finally:
        s.close()


def test_load_levels_on_the_stub_and_their_report(stub, tmp_path, capsys):
    pytest.importorskip("plotly")
    from specgen.bench.report import load_records, build_report

    reqs = write_requests(tmp_path / "r.jsonl", {f"q{i}": f"prompt {i}" for i in range(6)})
    out, page = tmp_path / "rec.jsonl", tmp_path / "r.html"
    code, stdout, err = cli(capsys, "bench", reqs, "--endpoint", f"a={stub.url}", "--endpoint", f"b={stub.url}",
                            "-n", "6", "--concurrency", "1,3", "--rate", "40", "--count", "9", "--out", out,
                            "--report", page, "--json")
    assert code == 0, err
    meta, recs = records(out)
    assert [(r["load"], r["concurrency"] or r["rate"], r["config"]) for r in recs] == [
        ("concurrency", 1, "a"), ("concurrency", 1, "b"), ("concurrency", 3, "b"), ("concurrency", 3, "a"),
        ("rate", 40, "a"), ("rate", 40, "b")]
    for r in recs:
        assert r["requests_sent"] == r["requests_served"] == 9 and r["failed"] == 0
        assert [x["id"] for x in r["requests"]] == [f"q{i % 6}" for i in range(9)]  # the set, cycled
    summary = json.loads(stdout)["summary"]
    assert set(summary) == {"concurrency", "rate"}
    assert summary["concurrency"]["per_level"]["3"]["b"]["request_speedup"]["requests"] == 9
    text = page.read_text()
    assert "rate-latency-throughput" in text and "per arrival rate level" in text and "a vs the other endpoints" in text
    assert build_report(*load_records(out)) == build_report(*load_records(out))


# =========================================================== the stream reader: lines, connections, TLS


def test_sse_lines_are_cut_wherever_the_reads_split_them():
    text = b'data: {"a": 1}\r\n\r\n: ping\n\nevent: x\ndata: {"b": 2}\n\ndata:{"c": 3}\r\rdata: [DONE]'
    want = [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}', b"[DONE]"]
    for cut in range(1, len(text)):
        lines = SseLines()
        assert lines.feed(text[:cut]) + lines.feed(text[cut:]) + lines.tail() == want, cut
    lines = SseLines()
    assert [x for i in range(len(text)) for x in lines.feed(text[i:i + 1])] + lines.tail() == want
    assert lines.tail() == [] and SseLines().feed(b": only a comment\n\n") == []


ONE_TOKEN = (b'data: {"choices": [{"text": "hi", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}\n\n'
             b"data: [DONE]\n\n")


async def sized_server(answers: int, opened: list):
    """Answers `answers` requests a connection (a Content-Length body, kept alive), then closes the
    connection at the next request without answering it: a keep-alive timeout met in flight."""

    async def handle(reader, writer):
        opened.append(writer)
        try:
            for i in range(answers + 1):
                await read_request(reader)
                if i == answers:
                    break
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(ONE_TOKEN), ONE_TOKEN))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await loopback_server(handle)


@pytest.mark.parametrize("answers, connections", [(2, 3), (0, 5)])
def test_kept_alive_connections_are_reused_and_one_closed_unanswered_is_replaced_once(answers, connections):
    opened: list = []

    async def main():
        server, url = await sized_server(answers, opened)
        pool = StreamPool()
        try:
            return [await stream_one(pool, Endpoint("a", url), "/v1/completions", {"prompt": "x"}, 10) for _ in range(5)]
        finally:
            pool.close()
            server.close()

    results = asyncio.run(main())
    if answers:  # 5 requests, 2 a connection: the 3rd and 5th find theirs closed and go again on a new one
        assert [(r["error"], r["text"], r["status"]) for r in results] == [(None, "hi", 200)] * 5
        assert all(r["usage"] == {"completion_tokens": 1} and 0 < r["ttft_s"] <= r["total_s"] for r in results)
    else:  # a fresh connection closed unanswered is a failure, not sent again
        assert all(r["error"] == "the server closed the connection mid-response: before answering" for r in results)
    assert len(opened) == connections


def test_a_key_that_is_not_a_valid_header_is_a_failure_that_never_quotes_it(monkeypatch):
    monkeypatch.setenv("BENCH_KEY", "sekrit\nline two")
    ep = Endpoint("a", "http://127.0.0.1:9", key_env="BENCH_KEY")
    raw = asyncio.run(stream_one(StreamPool(), ep, "/v1/completions", {"prompt": "x"}, 5))
    assert raw["error"].startswith("cannot send the request") and "sekrit" not in raw["error"]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days",
                    "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True, timeout=120)
    return str(cert), str(key)


def test_https_endpoints_stream_over_tls_and_an_untrusted_certificate_is_a_tls_failure(tls_files, tmp_path, capsys,
                                                                                      monkeypatch):
    s = StubServer(ssl_files=tls_files, delay=0.001)
    try:
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        code, _, err = cli(capsys, "bench", "--endpoint", f"a={s.url}", "--endpoint", f"b={s.url}")
        assert code == 2 and err.count("\n") == 1 and f"endpoint a ({s.url}): TLS failure" in err

        async def one():
            pool = StreamPool()
            try:
                return await stream_one(pool, Endpoint("a", s.url), "/v1/completions", {"prompt": "x", "max_tokens": 2}, 10)
            finally:
                pool.close()

        assert asyncio.run(one())["error"].startswith("TLS failure")  # the stream checks the certificate too
        monkeypatch.setenv("SSL_CERT_FILE", tls_files[0])  # trusted now
        assert asyncio.run(one())["text"] == "t0 t1 "
        reqs = write_requests(tmp_path / "r.jsonl", {"x": "hello", "y": "there"})
        code, out, err = cli(capsys, "bench", reqs, "--endpoint", f"a={s.url}", "--endpoint", f"b={s.url}", "-n", "3",
                             "--json")
        assert code == 0, err
        lat = json.loads(out)["latency"]
        assert lat["a"]["runs"] == lat["b"]["runs"] == 2 and lat["a"]["failed"] == lat["b"]["failed"] == 0
    finally:
        s.close()


# =========================================================== a real `specgen serve`: on and off


@pytest.fixture(scope="module")
def serve(gemma_path):
    from test_server import KEY, Running

    s = Running(gemma_path, parallel=4, queue=16)  # open-loop arrivals may outnumber the slots
    os.environ["SPECGEN_TEST_SERVE_KEY"] = KEY
    yield s
    s.close()
    os.environ.pop("SPECGEN_TEST_SERVE_KEY", None)


def serve_args(serve) -> list[str]:
    return ["--endpoint", f"plain={serve.url}", "--endpoint", f"spec={serve.url}/v1",
            "--endpoint-body", f"plain={OFF}", "--endpoint-key-env", "plain=SPECGEN_TEST_SERVE_KEY",
            "--endpoint-key-env", "spec=SPECGEN_TEST_SERVE_KEY"]


def test_one_server_as_both_configurations_records_latency_change_and_spec_stats(serve, tmp_path, capsys):
    out = tmp_path / "rec.jsonl"
    code, stdout, err = cli(capsys, "bench", *serve_args(serve), "--limit", "2", "-n", "16", "--out", out, "--json")
    assert code == 0, err
    meta, recs = records(out)
    assert meta["mode"] == "http" and meta["baseline"] == "plain" and meta["configs"] == ["plain", "spec"]
    assert meta["endpoints"][0]["body"] == json.loads(OFF) and meta["endpoints"][0]["model"] == serve.model
    assert [r["id"] for r in recs] == ["code-rename", "code-type-hints"]
    for r in recs:
        runs = {x["config"]: x for x in r["runs"]}
        assert set(runs) == {"plain", "spec"} and not r["failed"]
        p, s = runs["plain"], runs["spec"]
        assert r["speedup"]["spec"] == pytest.approx(p["total_s"] / s["total_s"])
        assert r["latency_change_ms"]["spec"] == pytest.approx(1000 * (s["total_s"] - p["total_s"]))
        assert p["spec_source"] == s["spec_source"] == "specgen"
        assert p["server_spec"]["mode"] == "plain" and p["drafted"] == 0 and p["rounds"] == p["generated_tokens"]
        assert s["server_spec"]["mode"] == "lookup" and s["drafted"] > 0 and s["rounds"] < s["generated_tokens"]
        assert p["generated_tokens"] == s["generated_tokens"] == 16
        assert 0 < p["ttft_s"] < p["total_s"] and p["tpot_s"] > 0 and r["prompt_tokens"] > 0
        assert s["matches_plain"] is not None  # greedy: compared (equal but for near ties; test_server checks those)
    summary = json.loads(stdout)["summary"]["spec"]["overall"]
    assert summary["requests"] == 2 and summary["acceptance_rate"] > 0


def test_resume_sends_only_the_missing_requests(serve, tmp_path, capsys):
    out = tmp_path / "rec.jsonl"
    args = ["bench", *serve_args(serve), "-n", "6", "--out", out, "--no-warmup"]
    assert cli(capsys, *args, "--limit", "1")[0] == 0
    _, first = records(out)
    code, _, err = cli(capsys, *args, "--limit", "3")
    assert code == 2 and "already holds records: use --resume" in err
    code, _, err = cli(capsys, *args, "--limit", "3", "--resume")
    assert code == 0, err
    assert "1 already recorded" in err
    _, recs = records(out)
    assert [r["id"] for r in recs] == ["code-rename", "code-type-hints", "code-js-arrow"] and recs[0] == first[0]
    code, _, err = cli(capsys, *args, "--limit", "3", "--resume", "-n", "7")
    assert code == 2 and "recorded with max_tokens = 6, not 7" in err


def test_closed_loop_and_poisson_arrivals_against_the_server(serve, tmp_path, capsys):
    out = tmp_path / "rec.jsonl"
    code, stdout, err = cli(capsys, "bench", *serve_args(serve), "-n", "8", "--concurrency", "1,3", "--rate", "4",
                            "--count", "6", "--out", out, "--json")
    assert code == 0, err
    _, recs = records(out)
    assert len(recs) == 6 and all(r["failed"] == 0 and r["requests_served"] == 6 for r in recs), [
        (r["config"], r["concurrency"], [x.get("error") for x in r["requests"] if x.get("error")]) for r in recs]
    for r in recs:
        spans = [(x["sent_s"], x["sent_s"] + x["latency_s"]) for x in r["requests"]]
        most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)  # requests in flight at each send
        if r["load"] == "concurrency":
            assert most == r["concurrency"]  # exactly that many in flight, never more
        else:
            sched = poisson_arrivals(4, 6, None, seed=0)
            assert [x["scheduled_s"] for x in r["requests"]] == pytest.approx(sched)
            lag = [x["sent_s"] - x["scheduled_s"] for x in r["requests"]]
            assert all(-0.001 <= d < 0.25 for d in lag), lag  # sent on schedule, not when the last one finished
        drafted = sum(x["drafted"] for x in r["requests"])
        assert (drafted == 0) == (r["config"] == "plain")
    summ = json.loads(stdout)["summary"]
    row = summ["concurrency"]["per_level"]["3"]
    assert row["spec"]["request_speedup"]["requests"] == 6 and row["spec"]["p50_tpot_s"] > 0
    assert set(summ["concurrency"]["crossover"]["spec"]["latency_speedup"]) == {"1", "3"}
    assert summ["rate"]["levels"] == [4]
