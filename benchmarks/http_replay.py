"""The reading alone: one streamed response replayed from memory through specgen's protocol and reader.

No socket and no event loop wake-ups (benchmarks/http_client.py measures
those): a stub-like response of --tokens one-token chunks, chunked as
uvicorn sends it, fed read by read to specgen.bench.stream's connection
with the bench's reader (specgen.bench.http) as its sink, --repeats times,
caches warm. Side by side in one run: `protocol` (the body's chunks cut by
ChunkedBody) and `h11-body` (h11 framing the body, as before), then the
protocol's reading in parts: the framing alone (a sink that drops the
bytes), framing and SSE lines, everything (JSON and the record too).

    nice -n 19 python benchmarks/http_replay.py --tokens 64 --repeats 300

CPU per request from time.process_time; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import h11  # noqa: E402

from http_client import H11BodyConnection  # noqa: E402
from specgen.bench.http import _Reader  # noqa: E402
from specgen.bench.stream import SseLines, _Connection  # noqa: E402

HEAD = (b"HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 18:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")


def reads(tokens: int) -> list[bytes]:
    """The response as the stub writes it: the head, then one HTTP chunk a read."""
    def chunk(obj: dict, tail: bytes = b"") -> bytes:
        data = b"data: " + json.dumps(obj).encode() + b"\n\n" + tail
        return b"%x\r\n%s\r\n" % (len(data), data)

    out = [HEAD] + [chunk({"id": "x", "object": "chunk", "choices": [{"index": 0, "finish_reason": None,
                                                                       "text": f"t{i} "}]}) for i in range(tokens)]
    last = {"id": "x", "object": "chunk", "choices": [{"index": 0, "finish_reason": "length", "text": ""}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3},
            "timings": {"prompt_n": 3, "predicted_n": tokens}}
    out.append(chunk(last, b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return out


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class _Drop:
    def response(self, status, headers) -> None:
        pass

    def data(self, data: bytes, now: float) -> None:
        pass

    def end(self) -> None:
        pass


class _Lines(_Drop):
    def __init__(self) -> None:
        self.lines = SseLines()

    def data(self, data: bytes, now: float) -> None:
        self.lines.feed(data)


def _result() -> dict:
    return {"status": None, "error": None, "ttft_s": None, "total_s": None, "chunk_s": [], "text": "", "usage": None,
            "speculative": None, "timings": None, "finish_reason": None}


def replay(loop, connection, sink, pieces: list[bytes]) -> None:
    conn = connection()
    conn.connection_made(_Transport())
    done = loop.create_future()
    conn.send(h11.Request(method="POST", target="/v1/completions", headers=[("Host", "x"), ("Content-Length", "2")]),
              b"{}", sink, done)
    for piece in pieces:
        conn.data_received(piece)
    if not done.done() or done.exception() is not None:
        raise SystemExit(f"the replayed response did not end cleanly: {done}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=300)
    a = ap.parse_args()
    pieces = reads(a.tokens)
    cases = {
        "protocol": lambda loop: replay(loop, _Connection, _Reader(_result(), 0.0), pieces),
        "h11-body": lambda loop: replay(loop, H11BodyConnection, _Reader(_result(), 0.0), pieces),
        "protocol, framing only": lambda loop: replay(loop, _Connection, _Drop(), pieces),
        "protocol, framing + SSE lines": lambda loop: replay(loop, _Connection, _Lines(), pieces),
    }
    loop = asyncio.new_event_loop()
    cpu = {k: 0.0 for k in cases}
    try:
        for turn in range(6):  # alternating turns, each case a sixth of the repeats
            for name in (list(cases) if turn % 2 == 0 else list(cases)[::-1]):
                c0 = time.process_time()
                for _ in range(max(1, a.repeats // 6)):
                    cases[name](loop)
                cpu[name] += time.process_time() - c0
    finally:
        loop.close()
    n = 6 * max(1, a.repeats // 6)
    ms = {k: 1000 * v / n for k, v in cpu.items()}
    print(json.dumps({"tokens": a.tokens, "requests": n, "cpu_ms_per_request": ms}, indent=1))
    for k, v in ms.items():
        print(f"{k:>30}: {v:.3f} ms of CPU a {a.tokens}-chunk request", file=sys.stderr)
    print(f"protocol / h11-body: {ms['protocol'] / ms['h11-body']:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
