"""A tiny OpenAI-compatible streaming server for the HTTP bench's tests and benchmark.

Streams one chunk per token ("t0 t1 …") every `delay` seconds, then a final
chunk with usage (and llama-server-style `timings` with draft counters), then
`data: [DONE]`. The prompt (or the last message) picks a failure:
"!500" an HTTP 500 in OpenAI's error shape, "!slow" no answer for 30 s,
"!malformed" a data line that is not JSON, "!disconnect" the connection cut
after two chunks, "!nodone" a stream that ends without [DONE]. With `key`
set, requests without `Authorization: Bearer KEY` get a 401. `served` counts
the tokens it sent (the server's own counter, for the throughput check).
With `stamp`, the last chunk's `timings.sent_at` is time.perf_counter() just
before it and [DONE] are written together (one write): the benchmark's mark
for the wall time the client adds. `ssl_files` (cert, key) serves https.

Run alone (the benchmark): python tests/openai_stub.py --port 8099 --delay-ms 5 [--stamp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route


class Stats:
    def __init__(self) -> None:
        self.tokens = 0
        self.requests = 0
        self.bodies: list[dict] = []
        self.first_s: float | None = None
        self.last_s: float | None = None


def make_app(delay: float = 0.0, key: str | None = None, draft: bool = True, keep_bodies: bool = True,
             stamp: bool = False):
    stats = Stats()

    def authorized(request: Request) -> bool:
        return key is None or request.headers.get("authorization") == f"Bearer {key}"

    async def models(request: Request):
        if not authorized(request):
            return JSONResponse({"error": {"message": "invalid api key", "type": "auth"}}, status_code=401)
        return JSONResponse({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def metrics(request: Request):
        """Tokens sent, and the span from the first to the last since the previous ?reset (the server's own clock)."""
        span = (stats.last_s - stats.first_s) if stats.first_s is not None else 0.0
        text = f"stub_tokens_total {stats.tokens}\nstub_token_span_seconds {span}\n"
        if "reset" in request.query_params:
            stats.first_s = stats.last_s = None
        return PlainTextResponse(text)

    async def generate(request: Request):
        if not authorized(request):
            return JSONResponse({"error": {"message": "invalid api key", "type": "auth"}}, status_code=401)
        body = await request.json()
        if keep_bodies:
            stats.bodies.append(body)
        stats.requests += 1
        chat = "messages" in body
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n = int(body.get("max_tokens", 16))
        if prompt.startswith("!500"):
            return JSONResponse({"error": {"message": "the stub failed on purpose", "type": "server_error"}}, status_code=500)
        if prompt.startswith("!slow"):
            await asyncio.sleep(30)

        def chunk(text=None, finish=None, **extra):
            choice = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {} if text is None else {"content": text}
            else:
                choice["text"] = text or ""
            return "data: " + json.dumps({"id": "x", "object": "chunk", "choices": [choice], **extra}) + "\n\n"

        async def events():
            t0 = time.perf_counter()
            for i in range(n):
                if delay:
                    await asyncio.sleep(delay)
                if prompt.startswith("!malformed") and i == 1:
                    yield "data: {this is not json\n\n"
                    return
                if prompt.startswith("!disconnect") and i == 2:
                    raise ConnectionAbortedError("the stub cut the connection on purpose")
                now = time.perf_counter()
                stats.first_s = now if stats.first_s is None else stats.first_s
                stats.last_s = now
                stats.tokens += 1
                yield chunk(f"t{i} ")
            timings = {"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": n, "predicted_ms": 1000 * (time.perf_counter() - t0)}
            if draft:
                timings.update(draft_n=2 * n, draft_n_accepted=n)
            if stamp:
                timings["sent_at"] = time.perf_counter()
                yield chunk(None, "length", usage={"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3},
                            timings=timings) + "data: [DONE]\n\n"
                return
            yield chunk(None, "length", usage={"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3},
                        timings=timings)
            if not prompt.startswith("!nodone"):
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[
        Route("/v1/models", models), Route("/metrics", metrics),
        Route("/v1/completions", generate, methods=["POST"]), Route("/v1/chat/completions", generate, methods=["POST"]),
    ])
    app.state.stats = stats
    return app


class StubServer:
    """The stub served by uvicorn in a thread on a free loopback port."""

    def __init__(self, ssl_files: tuple[str, str] | None = None, **kw) -> None:
        import socket

        import uvicorn

        self.app = make_app(**kw)
        self.stats = self.app.state.stats
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http{'s' * bool(ssl_files)}://127.0.0.1:{self.sock.getsockname()[1]}"
        cert, key = ssl_files or (None, None)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="critical", lifespan="off", access_log=False,
                                                    ssl_certfile=cert, ssl_keyfile=key))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            assert time.monotonic() - t0 < 10, "the stub did not start"
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    ap.add_argument("--stamp", action="store_true", help="timings.sent_at in the last chunk, written with [DONE]")
    a = ap.parse_args()
    uvicorn.run(make_app(a.delay_ms / 1000, keep_bodies=False, stamp=a.stamp), host="127.0.0.1", port=a.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
