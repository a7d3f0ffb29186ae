"""The OpenAI wire format: request validation and response, chunk and error shapes.

Validation is by hand, so every refusal is one OpenAI error object with the
field it concerns (`param`), never a framework's own error shape.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from specgen.rules.sampling import SamplingParams

ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 4


class ApiError(Exception):
    """A request refused with an HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error", headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class Defaults:
    """What the command line set: the server's sampling, draft and size defaults."""

    params: SamplingParams = SamplingParams()
    max_tokens: int = 256
    mode: str = "lookup"  # the server's drafting: plain | lookup | draft
    draft_max: int = 0
    policy: str = "fixed"


@dataclass
class Spec:
    """One request's speculation: its mode and its ceiling on k."""

    mode: str
    draft_max: int
    policy: str


@dataclass
class Parsed:
    """A validated request, before tokenizing."""

    kind: str  # chat | completion
    model: str | None
    params: SamplingParams
    max_tokens: int | None  # None: what the context leaves (up to the server's default)
    stream: bool
    include_usage: bool
    stops: list[str]
    spec: Spec
    messages: list[dict] = field(default_factory=list)  # chat
    prompt: str | list[int] | None = None  # completion: text or token ids
    cache_prompt: bool = True  # llama-server's field: false prefills the whole prompt afresh


# -- field checks --------------------------------------------------------------


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float))) and not isinstance(v, bool)


def _opt(body: dict, name: str, check, what: str):
    v = body.get(name)
    if v is None:
        return None
    if not check(v):
        raise bad(f"'{name}' must be {what} (got {type(v).__name__} {v!r:.40})", name, "invalid_type")
    return v


def _unsupported(body: dict) -> None:
    n = _opt(body, "n", _is_int, "an integer")
    if n is not None and n != 1:
        raise bad(f"n={n} is not supported: this server returns one choice per request (n must be 1)", "n", "unsupported_parameter")
    best_of = _opt(body, "best_of", _is_int, "an integer")
    if best_of is not None and best_of != 1:
        raise bad("best_of is not supported (must be 1)", "best_of", "unsupported_parameter")
    for name in ("logprobs", "top_logprobs", "echo", "tools", "functions", "suffix", "logit_bias"):
        v = body.get(name)
        if v not in (None, False, [], {}, 0, ""):
            raise bad(f"'{name}' is not supported by this server", name, "unsupported_parameter")
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise bad("'response_format' other than {\"type\": \"text\"} is not supported", "response_format", "unsupported_parameter")


def _sampling(body: dict, d: Defaults) -> SamplingParams:
    temp = _opt(body, "temperature", _is_num, "a number")
    if temp is not None and not 0 <= temp <= 2:
        raise bad(f"'temperature' must be in [0, 2] (got {temp})", "temperature", "invalid_value")
    top_p = _opt(body, "top_p", _is_num, "a number")
    if top_p is not None and not 0 < top_p <= 1:
        raise bad(f"'top_p' must be in (0, 1] (got {top_p})", "top_p", "invalid_value")
    seed = _opt(body, "seed", _is_int, "an integer")
    base = d.params
    return SamplingParams(
        temperature=float(base.temperature if temp is None else temp),
        top_k=base.top_k,
        top_p=float(base.top_p if top_p is None else top_p),
        min_p=base.min_p,
        seed=base.seed if seed is None else seed,
        ignore_eos=base.ignore_eos,  # the server's --ignore-eos
    )


def _max_tokens(body: dict) -> int | None:
    m = _opt(body, "max_completion_tokens", _is_int, "an integer")
    if m is None:
        m = _opt(body, "max_tokens", _is_int, "an integer")
        name = "max_tokens"
    else:
        name = "max_completion_tokens"
    if m is not None and m < 1:
        raise bad(f"'{name}' must be >= 1 (got {m})", name, "invalid_value")
    return m


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOPS:
            raise bad(f"'stop' takes at most {MAX_STOPS} strings (got {len(stop)})", "stop", "invalid_value")
        return [s for s in stop if s]
    raise bad("'stop' must be a string or a list of strings", "stop", "invalid_type")


def _stream(body: dict) -> tuple[bool, bool]:
    stream = bool(_opt(body, "stream", lambda v: isinstance(v, bool), "a boolean"))
    so = _opt(body, "stream_options", lambda v: isinstance(v, dict), "an object")
    include = False
    if so is not None:
        include = bool(_opt(so, "include_usage", lambda v: isinstance(v, bool), "a boolean"))
    return stream, include


def _spec(body: dict, d: Defaults) -> Spec:
    """The `speculative` extension: {"mode": "lookup|draft|none", "k": N, "policy": NAME}.

    A request can turn speculation off (mode "none", or k = 0) or lower the
    ceiling on k; it cannot switch drafter or policy on a running server, and
    k above the server's -k is refused, since the scheduler reserves verify
    rows and cache for the server's k.
    """
    s = _opt(body, "speculative", lambda v: isinstance(v, dict), "an object")
    if s is None:
        return Spec(d.mode, d.draft_max, d.policy)
    unknown = set(s) - {"mode", "k", "policy"}
    if unknown:
        raise bad(f"'speculative' has unknown field(s): {', '.join(sorted(unknown))} (known: mode, k, policy)", "speculative")
    mode = _opt(s, "mode", lambda v: isinstance(v, str), "a string")
    if mode is not None and mode not in ("none", "plain", d.mode):
        served = "does not speculate (--no-spec)" if d.mode == "plain" else f"drafts by {d.mode}"
        choices = "'none'" if d.mode == "plain" else f"'{d.mode}' or 'none'"
        raise bad(f"speculative.mode '{mode}' is not available: this server {served} (a request may ask for {choices})",
                  "speculative.mode", "unsupported_parameter")
    k = _opt(s, "k", _is_int, "an integer")
    if k is not None and not 0 <= k <= d.draft_max:
        raise bad(f"speculative.k must be in 0..{d.draft_max}, the server's -k (got {k})", "speculative.k", "invalid_value")
    policy = _opt(s, "policy", lambda v: isinstance(v, str), "a string")
    if policy is not None and policy != d.policy:
        raise bad(f"speculative.policy '{policy}' is not available: this server runs '{d.policy}'",
                  "speculative.policy", "unsupported_parameter")
    if mode in ("none", "plain") or k == 0 or d.mode == "plain":
        return Spec("plain", 0, "fixed")
    return Spec(d.mode, d.draft_max if k is None else k, d.policy)


