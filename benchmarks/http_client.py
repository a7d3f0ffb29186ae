"""The HTTP bench's own cost: client overhead per request, and whether 64 streams outrun it.

Starts the stub OpenAI server (tests/openai_stub.py --stamp) in its own
process, so the client's CPU time (this process's) is the client's alone,
then drives it through the same code as `specgen bench --endpoint`
(HttpBench), side by side in one run for the readers of the timed stream:

- `specgen`: what specgen uses (specgen.bench.endpoint.client: an asyncio Protocol
  whose bytes llhttp frames through httptools, the SSE parsed in
  data_received, one task wake-up a request);
- `aiohttp`: aiohttp's client (its keep-alive pool, its C parser, the body
  read by `content.iter_any()` in the request's task, as vLLM's serving
  benchmark reads it), feeding the same reader (specgen.bench.endpoint.measure): the
  alternative to httptools, kept here for the comparison (run when aiohttp
  is installed: it is no dependency of specgen's);
- `httpx`: the reader before the protocol (httpx's aiter_lines, kept here
  only: one task wake-up per chunk through httpx, httpcore, anyio).

1. sequential: --requests streamed requests of --tokens chunks each, one at
   a time, the readers taking turns in blocks of --block. Per reader:
   client CPU per request (time.process_time) and its share of the
   requests' end-to-end time; the wall time the client adds to each
   latency: from the stub's clock just before it writes the last chunk and
   [DONE] (`timings.sent_at`, time.perf_counter is one clock for every
   process here) to the client's record of [DONE] — an upper bound, as it
   holds the stub's own write and the loopback.
   The floor: the same requests read by an asyncio Protocol that parses
   nothing (one block before each turn), what any Python reader pays for a
   wake-up of the event loop per chunk.
2. closed loop at --streams concurrent streams, each reader in turn: the
   tokens per second the client measured against those the server counted
   over its own first-to-last token span, the client's CPU (share of one
   core, per request), and the wall time added under that load.

    flock "$BENCH_LOCK" nice -n -5 python benchmarks/http_client.py --requests 200 --tokens 64 --streams 64

The issue's targets, as read here: "client overhead < 1 ms a request" is
the wall time the client adds to each measured latency (what could bias a
latency or a speedup); "< 1 % of a run" is the client's CPU over the
requests' time, which the stub (2 ms a chunk) inflates several times over a
model's pace: benchmarks/http_llama.py measures it against llama-server. CPU
is spent while waiting for the next chunk, so it adds to no latency unless
the client saturates a core, which part 2 checks (throughput ratio ≈ 1, CPU
well under one core). `--readers specgen,aiohttp` skips httpx.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specgen.bench.endpoint.measure import (  # noqa: E402
    Endpoint, Sampling, RequestFailed, SseReader, short_text, describe, error_text, parse_counters,
)
from specgen.bench.endpoint.load import HttpBench, LoadSettings  # noqa: E402
from specgen.bench.requests import Request  # noqa: E402
from specgen.bench.endpoint.client import BadResponse, ConnectFailed, ServerClosed, StreamError  # noqa: E402

READERS = ("specgen", "aiohttp", "httpx")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stub(delay_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = subprocess.Popen([sys.executable, str(ROOT / "tests" / "openai_stub.py"), "--port", str(port),
                          "--delay-ms", str(delay_ms), "--stamp"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import httpx

    t0 = time.monotonic()
    while True:
        try:
            httpx.get(url + "/v1/models", timeout=1)
            return p, url
        except httpx.HTTPError:
            if time.monotonic() - t0 > 60 or p.poll() is not None:
                p.kill()
                raise SystemExit("the stub server did not start")
            time.sleep(0.1)


class Recording(HttpBench):
    """HttpBench keeping every raw stream result (for `started` and the stub's `sent_at`)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.raws: list[dict] = []

    async def stream(self, client, ep, path, body):
        raw = await super().stream(client, ep, path, body)
        self.raws.append(raw)
        return raw


class HttpxRecording(Recording):
    """The same, the stream read by httpx as `specgen bench --endpoint` did before specgen.bench.endpoint.client."""

    async def stream(self, client, ep, path, body):
        raw = await httpx_stream_one(client, ep, path, body, self.settings.timeout)
        self.raws.append(raw)
        return raw


async def httpx_stream_one(client, ep: Endpoint, path: str, body: dict, timeout: float) -> dict:
    """The former specgen.bench.endpoint.measure.stream_one and _read_stream (httpx, aiter_lines), unchanged but for `started`."""
    import httpx

    out: dict = {"status": None, "error": None, "ttft_s": None, "total_s": None, "chunk_s": [], "text": "",
                 "usage": None, "speculative": None, "timings": None, "finish_reason": None}
    out["started"] = t0 = time.perf_counter()
    try:
        await asyncio.wait_for(_httpx_read(client, ep, path, body, out, t0), timeout)
    except RequestFailed as f:
        out["error"] = f.message
    except (asyncio.TimeoutError, httpx.HTTPError) as e:
        out["error"] = describe(e, timeout)
    out["total_s"] = time.perf_counter() - t0 if out["total_s"] is None else out["total_s"]
    return out


async def _httpx_read(client, ep: Endpoint, path: str, body: dict, out: dict, t0: float) -> None:
    clock = time.perf_counter
    texts: list[str] = []
    async with client.stream("POST", ep.url + path, json=body, headers=ep.headers) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            raise RequestFailed(f"HTTP {r.status_code}: {error_text(await r.aread())}")
        ctype = r.headers.get("content-type", "")
        if "text/event-stream" not in ctype:
            raw = await r.aread()
            raise RequestFailed(f"not a stream (content-type {ctype or 'none'}): {error_text(raw)}")
        done = False
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments (": ping"), event: lines
            if done:
                continue  # read on to the end of the response: the connection is then kept for the next request
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                out["total_s"] = clock() - t0
                continue
            now = clock()
            try:
                obj = json.loads(data)
            except json.JSONDecodeError:
                raise RequestFailed(f"malformed SSE: a data line is not JSON: {short_text(data)}") from None
            if not isinstance(obj, dict):
                raise RequestFailed(f"malformed SSE: a data line is not a JSON object: {short_text(data)}")
            if "error" in obj:
                raise RequestFailed(f"error in the stream: {error_text(json.dumps(obj))}")
            for choice in obj.get("choices") or []:
                if not isinstance(choice, dict):
                    raise RequestFailed("malformed SSE: a choice is not an object")
                delta = choice.get("delta")
                piece = choice.get("text") if delta is None else (delta or {}).get("content")
                if piece:
                    if out["ttft_s"] is None:
                        out["ttft_s"] = now - t0
                    out["chunk_s"].append(now - t0)
                    texts.append(piece)
                if choice.get("finish_reason"):
                    out["finish_reason"] = choice["finish_reason"]
            for key in ("usage", "speculative", "timings"):
                if isinstance(obj.get(key), dict):
                    out[key] = obj[key]
        out["text"] = "".join(texts)
        if not done:
            raise RequestFailed("the stream ended without data: [DONE]" + (" (and no text)" if not texts else ""))


class AiohttpRecording(Recording):
    """The same, the stream read by aiohttp's client into specgen's reader (the `aiohttp` reader)."""

    session = None

    @contextlib.asynccontextmanager
    async def client(self):
        async with super().client() as c:
            try:
                yield c
            finally:
                if self.session is not None:
                    await self.session.close()

    async def stream(self, client, ep, path, body):
        raw = await aiohttp_stream_one(self._session(), ep, path, body, self.settings.timeout)
        self.raws.append(raw)
        return raw

    def _session(self):
        if self.session is None:
            import aiohttp

            self.session = aiohttp.ClientSession(  # as specgen's pool: no proxy, no limit, kept alive
                connector=aiohttp.TCPConnector(limit=0), trust_env=False, auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), headers={"User-Agent": "specgen-bench"})
        return self.session


