"""The HTTP face: FastAPI endpoints in OpenAI's shapes over an EngineLoop.

POST /v1/chat/completions, POST /v1/completions (streamed as server-sent
events or not), GET /v1/models, GET /health, GET /metrics. Handlers validate,
tokenize and hand the request to the engine thread; they never wait on it
except through their own asyncio queue.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from specgen.apps.chat import ChatFormat, encode, render
from specgen.errors import SpecgenError
from specgen.serve.http import schema as S
from specgen.serve.http.loop import EngineLoop, Request, log
from specgen.serve.scheduler import Job, need_tokens

MAX_BODY = 4 * 1024 * 1024  # bytes


@dataclass
class AppConfig:
    model_id: str
    defaults: S.Defaults
    chat_format: ChatFormat | None = None
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_body: int = MAX_BODY
    created: int = field(default_factory=lambda: int(time.time()))

    def knows(self, model: str | None) -> bool:
        return model is None or model == self.model_id or model in self.aliases


def _error(exc: S.ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class _Stream(StreamingResponse):
    """A streaming response that calls `on_close` however it ends (a disconnect included)."""

    def __init__(self, content, on_close, **kw) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def create_app(engine: EngineLoop, cfg: AppConfig) -> FastAPI:
    app = FastAPI(title="specgen", docs_url=None, redoc_url=None, openapi_url=None)
    target = engine.target
    metrics = engine.metrics

    @app.exception_handler(S.ApiError)
    async def _api_error(request, exc: S.ApiError):
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(S.error_body(str(exc.detail), code=code), status_code=exc.status_code)

    def auth(request: HttpRequest) -> None:
        if cfg.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), cfg.api_key.encode()):
            raise S.ApiError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                             code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def read_json(request: HttpRequest):
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > cfg.max_body:
            raise S.ApiError(413, f"request body of {length} bytes exceeds the limit of {cfg.max_body}",
                             code="request_too_large")
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > cfg.max_body:
                raise S.ApiError(413, f"request body exceeds the limit of {cfg.max_body} bytes", code="request_too_large")

        def no_constant(name):
            raise ValueError(f"{name} is not valid JSON")

        try:
            return json.loads(bytes(data).decode("utf-8"), parse_constant=no_constant)
        except UnicodeDecodeError:
            raise S.bad("the request body is not UTF-8", code="invalid_json") from None
        except ValueError as exc:
            raise S.bad(f"the request body is not valid JSON: {exc}", code="invalid_json") from None

    def prompt_tokens(p: S.Parsed) -> tuple[list[int], list[str]]:
        stops = list(p.stops)
        if p.kind == "chat":
            fmt = cfg.chat_format
            if fmt is None:
                raise S.bad("this model has no chat template: use /v1/completions", code="no_chat_template")
            try:
                text = render(fmt, p.messages)
            except SpecgenError as exc:
                raise S.bad(str(exc), "messages", "invalid_messages") from None
            stops += [s for s in fmt.stop if s not in stops]
            return encode(target, text, [m["content"] for m in p.messages]), stops
        if isinstance(p.prompt, list):
            if max(p.prompt) >= target.n_vocab:
                raise S.bad(f"token id {max(p.prompt)} is outside the vocabulary of {target.n_vocab}", "prompt", "invalid_value")
            return list(p.prompt), stops
        return target.tokenize(p.prompt), stops

    def make_job(p: S.Parsed, tokens: list[int]) -> Job:
        n_ctx = target.n_ctx
        k = cfg.defaults.draft_max
        if len(tokens) + 1 + k + 1 > n_ctx:
            raise S.bad(f"the prompt has {len(tokens)} tokens; the context holds {n_ctx} "
                        "(with room for a reply and a draft)", "messages" if p.kind == "chat" else "prompt",
                        "context_length_exceeded")
        max_tokens = p.max_tokens
        if max_tokens is None:
            max_tokens = min(cfg.defaults.max_tokens, n_ctx - len(tokens) - k - 1)
        elif need_tokens(len(tokens), max_tokens, k) > n_ctx:
            raise S.bad(f"{len(tokens)} prompt + {max_tokens} completion tokens (+{k + 1} for drafts) exceed the "
                        f"context of {n_ctx} tokens; lower max_tokens", "max_tokens", "context_length_exceeded")
        job = Job(S.new_id(p.kind), tokens, max_tokens, p.params, draft_max=p.spec.draft_max, cache_prompt=p.cache_prompt)
        try:
            engine.check(job)
        except SpecgenError as exc:
            raise S.bad(str(exc), "max_tokens", "context_length_exceeded") from None
        return job

    async def generate(request: HttpRequest, kind: str):
        endpoint = "chat" if kind == "chat" else "completions"
        try:
            auth(request)
            body = await read_json(request)
            p = S.parse_chat(body, cfg.defaults) if kind == "chat" else S.parse_completion(body, cfg.defaults)
            if not cfg.knows(p.model):
                raise S.ApiError(404, f"the model '{p.model}' does not exist; this server serves '{cfg.model_id}'",
                                 param="model", code="model_not_found")
            tokens, stops = await run_in_threadpool(prompt_tokens, p)  # a long prompt must not stall the loop
            job = make_job(p, tokens)
            req = Request(job, stops, p.spec, asyncio.get_running_loop())
            engine.submit(req)
        except S.ApiError as exc:
            metrics.request(endpoint, exc.status)
            return _error(exc)
        except Exception as exc:  # a bug of ours: one error object, the server goes on
            log.exception("request failed")
            metrics.request(endpoint, 500)
            return _error(S.ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error",
                                     code="internal_error"))
        metrics.request(endpoint, 200)
        model = p.model or cfg.model_id
        return_tokens = isinstance(body, dict) and body.get("return_tokens") is True

        def on_close() -> None:
            if not req.ended:
                engine.cancel(req)

        if p.stream:
            return _Stream(_sse(req, kind, model, p.include_usage), on_close, media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            done = await _collect(req, request)
        finally:
            on_close()
        if done is None:  # the client went away
            return Response(status_code=499)
        if done[0] == "error":
            return _error(done[1])
        _, reason, record, text = done
        use = S.usage(record["prompt_tokens"], record["generated_tokens"], record["cached_tokens"])
        spec = S.speculative_block(req.spec, record)
        return JSONResponse(S.response(kind, job.id, model, text, S.finish_reason(reason), use, spec,
                                       record["tokens"] if return_tokens else None))

    async def _collect(req: Request, request: HttpRequest):
        """The request's end event; None if the client went away first (checked every 0.25 s,
        however often text arrives)."""
        clock = asyncio.get_running_loop().time
        next_check = clock() + 0.25
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
                next_check = clock() + 0.25

    async def _sse(req: Request, kind: str, model: str, include_usage: bool):
        rid, created = req.job.id, int(time.time())

        def data(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        if kind == "chat":
            yield data(S.chunk(kind, rid, model, created, role=True, text=""))
        while True:
            ev = await req.events.get()
            if ev[0] == "text":
                yield data(S.chunk(kind, rid, model, created, text=ev[1]))
                continue
            req.ended = True
            if ev[0] == "error":
                yield data(ev[1].body())
                yield "data: [DONE]\n\n"
                return
            _, reason, record, _text = ev
            use = S.usage(record["prompt_tokens"], record["generated_tokens"], record["cached_tokens"])
            spec = S.speculative_block(req.spec, record)
            last = S.chunk(kind, rid, model, created, finish=S.finish_reason(reason))
            if include_usage:
                yield data(last)
                last = S.chunk(kind, rid, model, created, choices=False)
            last["usage"], last["speculative"] = use, spec
            yield data(last)
            yield "data: [DONE]\n\n"
            return

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HttpRequest):
        return await generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        return await generate(request, "completion")

    @app.get("/v1/models")
    async def models(request: HttpRequest):
        auth(request)
        return {"object": "list", "data": [{"id": cfg.model_id, "object": "model", "created": cfg.created, "owned_by": "specgen"}]}

    @app.get("/health")
    async def health():
        body = {"status": "ok" if engine.accepting else "shutting_down", "slots": engine.parallel,
                "running": engine.running, "waiting": engine.waiting, "in_flight": engine.inflight}
        return JSONResponse(body, status_code=200 if engine.accepting else 503)

    @app.get("/metrics")
    async def metrics_text(request: HttpRequest):
        auth(request)
        gauges = {
            "specgen_requests_running": ("Requests in a slot now.", engine.running),
            "specgen_queue_depth": ("Requests waiting for a slot.", engine.waiting),
            "specgen_requests_in_flight": ("Requests accepted and not yet finished.", engine.inflight),
            "specgen_slots": ("Slots (--parallel).", engine.parallel),
            "specgen_decode_steps_total": ("Decode steps of the scheduler (one batch each).", engine.server.steps),
            "specgen_prompt_cache_enabled": ("1 when slots keep their cache for later prompts (--prompt-cache).",
                                             int(engine.server.prompt_cache)),
            "specgen_linger_waits_total": ("Waits for the next requests after a step that finished some.", engine.lingers[0]),
            "specgen_linger_requests_total": ("Requests those waits caught for the next step.", engine.lingers[1]),
            "specgen_linger_seconds_total": ("Time spent in those waits.", engine.lingers[2]),
        }
        store = getattr(engine.server, "store", None)
        if store is not None:  # slot caches saved to host memory (--cache-ram)
            gauges["specgen_prompt_store_states"] = ("Prompt states kept in host memory.", len(store))
            gauges["specgen_prompt_store_bytes"] = ("Their size in bytes.", store.bytes)
            gauges["specgen_prompt_store_loads_total"] = ("Prompt states loaded back into a slot.", store.loaded)
        gate = getattr(engine.server, "gate", None)
        if gate is not None:  # the shared-step gate (specgen.policy.stepgate): steps of 2+ sequences, drafting or not
            gauges["specgen_shared_steps_drafting_total"] = (
                "Steps of several sequences in which the policies could draft.", sum(d for d, _ in gate.steps))
            gauges["specgen_shared_steps_plain_total"] = (
                "Steps of several sequences the gate kept plain (drafting measured slower there).",
                sum(p for _, p in gate.steps))
        return PlainTextResponse(metrics.render(gauges), media_type="text/plain; version=0.0.4")

    return app


# -- running it ------------------------------------------------------------------


def listen(host: str, port: int):
    """A bound, listening socket (port 0: any free port); one clear error if it cannot be had."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SpecgenError(f"cannot resolve --host {host}: {exc.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise SpecgenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def http_server(app: FastAPI, *, grace: float, log_level: str = "warning"):
    """A uvicorn Server for the app: on SIGINT/SIGTERM it stops accepting and waits
    up to `grace` seconds for running responses before cancelling them."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=max(grace, 0.0),
                            lifespan="off", access_log=False, server_header=False)
    return uvicorn.Server(config)
