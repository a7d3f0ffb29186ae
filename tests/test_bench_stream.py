"""specgen.bench.endpoint.client: a response read as its bytes arrive (llhttp frames it), and every event's arrival time.

The connection is driven by scripted reads and a scripted clock (no socket,
no timing), so an event's time must be exactly the time of the read that
ended its line, whichever framing the body has (chunked, sized, to the
close) and wherever the reads cut it. Malformed responses are one error
line; a sink's failure is the request's. Last, a raw server on 127.0.0.1:
the request as written, broken and cut bodies, a body that runs to the
close, and responses in turn on one kept-alive connection.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from helpers import loopback_server, read_request
from specgen.bench.endpoint import client as stream
from specgen.bench.endpoint.measure import Endpoint, SseReader, stream_one
from specgen.bench.endpoint.client import StreamPool, Connection, request_bytes

DONE = b"data: [DONE]\n\n"


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def event(text: bytes) -> bytes:
    return b'data: {"choices": [{"text": "%s", "finish_reason": null}]}\n\n' % text


def head(framing: str) -> bytes:
    length = {"chunked": b"transfer-encoding: chunked\r\n", "close": b""}.get(framing, b"content-length: %s\r\n" % framing.encode())
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + length + b"\r\n"


# =========================================================== the connection, read by a script


class _Transport:
    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def read(monkeypatch, pieces: list[tuple[float, bytes]], close: bool = False) -> tuple[dict, Connection]:
    """What the bench's reader records for a response arriving in `pieces` ((clock, bytes), one read each)."""
    clock = [0.0]
    monkeypatch.setattr(stream, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    out = {"status": None, "error": None, "ttft_s": None, "total_s": None, "chunk_s": [], "text": "", "usage": None,
           "speculative": None, "timings": None, "finish_reason": None}
    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()
        conn = Connection()
        conn.connection_made(_Transport())
        conn.send(request_bytes("/v1/completions", [("Host", "x"), ("Content-Length", "2")], b"{}"), SseReader(out, 0.0),
                  done)
        for t, piece in pieces:
            clock[0] = t
            conn.data_received(piece)
        if close:
            conn.connection_lost(None)
        assert done.done()
        if done.exception() is not None:
            out["error"] = str(done.exception())
    finally:
        loop.close()
    return out, conn


def test_each_event_is_timed_by_the_read_that_ends_its_line_wherever_the_chunks_split(monkeypatch):
    a, b, c = event(b"a"), event(b"b"), event(b"c")
    wire = head("chunked") + chunked(a + b[:10], b[10:], c, DONE)
    cuts = [wire.index(a) + len(a) + 10,  # a whole, b begun
            wire.index(b"\n", wire.index(b[10:])),  # b's line to just before its line break
            wire.index(c) - 3,  # inside c's chunk-size line
            wire.index(c) + len(c) + 1,  # between the CR and the LF after c's chunk
            len(wire)]
    pieces = [(float(i + 1), wire[lo:hi]) for i, (lo, hi) in enumerate(zip([0] + cuts, cuts))]
    out, conn = read(monkeypatch, pieces)
    assert out["error"] is None and out["text"] == "abc"
    assert out["chunk_s"] == [1.0, 3.0, 4.0] and out["ttft_s"] == 1.0 and out["total_s"] == 5.0
    assert conn.reusable  # HTTP/1.1, chunked, nothing after the end


def test_a_chunked_body_with_extensions_and_trailers_reads_right_wherever_the_reads_cut_it(monkeypatch):
    body = event(b"a") + b": ping\r\n\r\n" + event(b"b") + DONE
    wire = (head("chunked") + b"5;name=value\r\n" + body[:5] + b"\r\n" + b"%X\r\n" % (len(body) - 5) + body[5:]
            + b"\r\n0\r\nx-trailer: 1\r\n\r\n")
    for cut in range(1, len(wire)):
        for cut2 in range(cut, len(wire), 7):
            out, conn = read(monkeypatch, [(1.0, wire[:cut]), (2.0, wire[cut:cut2]), (3.0, wire[cut2:])])
            assert (out["error"], out["text"], conn.reusable) == (None, "ab", True), (cut, cut2)
    out, _ = read(monkeypatch, [(float(i), wire[i:i + 1]) for i in range(len(wire))])  # a byte a read
    assert out["text"] == "ab" and out["chunk_s"] == [float(wire.index(b"\n", wire.index(b'"a"'))),
                                                      float(wire.index(b"\n", wire.index(b'"b"')))]


@pytest.mark.parametrize("framing", ["chunked", "sized", "close"])
def test_every_framing_gives_the_same_times_and_text(monkeypatch, framing):
    a, b, c = event(b"a"), event(b"b"), event(b"c")
    body = a + b + c + DONE
    if framing == "chunked":
        wire = head("chunked") + chunked(a, b, c + DONE)
    else:
        wire = head(str(len(body)) if framing == "sized" else "close") + body
    cut = [wire.index(b) + 5, wire.index(c) + 5, len(wire)]  # b and c each split over two reads
    pieces = [(10.0, wire[:cut[0]]), (20.0, wire[cut[0]:cut[1]]), (30.0, wire[cut[1]:])]
    out, conn = read(monkeypatch, pieces, close=framing == "close")
    assert out["error"] is None and out["text"] == "abc"
    assert out["chunk_s"] == [10.0, 20.0, 30.0] and out["total_s"] == 30.0
    assert conn.reusable == (framing != "close")


def test_a_body_that_runs_to_the_close_ends_only_there(monkeypatch):
    out, conn = read(monkeypatch, [(1.0, head("close") + event(b"a")), (2.0, event(b"b") + DONE)], close=True)
    assert out["error"] is None and out["text"] == "ab" and out["chunk_s"] == [1.0, 2.0] and not conn.reusable
    wire = head("close").replace(b"\r\n\r\n", b"\r\ntransfer-encoding: identity\r\n\r\n") + event(b"a") + DONE
    out, conn = read(monkeypatch, [(1.0, wire)], close=True)  # a coding other than chunked: to the close too
    assert out["error"] is None and out["text"] == "a" and not conn.reusable


def test_interim_responses_are_skipped_and_the_final_one_is_read(monkeypatch):
    wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + head("chunked") + chunked(
        event(b"a") + DONE)
    out, conn = read(monkeypatch, [(1.0, wire[:30]), (2.0, wire[30:])])
    assert (out["error"], out["status"], out["text"], conn.reusable) == (None, 200, "a", True)


def test_a_response_that_closes_the_connection_or_sends_more_is_not_reused(monkeypatch):
    wire = head("chunked").replace(b"\r\n\r\n", b"\r\nconnection: keep-alive, Close\r\n\r\n") + chunked(event(b"a") + DONE)
    out, conn = read(monkeypatch, [(1.0, wire)])
    assert out["error"] is None and out["text"] == "a" and not conn.reusable and conn.transport.closed
    for more in (b"HTTP/1.1 200 OK\r\n", b"garbage\r\n"):  # a next response begun, or bytes that are none
        out, conn = read(monkeypatch, [(1.0, head("chunked") + chunked(event(b"a") + DONE) + more)])
        assert out["error"] is None and out["text"] == "a" and not conn.reusable and conn.transport.closed
    wire = head("chunked").replace(b"HTTP/1.1", b"HTTP/1.0") + chunked(event(b"a") + DONE)
    out, conn = read(monkeypatch, [(1.0, wire)])
    assert out["error"] is None and not conn.reusable  # HTTP/1.0 without keep-alive
    out, conn = read(monkeypatch, [(1.0, head("chunked") + chunked(event(b"a") + DONE))])
    assert conn.reusable and not conn.transport.closed  # and the plain case is kept: the checks above can fail


def test_a_body_cut_short_is_a_failure_whatever_its_framing(monkeypatch):
    wire = head("chunked") + chunked(event(b"a"), DONE)
    out, _ = read(monkeypatch, [(1.0, wire[:-20])], close=True)
    assert out["error"] == "the connection closed before the body's end" and out["chunk_s"] == [1.0]
    out, _ = read(monkeypatch, [(1.0, head("500") + event(b"a"))], close=True)
    assert out["error"] == "the connection closed before the body's end"
    out, _ = read(monkeypatch, [(1.0, head("chunked")[:-5])], close=True)
    assert out["error"] == "in the response's head"


@pytest.mark.parametrize("wire", [
    b"SPDY/3 200 OK\r\n\r\n",  # not HTTP
    b"HTTP/1.1 2x0 OK\r\n\r\n",  # a bad status
    b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",  # a header line without a colon
    head("chunked") + b"zz\r\nab\r\n",  # an illegal chunk size
    head("chunked") + b"3\r\nabcd\r\n",  # a chunk longer than its size
    head("chunked").replace(b"\r\n\r\n", b"\r\ncontent-length: 4\r\n\r\n") + b"4\r\nabcd\r\n",  # both lengths
    b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\n",  # two that disagree
])
def test_a_malformed_response_is_one_clear_error(monkeypatch, wire):
    out, conn = read(monkeypatch, [(1.0, wire)])
    assert out["error"].startswith("not an HTTP/1.1 response: ") and "\n" not in out["error"], out["error"]
    assert not conn.reusable and conn.transport.closed


def test_the_readers_own_failure_inside_the_parse_is_the_requests(monkeypatch):
    out, conn = read(monkeypatch, [(1.0, head("chunked") + chunked(b"data: {not json\n\n" + event(b"a") + DONE))])
    assert out["error"].startswith("malformed SSE: a data line is not JSON") and not conn.reusable
    out, _ = read(monkeypatch, [(1.0, head(str(len(b"data: [1]\n\n"))) + b"data: [1]\n\n")])
    assert out["error"].startswith("malformed SSE: a data line is not a JSON object")


@pytest.mark.parametrize("target, headers", [
    ("/v1/completions", [("Authorization", "Bearer sekrit\nline two")]),
    ("/v1/completions", [("Authorization", "Bearer sekrit\r")]),
    ("/v1/completions", [("Bad Name", "x")]),
    ("/v1/completions", [("Authorization", "Bearer \u2603")]),
    ("/a b/v1/completions", []),
])
def test_a_request_that_is_not_valid_http_is_refused_before_it_is_sent(target, headers):
    with pytest.raises(ValueError):
        request_bytes(target, [("Host", "x"), *headers], b"{}")
    assert request_bytes("/v1/x", [("Host", "h:1"), ("A", "b c")], b"{}") == b"POST /v1/x HTTP/1.1\r\nHost: h:1\r\nA: b c\r\n\r\n{}"


# =========================================================== a raw server on 127.0.0.1


async def raw_server(answers: list[bytes], opened: list, heads: list | None = None):
    """Answers each request on a connection with the next of `answers` (written as is), then closes it."""

    async def handle(reader, writer):
        opened.append(writer)
        try:
            for answer in answers:
                got = await read_request(reader)
                if heads is not None:
                    heads.append(got)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await loopback_server(handle)


def run_requests(answers: list[bytes], n: int, heads: list | None = None, url_tail: str = "") -> tuple[list[dict], int]:
    opened: list = []

    async def main():
        server, url = await raw_server(answers, opened, heads)
        pool = StreamPool()
        try:
            url = url.replace("//", "//" + url_tail) if "@" in url_tail else url + url_tail
            return [await stream_one(pool, Endpoint("a", url), "/v1/completions", {"prompt": "x"}, 10) for _ in range(n)]
        finally:
            pool.close()
            server.close()

    return asyncio.run(main()), len(opened)


ANSWER = head("chunked") + chunked(event(b"hi"), b'data: {"choices": [], "usage": {"completion_tokens": 1}}\n\n' + DONE)


def test_chunked_responses_are_read_in_turn_on_one_kept_alive_connection():
    results, connections = run_requests([ANSWER] * 3, 3)
    assert [(r["error"], r["text"], r["usage"]) for r in results] == [(None, "hi", {"completion_tokens": 1})] * 3
    assert connections == 1


def test_the_request_is_written_as_http_1_1_with_its_host_length_and_the_urls_credentials():
    heads: list = []
    (result,), _ = run_requests([ANSWER], 1, heads, "user:p%40ss@")
    assert result["error"] is None
    lines = heads[0].decode().split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1"
    fields = dict(line.split(": ", 1) for line in lines[1:] if line)
    port = fields["Host"].split(":")[1]
    assert fields["Host"] == f"127.0.0.1:{port}" and fields["Accept"] == "text/event-stream"
    assert fields["Content-Type"] == "application/json" and fields["Content-Length"] == str(len(b'{"prompt": "x"}'))
    assert fields["Authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss
    heads.clear()
    run_requests([ANSWER], 1, heads, "/prefix")
    assert heads[0].startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n")


def test_a_body_that_runs_to_the_close_is_read_from_a_server_and_its_connection_not_kept():
    answer = head("close") + event(b"hi") + DONE  # the server closes after it: the body's end
    results, connections = run_requests([answer], 2)
    assert [(r["error"], r["text"]) for r in results] == [(None, "hi")] * 2 and connections == 2


@pytest.mark.parametrize("answer, error", [
    (head("chunked") + b"zz\r\n", "not an HTTP/1.1 response: "),
    (head("chunked") + b"%x\r\n%s\r\n" % (len(event(b"a")), event(b"a")),
     "the server closed the connection mid-response: the connection closed before the body's end"),
    (b"HTTP/1.1 200 OK\r\ncontent-le", "the server closed the connection mid-response: in the response's head"),
])
def test_broken_or_cut_responses_from_a_server_are_recorded_failures(answer, error):
    (result,), _ = run_requests([answer], 1)
    assert result["error"].startswith(error), result["error"]
