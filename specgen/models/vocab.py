"""Tokenizer compatibility between a target model and its draft model.

Speculative decoding hands the draft's token ids straight to the target, so
both must mean the same thing by every id. `compare` makes llama.cpp's own
checks (common_speculative_are_compatible: vocab type, BOS/EOS flags and ids,
sizes within 128, identical token text from id 5 to the smaller size) and
goes further: the pre-tokenizer name, token attributes (control, user-defined,
byte, ...) over the shared range, the end-of-turn id, and a probe text that
both must tokenize to the same ids. Every check runs, so the report lists
every problem, first the most basic.

The engines are duck typed (specgen.engine.llama.Engine or a test fake): `n_vocab`,
`vocab_info()`, `token_text(i) -> bytes`, `token_attr(i) -> int`,
`tokenize(text, add_special=, parse_special=) -> list[int]`, `meta(key)`.
Comparing two 262,144-token vocabularies takes about half a second (seconds on
a busy machine).

Before any engine: `fingerprint(path)`, a hash of what decides compatibility
read from the GGUF header (every `tokenizer.ggml.*` value: tokenizer model,
pre-tokenizer, token texts, types, scores, merges, special ids and add flags;
and the name and architecture rules by which llama.cpp adds strip attributes),
cached by file identity. Equal fingerprints mean llama.cpp builds the same
tokenizer from both files, so every check here would pass: `same_tokenizer`
says so without comparing token by token. Differing ones (even where only an
unused padding id differs) call for `compare`. Measurements:
docs/notes/2026-12-02-vocab-fingerprint.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from specgen.errors import SpecgenError

MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
CHECK_START_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID: ids below may differ

VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2"}

# llama_token_attr bits that say what kind of token an id is. The rest
# (normalized, lstrip, rstrip, single-word) only shape how text around a
# special token is matched, which the probe text exercises directly.
ATTR_NAMES = {1: "unknown", 2: "unused", 4: "normal", 8: "control", 16: "user-defined", 32: "byte"}
ATTR_KIND_MASK = sum(ATTR_NAMES)

# Mixed text both tokenizers must split identically: prose, code with
# indentation, numbers, punctuation, several scripts, emoji (with joiners and
# skin tones), runs of spaces, tabs and newlines.
PROBE_TEXT = (
    'The quick brown fox jumps over the lazy dog. Isn\'t it? "Yes" -- (maybe); 50% off!\n'
    "def fib(n: int) -> int:\n"
    "    if n < 2:\n"
    "        return n\n"
    "\treturn fib(n - 1) + fib(n - 2)  # recursion\n\n\n"
    "x = [1, 22, 333, 4444, 55555, 3.14159, -1e-9, 0x7F, 1_000_000]\n"
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, العربية, हिन्दी\n"
    "Emoji: 🙂🚀 👍🏽 👨‍👩‍👧 ❤️\n"
    "   leading spaces,    inner   runs,\ttabs\t\tand trailing   \n"
    "\r\n"
    "URL https://example.com/a?b=c&d=e#f, e-mail a.b@c.org, path C:\\Users\\x\n"
    '{"key": [true, null, -0.5e+10]} <b>&amp;</b> `code` **bold** ~~~ ... !!! ???\n'
    "    \n\n\n\n"
)


class VocabSource(Protocol):
    n_vocab: int

    def vocab_info(self) -> Any: ...
    def token_text(self, token: int) -> bytes: ...
    def token_attr(self, token: int) -> int: ...
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...
    def meta(self, key: str) -> str | None: ...


@dataclass
class VocabReport:
    """The outcome of `compare`: every check as (name, passed, detail)."""

    compatible: bool
    problems: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def first_problem(self) -> str:
        """The first failed check's detail, one line ("" when compatible)."""
        return self.problems[0] if self.problems else ""

    def to_dict(self) -> dict:
        return {
            "compatible": self.compatible,
            "problems": list(self.problems),
            "checks": [{"name": n, "passed": p, "detail": d} for n, p, d in self.checks],
        }