def _message_text(m, i: int) -> dict:
    if not isinstance(m, dict):
        raise bad(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)} (got {role!r:.40})", f"messages[{i}].role", "invalid_value")
    content = m.get("content")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content[{j}]: only text parts are supported", f"messages[{i}].content", "unsupported_parameter")
            texts.append(part["text"])
        content = "".join(texts)
    if content is None and role == "assistant":
        content = ""
    if not isinstance(content, str):
        raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content", "invalid_type")
    return {"role": "system" if role == "developer" else role, "content": content}


def _common(body, d: Defaults) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_type")
    _unsupported(body)
    model = _opt(body, "model", lambda v: isinstance(v, str), "a string")
    stream, include = _stream(body)
    cache_prompt = _opt(body, "cache_prompt", lambda v: isinstance(v, bool), "a boolean")
    return dict(model=model, params=_sampling(body, d), max_tokens=_max_tokens(body), stream=stream,
                include_usage=include, stops=_stops(body), spec=_spec(body, d), cache_prompt=cache_prompt is not False)


def parse_chat(body, d: Defaults) -> Parsed:
    common = _common(body, d)
    messages = body.get("messages")
    if messages is None:
        raise bad("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise bad("'messages' must be a list", "messages", "invalid_type")
    if not messages:
        raise bad("'messages' must not be empty", "messages", "empty_array")
    return Parsed("chat", messages=[_message_text(m, i) for i, m in enumerate(messages)], **common)


def parse_completion(body, d: Defaults) -> Parsed:
    common = _common(body, d)
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("'prompt' is required", "prompt", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt given as a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(_is_int(t) and t >= 0 for t in prompt):
            raise bad("'prompt' must be a string, or a list of token ids (one prompt per request)", "prompt", "invalid_type")
    elif not isinstance(prompt, str):
        raise bad("'prompt' must be a string, or a list of token ids (one prompt per request)", "prompt", "invalid_type")
    if not prompt:
        raise bad("'prompt' must not be empty", "prompt", "invalid_value")
    return Parsed("completion", prompt=prompt, **common)


# -- responses -------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


FINISH = {"eos": "stop", "stop": "stop", "max_tokens": "length", "context_full": "length"}


def finish_reason(stop_reason: str) -> str:
    return FINISH.get(stop_reason, "stop")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; cached_tokens: prompt tokens the prompt cache served (not prefilled)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def speculative_block(spec: Spec, record: dict) -> dict:
    """What speculation did for one request (ServeResult.record()'s numbers)."""
    return {
        "mode": spec.mode,
        "k_max": spec.draft_max,
        "policy": spec.policy,
        "rounds": record["rounds"],
        "drafted": record["drafted"],
        "accepted": record["accepted"],
        "acceptance_rate": record["acceptance_rate"],
        "mean_accepted_len": record["mean_accepted_len"],
        "k_hist": record["k_hist"],
        "queue_s": record["queue_s"],
        "ttft_s": record["ttft_s"],
        "latency_s": record["latency_s"],
        "decode_tokens_per_s": record["tokens_per_s"],
    }


def timings_block(record: dict) -> dict:
    """llama-server's `timings` object for one request (its field names and units: milliseconds).

    prompt_n: prompt tokens prefilled (cache_n more came from the prompt
    cache); prompt_ms: admission → first token (the prefill); predicted_n:
    tokens generated; predicted_ms: first token → last; draft_n /
    draft_n_accepted: draft tokens proposed / accepted. llama-server leaves
    the draft fields out when nothing was drafted; here they are always
    there (0), so a client can tell "speculation did not engage" from a
    server that does not report it.
    """
    cached = int(record.get("cached_tokens") or 0)
    prompt_n = max(int(record["prompt_tokens"]) - cached, 0)
    prompt_ms = 1000.0 * max(record["ttft_s"] - record["queue_s"], 0.0)
    predicted_n = int(record["generated_tokens"])
    predicted_ms = 1000.0 * max(record["latency_s"] - record["ttft_s"], 0.0)
    return {
        "cache_n": cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
        "predicted_per_second": 1000.0 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0,
        "draft_n": int(record["drafted"]),
        "draft_n_accepted": int(record["accepted"]),
    }


def response(kind: str, rid: str, model: str, text: str, finish: str, use: dict, spec: dict, tokens=None,
             timings: dict | None = None) -> dict:
    created = int(time.time())
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    if tokens is not None:
        choice["tokens"] = tokens
    out = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
           "usage": use, "speculative": spec}
    if timings is not None:
        out["timings"] = timings
    return out


def chunk(kind: str, rid: str, model: str, created: int, *, text: str | None = None, role: bool = False,
          finish: str | None = None, choices: bool = True) -> dict:
    if kind == "chat":
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice] if choices else []}