async def aiohttp_stream_one(session, ep: Endpoint, path: str, body: dict, timeout: float) -> dict:
    """specgen.bench.endpoint.measure.stream_one with aiohttp's client in place of specgen.bench.endpoint.client's pool."""
    out: dict = {"status": None, "error": None, "ttft_s": None, "total_s": None, "chunk_s": [], "text": "",
                 "usage": None, "speculative": None, "timings": None, "finish_reason": None}
    data = json.dumps(body).encode()
    out["started"] = t0 = time.perf_counter()
    try:
        await asyncio.wait_for(_aiohttp_read(session, ep.url + path, ep.headers, data, SseReader(out, t0)), timeout)
    except RequestFailed as f:
        out["error"] = f.message
    except (asyncio.TimeoutError, StreamError) as e:
        out["error"] = describe(e, timeout)
    out["total_s"] = time.perf_counter() - t0 if out["total_s"] is None else out["total_s"]
    return out


async def _aiohttp_read(session, url: str, headers: dict, data: bytes, sink) -> None:
    import aiohttp

    clock = time.perf_counter
    try:
        async with session.post(url, data=data, headers={"Accept": "text/event-stream",
                                                         "Content-Type": "application/json", **headers}) as r:
            sink.response(r.status, [(k.lower(), v) for k, v in r.raw_headers])
            async for piece in r.content.iter_any():  # what the stream holds at each wake-up of this task
                sink.data(piece, clock())
            sink.end()
    except aiohttp.ClientConnectorError as e:
        raise ConnectFailed(str(e)) from e
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as e:
        raise ServerClosed(str(e)) from None
    except aiohttp.ClientResponseError as e:
        raise BadResponse(f"not an HTTP/1.1 response: {e.message}") from None


