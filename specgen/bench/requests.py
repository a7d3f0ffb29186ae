"""Bench requests: the request file (JSONL or one prompt a line), parsed strictly.

JSONL lines carry `prompt` or `messages`, optional `id`, `category`,
`max_tokens`, `temperature`, `seed`; with no file, the bundled set in
specgen/data/requests.jsonl. `messages` go through the model's own chat
template, rendered by specgen.apps.chat (the renderer `specgen chat` uses).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

from specgen.apps import chat
from specgen.errors import SpecgenError, read_text_file

BUNDLED = "requests.jsonl"
REQUEST_KEYS = ("id", "prompt", "messages", "category", "max_tokens", "temperature", "seed")
DEFAULT_CATEGORY = "general"


@dataclass(frozen=True)
class Request:
    id: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content)
    category: str = DEFAULT_CATEGORY
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    line: int = 0


def bundled_requests_text() -> str:
    return resources.files("specgen").joinpath("data", BUNDLED).read_text(encoding="utf-8")


def load_requests(path: Path | None) -> list[Request]:
    """A request file (JSONL, or text with one prompt a line); None: the bundled set."""
    if path is None:
        return parse_requests(bundled_requests_text(), f"<bundled {BUNDLED}>", jsonl=True)
    text = read_text_file(path, "request file")
    jsonl = None
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        jsonl = True
    elif path.suffix.lower() == ".txt":
        jsonl = False
    return parse_requests(text, str(path), jsonl=jsonl)


def parse_requests(text: str, source: str, *, jsonl: bool | None = None) -> list[Request]:
    """Parse a request set. jsonl=None: JSONL if the first non-blank line starts with '{'."""
    lines = text.splitlines()
    if jsonl is None:
        first = next((ln for ln in lines if ln.strip()), "")
        jsonl = first.lstrip().startswith("{")
    requests: list[Request] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        req = _json_request(raw, source, n) if jsonl else Request(id=f"line{n}", prompt=raw, line=n)
        if req.id in seen:
            raise SpecgenError(f"{source}:{n}: duplicate id '{req.id}' (first on line {seen[req.id]})")
        seen[req.id] = n
        requests.append(req)
    if not requests:
        raise SpecgenError(f"no requests in {source} (empty file)")
    return requests


def _json_request(raw: str, source: str, n: int) -> Request:
    where = f"{source}:{n}"
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SpecgenError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(obj, dict):
        raise SpecgenError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(REQUEST_KEYS))
    if unknown:
        raise SpecgenError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(REQUEST_KEYS)}")
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if prompt is None and messages is None:
        raise SpecgenError(f"{where}: missing 'prompt' (or 'messages')")
    if prompt is not None and messages is not None:
        raise SpecgenError(f"{where}: give 'prompt' or 'messages', not both")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise SpecgenError(f"{where}: 'prompt' must be a non-empty string")
    msgs = _messages(messages, where) if messages is not None else None
    rid = obj.get("id", f"line{n}")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or not str(rid).strip():
        raise SpecgenError(f"{where}: 'id' must be a non-empty string or an integer")
    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise SpecgenError(f"{where}: 'category' must be a non-empty string")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise SpecgenError(f"{where}: 'max_tokens' must be an integer >= 1 (got {max_tokens!r})")
    temperature = obj.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf
    ):
        raise SpecgenError(f"{where}: 'temperature' must be a number >= 0 (got {temperature!r})")
    seed = obj.get("seed")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise SpecgenError(f"{where}: 'seed' must be an integer >= 0 (got {seed!r})")
    return Request(
        id=str(rid).strip(),
        prompt=prompt,
        messages=msgs,
        category=category.strip(),
        max_tokens=max_tokens,
        temperature=None if temperature is None else float(temperature),
        seed=seed,
        line=n,
    )


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _messages(value, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise SpecgenError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise SpecgenError(f"{where}: messages[{i}] needs string 'role' and 'content'")
        out.append((m["role"], m["content"]))
    return tuple(out)


def apply_chat_template(engine, messages: Sequence[tuple[str, str]]) -> str:
    """The model's own chat template over `messages`, ending with the assistant's turn."""
    if not engine.chat_template():
        raise SpecgenError(f"{engine.path.name} has no chat template: give requests as 'prompt', not 'messages'")
    return chat.render(chat.format_for(engine, "gguf"), [{"role": r, "content": c} for r, c in messages])


def request_tokens(engine, req: Request) -> list[int]:
    """The prompt tokens of a request: its text, or its messages through the chat template
    (tokenized as `specgen chat` does: message contents never parse as special tokens)."""
    if req.messages is None:
        return engine.tokenize(req.prompt)
    return chat.encode(engine, apply_chat_template(engine, req.messages), [c for _, c in req.messages])
