"""`specgen bench`: serve a request set through plain and speculative decoding, side by side.

The logic only; the command and all rendering live in cli_bench.py.

- Requests: JSONL (`prompt` or `messages`, optional `id`, `category`,
  `max_tokens`, `temperature`, `seed`) or plain text, one prompt a line; with
  no file, the bundled set in specgen/data/requests.jsonl.
- Configurations: plain is always measured; `lookup[:k=N,ngram=N,ngram_min=N]`,
  `draft=MODEL[:k=N]`, `pair=NAME[:k=N]` add speculative ones. Every model is
  loaded once; all configurations share the target engine.
- Method: a warm-up, then for each request every configuration, in an order
  that reverses from one (request, repeat) to the next (plain, spec | spec,
  plain | ...), so slow drift on a shared machine hits both sides. Each run
  starts from an empty KV cache, so every run pays the same prefill.
- Records: one JSON line per finished request (all its runs, and its speedup
  per configuration), flushed and fsynced, so Ctrl-C or a crash loses only the
  request in flight; `resume` skips the ids already recorded.
- Summaries: per category and overall, median and geometric-mean speedup with
  bootstrap 95% intervals, the share of requests that got slower, batch
  throughput, and Leviathan's predicted speedup from the measured acceptance
  and costs, next to the measured one.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from statistics import median
from typing import Callable, Iterable, Sequence

import numpy as np

from specgen.errors import SpecgenError, read_text_file
from specgen.drafters import NGRAM_MAX

BUNDLED = "requests.jsonl"
REQUEST_KEYS = ("id", "prompt", "messages", "category", "max_tokens", "temperature", "seed")
DEFAULT_CATEGORY = "general"
DEFAULT_CONFIGS = ("lookup:k=8",)
DEFAULT_K = {"lookup": 8, "draft": 4, "pair": 4}
MAX_K = 128
WARMUP_TOKENS = 8
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


# =============================================================== requests


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
    import ctypes

    import llama_cpp as llama

    tmpl = engine.chat_template()
    if not tmpl:
        raise SpecgenError(f"{engine.path.name} has no chat template: give requests as 'prompt', not 'messages'")
    keep = [(r.encode("utf-8"), c.encode("utf-8")) for r, c in messages]
    arr = (llama.llama_chat_message * len(keep))(*[llama.llama_chat_message(role=r, content=c) for r, c in keep])
    size = 4 * sum(len(r) + len(c) for r, c in keep) + 1024
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama.llama_chat_apply_template(tmpl.encode("utf-8"), arr, len(keep), True, buf, size)
        if n < 0:
            raise SpecgenError(f"llama.cpp does not support the chat template of {engine.path.name}")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n + 1
    raise SpecgenError("chat template output did not fit")  # pragma: no cover


# =============================================================== configurations

_CONFIG_USAGE = (
    "expected lookup[:k=N,ngram=N,ngram_min=N,policy=P], draft=MODEL[:k=N,policy=P] or pair=NAME[:k=N,policy=P]"
    " (P: fixed, cost, heuristic)"
)
_OPTIONS_RE = re.compile(r"[a-z_]+=[^,:]*(,[a-z_]+=[^,:]*)*")
POLICY_NAMES = ("fixed", "cost", "heuristic")


@dataclass(frozen=True)
class Config:
    """One way of decoding: plain, prompt lookup, or a draft model (by ref or pair)."""

    kind: str  # plain | lookup | draft | pair
    k: int | None = 0
    ngram_max: int = NGRAM_MAX
    ngram_min: int = 1
    draft: str | None = None  # model reference, for kind draft (and pair, once resolved)
    pair: str | None = None
    policy: str = "fixed"  # draft-length policy (specgen.policy); k is its ceiling unless fixed

    @property
    def name(self) -> str:
        if self.kind == "plain":
            return "plain"
        extra = [f"k={self.k}"] if self.k else []
        if self.kind == "lookup":
            if self.ngram_max != NGRAM_MAX:
                extra.append(f"ngram={self.ngram_max}")
            if self.ngram_min != 1:
                extra.append(f"ngram_min={self.ngram_min}")
        if self.policy != "fixed":
            extra.append(f"policy={self.policy}")
        head = "lookup" if self.kind == "lookup" else f"pair={self.pair}" if self.kind == "pair" else f"draft={self.draft}"
        return head + (":" + ",".join(extra) if extra else "")

    @property
    def label(self) -> str:
        """A short name for tables: a draft path shows only its file name."""
        if self.kind == "draft" and self.draft and ("/" in self.draft or os.sep in self.draft):
            return f"draft={Path(self.draft).name}:k={self.k}" + ("" if self.policy == "fixed" else f",policy={self.policy}")
        return self.name

    @property
    def drafts_with_model(self) -> bool:
        return self.kind in ("draft", "pair")


PLAIN = Config("plain")


def parse_config(text: str) -> Config:
    """`lookup`, `lookup:k=16,ngram=4`, `draft=PATH_OR_NAME:k=4`, `pair=NAME`; strict."""
    s = text.strip()
    if s == "plain":
        raise SpecgenError("--config plain: plain decoding is always measured; --config names speculative configurations")
    if s == "lookup" or s.startswith("lookup:"):
        opts = _options(s[len("lookup:") :] if ":" in s else "", ("k", "ngram", "ngram_min", "policy"), text)
        policy = opts.get("policy", "fixed")
        cfg = Config("lookup", opts.get("k", _default_k("lookup", policy)), opts.get("ngram", NGRAM_MAX), opts.get("ngram_min", 1),
                     policy=policy)
        if not cfg.ngram_min <= cfg.ngram_max:
            raise SpecgenError(f"--config {text}: need ngram_min <= ngram")
        return cfg
    for kind in ("draft", "pair"):
        if s.startswith(kind + "="):
            ref, tail = _split_options(s[len(kind) + 1 :])
            if not ref:
                raise SpecgenError(f"--config {text}: {kind}= needs a {'model' if kind == 'draft' else 'pair name'}")
            opts = _options(tail, ("k", "policy"), text)
            policy = opts.get("policy", "fixed")
            if kind == "draft":
                return Config("draft", opts.get("k", _default_k("draft", policy)), draft=ref, policy=policy)
            return Config("pair", opts.get("k"), pair=ref, policy=policy)
    raise SpecgenError(f"unknown --config '{text}' ({_CONFIG_USAGE})")


def _split_options(body: str) -> tuple[str, str]:
    """`REF:k=4` → (REF, "k=4"); a ':' inside REF (hf:..., C:\\...) stays in REF."""
    if ":" in body:
        head, tail = body.rsplit(":", 1)
        if _OPTIONS_RE.fullmatch(tail):
            return head.strip(), tail
    return body.strip(), ""


def _default_k(kind: str, policy: str) -> int:
    from specgen.loader import ADAPTIVE_K_MAX

    return DEFAULT_K[kind] if policy == "fixed" else ADAPTIVE_K_MAX[kind]


def _options(text: str, allowed: tuple[str, ...], whole: str) -> dict:
    out: dict = {}
    if not text:
        return out
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            raise SpecgenError(f"--config {whole}: unknown option '{part}' (allowed: {', '.join(k + '=N' for k in allowed)})")
        if key in out:
            raise SpecgenError(f"--config {whole}: {key} given twice")
        if key == "policy":
            if value.strip() not in POLICY_NAMES:
                raise SpecgenError(f"--config {whole}: policy must be one of {', '.join(POLICY_NAMES)} (got '{value}')")
            out[key] = value.strip()
            continue
        try:
            n = int(value)
        except ValueError:
            raise SpecgenError(f"--config {whole}: {key} must be an integer (got '{value}')") from None
        if not 1 <= n <= (MAX_K if key == "k" else 16):
            raise SpecgenError(f"--config {whole}: {key} must be in 1..{MAX_K if key == 'k' else 16} (got {n})")
        out[key] = n
    return out


def parse_configs(texts: Iterable[str] | None) -> list[Config]:
    """The speculative configurations (default: lookup:k=8); duplicates refused."""
    texts = list(texts or DEFAULT_CONFIGS)
    configs: list[Config] = []
    for t in texts:
        c = parse_config(t)
        if c in configs:
            raise SpecgenError(f"--config {c.name} given twice")
        configs.append(c)
    return configs


# =============================================================== method


def run_order(n_configs: int, repeats: int, offset: int = 0) -> list[list[int]]:
    """Configuration indices to run, per repeat; each repeat reverses the last.

    With plain (0) and one speculative configuration (1): [0, 1], [1, 0], [0, 1] …
    — plain, spec, spec, plain — so drift over time hits both sides alike.
    `offset` (the request's index) continues the alternation across requests.
    """
    if repeats < 1:
        raise SpecgenError(f"--repeats must be >= 1 (got {repeats})")
    forward = list(range(n_configs))
    return [forward if (offset + r) % 2 == 0 else forward[::-1] for r in range(repeats)]


# =============================================================== statistics


def geomean(values: Sequence[float]) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=np.float64)))))


def bootstrap_ci(
    values: Sequence[float],
    stat: str = "median",
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median or geometric mean (requests resampled)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap of no values")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    draws = x[rng.integers(0, x.size, size=(samples, x.size))]
    if stat == "median":
        est = np.median(draws, axis=1)
    elif stat == "geomean":
        est = np.exp(np.log(draws).mean(axis=1))
    else:
        raise ValueError(f"unknown statistic {stat}")
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(est, [tail, 100 - tail])
    return float(lo), float(hi)


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Leviathan et al.: E[tokens per round] = (1 − α^(k+1)) / (1 − α)."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, t_plain_step: float, t_draft_round: float, t_verify: float) -> float:
    """E[tokens/round] × t_plain_step / (t_draft_round + t_verify(k+1)).

    t_draft_round is k × the cost of one draft-model step, or a lookup's cost
    per round; t_verify is the measured target pass over k+1 rows.
    """
    return expected_tokens_per_round(alpha, k) * t_plain_step / (t_draft_round + t_verify)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token; None if the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# =============================================================== models


@dataclass
class Setup:
    """The loaded models: one target engine shared by every configuration."""

    target: object  # specgen.engine.Engine
    target_path: Path
    configs: list[Config]  # resolved; plain first
    drafters: dict[str, object]  # config name → drafter (None for plain)
    draft_engines: dict[str, object] = field(default_factory=dict)  # config name → its draft Engine
    _owned: list = field(default_factory=list)

    def close(self) -> None:
        for e in reversed(self._owned):
            e.close()
        self._owned.clear()


def _resolve_pairs(model: str | None, configs: list[Config], catalog) -> tuple[str | None, list[Config]]:
    from specgen import registry

    out, targets = [], {}
    for c in configs:
        if c.kind != "pair":
            out.append(c)
            continue
        p = registry.resolve_pair(c.pair, catalog)
        targets[c.pair] = p.target
        out.append(replace(c, k=c.k or p.draft_max or DEFAULT_K["pair"], draft=p.draft))
    if model is None and targets:
        distinct = {registry.resolve_model(t, catalog) for t in targets.values()}
        if len(distinct) > 1:
            raise SpecgenError(f"pairs {', '.join(targets)} have different targets: one bench measures one target (give -m)")
        model = next(iter(targets.values()))
    if targets:
        tpath = registry.resolve_model(model, catalog)
        for name, t in targets.items():
            if registry.resolve_model(t, catalog) != tpath:
                raise SpecgenError(f"pair '{name}' has target '{t}', but this bench measures {tpath.name}")
    return model, out


def _vocab_check(target, draft) -> int:
    """Refuse an incompatible draft; the number of token ids both share."""
    from specgen.vocab import n_shared, require_compatible

    require_compatible(target, draft)
    return n_shared(target, draft)


def open_bench(
    model: str | None,
    configs: Sequence[Config],
    *,
    ctx_size: int = 4096,
    threads: int | None = None,
    gpu_layers: int = 0,
    catalog=None,
    n_seq_max: int = 1,
) -> Setup:
    """Load the target once and each distinct draft model once; build every drafter.

    n_seq_max > 1 (a concurrency sweep) opens every context with that many
    sequences over one unified KV pool of ctx_size tokens (see specgen.serving).
    """
    from specgen import registry
    from specgen.drafters import DraftModel, PromptLookup
    from specgen.engine import Engine

    catalog = catalog if catalog is not None else registry.load_catalog()
    model, configs = _resolve_pairs(model, list(configs), catalog)
    target_path = registry.resolve_model(model, catalog)
    draft_paths = {c.name: registry.resolve_model(c.draft, catalog) for c in configs if c.drafts_with_model}
    kw = dict(n_ctx=ctx_size, n_threads=threads, n_gpu_layers=gpu_layers)
    if n_seq_max > 1:
        kw.update(n_seq_max=n_seq_max, kv_unified=True)
    target = Engine(target_path, **kw)
    setup = Setup(target, target_path, [PLAIN, *configs], {"plain": None}, _owned=[target])
    try:
        by_path: dict[Path, tuple[object, int]] = {}
        for c in configs:
            if c.kind == "lookup":
                setup.drafters[c.name] = PromptLookup(c.ngram_max, c.ngram_min)
                continue
            path = draft_paths[c.name]
            if path not in by_path:
                eng = Engine(path, **kw)
                setup._owned.append(eng)
                by_path[path] = (eng, _vocab_check(target, eng))
            eng, shared = by_path[path]
            setup.drafters[c.name] = DraftModel(eng, shared, target.n_vocab)
            setup.draft_engines[c.name] = eng
    except BaseException:
        setup.close()
        raise
    return setup


# =============================================================== running


@dataclass
class Settings:
    max_tokens: int = 64
    repeats: int = 1
    ignore_eos: bool = False
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0
    warmup: bool = True

    def validate(self) -> None:
        from specgen.sampling import SamplingParams

        if self.repeats < 1:
            raise SpecgenError(f"--repeats must be >= 1 (got {self.repeats})")
        if self.max_tokens < 1:
            raise SpecgenError(f"-n/--max-tokens must be >= 1 (got {self.max_tokens})")
        SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.seed).validate()

    def meta(self) -> dict:
        return {"max_tokens": self.max_tokens, "repeats": self.repeats, "ignore_eos": self.ignore_eos}


@dataclass
class Prepared:
    """A request, tokenized, with its effective generation parameters."""

    req: Request
    index: int
    tokens: list[int]
    max_tokens: int
    params: object  # SamplingParams


@dataclass
class Timing:
    """Where this session's time went: generation vs the bench's own work."""

    prepare_s: float = 0.0  # tokenizing, checks
    warmup_s: float = 0.0
    measured_s: float = 0.0  # wall time of the measured phase
    generation_s: float = 0.0  # sum of every measured run's latency
    runs: int = 0

    @property
    def overhead_s(self) -> float:
        return max(self.measured_s - self.generation_s, 0.0)

    def to_dict(self) -> dict:
        share = self.overhead_s / self.measured_s if self.measured_s > 0 else 0.0
        per_run = self.overhead_s / self.runs if self.runs else 0.0
        return {
            "prepare_s": self.prepare_s,
            "warmup_s": self.warmup_s,
            "measured_s": self.measured_s,
            "generation_s": self.generation_s,
            "overhead_s": self.overhead_s,
            "overhead_share": share,
            "overhead_per_run_ms": 1000 * per_run,
            "runs": self.runs,
        }


RunHook = Callable[[int, int, Prepared, Config], None]  # (done, total, request, config) before a run
RequestHook = Callable[[dict], None]  # after a request's record is written


class Runner:
    """Runs prepared requests through every configuration and hands out records."""

    def __init__(self, setup: Setup, settings: Settings) -> None:
        settings.validate()
        self.setup = setup
        self.settings = settings
        self.timing = Timing()

    # -- preparation ------------------------------------------------------
    def prepare(self, requests: Sequence[Request]) -> list[Prepared]:
        from specgen.sampling import SamplingParams

        t0 = time.perf_counter()
        s, target = self.settings, self.setup.target
        k_max = max((c.k or 0) for c in self.setup.configs)
        out = []
        for i, r in enumerate(requests):
            text = r.prompt if r.messages is None else apply_chat_template(target, r.messages)
            tokens = target.tokenize(text)
            max_tokens = r.max_tokens or s.max_tokens
            need = len(tokens) + max_tokens + k_max + 1
            if need > target.n_ctx:
                raise SpecgenError(
                    f"request '{r.id}' (line {r.line}): {len(tokens)} prompt + {max_tokens} generated tokens "
                    f"do not fit a context of {target.n_ctx} (raise -c/--ctx-size)"
                )
            temp = s.temperature if r.temperature is None else r.temperature
            seed = s.seed if r.seed is None else r.seed
            params = SamplingParams(temp, s.top_k, s.top_p, s.min_p, seed)
            out.append(Prepared(r, i, tokens, max_tokens, params))
        self.timing.prepare_s += time.perf_counter() - t0
        return out

    # -- one run ----------------------------------------------------------
    def run_one(self, p: Prepared, config: Config, max_tokens: int | None = None) -> dict:
        """One request through one configuration, from an empty cache; the run's record."""
        from specgen.decoding import Generation

        setup = self.setup
        target = setup.target
        drafter = setup.drafters[config.name]
        draft_engine = setup.draft_engines.get(config.name)
        target.truncate(0, 0)
        if draft_engine is not None:
            draft_engine.truncate(0, 0)
        from specgen.loader import make_policy

        gen = Generation(
            target, p.tokens, drafter, draft_max=config.k or 0, max_tokens=max_tokens or p.max_tokens,
            params=p.params, ignore_eos=self.settings.ignore_eos,
            policy=make_policy(config.policy, config.k or 0, target, draft_engine),
        )
        # Verify time by draft length, and drafting after the first decode
        # round (whose draft cost includes the drafter reading the prompt).
        verify_by_k: dict[int, list] = {}
        steady = [0, 0, 0.0]  # rounds, drafted, draft_s
        first_draft_s = 0.0
        n = 0
        for r in gen:
            n += 1
            if n == 1:
                continue
            v = verify_by_k.get(r.drafted)
            if v is None:
                v = verify_by_k[r.drafted] = [0, 0.0]
            v[0] += 1
            v[1] += r.verify_s
            if n == 2:
                first_draft_s = r.draft_s
            else:
                steady[0] += 1
                steady[1] += r.drafted
                steady[2] += r.draft_s
        return _run_record(gen, config, verify_by_k, steady, first_draft_s)

    # -- the whole set ----------------------------------------------------
    def warm_up(self, prepared: Sequence[Prepared]) -> None:
        if not prepared or not self.settings.warmup:
            return
        t0 = time.perf_counter()
        for c in self.setup.configs:
            self.run_one(prepared[0], c, max_tokens=min(WARMUP_TOKENS, prepared[0].max_tokens))
        self.timing.warmup_s += time.perf_counter() - t0

    def run(
        self,
        prepared: Sequence[Prepared],
        sink: Callable[[dict], None],
        *,
        on_run: RunHook | None = None,
        on_request: RequestHook | None = None,
    ) -> None:
        """Every request in every configuration; `sink` gets each request's record when it finishes.

        KeyboardInterrupt propagates; the request in flight is not recorded.
        """
        configs = self.setup.configs
        s = self.settings
        total = len(prepared) * len(configs) * s.repeats
        done = 0
        t_start = time.perf_counter()
        try:
            for p in prepared:
                runs = []
                for rep, order in enumerate(run_order(len(configs), s.repeats, p.index)):
                    for slot, ci in enumerate(order):
                        if on_run:
                            on_run(done, total, p, configs[ci])
                        rec = self.run_one(p, configs[ci])
                        rec["repeat"], rec["slot"] = rep, slot
                        self.timing.generation_s += rec["total_s"]
                        self.timing.runs += 1
                        runs.append(rec)
                        done += 1
                record = request_record(p, runs, [c.name for c in configs])
                sink(record)
                if on_request:
                    on_request(record)
        finally:
            self.timing.measured_s += time.perf_counter() - t_start


def _run_record(gen, config: Config, verify_by_k: dict, steady: list, first_draft_s: float) -> dict:
    st = gen.stats
    drafter = gen.drafter
    return {
        "config": config.name,
        "draft_max": config.k or 0,
        "prompt_tokens": st.prompt_tokens,
        "generated_tokens": st.generated,
        "ttft_s": st.prefill_s,
        "decode_s": st.decode_s,
        "total_s": st.total_s,
        "tokens_per_s": st.tokens_per_s,
        "rounds": st.rounds,
        "drafted": st.drafted,
        "accepted": st.accepted,
        "acceptance_rate": st.acceptance_rate,
        "mean_accepted_len": st.mean_accepted_len,
        "per_position": st.per_position,
        "k_hist": {str(k): n for k, n in sorted(st.k_chosen.items())},
        "stop_reason": st.stop_reason,
        "draft_s": st.draft_s,
        "draft_first_s": first_draft_s,
        "draft_steady": {"rounds": steady[0], "drafted": steady[1], "s": steady[2]},
        "draft_kind": "model" if config.drafts_with_model else ("lookup" if drafter is not None else "none"),
        "verify_by_k": {str(k): v for k, v in sorted(verify_by_k.items())},
        "matches_plain": None,
        "first_diff": None,
        "tokens": list(gen.tokens),
    }


def request_record(p: Prepared, runs: list[dict], config_names: Sequence[str]) -> dict:
    """A finished request: its runs, greedy token equality, and per-config speedup.

    speedup = median plain latency ÷ median speculative latency (over repeats);
    latency change = median speculative − median plain, in ms.
    """
    greedy = p.params.greedy
    plain_runs = [r for r in runs if r["config"] == "plain"]
    ref = plain_runs[0]["tokens"] if plain_runs else None
    for r in runs:
        if r["config"] != "plain" and greedy and ref is not None:
            diff = first_difference(ref, r["tokens"])
            r["matches_plain"] = diff is None
            r["first_diff"] = diff
    plain_lat = median(r["total_s"] for r in plain_runs)
    speedup, change = {}, {}
    for name in config_names:
        if name == "plain":
            continue
        lat = median(r["total_s"] for r in runs if r["config"] == name)
        speedup[name] = plain_lat / lat if lat > 0 else math.inf
        change[name] = 1000.0 * (lat - plain_lat)
    return {
        "type": "request",
        "id": p.req.id,
        "category": p.req.category,
        "line": p.req.line,
        "prompt_tokens": len(p.tokens),
        "max_tokens": p.max_tokens,
        "temperature": p.params.temperature,
        "seed": p.params.seed,
        "runs": runs,
        "speedup": speedup,
        "latency_change_ms": change,
    }


# =============================================================== records file


class RecordFile:
    """The JSONL record file: a meta line, then one line per finished request.

    Each line is written whole, flushed and fsynced. A half-written last line
    (a crash mid-write) is dropped when the file is resumed.
    """

    def __init__(self, path: Path, meta: dict, *, resume: bool) -> None:
        self.path = path
        self.records: list[dict] = []
        self._fh = None
        exists = path.exists() and not path.is_dir() and path.stat().st_size > 0
        if exists and not resume:
            raise SpecgenError(f"{path} already holds records: use --resume to continue it, or another --out")
        try:
            if exists:
                self._load(meta)
                self._fh = open(path, "a", encoding="utf-8")
            else:
                self._fh = open(path, "w", encoding="utf-8")
                self._write({"type": "meta", **meta})
        except IsADirectoryError:
            raise SpecgenError(f"cannot write --out {path}: it is a directory") from None
        except OSError as e:
            raise SpecgenError(f"cannot write --out {path}: {e.strerror or e}") from None

    def _load(self, meta: dict) -> None:
        raw = self.path.read_bytes()
        end = raw.rfind(b"\n") + 1
        if end < len(raw):  # a torn last line: that request never finished
            with open(self.path, "r+b") as f:
                f.truncate(end)
        lines = raw[:end].decode("utf-8", errors="replace").splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise SpecgenError(f"{self.path}:{n}: not a bench record (invalid JSON)") from None
            kind = obj.get("type") if isinstance(obj, dict) else None
            if kind == "meta":
                _check_meta(self.path, obj, meta)
            elif kind == "request":
                self.records.append(obj)
            else:
                raise SpecgenError(f"{self.path}:{n}: not a bench record")

    def _write(self, obj: dict) -> None:
        try:
            self._fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as e:
            raise SpecgenError(f"cannot write --out {self.path}: {e.strerror or e}") from None

    def done_ids(self) -> set[str]:
        return {r["id"] for r in self.records}

    def append(self, record: dict) -> None:
        self._write(record)
        self.records.append(record)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


_RESUME_KEYS = ("model", "configs", "max_tokens", "repeats", "ignore_eos", "temperature")


def _check_meta(path: Path, old: dict, new: dict) -> None:
    for key in _RESUME_KEYS:
        if key in new and old.get(key) != new.get(key):
            raise SpecgenError(f"--resume: {path} was recorded with {key} = {old.get(key)!r}, not {new.get(key)!r}")


# =============================================================== summaries


def _group_summary(records: Sequence[dict], name: str) -> dict:
    """Speedups and the prediction for one configuration over some requests."""
    speedups = [r["speedup"][name] for r in records if name in r["speedup"]]
    if not speedups:
        return {"requests": 0}
    spec_runs = [x for r in records for x in r["runs"] if x["config"] == name]
    plain_runs = [x for r in records for x in r["runs"] if x["config"] == "plain"]
    med, gm = float(median(speedups)), geomean(speedups)
    greedy = [x["matches_plain"] for x in spec_runs if x["matches_plain"] is not None]
    out = {
        "requests": len(speedups),
        "median_speedup": med,
        "median_ci95": list(bootstrap_ci(speedups, "median")),
        "geomean_speedup": gm,
        "geomean_ci95": list(bootstrap_ci(speedups, "geomean")),
        "slower_share": sum(s < 1.0 for s in speedups) / len(speedups),
        "median_latency_change_ms": float(median(r["latency_change_ms"][name] for r in records if name in r["latency_change_ms"])),
        "throughput": {"plain_tokens_per_s": _throughput(plain_runs), "spec_tokens_per_s": _throughput(spec_runs)},
        "decode_speedup": _median_decode_speedup(records, name),
        "acceptance_rate": _ratio(sum(x["accepted"] for x in spec_runs), sum(x["drafted"] for x in spec_runs)),
        "mean_accepted_len": _ratio(sum(x["generated_tokens"] for x in spec_runs), sum(x["rounds"] for x in spec_runs)),
        "matches_plain": {"equal": sum(greedy), "compared": len(greedy)},
        "prediction": predict(spec_runs, plain_runs),
    }
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _throughput(runs: Sequence[dict]) -> float | None:
    """Batch throughput: all tokens generated over all the time taken (prefill included)."""
    return _ratio(sum(x["generated_tokens"] for x in runs), sum(x["total_s"] for x in runs))


def _decode_rate(runs: Sequence[dict]) -> float | None:
    """Tokens after the first per second after the first, median over runs."""
    rates = [(x["generated_tokens"] - 1) / x["decode_s"] for x in runs if x["generated_tokens"] > 1 and x["decode_s"] > 0]
    return float(median(rates)) if rates else None


def _median_decode_speedup(records: Sequence[dict], name: str) -> float | None:
    """Decode phase only (what Leviathan's formula predicts): median over requests."""
    ratios = []
    for r in records:
        plain = _decode_rate([x for x in r["runs"] if x["config"] == "plain"])
        spec = _decode_rate([x for x in r["runs"] if x["config"] == name])
        if plain and spec:
            ratios.append(spec / plain)
    return float(median(ratios)) if ratios else None


def predict(spec_runs: Sequence[dict], plain_runs: Sequence[dict]) -> dict | None:
    """Leviathan's predicted decode-phase speedup from the measurements.

    α = accepted / drafted (pooled counts). Costs are medians over runs of
    each run's mean, so a burst of load on a shared machine does not set them:
    t_plain_step = a plain verify pass; t_verify = a verify pass of the rounds
    that drafted the full k; t_draft_step = steady-state drafting time per
    token drafted (a draft model: one forward pass a token) or per round
    (prompt lookup, which drafts all k at once). `speedup_by_k` uses the
    measured distribution of draft lengths instead of a fixed k (prompt lookup
    often finds fewer than k tokens, or none). Both assume each draft token is
    accepted independently with probability α; `speedup_measured_tokens`
    replaces that assumption with the measured tokens per round, which checks
    the cost model alone (prompt lookup's acceptance comes in runs: a
    matching span is accepted whole or not at all).
    """
    if not spec_runs or not plain_runs:
        return None
    k = max(x["draft_max"] for x in spec_runs)
    drafted = sum(x["drafted"] for x in spec_runs)
    if k == 0 or drafted == 0:
        return None
    alpha = sum(x["accepted"] for x in spec_runs) / drafted
    t_plain, t_verify = _median_step(plain_runs, "0"), _median_step(spec_runs, str(k))
    if t_plain is None or t_verify is None:
        return None
    model = spec_runs[0]["draft_kind"] == "model"
    per = "drafted" if model else "rounds"
    steps = [x["draft_steady"]["s"] / x["draft_steady"][per] for x in spec_runs if x["draft_steady"][per]]
    t_step = float(median(steps)) if steps else 0.0
    t_draft_round = k * t_step if model else t_step
    by_k, by_tokens = _predict_by_k(spec_runs, alpha, t_plain, t_step, model)
    return {
        "alpha": alpha,
        "k": k,
        "expected_tokens_per_round": expected_tokens_per_round(alpha, k),
        "t_plain_step_ms": 1000 * t_plain,
        "t_verify_ms": 1000 * t_verify,
        "t_draft_step_ms": 1000 * t_step,
        "draft_step": "token" if model else "round",
        "speedup": predicted_speedup(alpha, k, t_plain, t_draft_round, t_verify),
        "speedup_by_k": by_k,
        "speedup_measured_tokens": by_tokens,
    }


def _median_step(runs: Sequence[dict], k: str) -> float | None:
    """Median over runs of the mean verify time of the rounds that drafted k tokens."""
    means = [v[1] / v[0] for x in runs if (v := x["verify_by_k"].get(k)) and v[0]]
    return float(median(means)) if means else None


def _predict_by_k(spec_runs, alpha: float, t_plain: float, t_step: float, model: bool) -> tuple[float | None, float | None]:
    """(i.i.d. tokens per round at each measured draft length, measured tokens per round) × t_plain / cost per round."""
    rounds = tokens = cost = 0.0
    for kk in {j for x in spec_runs for j in x["verify_by_k"]}:
        n = sum(x["verify_by_k"][kk][0] for x in spec_runs if kk in x["verify_by_k"])
        k = int(kk)
        draft = k * t_step if model else t_step
        rounds += n
        tokens += n * expected_tokens_per_round(alpha, k)
        cost += n * (_median_step(spec_runs, kk) + draft)
    if not cost:
        return None, None
    measured = sum(x["generated_tokens"] - 1 for x in spec_runs) / rounds  # decode rounds only
    return tokens * t_plain / cost, measured * rounds * t_plain / cost


def summarize(records: Sequence[dict], config_names: Sequence[str]) -> dict:
    """Per configuration: overall and per-category summaries."""
    cats = sorted({r["category"] for r in records})
    out = {}
    for name in config_names:
        if name == "plain":
            continue
        out[name] = {
            "overall": _group_summary(records, name),
            "categories": {c: _group_summary([r for r in records if r["category"] == c], name) for c in cats},
        }
    return out


# =============================================================== export

CSV_COLUMNS = (
    "id", "category", "config", "repeat", "slot", "prompt_tokens", "generated_tokens", "ttft_s", "decode_s",
    "total_s", "tokens_per_s", "rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted_len",
    "per_position", "k_hist", "stop_reason", "matches_plain", "first_diff", "request_speedup",
    "request_latency_change_ms",
)


def csv_rows(records: Sequence[dict]) -> Iterable[dict]:
    """One flat row per run (per_position space-separated, k_hist as JSON)."""
    for r in records:
        for x in r["runs"]:
            row = {c: x.get(c) for c in CSV_COLUMNS}
            row["id"], row["category"] = r["id"], r["category"]
            row["per_position"] = " ".join(f"{v:.4f}" for v in x["per_position"])
            row["k_hist"] = json.dumps(x["k_hist"], separators=(",", ":"))
            row["request_speedup"] = r["speedup"].get(x["config"])
            row["request_latency_change_ms"] = r["latency_change_ms"].get(x["config"])
            yield row


def write_csv(path: Path, records: Sequence[dict]) -> None:
    import csv

    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for row in csv_rows(records):
                w.writerow(row)
    except OSError as e:
        raise SpecgenError(f"cannot write --csv {path}: {e.strerror or e}") from None


# =============================================================== concurrency sweep
#
# `specgen bench --concurrency 1,2,4,8`: at each level the whole request set
# is served at once through specgen.serving (plain, then every speculative
# configuration, alternating order), all requests submitted together. One
# "serve" record per (level, configuration, repeat) carries the level, the
# total throughput and every request's queue wait, ttft, latency, tok/s and
# acceptance.


def parse_concurrency(text: str) -> list[int]:
    """`1,2,4,8` → [1, 2, 4, 8] (sorted, distinct); each level in 1..256."""
    from specgen.serving import MAX_SLOTS

    levels = []
    for part in text.split(","):
        part = part.strip()
        try:
            n = int(part)
        except ValueError:
            raise SpecgenError(f"--concurrency: '{part}' is not an integer (expected e.g. 1,2,4,8)") from None
        if n < 1:
            raise SpecgenError(f"--concurrency: levels must be >= 1 (got {n})")
        if n > MAX_SLOTS:
            raise SpecgenError(f"--concurrency: at most {MAX_SLOTS} sequences share a llama.cpp context (got {n})")
        levels.append(n)
    return sorted(set(levels))


def check_concurrency(levels: Sequence[int], prepared: Sequence[Prepared], n_ctx: int, k_max: int, n_batch: int = 512) -> None:
    """Refuse a level the context cannot hold with every slot busy (one pool of n_ctx tokens),
    or whose verify rows (k_max + 1 per sequence) would not fit one batch."""
    from specgen.serving import max_concurrency, need_tokens

    if max(levels) * (k_max + 1) > n_batch:
        raise SpecgenError(
            f"--concurrency {max(levels)}: {max(levels)} sequences × {k_max + 1} verify rows exceed a batch of "
            f"{n_batch} rows; at most {n_batch // (k_max + 1)} at once with k = {k_max} (lower k or the level)"
        )
    need = max(need_tokens(len(p.tokens), p.max_tokens, k_max) for p in prepared)
    limit = max_concurrency(n_ctx, need)
    if max(levels) > limit:
        raise SpecgenError(
            f"--concurrency {max(levels)}: a context of {n_ctx} tokens holds at most {limit} requests of up to "
            f"{need} tokens (prompt + max_tokens + draft) at once; raise -c/--ctx-size to at least {max(levels) * need}"
        )


class SweepRunner:
    """Serves the prepared requests at each concurrency level, in every configuration."""

    def __init__(self, setup: Setup, settings: Settings, levels: Sequence[int]) -> None:
        settings.validate()
        self.setup, self.settings, self.levels = setup, settings, list(levels)
        self.timing = Timing()

    def _new_policy(self, config: Config):
        from specgen.loader import make_policy

        # One acceptance estimate per server, shared by its requests: a new
        # request starts from what earlier ones taught.
        shared: dict = {}
        draft = self.setup.draft_engines.get(config.name)
        make = lambda: make_policy(config.policy, config.k or 0, self.setup.target, draft, shared=shared)  # noqa: E731
        make()  # measures (or reads) the cost profiles now: measuring uses sequence 0, so never mid-serve
        return make

    def server(self, config: Config, level: int):
        from specgen.drafters import PromptLookup
        from specgen.serving import Server

        s, setup = self.settings, self.setup
        drafter = setup.drafters[config.name]
        if config.kind == "lookup":
            drafter = PromptLookup(config.ngram_max, config.ngram_min)
        return Server(setup.target, level, draft_max=config.k or 0, drafter=drafter, ignore_eos=s.ignore_eos,
                      new_policy=self._new_policy(config))

    def serve_once(self, prepared: Sequence[Prepared], config: Config, level: int, max_tokens: int | None = None) -> dict:
        """The whole set at one level in one configuration; its "serve" record."""
        from specgen.serving import Job

        jobs = [
            Job(p.req.id, p.tokens, min(max_tokens or p.max_tokens, p.max_tokens), p.params,
                {"category": p.req.category, "temperature": p.params.temperature})
            for p in prepared
        ]
        server = self.server(config, level)
        for seq in range(level):
            self.setup.target.truncate(seq, 0)
        t0 = time.perf_counter()
        results = server.serve(jobs)
        wall = time.perf_counter() - t0
        by_id = {r.job.id: r for r in results}
        requests = []
        for j in jobs:  # records in request order
            rec = by_id[j.id].record()
            rec.update(concurrency=level, config=config.name)
            requests.append(rec)
        generated = sum(r["generated_tokens"] for r in requests)
        k_hist: Counter = Counter()
        for r in requests:
            k_hist.update({int(k): n for k, n in r["k_hist"].items()})
        rows = [v + p for _, v, p in server.step_log]
        return {
            "type": "serve",
            "concurrency": level,
            "config": config.name,
            "requests_served": len(jobs),
            "wall_s": wall,
            "generated_tokens": generated,
            "throughput_tokens_per_s": generated / wall if wall > 0 else 0.0,
            "steps": server.steps,
            "mean_rows_per_step": sum(rows) / len(rows) if rows else 0.0,
            "mean_sequences_per_step": sum(n for n, _, _ in server.step_log) / len(rows) if rows else 0.0,
            "k_hist": {str(k): n for k, n in sorted(k_hist.items())},
            "requests": requests,
        }

    def warm_up(self, prepared: Sequence[Prepared]) -> None:
        if not prepared or not self.settings.warmup:
            return
        t0 = time.perf_counter()
        for c in self.setup.configs:
            self.serve_once(prepared[:1], c, 1, max_tokens=WARMUP_TOKENS)
        self.timing.warmup_s += time.perf_counter() - t0

    def run(self, prepared: Sequence[Prepared], sink: Callable[[dict], None], *, on_run=None) -> None:
        """Every level × repeat × configuration (alternating order); `sink` gets each serve record."""
        configs = self.setup.configs
        total = len(self.levels) * self.settings.repeats * len(configs)
        done = 0
        t_start = time.perf_counter()
        try:
            for li, level in enumerate(self.levels):
                for rep, order in enumerate(run_order(len(configs), self.settings.repeats, li)):
                    plain_tokens = None
                    batch = []
                    for ci in order:
                        if on_run:
                            on_run(done, total, level, configs[ci])
                        rec = self.serve_once(prepared, configs[ci], level)
                        rec["repeat"] = rep
                        self.timing.generation_s += rec["wall_s"]
                        self.timing.runs += 1
                        done += 1
                        batch.append(rec)
                        if configs[ci].kind == "plain":
                            plain_tokens = {r["id"]: r["tokens"] for r in rec["requests"]}
                    for rec in batch:  # greedy equality with plain at the same level
                        for r in rec["requests"]:
                            greedy = r.get("temperature", 0.0) == 0.0
                            r["matches_plain"] = (
                                None if rec["config"] == "plain" or plain_tokens is None or not greedy
                                else plain_tokens[r["id"]] == r["tokens"]
                            )
                        sink(rec)
        finally:
            self.timing.measured_s += time.perf_counter() - t_start


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


# A ratio within this band of 1 reads as "no change": with one batch per level on a shared
# machine, two runs that decoded identically (the cost policy choosing k = 0 throughout, and
# plain) were measured 5–6% apart.
NOISE_BAND = 0.05


def summarize_sweep(records: Sequence[dict], config_names: Sequence[str]) -> dict:
    """Per level and configuration: throughput, latency percentiles, policy choices; the crossovers."""
    levels = sorted({r["concurrency"] for r in records})
    per_level: dict = {}
    for level in levels:
        row = {}
        for name in config_names:
            runs = [r for r in records if r["concurrency"] == level and r["config"] == name]
            if not runs:
                continue
            reqs = [x for r in runs for x in r["requests"]]
            lat = [x["latency_s"] for x in reqs]
            drafted = sum(x["drafted"] for x in reqs)
            k_hist: Counter = Counter()
            for r in runs:
                k_hist.update({int(k): n for k, n in r["k_hist"].items()})
            compared = [x["matches_plain"] for x in reqs if x.get("matches_plain") is not None]
            row[name] = {
                "runs": len(runs),
                "throughput_tokens_per_s": float(median(r["throughput_tokens_per_s"] for r in runs)),
                "p50_latency_s": _percentile(lat, 50),
                "p95_latency_s": _percentile(lat, 95),
                "p50_ttft_s": _percentile([x["ttft_s"] for x in reqs], 50),
                "p50_service_s": _percentile([x["service_s"] for x in reqs], 50),
                "mean_queue_s": float(np.mean([x["queue_s"] for x in reqs])),
                "median_request_tokens_per_s": float(median(x["tokens_per_s"] for x in reqs)),
                "acceptance_rate": _ratio(sum(x["accepted"] for x in reqs), drafted),
                "mean_rows_per_step": float(np.mean([r["mean_rows_per_step"] for r in runs])),
                "k_hist": {str(k): n for k, n in sorted(k_hist.items())},
                "mean_k": _ratio(sum(k * n for k, n in k_hist.items()), sum(k_hist.values())),
                "matches_plain": {"equal": sum(compared), "compared": len(compared)},
            }
        per_level[str(level)] = row
    crossover = {}
    for name in config_names:
        if name == "plain":
            continue
        lat_speedup, tput_ratio = {}, {}
        for level in levels:
            row = per_level[str(level)]
            if name in row and "plain" in row:
                p, s = row["plain"], row[name]
                lat_speedup[str(level)] = p["p50_latency_s"] / s["p50_latency_s"] if s["p50_latency_s"] else None
                tput_ratio[str(level)] = s["throughput_tokens_per_s"] / p["throughput_tokens_per_s"] if p["throughput_tokens_per_s"] else None
        cuts = [int(k) for k, v in lat_speedup.items() if v and v > 1.0 + NOISE_BAND]
        costs = [int(k) for k, v in tput_ratio.items() if v and v < 1.0 - NOISE_BAND]
        measured = [int(k) for k in lat_speedup]
        not_cutting = [lv for lv in measured if lv not in cuts]
        crossover[name] = {
            "latency_speedup": lat_speedup,
            "throughput_ratio": tput_ratio,
            "noise_band": NOISE_BAND,
            "cuts_latency_at": cuts,
            "stops_cutting_latency_at": min(not_cutting) if not_cutting else None,
            "cuts_again_at": [lv for lv in cuts if not_cutting and lv > min(not_cutting)],
            "costs_throughput_at": costs,
            "costs_throughput_from": min(costs) if costs else None,
            "recovers_at": [int(k) for k in tput_ratio if costs and int(k) > min(costs) and int(k) not in costs],
        }
    return {"levels": levels, "per_level": per_level, "crossover": crossover}


