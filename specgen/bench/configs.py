"""Bench configurations: `--config` parsed strictly into named ways of decoding.

Plain is always measured; `lookup[:k=N,ngram=N,ngram_min=N]`,
`suffix[:k=N,ngram_min=N]` (the suffix index; `ngram_min`: its shortest match),
`draft=MODEL[:k=N]`, `pair=NAME[:k=N]` and `heads[=FILE|auto][:k=N]` (prediction
heads over the target's hidden state; no FILE: auto, the heads trained for the
target) (each with an optional `policy=P`) add speculative ones; a draft model's and the
heads' `ngram_min=N` is the shortest match of prompt lookup alongside them (default, as `specgen run`: 2 beside a
draft model, 1 beside heads).
What a configuration speculates with is resolved as `specgen run` resolves its
options (specgen.plan.resolve, `Config.plan`): with lookup alongside under an adaptive
policy and no k given, lookup's offers reach lookup's own ceiling (16) and the model's
k stays its own.
`suffix:global=on` (or bench --global-cache on) adds an index over the
earlier requests of the same repeat.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from specgen.errors import SpecgenError
from specgen.plan import NGRAM_MAX, POLICIES, DrafterOptions, Kind, SpecPlan, default_k, resolve

DEFAULT_CONFIGS = ("lookup:k=8",)
MAX_K = 128
# bench's default policy (fixed) first
_POLICY_CHOICES = ("fixed", *(p for p in POLICIES if p != "fixed"))
_CONFIG_USAGE = (
    "expected lookup[:k=N,ngram=N,ngram_min=N,policy=P], suffix[:k=N,ngram_min=N,policy=P,global=on|off], draft=MODEL[:k=N,policy=P,lookup=on|off,ngram_min=N], pair=NAME[:k=N,policy=P,lookup=on|off,ngram_min=N] or heads[=FILE|auto][:k=N,policy=P,lookup=on|off,ngram_min=N]"
    f" (P: {', '.join(_POLICY_CHOICES)}; lookup alongside the draft model or heads: on by default under policy=cost)"
)
_OPTIONS_RE = re.compile(r"[a-z_]+=[^,:]*(,[a-z_]+=[^,:]*)*")


@dataclass(frozen=True)
class Config:
    """One way of decoding: plain, prompt lookup, the suffix index, a draft model (by ref or pair), or prediction heads."""

    kind: str  # plain | lookup | suffix | draft | pair | heads
    k: int | None = 0
    ngram_max: int = NGRAM_MAX
    ngram_min: int = 1
    draft: str | None = None  # model reference, for kind draft (and pair, once resolved)
    pair: str | None = None
    policy: str = "fixed"  # draft-length policy (specgen.policy.base); k is its ceiling unless fixed
    global_cache: bool = False  # suffix: an index over the earlier requests of the same repeat (runner.Runner)
    lookup: bool | None = None  # draft/pair/heads: prompt lookup alongside (None: as `specgen run`, on under cost)
    heads: str | None = None  # heads: a heads file, or "auto" (the heads trained for the target)
    alongside_ngram_min: int | None = None  # draft/heads: lookup alongside's shortest match (None: as `specgen run`)
    k_given: bool = field(default=True, compare=False)  # k was asked for (else it is the kind's default)

    @property
    def name(self) -> str:
        if self.kind == "plain":
            return "plain"
        extra = [f"k={self.k}"] if self.k else []
        if self.kind == "lookup" and self.ngram_max != NGRAM_MAX:
            extra.append(f"ngram={self.ngram_max}")
        if self.kind in _FREE and self.ngram_min != 1:
            extra.append(f"ngram_min={self.ngram_min}")
        if self.alongside_ngram_min is not None:
            extra.append(f"ngram_min={self.alongside_ngram_min}")
        if self.policy != "fixed":
            extra.append(f"policy={self.policy}")
        if self.global_cache:
            extra.append("global=on")
        if self.lookup is not None:
            extra.append(f"lookup={'on' if self.lookup else 'off'}")
        head = self.kind if self.kind in _FREE else f"pair={self.pair}" if self.kind == "pair" \
            else f"draft={self.draft}" if self.kind == "draft" else "heads" if self.heads == "auto" else f"heads={self.heads}"
        return head + (":" + ",".join(extra) if extra else "")

    @property
    def label(self) -> str:
        """A short name for tables: a draft path shows only its file name."""
        if self.kind == "draft" and self.draft and ("/" in self.draft or os.sep in self.draft):
            return f"draft={Path(self.draft).name}:" + self.name.rsplit(":", 1)[1]
        if self.kind == "heads" and self.heads and ("/" in self.heads or os.sep in self.heads):
            return f"heads={Path(self.heads).name}:" + self.name.rsplit(":", 1)[1]
        return self.name

    @property
    def drafts_with_model(self) -> bool:
        return self.kind in ("draft", "pair")

    @property
    def plan(self) -> SpecPlan:
        """What this configuration speculates with, by `specgen run`'s rule (specgen.plan.resolve)."""
        kind = Kind.DRAFT if self.drafts_with_model else Kind(self.kind)
        return resolve(kind, k=self.k if self.k_given else None, policy=self.policy, lookup=self.lookup,
                       ngram_max=self.ngram_max,
                       ngram_min=self.alongside_ngram_min if kind.with_model else self.ngram_min,
                       global_cache=self.global_cache)

    @property
    def round_k(self) -> int:
        """The round's ceiling on k (lookup's offers alongside a model may reach further than its own k)."""
        return self.plan.k

    @property
    def lookup_alongside(self) -> bool:
        return self.plan.lookup_alongside

    def drafter_options(self) -> DrafterOptions:
        """What this configuration drafts with (specgen.drafters.build); plain drafts with nothing."""
        if self.kind == "plain":
            raise ValueError("plain decoding has no drafter")
        return self.plan.drafting


