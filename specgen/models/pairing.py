"""Which local models can draft for a target, in which order, and saving a pair.

Pure bookkeeping over specgen.models.local's listing: the checks that need a
model's vocabulary or the machine's costs are handed in (`check`, `predict`:
specgen.drafters.candidates supplies them), so this stays below the engine.

A draft must be the target's equal in vocabulary (equal fingerprints, or the
detailed check passes: vocabularies that differ only by padding), or usable by
translation through text; and smaller by a useful margin: its file at most
SIZE_MARGIN of the target's. A draft step reads all of its weights, so the
file size is what it costs on a CPU; the parameter count alone would let a
Q4_0 copy of the target itself (the same parameters in a quarter of the bytes)
count as no smaller.

Ranking (`rank_key`), best first: same vocabulary before translation; a
measured prediction that pays (> 1x) before an unmeasured one, before a
measured one that does not; then the higher predicted speedup; unmeasured
ones by the target's architecture first, then the smaller file; the name last
(so the order never depends on the file system's).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specgen.errors import SpecgenError
from specgen.models.local import LocalModel

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SIZE_MARGIN = 0.5  # a draft's file at most half the target's
SAME, TRANSLATED = "same", "translated"


@dataclass(frozen=True)
class Candidate:
    model: LocalModel
    vocabulary: str  # SAME | TRANSLATED
    size_ratio: float  # draft file size / target file size
    speedup: float | None  # predicted from this machine's measured costs; None: unmeasured
    basis: str  # how the prediction was made, or why there is none

    def to_dict(self) -> dict:
        return {**self.model.to_dict(), "vocabulary": self.vocabulary, "size_ratio": round(self.size_ratio, 4),
                "predicted_speedup": None if self.speedup is None else round(self.speedup, 3),
                "prediction": self.basis}

    def reason(self) -> str:
        """Why it was chosen, in a few words."""
        vocab = "same vocabulary" if self.vocabulary == SAME else "another vocabulary, drafting through text"
        pred = f"predicted {self.speedup:.2f}x ({self.basis})" if self.speedup is not None else "speedup unmeasured"
        return f"{vocab}, {100 * self.size_ratio:.0f}% of the target's size, {pred}"


@dataclass(frozen=True)
class Rejected:
    model: LocalModel
    reason: str

    def to_dict(self) -> dict:
        return {**self.model.to_dict(), "reason": self.reason}


def screen(target: Path, target_size: int, models: list[LocalModel]) -> tuple[list[tuple[LocalModel, float]],
                                                                                list[Rejected]]:
    """Models small enough to draft for the target (with their size ratio), and the rest with why."""
    real = os.path.realpath(target)
    keep, out = [], []
    for m in models:
        ratio = m.size / target_size if target_size else 1.0
        if os.path.realpath(m.path) == real:
            out.append(Rejected(m, "the target itself"))
        elif m.fingerprint is None:
            out.append(Rejected(m, "no vocabulary in its GGUF"))
        elif ratio > SIZE_MARGIN:
            out.append(Rejected(m, f"not small enough: {100 * ratio:.0f}% of the target's size "
                                   f"(a draft needs at most {100 * SIZE_MARGIN:.0f}%)"))
        else:
            keep.append((m, ratio))
    return keep, out


def rank_key(c: Candidate, target_arch: str | None) -> tuple:
    group = 1 if c.speedup is None else 0 if c.speedup > 1.0 else 2
    return (c.vocabulary != SAME, group, -(c.speedup or 0.0), c.model.architecture != target_arch,
            c.model.size, c.model.name, str(c.model.path))


def rank(target: Path, target_size: int, target_arch: str | None, models: list[LocalModel], *,
         check: Callable[[LocalModel], tuple[str | None, str]],
         predict: Callable[[LocalModel, str], tuple[float | None, str]]) -> tuple[list[Candidate], list[Rejected]]:
    """The local models that can draft for the target, best first, and those that cannot, with why.
    check(model) -> (SAME | TRANSLATED | None, why not); predict(model, vocabulary) -> (speedup | None, basis)."""
    keep, rejected = screen(target, target_size, models)
    out = []
    for m, ratio in keep:
        vocab, why = check(m)
        if vocab is None:
            rejected.append(Rejected(m, why))
            continue
        speedup, basis = predict(m, vocab)
        out.append(Candidate(m, vocab, ratio, speedup, basis))
    out.sort(key=lambda c: rank_key(c, target_arch))
    return out, rejected


def best(candidates: list[Candidate]) -> Candidate | None:
    """The draft `--pair auto` uses: the first, unless measured costs say it would not pay."""
    if candidates and (candidates[0].speedup is None or candidates[0].speedup > 1.0):
        return candidates[0]
    return None


# --------------------------------------------------------------------------- --save


_NAME_RE = re.compile(r"[^A-Za-z0-9_.+-]+")


def model_name(path: Path) -> str:
    """A catalog name for a file: its stem, tidied (an Ollama blob's is its digest: callers name those)."""
    name = _NAME_RE.sub("-", Path(path).stem).strip("-") or "model"
    return name


def save_pair(file: Path, name: str, target: tuple[str, Path], draft: tuple[str, Path],
              draft_max: int | None = None, description: str = "") -> Path:
    """Add [models.T], [models.D] and [pairs.NAME] to the models file `file` (created if
    absent), keeping everything in it; a name it already uses for something else is an
    error, one it uses for the same file is reused. Written whole or not at all (temp +
    rename), and checked as the catalog reads it before it replaces the old one."""
    from specgen.models.catalog import load_catalog

    file = Path(file)
    try:
        old = file.read_text(encoding="utf-8") if file.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        raise SpecgenError(f"cannot read models file {file}: {e}") from None
    try:
        data = tomllib.loads(old)
    except tomllib.TOMLDecodeError as e:
        raise SpecgenError(f"{file}: invalid TOML: {e}; not changed") from None
    models, pairs = data.get("models", {}), data.get("pairs", {})
    if name in pairs:
        raise SpecgenError(f"{file} already has [pairs.{name}]: give another name (pair --save NAME)")
    add = []
    for mname, path in (target, draft):
        have = models.get(mname)
        if have is None:
            add.append(f"[models.{_key(mname)}]\npath = {_str(str(path))}\n")
            models[mname] = {"path": str(path)}
        elif os.path.realpath(Path(str(have.get("path", ""))).expanduser()) != os.path.realpath(path):
            raise SpecgenError(f"{file} already has [models.{mname}] for another file: rename it or choose another file")
    lines = [f"[pairs.{_key(name)}]", f"target = {_str(target[0])}", f"draft = {_str(draft[0])}"]
    if draft_max:
        lines.append(f"draft_max = {int(draft_max)}")
    if description:
        lines.append(f"description = {_str(description)}")
    text = old + ("\n" if old and not old.endswith("\n") else "") + ("\n" if old.strip() else "")
    text += "\n".join(add + ["\n".join(lines) + "\n"])
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        load_catalog(user=tmp)  # what the catalog will read: refuse before replacing
        os.replace(tmp, file)
    except OSError as e:
        raise SpecgenError(f"cannot write models file {file}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return file


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _str(name)


def _str(s: str) -> str:
    """A TOML basic string."""
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    out = "".join(c if c >= " " and c != "\x7f" else f"\\u{ord(c):04x}" for c in out)
    return f'"{out}"'
