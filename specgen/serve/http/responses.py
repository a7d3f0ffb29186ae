"""A request's events (specgen.serve.http.loop.Request) turned into a response:
server-sent events as the text comes, or one JSON body once it has ended.

SSE framing: one `data: JSON` line and a blank line per chunk, `data: [DONE]`
last; an error after the stream began is sent as its error object, then [DONE].
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specgen.serve.http import schema as S
from specgen.serve.http.loop import Request

DONE = "data: [DONE]\n\n"
DISCONNECT_CHECK_S = 0.25  # how often a non-streamed request asks whether its client is still there
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def error_response(exc: S.ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def end_blocks(req: Request, record: dict) -> tuple[dict, dict, dict]:
    """The usage, speculative and (llama-server's) timings blocks of a finished request."""
    use = S.usage(record["prompt_tokens"], record["generated_tokens"], record["cached_tokens"])
    return use, S.speculative_block(req.spec, record), S.timings_block(record)


# -- streamed --------------------------------------------------------------------


class ClosingStream(StreamingResponse):
    """A streaming response that calls `on_close` however it ends (a disconnect included)."""

    def __init__(self, content, on_close: Callable[[], None], **kw) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def sse_response(req: Request, kind: str, model: str, include_usage: bool, on_close: Callable[[], None]) -> ClosingStream:
    return ClosingStream(sse_lines(req, kind, model, include_usage), on_close,
                         media_type="text/event-stream", headers=dict(SSE_HEADERS))


def data(obj) -> str:
    """One SSE event carrying `obj` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


@dataclass(frozen=True)
class _Chunks:
    """The fixed fields of one request's chunks."""

    kind: str
    rid: str
    model: str
    created: int

    def __call__(self, **kw) -> dict:
        return S.chunk(self.kind, self.rid, self.model, self.created, **kw)


async def sse_lines(req: Request, kind: str, model: str, include_usage: bool) -> AsyncIterator[str]:
    """A chat's opening role chunk, a chunk per run of text, then the end (or the error) and [DONE]."""
    chunk = _Chunks(kind, req.job.id, model, int(time.time()))
    if kind == "chat":
        yield data(chunk(role=True, text=""))
    while True:
        ev = await req.events.get()
        if ev[0] != "text":
            break
        yield data(chunk(text=ev[1]))
    req.ended = True
    if ev[0] == "error":
        yield data(ev[1].body())
    else:
        for obj in _final_chunks(chunk, req, ev, include_usage):
            yield data(obj)
    yield DONE


def _final_chunks(chunk: _Chunks, req: Request, done: tuple, include_usage: bool) -> list[dict]:
    """The finish chunk carrying usage, speculative and timings blocks; with include_usage,
    they ride on a chunk of their own with no choices (OpenAI's shape; llama-server puts
    its timings on that last chunk too)."""
    _, reason, record, _text = done
    use, spec, timings = end_blocks(req, record)
    out = [chunk(finish=S.finish_reason(reason))]
    if include_usage:
        out.append(chunk(choices=False))
    out[-1]["usage"], out[-1]["speculative"], out[-1]["timings"] = use, spec, timings
    return out


# -- whole -----------------------------------------------------------------------


async def whole_response(req: Request, request: HttpRequest, kind: str, model: str, return_tokens: bool,
                         on_close: Callable[[], None]) -> Response:
    """The reply as one JSON body once the request ends; 499 if the client left first."""
    try:
        done = await collect(req, request)
    finally:
        on_close()
    if done is None:
        return Response(status_code=499)
    if done[0] == "error":
        return error_response(done[1])
    _, reason, record, text = done
    use, spec, timings = end_blocks(req, record)
    tokens = record["tokens"] if return_tokens else None
    return JSONResponse(S.response(kind, req.job.id, model, text, S.finish_reason(reason), use, spec, tokens, timings))


async def collect(req: Request, request: HttpRequest):
    """The request's end event; None if the client went away first (checked every
    DISCONNECT_CHECK_S, however often text arrives)."""
    clock = asyncio.get_running_loop().time
    next_check = clock() + DISCONNECT_CHECK_S
    while True:
        try:
            ev = await asyncio.wait_for(req.events.get(), max(next_check - clock(), 0.0))
        except asyncio.TimeoutError:
            ev = None
        if ev is not None and ev[0] in ("done", "error"):
            req.ended = True
            return ev
        if clock() >= next_check:
            if await request.is_disconnected():
                return None
            next_check = clock() + DISCONNECT_CHECK_S