def n_shared(target: VocabSource, draft: VocabSource) -> int:
    """The number of token ids both models have (logit rows beyond it are cut)."""
    return min(int(target.n_vocab), int(draft.n_vocab))


def require_compatible(target: VocabSource, draft: VocabSource) -> VocabReport:
    """`compare`, raising SpecgenError with the first problem when incompatible."""
    report = compare(target, draft)
    if not report.compatible:
        raise SpecgenError(f"draft model's tokenizer does not match the target's: {report.first_problem()}")
    return report


def compare(target: VocabSource, draft: VocabSource, probe: str = PROBE_TEXT) -> VocabReport:
    """Every tokenizer check between `target` and `draft`; see the module docstring."""
    ti, di = target.vocab_info(), draft.vocab_info()
    checks: list[tuple[str, bool, str]] = [
        _check_type(ti, di),
        _check_special("BOS", ti.add_bos, di.add_bos, ti.bos, di.bos, target, draft),
        _check_special("EOS", ti.add_eos, di.add_eos, ti.eos, di.eos, target, draft),
        _check_size(int(target.n_vocab), int(draft.n_vocab)),
        _check_texts(target, draft),
        _check_pre(target, draft),
        _check_attrs(target, draft),
        _check_eot(getattr(ti, "eot", -1), getattr(di, "eot", -1), target, draft),
        _check_probe(target, draft, probe),
    ]
    problems = [detail for _, passed, detail in checks if not passed]
    return VocabReport(compatible=not problems, problems=problems, checks=checks)


# --------------------------------------------------------------------------- fingerprints

# Raised whenever what the fingerprint covers changes: older cache entries are recomputed.
FINGERPRINT_VERSION = 1
NO_VOCAB = ("none", "no_vocab")  # tokenizer models without a vocabulary: nothing to fingerprint

# llama.cpp (llama_vocab::impl::load) sets strip attributes by these substrings of the
# lowercased general.name and of general.architecture: they enter the fingerprint as flags.
_NAME_RULES = ("phi-3", "phi3")
_ARCH_RULES = ("nomic-bert-moe", "jina-bert-v3")


def same_tokenizer(a: str | Path | None, b: str | Path | None, *, cache: Path | None = None) -> bool:
    """Whether the GGUF files at `a` and `b` have equal tokenizer fingerprints (False
    when either has none, is None, or cannot be read: a shortcut, never an obstacle;
    the detailed comparison, or opening the model, then says what is wrong)."""
    if a is None or b is None:
        return False
    try:
        fa = fingerprint(a, cache=cache)
        return fa is not None and fa == fingerprint(b, cache=cache)
    except SpecgenError:
        return False


def fingerprint(path: str | Path, *, cache: Path | None = None) -> str | None:
    """The tokenizer fingerprint of the GGUF file at `path` (None where it has no
    vocabulary), from the cache when the file is unchanged: one small JSON file per
    resolved path under `cache` (default: specgen's cache dir, vocab/), valid while
    the file's size, mtime and inode are as recorded. A damaged or stale entry is
    recomputed; a cache that cannot be written is only skipped."""
    path = Path(path).resolve()
    try:
        st = path.stat()
    except OSError:
        return compute_fingerprint(path)  # raises the one-line reason
    ident = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
             "version": FINGERPRINT_VERSION}
    entry = _entry_file(path, cache)
    if entry is not None:
        try:
            got = json.loads(entry.read_text())
            fp = got["fingerprint"]
            if {k: got.get(k) for k in ident} == ident and (fp is None or isinstance(fp, str)):
                return fp
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # missing or damaged: recomputed below
    fp = compute_fingerprint(path)
    if entry is not None:
        _write_atomic(entry, json.dumps({**ident, "fingerprint": fp}))
    return fp