class _Floor(asyncio.Protocol):
    """The floor: an asyncio Protocol that reads the same stream and does nothing with it but find its end."""

    def __init__(self) -> None:
        self.tail, self.done = b"", None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.tail = self.tail[-8:] + data
        if self.tail.endswith(b"\r\n0\r\n\r\n"):  # the stub's chunked body ends (nothing is parsed)
            self.done.set_result(None)


async def floor_requests(url: str, n: int, tokens: int) -> None:
    """`n` requests read by _Floor, one at a time, on one kept connection."""
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"prompt": "x", "max_tokens": tokens, "stream": True}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
           % (host.encode(), len(body)) + body)
    loop = asyncio.get_running_loop()
    transport, floor = await loop.create_connection(_Floor, host, int(port))
    try:
        for _ in range(n):
            floor.done = loop.create_future()
            transport.write(req)
            await asyncio.wait_for(floor.done, 60)
    finally:
        transport.close()


def added_ms(raws: list[dict]) -> list[float]:
    """Per request: the client's record of [DONE] minus the stub's clock just before writing it (ms)."""
    return [1000 * (r["started"] + r["total_s"] - r["timings"]["sent_at"]) for r in raws
            if r["error"] is None and (r["timings"] or {}).get("sent_at") is not None]


async def server_counters(client, url: str) -> dict:
    r = await client.get(url + "/metrics?reset=1")
    return parse_counters(r.text, ["stub_tokens_total", "stub_token_span_seconds"])


