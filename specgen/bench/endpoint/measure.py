"""The HTTP side of `specgen bench --endpoint`: endpoints, the probe, one streamed request.

An Endpoint is a configuration served by some OpenAI-compatible server
(`specgen serve`, llama.cpp's `llama-server`, vLLM, SGLang …): a base URL,
an optional model name, an API key read from the environment, and extra JSON
merged into every request body (so one specgen server can be both
configurations: `{"speculative": {"mode": "none"}}`). `probe` turns an
endpoint that cannot be used into one SpecgenError line before any request
is timed; `stream_one` sends one streamed request and returns what it saw:
time to first token, the arrival time of every chunk, tokens, the server's
own speculative statistics, HTTP status and error text. It never raises for
a failed request: a failure is a result (`error` set), counted, not fatal.

Speculative statistics (where each figure came from, counter differences
around a request for a server with only /metrics counters) are read by
specgen.bench.endpoint.spec_sources.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence
from urllib.parse import urlsplit

import httpx

from specgen.bench.requests import Request
from specgen.bench.endpoint.spec_sources import COUNTER_FAMILIES, asks_speculation, sample_names, spec_stats
from specgen.bench.endpoint.spec_sources import parse_counters  # noqa: F401 - benchmarks/http_client.py imports it from here
from specgen.bench.endpoint.client import BadResponse, ConnectFailed, ServerClosed, SseLines, StreamError, StreamPool
from specgen.errors import SpecgenError

PROBE_TIMEOUT_S = 10.0
ERROR_TEXT_MAX = 300
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


@dataclass
class Endpoint:
    """One configuration: a server (and body overrides) to measure.

    `kind` is "plain" for the baseline and "http" otherwise, so the bench's
    tables treat the baseline as they treat plain decoding in process.
    """

    name: str
    url: str  # base URL, without /v1
    model: str | None = None
    key_env: str | None = None
    body: dict = field(default_factory=dict)
    kind: str = "http"
    counters: str | None = None  # set by probe: the family of speculative counters /metrics carries (COUNTER_FAMILIES)
    per_request: bool = False  # set by the warm-up: its responses carry their own speculative statistics

    @property
    def vllm_metrics(self) -> bool:
        return self.counters == "vllm"

    @property
    def speculative(self) -> bool:
        """Named as speculative: its body asks for speculation, or (unless its body turns it
        off) the run compares it against the baseline."""
        asked = asks_speculation(self.body)
        return asked if asked is not None else self.kind != "plain"

    @property
    def label(self) -> str:
        return self.name

    @property
    def headers(self) -> dict:
        if self.key_env is None:
            return {}
        return {"Authorization": f"Bearer {os.environ[self.key_env]}"}

    def meta(self) -> dict:
        """What the records file says about this endpoint (never the key itself)."""
        return {"name": self.name, "url": self.url, "model": self.model, "key_env": self.key_env, "body": self.body,
                "baseline": self.kind == "plain"}


# =============================================================== parsing the options


def _pairs(texts: Iterable[str] | None, flag: str) -> list[tuple[str, str]]:
    out = []
    for t in texts or []:
        name, sep, value = t.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise SpecgenError(f"{flag} '{t}': expected NAME=VALUE")
        out.append((name.strip(), value.strip()))
    return out


def normalize_url(url: str, name: str) -> str:
    """`http://host:port[/v1][/]` → `http://host:port` (the paths are added per request)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecgenError(f"--endpoint {name}={url}: expected an http:// or https:// URL, e.g. http://127.0.0.1:8080")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise SpecgenError(f"--endpoint {name}={url}: bad port") from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


