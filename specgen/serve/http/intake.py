"""A request on its way in: the API key, the body read within its limit, the
prompt tokenized, and the scheduler Job it becomes.

Every refusal is an ApiError in OpenAI's error shape (specgen.serve.http.schema).
"""

from __future__ import annotations

import hmac
import json

from fastapi import Request as HttpRequest

from specgen.apps.chat import ChatFormat, encode, render
from specgen.errors import SpecgenError
from specgen.serve.http import schema as S
from specgen.serve.scheduler import Job, need_tokens


def check_auth(request: HttpRequest, api_key: str | None) -> None:
    """Refuse (401) a request without `Authorization: Bearer KEY` when the server has a key."""
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise S.ApiError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                         code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def read_json(request: HttpRequest, max_body: int):
    """The body as JSON, refused (413) once it passes `max_body` bytes, announced or not."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > max_body:
        raise S.ApiError(413, f"request body of {length} bytes exceeds the limit of {max_body}",
                         code="request_too_large")
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > max_body:
            raise S.ApiError(413, f"request body exceeds the limit of {max_body} bytes", code="request_too_large")
    return parse_json(bytes(data))


def parse_json(data: bytes):
    """Strict JSON (no NaN or Infinity) from UTF-8 bytes, or a 400 naming what is wrong."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise S.bad("the request body is not UTF-8", code="invalid_json") from None
    except ValueError as exc:
        raise S.bad(f"the request body is not valid JSON: {exc}", code="invalid_json") from None


def _no_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def prompt_tokens(p: S.Parsed, target, chat_format: ChatFormat | None) -> tuple[list[int], list[str]]:
    """The prompt's tokens and the stop strings (a chat adds its template's own)."""
    if p.kind == "chat":
        return _chat_tokens(p, target, chat_format)
    stops = list(p.stops)
    if isinstance(p.prompt, list):
        if max(p.prompt) >= target.n_vocab:
            raise S.bad(f"token id {max(p.prompt)} is outside the vocabulary of {target.n_vocab}", "prompt", "invalid_value")
        return list(p.prompt), stops
    return target.tokenize(p.prompt), stops


def _chat_tokens(p: S.Parsed, target, fmt: ChatFormat | None) -> tuple[list[int], list[str]]:
    if fmt is None:
        raise S.bad("this model has no chat template: use /v1/completions", code="no_chat_template")
    try:
        text = render(fmt, p.messages)
    except SpecgenError as exc:
        raise S.bad(str(exc), "messages", "invalid_messages") from None
    stops = list(p.stops)
    stops += [s for s in fmt.stop if s not in stops]
    return encode(target, text, [m["content"] for m in p.messages]), stops


def make_job(p: S.Parsed, tokens: list[int], engine, defaults: S.Defaults) -> Job:
    """The scheduler's Job for the request, refused (400) when prompt and reply cannot fit the context."""
    n_ctx = engine.target.n_ctx
    k = defaults.draft_max
    if len(tokens) + 1 + k + 1 > n_ctx:
        raise S.bad(f"the prompt has {len(tokens)} tokens; the context holds {n_ctx} "
                    "(with room for a reply and a draft)", "messages" if p.kind == "chat" else "prompt",
                    "context_length_exceeded")
    max_tokens = p.max_tokens
    if max_tokens is None:
        max_tokens = min(defaults.max_tokens, n_ctx - len(tokens) - k - 1)
    elif need_tokens(len(tokens), max_tokens, k) > n_ctx:
        raise S.bad(f"{len(tokens)} prompt + {max_tokens} completion tokens (+{k + 1} for drafts) exceed the "
                    f"context of {n_ctx} tokens; lower max_tokens", "max_tokens", "context_length_exceeded")
    job = Job(S.new_id(p.kind), tokens, max_tokens, p.params, draft_max=p.spec.draft_max, cache_prompt=p.cache_prompt)
    try:
        engine.check(job)
    except SpecgenError as exc:
        raise S.bad(str(exc), "max_tokens", "context_length_exceeded") from None
    return job