async def sequential(benches: dict, clients: dict, ep: Endpoint, reqs: list, block: int, tokens: int) -> dict:
    acc = {k: {"cpu": 0.0, "n": 0, "e2e": 0.0, "failed": 0, "first": len(b.raws)} for k, b in benches.items()}
    floor = {"cpu": 0.0, "n": 0}
    for i in range(0, len(reqs), block):
        order = list(benches) if (i // block) % 2 == 0 else list(benches)[::-1]
        c0 = time.process_time()
        await floor_requests(ep.url, len(reqs[i: i + block]), tokens)
        floor["cpu"] += time.process_time() - c0
        floor["n"] += len(reqs[i: i + block])
        for k in order:
            b, a = benches[k], acc[k]
            c0 = time.process_time()
            results = [await b.one(clients[k], ep, r) for r in reqs[i: i + block]]
            a["cpu"] += time.process_time() - c0
            a["n"] += len(results)
            a["e2e"] += sum(x["total_s"] for x in results)
            a["failed"] += sum(x["error"] is not None for x in results)
    out = {}
    for k, a in acc.items():
        raws = benches[k].raws[a["first"]:]
        gaps = added_ms(raws)
        out[k] = {"requests": a["n"], "failed": a["failed"], "client_cpu_per_request_ms": 1000 * a["cpu"] / a["n"],
                  "client_cpu_share_of_e2e": a["cpu"] / a["e2e"],
                  "median_e2e_ms": 1000 * median(r["total_s"] for r in raws if r["error"] is None),
                  "wall_added_ms_p50": median(gaps), "wall_added_ms_p95": sorted(gaps)[int(0.95 * (len(gaps) - 1))]}
    out["floor"] = {"requests": floor["n"], "client_cpu_per_request_ms": 1000 * floor["cpu"] / floor["n"]}
    return out


async def concurrent(b: HttpBench, client, ep: Endpoint, url: str, reqs: list, streams: int) -> dict:
    await server_counters(client, url)
    before = (await server_counters(client, url))["stub_tokens_total"]
    first = len(b.raws)
    c0 = time.process_time()
    results, wall = await b.closed_loop(client, ep, reqs, streams)
    cpu = time.process_time() - c0
    after = await server_counters(client, url)
    ok = [x for x in results if x.get("error") is None]
    client_tokens = sum(x["generated_tokens"] for x in ok)
    server_tokens = after["stub_tokens_total"] - before
    span = after["stub_token_span_seconds"]
    gaps = added_ms(b.raws[first:])
    return {
        "streams": streams, "requests": len(results), "failed": len(results) - len(ok), "wall_s": wall,
        "client_tokens_per_s": client_tokens / wall, "server_tokens_per_s": server_tokens / span if span else None,
        "throughput_ratio_client_over_server": (client_tokens / wall) / (server_tokens / span) if span else None,
        "client_cpu_share_of_one_core": cpu / wall, "client_cpu_per_request_ms": 1000 * cpu / len(results),
        "wall_added_ms_p50": median(gaps), "wall_added_ms_p95": sorted(gaps)[int(0.95 * (len(gaps) - 1))],
    }


async def measure(url: str, n: int, tokens: int, streams: int, block: int, readers: list[str]) -> dict:
    ep = Endpoint("stub", url, kind="plain")
    reqs = [Request(f"r{i}", prompt=f"request {i}") for i in range(n)]
    settings = LoadSettings(Sampling(max_tokens=tokens), warmup=True)
    kinds = {"specgen": Recording, "aiohttp": AiohttpRecording, "httpx": HttpxRecording}
    benches = {k: kinds[k]([ep, Endpoint("same", url)], reqs, settings) for k in readers}
    out: dict = {}
    async with contextlib.AsyncExitStack() as stack:
        clients = {k: await stack.enter_async_context(b.client()) for k, b in benches.items()}
        for k in readers:
            await benches[k].prepare(clients[k])
        out["sequential"] = await sequential(benches, clients, ep, reqs, block, tokens)
        many = [reqs[i % n] for i in range(max(n, 8 * streams))]  # each stream's connection serves 8 or more
        out["concurrent"] = {k: await concurrent(benches[k], clients[k], ep, url, many, streams) for k in readers}
    return out


def report(res: dict, readers: list[str], tokens: int) -> None:
    """The figures in words, on stderr: wall time added (the issue's "< 1 ms a request"), then CPU, then 64 streams."""
    seq, conc, floor = res["sequential"], res["concurrent"], res["sequential"]["floor"]["client_cpu_per_request_ms"]
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    say("wall time the client adds to each request's latency (the issue's '< 1 ms a request'; goal < 1 ms):")
    for k in readers:
        say(f"  {k:>8}: p50 {seq[k]['wall_added_ms_p50']:.3f} ms, p95 {seq[k]['wall_added_ms_p95']:.3f} ms "
            f"(at {conc[k]['streams']} streams: p50 {conc[k]['wall_added_ms_p50']:.2f} ms)")
    say(f"client CPU a request of {tokens} chunks (burnt while it waits for the next chunk, not added to the latency; "
        f"goal: < 1 % of a run, see benchmarks/http_llama.py for a real server):")
    for k in readers:
        cpu = seq[k]["client_cpu_per_request_ms"]
        say(f"  {k:>8}: {cpu:.2f} ms = floor + {cpu - floor:.2f} ms; {100 * seq[k]['client_cpu_share_of_e2e']:.2f} % of "
            f"its e2e here ({seq[k]['median_e2e_ms']:.0f} ms)")
    say(f"     floor: {floor:.2f} ms ({1000 * floor / (tokens + 1):.0f} µs a read): an asyncio Protocol that reads the same "
        "stream and parses nothing, one wake-up of Python's event loop per chunk, what any Python reader pays")
    say(f"at {conc[readers[0]]['streams']} streams (client tok/s over the server's own; CPU share of one core):")
    for k in readers:
        c = conc[k]
        say(f"  {k:>8}: {c['throughput_ratio_client_over_server']:.3f} ({c['server_tokens_per_s']:.0f} tok/s), "
            f"{100 * c['client_cpu_share_of_one_core']:.0f} % of a core, {c['client_cpu_per_request_ms']:.2f} ms a request")
    new = seq["specgen"]
    for k in readers[1:]:
        old = seq[k]
        above = (new["client_cpu_per_request_ms"] - floor) / (old["client_cpu_per_request_ms"] - floor)
        say(f"specgen / {k}: CPU a request {new['client_cpu_per_request_ms'] / old['client_cpu_per_request_ms']:.3f} "
            f"(above the floor {above:.3f}), wall added p50 {new['wall_added_ms_p50'] / old['wall_added_ms_p50']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--block", type=int, default=20, help="sequential requests a reader runs before the next one's turn")
    ap.add_argument("--delay-ms", type=float, default=2.0, help="the stub's time between chunks")
    have = [r for r in READERS if r != "aiohttp" or importlib.util.find_spec("aiohttp") is not None]
    ap.add_argument("--readers", default=",".join(have),
                    help=f"which to compare, specgen first (of {', '.join(READERS)}; default: those installed)")
    a = ap.parse_args()
    readers = [r.strip() for r in a.readers.split(",") if r.strip()]
    if not readers or readers[0] != "specgen" or not set(readers) <= set(READERS) or len(set(readers)) != len(readers):
        ap.error(f"--readers: specgen first, then any of {', '.join(READERS[1:])}, each once")
    if not set(readers) <= set(have):
        ap.error("--readers aiohttp: aiohttp is not installed (pip install aiohttp)")
    stub, url = start_stub(a.delay_ms)
    try:
        res = asyncio.run(measure(url, a.requests, a.tokens, a.streams, a.block, readers))
    finally:
        stub.terminate()
        stub.wait(10)
    res["stub_delay_ms"] = a.delay_ms
    print(json.dumps(res, indent=1))
    report(res, readers, a.tokens)


if __name__ == "__main__":
    main()