PLAIN = Config("plain")


def parse_config(text: str) -> Config:
    """`lookup`, `lookup:k=16,ngram=4`, `draft=PATH_OR_NAME:k=4`, `pair=NAME`; strict."""
    s = text.strip()
    if s == "plain":
        raise SpecgenError("--config plain: plain decoding is always measured; --config names speculative configurations")
    for kind in (k for k in Kind if k.free):  # lookup, suffix: `NAME` or `NAME:options`
        if s == kind.value or s.startswith(kind.value + ":"):
            return _free_config(kind, s[len(kind.value) + 1 :], text)
    if s == "heads" or s.startswith(("heads:", "heads=")):
        ref, tail = _split_options(s[len("heads=") :]) if s.startswith("heads=") else ("auto", s[len("heads:") :])
        if not ref:
            raise SpecgenError(f"--config {text}: heads= needs a heads file (or auto)")
        opts = _alongside_options(tail, text)
        policy = opts.get("policy", "fixed")
        lookup = {"on": True, "off": False}.get(opts.get("lookup"))
        return Config("heads", opts.get("k", default_k(Kind.HEADS, policy)), policy=policy, lookup=lookup, heads=ref,
                      alongside_ngram_min=opts.get("ngram_min"), k_given="k" in opts)
    for kind in ("draft", "pair"):
        if s.startswith(kind + "="):
            ref, tail = _split_options(s[len(kind) + 1 :])
            if not ref:
                raise SpecgenError(f"--config {text}: {kind}= needs a {'model' if kind == 'draft' else 'pair name'}")
            opts = _alongside_options(tail, text)
            policy = opts.get("policy", "fixed")
            lookup = {"on": True, "off": False}.get(opts.get("lookup"))
            if kind == "draft":
                return Config("draft", opts.get("k", default_k(Kind.DRAFT, policy)), draft=ref, policy=policy,
                              lookup=lookup, alongside_ngram_min=opts.get("ngram_min"), k_given="k" in opts)
            return Config("pair", opts.get("k"), pair=ref, policy=policy, lookup=lookup,
                          alongside_ngram_min=opts.get("ngram_min"), k_given="k" in opts)
    raise SpecgenError(f"unknown --config '{text}' ({_CONFIG_USAGE})")


_FREE = tuple(k.value for k in Kind if k.free)  # the configs named by their kind alone
# The options a free kind's config takes (a kind not listed: k, ngram_min, policy)
_FREE_OPTIONS = {Kind.LOOKUP: ("k", "ngram", "ngram_min", "policy"), Kind.SUFFIX: ("k", "ngram_min", "policy", "global")}


def _free_config(kind: Kind, tail: str, text: str) -> Config:
    opts = _options(tail, _FREE_OPTIONS.get(kind, ("k", "ngram_min", "policy")), text)
    policy = opts.get("policy", "fixed")
    cfg = Config(kind.value, opts.get("k", default_k(kind, policy)), opts.get("ngram", NGRAM_MAX),
                 opts.get("ngram_min", 1), policy=policy, global_cache=opts.get("global") == "on", k_given="k" in opts)
    if not cfg.ngram_min <= cfg.ngram_max:
        raise SpecgenError(f"--config {text}: need ngram_min <= ngram")
    return cfg


def _alongside_options(tail: str, text: str) -> dict:
    """A draft model's or the heads' options; lookup alongside matches no longer n-grams than it looks up."""
    opts = _options(tail, ("k", "policy", "lookup", "ngram_min"), text)
    if opts.get("ngram_min", 1) > NGRAM_MAX:
        raise SpecgenError(f"--config {text}: need ngram_min <= {NGRAM_MAX} (lookup's longest n-gram)")
    return opts


def _split_options(body: str) -> tuple[str, str]:
    """`REF:k=4` → (REF, "k=4"); a ':' inside REF (hf:..., C:\\...) stays in REF."""
    if ":" in body:
        head, tail = body.rsplit(":", 1)
        if _OPTIONS_RE.fullmatch(tail):
            return head.strip(), tail
    return body.strip(), ""


def _options(text: str, allowed: tuple[str, ...], whole: str) -> dict:
    out: dict = {}
    if not text:
        return out
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in allowed:
            raise SpecgenError(f"--config {whole}: unknown option '{part}' (allowed: {', '.join(k + ('=P' if k == 'policy' else '=on|off' if k in ('global', 'lookup') else '=N') for k in allowed)})")
        if key in out:
            raise SpecgenError(f"--config {whole}: {key} given twice")
        if key == "policy":
            if value.strip() not in POLICIES:
                raise SpecgenError(f"--config {whole}: policy must be one of {', '.join(_POLICY_CHOICES)} (got '{value}')")
            out[key] = value.strip()
            continue
        if key in ("global", "lookup"):
            if value.strip() not in ("on", "off"):
                raise SpecgenError(f"--config {whole}: {key} must be on or off (got '{value}')")
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
