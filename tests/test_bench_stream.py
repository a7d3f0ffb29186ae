"""specgen.bench.stream: a response's body cut by its framing as the bytes arrive, and every event's arrival time.

The framings (ChunkedBody, SizedBody, BodyToClose) are fed bytes cut at
every place. The connection is then driven by scripted reads and a scripted
clock (no socket, no timing), so an event's time must be exactly the time of
the read that ended its line. Last, a raw server on 127.0.0.1 for broken
framing, a body cut short, and chunked responses on one kept-alive connection.
"""

from __future__ import annotations

import asyncio
import re
import types

import h11
import pytest

from helpers import loopback_server, read_request
from specgen.bench import stream
from specgen.bench.http import Endpoint, _Reader, stream_one
from specgen.bench.stream import BodyToClose, ChunkedBody, FramingError, SizedBody, StreamPool, _Connection

BODY = b'data: {"a": 1}\r\n\r\n: ping\n\ndata: {"b": 2}\n\n'
DONE = b"data: [DONE]\n\n"


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def event(text: bytes) -> bytes:
    return b'data: {"choices": [{"text": "%s", "finish_reason": null}]}\n\n' % text


def head(framing: str) -> bytes:
    length = {"chunked": b"transfer-encoding: chunked\r\n", "close": b""}.get(framing, b"content-length: %s\r\n" % framing.encode())
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + length + b"\r\n"


# =========================================================== the framings


def test_a_chunked_body_is_cut_wherever_the_reads_split_it():
    wire = (b"5;name=value\r\n" + BODY[:5] + b"\r\n" + b"%X \r\n" % (len(BODY) - 5) + BODY[5:] + b"\r\n"
            + b"0\r\nx-trailer: 1\r\n\r\n")
    for cut in range(len(wire) + 1):
        for cut2 in range(cut, len(wire) + 1, 3):
            body = ChunkedBody()
            got = [body.feed(piece) for piece in (wire[:cut], wire[cut:cut2], wire[cut2:])]
            assert b"".join(got) == BODY and body.ended and body.extra == b"", (cut, cut2)
    body = ChunkedBody()
    assert b"".join(body.feed(wire[i:i + 1]) for i in range(len(wire))) == BODY and body.ended
    body = ChunkedBody()
    assert body.feed(chunked(b"abc") + b"HTTP/1.1 200") == b"abc" and body.ended and body.extra == b"HTTP/1.1 200"
    body = ChunkedBody()
    assert body.feed(b"3\r\nabc\r\n") == b"abc" and not body.ended  # no last chunk yet


@pytest.mark.parametrize("wire, message", [
    (b"zz\r\nab\r\n", "illegal chunk header: b'zz'"),
    (b"-1\r\n", "illegal chunk header"),
    (b"3\r\nabcd\r\n", "a chunk is longer than its size says: b'd'"),
    (b"3\nabc\r\n", "does not end with CRLF"),
    (b"1" * 70000, "over 65536 bytes"),
])
def test_broken_chunked_framing_is_an_error_that_says_how(wire, message):
    with pytest.raises(FramingError, match=re.escape(message)):
        ChunkedBody().feed(wire)


def test_a_sized_body_ends_at_its_length_and_a_body_without_one_at_the_close():
    body = SizedBody(5)
    assert [body.feed(b"abc"), body.ended, body.feed(b"deXY"), body.ended, body.extra] == [b"abc", False, b"de", True, b"XY"]
    assert SizedBody(0).ended
    body = BodyToClose()
    assert body.feed(b"abc") == b"abc" and not body.ended


