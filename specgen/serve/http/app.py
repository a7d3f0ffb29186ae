"""The HTTP face: FastAPI endpoints in OpenAI's shapes over an EngineLoop.

POST /v1/chat/completions, POST /v1/completions (streamed as server-sent
events or not), GET /v1/models, GET /health, GET /metrics. Handlers validate,
tokenize and hand the request to the engine thread; they never wait on it
except through their own asyncio queue.

`Routes` holds the app's state and its handlers; the way in (auth, body,
tokens, job) is specgen.serve.http.intake, the way out (SSE or one JSON body)
specgen.serve.http.responses.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from specgen.apps.chat import ChatFormat
from specgen.errors import SpecgenError
from specgen.serve.http import schema as S
from specgen.serve.http.intake import check_auth, make_job, prompt_tokens, read_json
from specgen.serve.http.loop import EngineLoop, Request, log
from specgen.serve.http.responses import error_response, sse_response, whole_response

MAX_BODY = 4 * 1024 * 1024  # bytes
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


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


def create_app(engine: EngineLoop, cfg: AppConfig) -> FastAPI:
    app = FastAPI(title="specgen", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(S.ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    routes = Routes(engine, cfg)
    app.post("/v1/chat/completions")(routes.chat_completions)
    app.post("/v1/completions")(routes.completions)
    app.get("/v1/models")(routes.models)
    app.get("/health")(routes.health)
    app.get("/metrics")(routes.metrics_text)
    return app


async def _api_error(request, exc: S.ApiError):
    return error_response(exc)


async def _http_error(request, exc: StarletteHTTPException):
    code = _HTTP_CODES.get(exc.status_code)
    return JSONResponse(S.error_body(str(exc.detail), code=code), status_code=exc.status_code)


class Routes:
    """The route handlers over one engine loop and its configuration."""

    def __init__(self, engine: EngineLoop, cfg: AppConfig) -> None:
        self.engine, self.cfg = engine, cfg
        self.target, self.metrics = engine.target, engine.metrics

    async def chat_completions(self, request: HttpRequest):
        return await self.generate(request, "chat")

    async def completions(self, request: HttpRequest):
        return await self.generate(request, "completion")

    async def models(self, request: HttpRequest):
        check_auth(request, self.cfg.api_key)
        entry = {"id": self.cfg.model_id, "object": "model", "created": self.cfg.created, "owned_by": "specgen"}
        return {"object": "list", "data": [entry]}

    async def health(self):
        e = self.engine
        body = {"status": "ok" if e.accepting else "shutting_down", "slots": e.parallel,
                "running": e.running, "waiting": e.waiting, "in_flight": e.inflight}
        return JSONResponse(body, status_code=200 if e.accepting else 503)

    async def metrics_text(self, request: HttpRequest):
        check_auth(request, self.cfg.api_key)
        text = self.metrics.render(gauges(self.engine), model_name=self.cfg.model_id, draft_max=self.cfg.defaults.draft_max)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # -- generation

    async def generate(self, request: HttpRequest, kind: str):
        """Admit the request (any refusal: one error object), then stream or collect its reply."""
        endpoint = "chat" if kind == "chat" else "completions"
        try:
            p, body, req = await self.admit(request, kind)
        except S.ApiError as exc:
            self.metrics.request(endpoint, exc.status)
            return error_response(exc)
        except Exception as exc:  # a bug of ours: one error object, the server goes on
            log.exception("request failed")
            self.metrics.request(endpoint, 500)
            return error_response(S.ApiError(500, f"internal error: {type(exc).__name__}: {exc}",
                                             type="server_error", code="internal_error"))
        self.metrics.request(endpoint, 200)
        model = p.model or self.cfg.model_id
        on_close = functools.partial(self.release, req)
        if p.stream:
            return sse_response(req, kind, model, p.include_usage, on_close)
        return_tokens = isinstance(body, dict) and body.get("return_tokens") is True
        return await whole_response(req, request, kind, model, return_tokens, on_close)

    async def admit(self, request: HttpRequest, kind: str) -> tuple[S.Parsed, object, Request]:
        """Auth, body, parse, model name, tokens, job: the request handed to the engine thread."""
        check_auth(request, self.cfg.api_key)
        body = await read_json(request, self.cfg.max_body)
        p = S.parse_chat(body, self.cfg.defaults) if kind == "chat" else S.parse_completion(body, self.cfg.defaults)
        if not self.cfg.knows(p.model):
            raise S.ApiError(404, f"the model '{p.model}' does not exist; this server serves '{self.cfg.model_id}'",
                             param="model", code="model_not_found")
        # a long prompt must not stall the event loop
        tokens, stops = await run_in_threadpool(prompt_tokens, p, self.target, self.cfg.chat_format)
        job = make_job(p, tokens, self.engine, self.cfg.defaults)
        req = Request(job, stops, p.spec, asyncio.get_running_loop())
        self.engine.submit(req)
        return p, body, req

    def release(self, req: Request) -> None:
        """However the response ends: a request the client did not see end is cancelled."""
        if not req.ended:
            self.engine.cancel(req)


# -- /metrics gauges -------------------------------------------------------------


def gauges(engine: EngineLoop) -> dict[str, tuple[str, float]]:
    """The gauges of /metrics: name → (help, value)."""
    server = engine.server
    out = {
        "specgen_requests_running": ("Requests in a slot now.", engine.running),
        "specgen_queue_depth": ("Requests waiting for a slot.", engine.waiting),
        "specgen_requests_in_flight": ("Requests accepted and not yet finished.", engine.inflight),
        "specgen_slots": ("Slots (--parallel).", engine.parallel),
        "specgen_decode_steps_total": ("Decode steps of the scheduler (one batch each).", server.steps),
        "specgen_prompt_cache_enabled": ("1 when slots keep their cache for later prompts (--prompt-cache).",
                                         int(server.prompt_cache)),
        "specgen_linger_waits_total": ("Waits for the next requests after a step that finished some.", engine.lingers[0]),
        "specgen_linger_requests_total": ("Requests those waits caught for the next step.", engine.lingers[1]),
        "specgen_linger_seconds_total": ("Time spent in those waits.", engine.lingers[2]),
    }
    out.update(_store_gauges(getattr(server, "store", None)))
    out.update(_gate_gauges(getattr(server, "gate", None)))
    return out


def _store_gauges(store) -> dict[str, tuple[str, float]]:
    """Slot caches saved to host memory (--cache-ram), when there is a store."""
    if store is None:
        return {}
    return {
        "specgen_prompt_store_states": ("Prompt states kept in host memory.", len(store)),
        "specgen_prompt_store_bytes": ("Their size in bytes.", store.bytes),
        "specgen_prompt_store_loads_total": ("Prompt states loaded back into a slot.", store.loaded),
    }


def _gate_gauges(gate) -> dict[str, tuple[str, float]]:
    """The shared-step gate (specgen.policy.stepgate): steps of 2+ sequences, drafting or not."""
    if gate is None:
        return {}
    return {
        "specgen_shared_steps_drafting_total": (
            "Steps of several sequences in which the policies could draft.", sum(d for d, _ in gate.steps)),
        "specgen_shared_steps_plain_total": (
            "Steps of several sequences the gate kept plain (drafting measured slower there).",
            sum(p for _, p in gate.steps)),
    }


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