def parse_endpoints(
    endpoints: Sequence[str],
    models: Sequence[str] | None = None,
    key_envs: Sequence[str] | None = None,
    bodies: Sequence[str] | None = None,
    baseline: str | None = None,
) -> list[Endpoint]:
    """`--endpoint NAME=URL` (repeatable) with `--endpoint-model/-key-env/-body NAME=…`; the baseline first."""
    eps: dict[str, Endpoint] = {}
    for name, url in _pairs(endpoints, "--endpoint"):
        if not _NAME_RE.match(name):
            raise SpecgenError(f"--endpoint {name}: a name is letters, digits and _.+- (up to 64)")
        if name in eps:
            raise SpecgenError(f"--endpoint {name} given twice")
        eps[name] = Endpoint(name, normalize_url(url, name))
    if len(eps) < 2:
        raise SpecgenError("give at least two --endpoint NAME=URL: a baseline and a configuration to compare with it "
                           "(one server can be both: add --endpoint-body NAME=JSON to one of them)")

    def target(name: str, flag: str) -> Endpoint:
        if name not in eps:
            raise SpecgenError(f"{flag} {name}: no --endpoint named {name} (have {', '.join(eps)})")
        return eps[name]

    for name, model in _pairs(models, "--endpoint-model"):
        target(name, "--endpoint-model").model = model
    for name, var in _pairs(key_envs, "--endpoint-key-env"):
        ep = target(name, "--endpoint-key-env")
        if not os.environ.get(var):
            raise SpecgenError(f"--endpoint-key-env {name}={var}: the environment variable {var} is not set")
        ep.key_env = var
    for name, text in _pairs(bodies, "--endpoint-body"):
        ep = target(name, "--endpoint-body")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecgenError(f"--endpoint-body {name}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise SpecgenError(f"--endpoint-body {name}: expected a JSON object, got {type(obj).__name__}")
        ep.body = merge(ep.body, obj)
    order = list(eps)
    if baseline is not None:
        target(baseline, "--baseline")
        order.remove(baseline)
        order.insert(0, baseline)
    out = [eps[n] for n in order]
    out[0].kind = "plain"
    return out


def merge(base: dict, extra: dict) -> dict:
    """`extra` merged into `base`, objects merged key by key (a copy; neither is changed)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# =============================================================== one request


@dataclass(frozen=True)
class Sampling:
    """What every endpoint is asked for, unless a request sets its own."""

    max_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = False


def request_body(ep: Endpoint, req: Request, s: Sampling, max_tokens: int | None = None) -> tuple[str, dict]:
    """(path, body) of one streamed request: chat for `messages`, completions for `prompt`."""
    if req.messages is not None:
        path, body = "/v1/chat/completions", {"messages": [{"role": r, "content": c} for r, c in req.messages]}
    else:
        path, body = "/v1/completions", {"prompt": req.prompt}
    if ep.model is not None:
        body["model"] = ep.model
    body.update(
        max_tokens=max_tokens or req.max_tokens or s.max_tokens,
        temperature=s.temperature if req.temperature is None else req.temperature,
        seed=s.seed if req.seed is None else req.seed,
        stream=True,
        stream_options={"include_usage": True},
    )
    if s.ignore_eos:
        body["ignore_eos"] = True  # llama-server's and vLLM's field
    return path, merge(body, ep.body)


def short_text(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= ERROR_TEXT_MAX else text[: ERROR_TEXT_MAX - 1] + "…"


def error_text(raw: bytes | str) -> str:
    """The message of an error body (OpenAI's shape or any other), one line."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return short_text(text) or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and err.get("message"):
            return short_text(err["message"])
        if isinstance(err, str):
            return short_text(err)
        if isinstance(obj.get("detail"), str):
            return short_text(obj["detail"])
    return short_text(text)


def describe(exc: BaseException, timeout: float | None = None) -> str:
    """One line for a transport failure: refused, unresolvable, TLS, timed out, cut off."""
    chain, e = [], exc
    while e is not None and len(chain) < 8:
        chain.append(e)
        e = e.__cause__ or e.__context__
    if any(isinstance(x, ssl.SSLError) for x in chain) or "SSL" in str(exc) or "CERTIFICATE" in str(exc):
        return f"TLS failure: {short_text(str(exc))}"
    if isinstance(exc, (httpx.TimeoutException, asyncio.TimeoutError, TimeoutError)):
        return f"timed out after {timeout:g} s" if timeout else "timed out"
    if isinstance(exc, (httpx.ConnectError, ConnectFailed)):
        refused = any(isinstance(x, ConnectionRefusedError) for x in chain) or "refused" in str(exc).lower()
        return "connection refused" if refused else f"cannot connect: {short_text(str(exc)) or type(exc).__name__}"
    if isinstance(exc, BadResponse):
        return short_text(str(exc))
    if isinstance(exc, (httpx.RemoteProtocolError, ServerClosed)):
        return f"the server closed the connection mid-response: {short_text(str(exc))}"
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {short_text(str(exc))}"
    return f"{type(exc).__name__}: {short_text(str(exc))}"


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class RequestFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


async def stream_one(pool: StreamPool, ep: Endpoint, path: str, body: dict, timeout: float) -> dict:
    """Send one streamed request; its measurements (always a dict; `error` is None when it succeeded).

    Times are seconds from just before the request is sent (`started`, on
    time.perf_counter's clock): ttft_s to the arrival of the first chunk
    carrying text, total_s to the arrival of [DONE], chunk_s for every chunk
    with text. One chunk may carry several tokens (a speculative server
    settles several at once), so the token count is the server's
    usage.completion_tokens when it reports one, else the chunks. The stream
    is parsed as its bytes arrive (specgen.bench.endpoint.client), not by httpx.
    """
    out: dict = {"status": None, "error": None, "ttft_s": None, "total_s": None, "chunk_s": [], "text": "",
                 "usage": None, "speculative": None, "timings": None, "metrics": None, "finish_reason": None}
    data = json.dumps(body).encode()
    out["started"] = t0 = time.perf_counter()
    try:
        await asyncio.wait_for(pool.post(ep.url, path, ep.headers, data, SseReader(out, t0)), timeout)
    except RequestFailed as f:
        out["error"] = f.message
    except (asyncio.TimeoutError, StreamError) as e:
        out["error"] = describe(e, timeout)
    out["total_s"] = time.perf_counter() - t0 if out["total_s"] is None else out["total_s"]
    return out


class SseReader:
    """One response, read inside the connection's callbacks: status, then the SSE events as they arrive."""

    ERROR_BODY_MAX = 65536

    def __init__(self, out: dict, t0: float) -> None:
        self.out, self.t0 = out, t0
        self.lines = SseLines()
        self.texts: list[str] = []
        self.done = False  # [DONE] seen: the rest is read to the end, so the connection is kept for the next request
        self.refused: str | None = None  # not a stream: why, once its body (kept in `error_body`) has ended
        self.error_body = bytearray()

    def response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.out["status"] = status
        if status != 200:
            self.refused = f"HTTP {status}"
            return
        ctype = next((v.decode("latin-1") for k, v in headers if k == b"content-type"), "")
        if "text/event-stream" not in ctype:
            self.refused = f"not a stream (content-type {ctype or 'none'})"

    def data(self, data: bytes, now: float) -> None:
        if self.refused is not None:
            if len(self.error_body) < self.ERROR_BODY_MAX:
                self.error_body += data
        elif not self.done:
            for line in self.lines.feed(data):
                self.event(line, now)

    def end(self) -> None:
        if self.refused is not None:
            raise RequestFailed(f"{self.refused}: {error_text(bytes(self.error_body))}")
        now = time.perf_counter()
        for line in self.lines.tail():
            if not self.done:
                self.event(line, now)
        self.out["text"] = "".join(self.texts)
        if not self.done:
            raise RequestFailed("the stream ended without data: [DONE]" + (" (and no text)" if not self.texts else ""))

    def event(self, data: bytes, now: float) -> None:
        out = self.out
        if data == b"[DONE]":
            self.done = True
            out["total_s"] = now - self.t0
            return
        try:
            obj = json.loads(data)
        except ValueError:  # not JSON, or not UTF-8
            raise RequestFailed(f"malformed SSE: a data line is not JSON: {short_text(data.decode(errors='replace'))}") from None
        if not isinstance(obj, dict):
            raise RequestFailed(f"malformed SSE: a data line is not a JSON object: {short_text(data.decode(errors='replace'))}")
        if "error" in obj:
            raise RequestFailed(f"error in the stream: {error_text(json.dumps(obj))}")
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                raise RequestFailed("malformed SSE: a choice is not an object")
            delta = choice.get("delta")
            piece = choice.get("text") if delta is None else (delta or {}).get("content")
            if piece:
                if out["ttft_s"] is None:
                    out["ttft_s"] = now - self.t0
                out["chunk_s"].append(now - self.t0)
                self.texts.append(piece)
            if choice.get("finish_reason"):
                out["finish_reason"] = choice["finish_reason"]
        for key in ("usage", "speculative", "timings", "metrics"):
            if isinstance(obj.get(key), dict):
                out[key] = obj[key]


def run_measures(raw: dict) -> dict:
    """The run record's measurements from `stream_one`'s result (a successful one)."""
    usage = raw["usage"] or {}
    n = usage.get("completion_tokens")
    chunks = raw["chunk_s"]
    tokens = int(n) if isinstance(n, int) and n >= 0 else len(chunks)
    total = raw["total_s"]
    ttft = raw["ttft_s"] if raw["ttft_s"] is not None else total
    decode = max(total - ttft, 0.0)
    gaps = [b - a for a, b in zip(chunks, chunks[1:])]
    out = {
        "status": raw["status"],
        "error": None,
        "ttft_s": ttft,
        "total_s": total,
        "decode_s": decode,
        "generated_tokens": tokens,
        "tokens_from": "usage" if isinstance(n, int) else "chunks",
        "prompt_tokens": usage.get("prompt_tokens"),
        "chunks": len(chunks),
        "tpot_s": decode / (tokens - 1) if tokens > 1 else None,
        "itl_p50_s": _percentile(gaps, 50),
        "itl_p95_s": _percentile(gaps, 95),
        "tokens_per_s": (tokens - 1) / decode if tokens > 1 and decode > 0 else 0.0,
        "finish_reason": raw["finish_reason"],
        "text": raw["text"],
    }
    out.update(spec_stats(raw["speculative"], raw["timings"], raw.get("metrics")))
    return out


# =============================================================== the probe and vLLM's counters


async def probe(client: httpx.AsyncClient, ep: Endpoint) -> list[str]:
    """GET /v1/models: the model ids it serves; one SpecgenError line if the endpoint cannot be used.

    Also looks at /metrics for speculative counters (sets ep.counters to their family).
    When no --endpoint-model was given, the first model listed is used.
    """
    where = f"endpoint {ep.name} ({ep.url})"
    try:
        r = await client.get(ep.url + "/v1/models", headers=ep.headers, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as e:
        raise SpecgenError(f"{where}: {describe(e, PROBE_TIMEOUT_S)}") from None
    if r.status_code in (401, 403):
        hint = "check the key" if ep.key_env else f"give one with --endpoint-key-env {ep.name}=VAR"
        raise SpecgenError(f"{where}: authentication failed (HTTP {r.status_code}: {error_text(r.content)}); {hint}")
    if r.status_code != 200:
        raise SpecgenError(f"{where}: not an OpenAI-compatible server: GET /v1/models answered HTTP {r.status_code}: "
                           f"{error_text(r.content)}")
    try:
        data = r.json()["data"]
        ids = [m["id"] for m in data]
    except (ValueError, KeyError, TypeError):
        raise SpecgenError(f"{where}: not an OpenAI-compatible server: GET /v1/models did not answer a model list "
                           f"({error_text(r.content)})") from None
    if ep.model is None and ids:
        ep.model = ids[0]
    ep.counters = None
    try:
        m = await client.get(ep.url + "/metrics", headers=ep.headers, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return ids
    if m.status_code == 200:
        names = sample_names(m.text)
        ep.counters = next((f for f, (c, _) in COUNTER_FAMILIES.items() if set(c) <= names), None)
    return ids