def compute_fingerprint(path: str | Path) -> str | None:
    """The fingerprint itself, from the header (about 35 ms for a 262k-token vocabulary)."""
    from specgen.models.gguf import tokenizer_digest

    return fingerprint_of(*tokenizer_digest(Path(path)))


def fingerprint_of(digest: str, meta: dict) -> str | None:
    """The fingerprint from a header's tokenizer digest and its scalar metadata."""
    model = meta.get("tokenizer.ggml.model")
    if not isinstance(model, str) or model in NO_VOCAB or not isinstance(meta.get("tokenizer.ggml.tokens"), int):
        return None
    name = str(meta.get("general.name", "")).lower()
    arch = str(meta.get("general.architecture", ""))
    rules = [any(r in name for r in _NAME_RULES), any(r in arch for r in _ARCH_RULES)]
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(["specgen-vocab", FINGERPRINT_VERSION, digest, rules]).encode())
    return h.hexdigest()


def _entry_file(path: Path, cache: Path | None) -> Path | None:
    if cache is None:
        from specgen.models.cache import cache_dir

        try:
            cache = cache_dir() / "vocab"
        except SpecgenError:
            return None
    key = hashlib.blake2b(str(path).encode(), digest_size=10).hexdigest()
    return Path(cache) / f"{key}.json"


def _write_atomic(f: Path, text: str) -> None:
    tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, f)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


# --------------------------------------------------------------------------- checks


def _check_type(ti: Any, di: Any) -> tuple[str, bool, str]:
    if ti.type == di.type:
        return ("vocab type", True, _type_name(ti.type))
    return ("vocab type", False, f"vocab type differs: target {_type_name(ti.type)} vs draft {_type_name(di.type)}")


def _check_special(
    which: str, t_add: bool, d_add: bool, t_id: int, d_id: int, target: VocabSource, draft: VocabSource
) -> tuple[str, bool, str]:
    name = which.lower()
    if bool(t_add) != bool(d_add):
        yes, no = ("target", "draft") if t_add else ("draft", "target")
        return (name, False, f"{yes} adds {which} to a prompt, {no} does not")
    if t_add and t_id != d_id:
        return (name, False, f"{which} id differs: target {_id_text(target, t_id)} vs draft {_id_text(draft, d_id)}")
    if t_add:
        return (name, True, f"both add {which} {_id_text(target, t_id)}")
    return (name, True, f"neither adds {which}")


def _check_size(nt: int, nd: int) -> tuple[str, bool, str]:
    diff = abs(nt - nd)
    if diff > MAX_SIZE_DIFFERENCE:
        return (
            "vocab size",
            False,
            f"vocab sizes differ by {diff} (target {nt}, draft {nd}; at most {MAX_SIZE_DIFFERENCE} allowed)",
        )
    return ("vocab size", True, f"target {nt}, draft {nd}" + (f" (differ by {diff})" if diff else ""))


def _check_texts(target: VocabSource, draft: VocabSource) -> tuple[str, bool, str]:
    lo, hi = CHECK_START_ID, n_shared(target, draft)
    tt, dt = _texts(target, lo, hi), _texts(draft, lo, hi)
    if tt == dt:
        return ("token text", True, f"ids {lo}..{hi - 1} identical" if hi > lo else "no shared ids to compare")
    i = _first_difference(tt, dt)
    return ("token text", False, f"token {lo + i} differs: target {_show(tt[i])} vs draft {_show(dt[i])}")


def _check_pre(target: VocabSource, draft: VocabSource) -> tuple[str, bool, str]:
    key = "tokenizer.ggml.pre"
    tp, dp = target.meta(key), draft.meta(key)
    if tp == dp:
        return ("pre-tokenizer", True, tp if tp is not None else "(none)")
    return ("pre-tokenizer", False, f"pre-tokenizer differs: target {_show_meta(tp)} vs draft {_show_meta(dp)}")