# =========================================================== the connection, read by a script


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def read(monkeypatch, pieces: list[tuple[float, bytes]], close: bool = False) -> tuple[dict, _Connection]:
    """What the bench's reader records for a response arriving in `pieces` ((clock, bytes), one read each)."""
    clock = [0.0]
    monkeypatch.setattr(stream, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    out = {"status": None, "error": None, "ttft_s": None, "total_s": None, "chunk_s": [], "text": "", "usage": None,
           "speculative": None, "timings": None, "finish_reason": None}
    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()
        conn = _Connection()
        conn.connection_made(_Transport())
        conn.send(h11.Request(method="POST", target="/v1/completions", headers=[("Host", "x"), ("Content-Length", "2")]),
                  b"{}", _Reader(out, 0.0), done)
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


@pytest.mark.parametrize("framing", ["chunked", "sized", "close"])
def test_every_framing_gives_the_same_times_and_text(monkeypatch, framing):
    a, b, c = event(b"a"), event(b"b"), event(b"c")
    body = a + b + c + DONE
    if framing == "chunked":
        wire = head("chunked") + chunked(a, b, c + DONE)
        cut = [wire.index(b) + 5, wire.index(c) + 5, len(wire)]  # b and c each split over two reads
    else:
        wire = head(str(len(body)) if framing == "sized" else "close") + body
        cut = [wire.index(b) + 5, wire.index(c) + 5, len(wire)]
    pieces = [(10.0, wire[:cut[0]]), (20.0, wire[cut[0]:cut[1]]), (30.0, wire[cut[1]:])]
    out, conn = read(monkeypatch, pieces, close=framing == "close")
    assert out["error"] is None and out["text"] == "abc"
    assert out["chunk_s"] == [10.0, 20.0, 30.0] and out["total_s"] == 30.0
    assert conn.reusable == (framing != "close")


def test_a_response_that_closes_the_connection_or_sends_more_is_not_reused(monkeypatch):
    wire = head("chunked").replace(b"\r\n\r\n", b"\r\nconnection: keep-alive, Close\r\n\r\n") + chunked(event(b"a") + DONE)
    out, conn = read(monkeypatch, [(1.0, wire)])
    assert out["error"] is None and out["text"] == "a" and not conn.reusable
    out, conn = read(monkeypatch, [(1.0, head("chunked") + chunked(event(b"a") + DONE) + b"HTTP/1.1 200 OK\r\n")])
    assert out["error"] is None and not conn.reusable


def test_a_body_cut_short_and_broken_framing_are_failures(monkeypatch):
    wire = head("chunked") + chunked(event(b"a"), DONE)
    out, _ = read(monkeypatch, [(1.0, wire[:-20])], close=True)
    assert out["error"] == "the connection closed with an incomplete chunked body"
    out, _ = read(monkeypatch, [(1.0, head("500") + event(b"a"))], close=True)
    assert out["error"] == f"the connection closed with {500 - len(event(b'a'))} bytes of the body missing"
    out, _ = read(monkeypatch, [(1.0, head("chunked") + b"zz\r\n")])
    assert out["error"] == "not an HTTP/1.1 response: illegal chunk header: b'zz'"


# =========================================================== a raw server on 127.0.0.1


async def raw_server(answers: list[bytes], opened: list):
    """Answers each request on a connection with the next of `answers` (written as is), then closes it."""

    async def handle(reader, writer):
        opened.append(writer)
        try:
            for answer in answers:
                await read_request(reader)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await loopback_server(handle)


def run_requests(answers: list[bytes], n: int) -> tuple[list[dict], int]:
    opened: list = []

    async def main():
        server, url = await raw_server(answers, opened)
        pool = StreamPool()
        try:
            return [await stream_one(pool, Endpoint("a", url), "/v1/completions", {"prompt": "x"}, 10) for _ in range(n)]
        finally:
            pool.close()
            server.close()

    return asyncio.run(main()), len(opened)


def test_chunked_responses_are_read_in_turn_on_one_kept_alive_connection():
    answer = head("chunked") + chunked(event(b"hi"), b'data: {"choices": [], "usage": {"completion_tokens": 1}}\n\n' + DONE)
    results, connections = run_requests([answer] * 3, 3)
    assert [(r["error"], r["text"], r["usage"]) for r in results] == [(None, "hi", {"completion_tokens": 1})] * 3
    assert connections == 1


@pytest.mark.parametrize("answer, error", [
    (head("chunked") + b"zz\r\n", "not an HTTP/1.1 response: illegal chunk header: b'zz'"),
    (head("chunked") + b"%x\r\n%s\r\n" % (len(event(b"a")), event(b"a")),
     "the server closed the connection mid-response: the connection closed with an incomplete chunked body"),
])
def test_broken_or_cut_bodies_from_a_server_are_recorded_failures(answer, error):
    (result,), _ = run_requests([answer], 1)
    assert result["error"] == error and result["status"] == 200