def _check_attrs(target: VocabSource, draft: VocabSource) -> tuple[str, bool, str]:
    lo, hi = CHECK_START_ID, n_shared(target, draft)
    ta, da = _attrs(target, lo, hi), _attrs(draft, lo, hi)
    if ta == da:
        n_special = sum(1 for a in ta if a & 0b11011)  # unknown, unused, control, user-defined
        return ("token attributes", True, f"ids {lo}..{hi - 1} identical ({n_special} special)")
    i = _first_difference(ta, da)
    tok = lo + i
    return (
        "token attributes",
        False,
        (
            f"token {tok} {_show(target.token_text(tok))} is {_attr_text(ta[i])} in the target "
            f"but {_attr_text(da[i])} in the draft"
        ),
    )


def _check_eot(t_eot: int, d_eot: int, target: VocabSource, draft: VocabSource) -> tuple[str, bool, str]:
    # Only a conflict when both models name one: older conversions often leave it unset.
    if t_eot >= 0 and d_eot >= 0 and t_eot != d_eot:
        return (
            "end of turn",
            False,
            f"end-of-turn id differs: target {_id_text(target, t_eot)} vs draft {_id_text(draft, d_eot)}",
        )
    if t_eot < 0 and d_eot < 0:
        return ("end of turn", True, "neither names one")
    if t_eot < 0 or d_eot < 0:
        return ("end of turn", True, "named by only one model")
    return ("end of turn", True, _id_text(target, t_eot))


def _check_probe(target: VocabSource, draft: VocabSource, probe: str) -> tuple[str, bool, str]:
    tp = list(target.tokenize(probe, add_special=True, parse_special=True))
    dp = list(draft.tokenize(probe, add_special=True, parse_special=True))
    if tp == dp:
        return ("probe text", True, f"{len(tp)} tokens identical")
    i = _first_difference(tp, dp)
    t_side = f"{tp[i]} {_show(target.token_text(tp[i]))}" if i < len(tp) else "(end)"
    d_side = f"{dp[i]} {_show(draft.token_text(dp[i]))}" if i < len(dp) else "(end)"
    return (
        "probe text",
        False,
        f"probe text tokenizes differently at position {i} of {len(tp)}/{len(dp)}: target {t_side} vs draft {d_side}",
    )


# --------------------------------------------------------------------------- helpers


def _texts(e: VocabSource, lo: int, hi: int) -> list[bytes]:
    get = e.token_text  # bound once: 262k ctypes calls take ~0.1 s
    return [get(i) for i in range(lo, hi)]


def _attrs(e: VocabSource, lo: int, hi: int) -> list[int]:
    get, mask = e.token_attr, ATTR_KIND_MASK
    return [get(i) & mask for i in range(lo, hi)]


def _first_difference(a: Sequence, b: Sequence) -> int:
    """The first index where a and b differ (or the shorter length)."""
    n = min(len(a), len(b))
    # Halve the range until the difference is pinned: slice compares run in C.
    lo, hi = 0, n
    if a[:n] == b[:n]:
        return n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] != b[lo:mid]:
            hi = mid
        else:
            lo = mid
    return lo


def _show(text: bytes | str, limit: int = 40) -> str:
    """A token's text as a quoted, escaped, single-line string."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="backslashreplace")
    if len(text) > limit:
        text = text[:limit] + "…"
    return repr(text)


def _show_meta(value: str | None) -> str:
    return "(none)" if value is None else _show(value)


def _id_text(e: VocabSource, token: int) -> str:
    if 0 <= token < int(e.n_vocab):
        return f"{token} {_show(e.token_text(token))}"
    return str(token)


def _type_name(t: int) -> str:
    return VOCAB_TYPES.get(int(t), f"type {t}")


def _attr_text(attr: int) -> str:
    names = [name for bit, name in ATTR_NAMES.items() if attr & bit]
    return "|".join(names) if names else "undefined"
