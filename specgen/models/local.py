"""The GGUF files already on this machine: the Hugging Face cache, Ollama's store,
LM Studio's models folder and the folders named in $SPECGEN_MODEL_DIRS.

Header reads only (specgen.models.gguf, no weights loaded): size, architecture,
parameter count and tokenizer fingerprint (specgen.models.vocab) of each file,
kept in one cache file while the file is unchanged. Split GGUFs (`-00001-of-00003.gguf`), non-GGUF blobs, vision
projectors and broken files are kept aside as `Skipped`, each with its reason.
`ollama_file("ollama:NAME[:TAG]")` is how `-m ollama:...` finds its blob.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from specgen.errors import SpecgenError

OLLAMA_HOST = "registry.ollama.ai"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
STORES = ("hf", "ollama", "lmstudio", "dirs")


@dataclass(frozen=True)
class LocalModel:
    """One usable GGUF file: where it was found, under which name, and its header's facts."""

    path: Path
    store: str  # hf | ollama | lmstudio | dirs
    name: str  # how the store names it (hf:REPO/FILE, ollama NAME:TAG, the path under a folder)
    size: int
    architecture: str | None
    n_params: int
    fingerprint: str | None  # the tokenizer fingerprint (None: no vocabulary)
    title: str = ""  # general.name

    @property
    def ref(self) -> str:
        """What -m takes for it."""
        return f"ollama:{self.name}" if self.store == "ollama" else str(self.path)

    def to_dict(self) -> dict:
        return {"name": self.name, "store": self.store, "path": str(self.path), "ref": self.ref, "size": self.size,
                "architecture": self.architecture, "parameters": self.n_params, "fingerprint": self.fingerprint,
                "title": self.title}


@dataclass(frozen=True)
class Skipped:
    path: Path
    store: str
    name: str
    reason: str

    def to_dict(self) -> dict:
        return {"name": self.name, "store": self.store, "path": str(self.path), "reason": self.reason}


@dataclass
class Scan:
    models: list[LocalModel] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    searched: list[tuple[str, Path]] = field(default_factory=list)  # (store, folder) that exist

    def to_dict(self) -> dict:
        return {"models": [m.to_dict() for m in self.models], "skipped": [s.to_dict() for s in self.skipped],
                "searched": [{"store": s, "path": str(p)} for s, p in self.searched]}


# --------------------------------------------------------------------------- where the stores are


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, as huggingface_hub finds it (read from the environment now,
    not at its import): $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def ollama_dir() -> Path:
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".ollama" / "models"


def lmstudio_dirs() -> list[Path]:
    """LM Studio's models folders: the one its settings name (downloadsFolder), then the defaults."""
    home = Path.home()
    out = []
    for settings in (home / ".lmstudio" / "settings.json", home / ".cache" / "lm-studio" / "settings.json"):
        try:
            folder = json.loads(settings.read_text()).get("downloadsFolder")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(folder, str) and folder.strip():
            out.append(Path(folder).expanduser())
    out += [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    return _unique(out)


def user_dirs() -> list[Path]:
    text = os.environ.get("SPECGEN_MODEL_DIRS", "")
    return _unique([Path(p).expanduser() for p in text.split(os.pathsep) if p.strip()])


def _unique(paths: list[Path]) -> list[Path]:
    seen, out = set(), []
    for p in paths:
        key = os.path.abspath(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


# --------------------------------------------------------------------------- the scan


def scan(stores: tuple[str, ...] = STORES) -> Scan:
    """Every GGUF file in the stores, by store then name; a file reached twice (a store's
    symlink into another) is listed once, where it was found first."""
    result = Scan()
    found: list[tuple[str, str, Path]] = []  # (store, name, path)
    for store in stores:
        for folder, items, skipped in _store_items(store):
            result.searched.append((store, folder))
            found += items
            result.skipped += skipped
    seen: set[str] = set()
    facts = _FactsCache.load()
    for store, name, path in found:
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        item = _examine(store, name, path, facts)
        (result.models if isinstance(item, LocalModel) else result.skipped).append(item)
    facts.save()
    return result


def _store_items(store: str):
    """(folder, [(store, name, path)], [Skipped]) for each existing folder of `store`."""
    if store == "hf":
        cache = hf_hub_cache()
        if cache.is_dir():
            yield cache, _hf_items(cache), []
    elif store == "ollama":
        root = ollama_dir()
        if (root / "manifests").is_dir():
            items, skipped = _ollama_items(root)
            yield root, items, skipped
    else:
        for folder in (lmstudio_dirs() if store == "lmstudio" else user_dirs()):
            if folder.is_dir():
                yield folder, _folder_items(store, folder), []


def _hf_items(cache: Path) -> list[tuple[str, str, Path]]:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache)
    except (CacheNotFound, OSError, ValueError):
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
            for f in sorted(rev.files, key=lambda f: str(f.file_path)):
                if f.file_name.lower().endswith(".gguf"):
                    rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                    out.append(("hf", f"hf:{repo.repo_id}/{rel}", f.file_path))
    return out


def _folder_items(store: str, folder: Path) -> list[tuple[str, str, Path]]:
    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() == ".gguf" and p.is_file())
    return [(store, p.relative_to(folder).as_posix(), p) for p in paths]


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """How `ollama list` writes a model: NAME:TAG for the library, NS/NAME:TAG, HOST/NS/NAME:TAG."""
    if host == OLLAMA_HOST:
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _ollama_items(root: Path) -> tuple[list[tuple[str, str, Path]], list[Skipped]]:
    items, skipped = [], []
    manifests = root / "manifests"
    for m in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = m.relative_to(manifests).parts
        if len(parts) != 4:
            continue
        name = ollama_name(*parts)
        try:
            items.append(("ollama", name, _manifest_blob(root, m)))
        except SpecgenError as e:
            skipped.append(Skipped(m, "ollama", name, str(e)))
    return items, skipped


def _manifest_blob(root: Path, manifest: Path) -> Path:
    """The model layer's blob a manifest names (blobs/sha256-<hex>)."""
    try:
        layers = json.loads(manifest.read_text()).get("layers") or []
        digest = next(x["digest"] for x in layers if x.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        raise SpecgenError(f"manifest {manifest} is not an Ollama manifest") from None
    except StopIteration:
        raise SpecgenError(f"manifest {manifest} has no model layer ({OLLAMA_MODEL_LAYER})") from None
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise SpecgenError(f"manifest {manifest}: bad layer digest {digest!r}")
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise SpecgenError(f"the blob {blob.name} its manifest names is missing")
    return blob


def _examine(store: str, name: str, path: Path, facts: "_FactsCache") -> LocalModel | Skipped:
    """A file's header facts (from the cache while the file is unchanged), or why it is left out."""
    split = SPLIT_RE.search(path.name) or SPLIT_RE.search(name)
    if split:
        return Skipped(path, store, name, f"split model (part {int(split[1])} of {int(split[2])}): "
                                          "specgen opens single-file GGUFs (merge it with llama-gguf-split --merge)")
    got = facts.get(path)
    if got is None:
        got = _header_facts(path)
        facts.put(path, got)
    if "reason" in got:
        return Skipped(path, store, name, got["reason"])
    return LocalModel(Path(path), store, name, got["size"], got["architecture"], got["n_params"], got["fingerprint"],
                      got["title"])


def _header_facts(path: Path) -> dict:
    from specgen.models.gguf import read_header_digest
    from specgen.models.vocab import fingerprint_of

    try:
        header, digest = read_header_digest(path)
        arch = header.metadata.get("general.architecture")
        if arch == "clip":
            return {"reason": "a vision projector (clip), not a language model"}
        fp = fingerprint_of(digest, header.metadata)
    except SpecgenError as e:
        return {"reason": str(e)}
    title = header.metadata.get("general.name")
    return {"size": header.file_size, "architecture": arch if isinstance(arch, str) else None,
            "n_params": header.n_params, "fingerprint": fp, "title": title if isinstance(title, str) else ""}


FACTS_VERSION = 1


class _FactsCache:
    """Each file's header facts, in one JSON file under specgen's cache (local-models.json),
    valid while the file's size, mtime and inode are as recorded: a scan of unchanged
    stores reads no headers. Unreadable or unwritable: only skipped."""

    def __init__(self, file: Path | None, entries: dict):
        self.file, self.entries, self.changed = file, entries, False

    @classmethod
    def load(cls) -> "_FactsCache":
        from specgen.models.cache import cache_root

        file = cache_root() / "local-models.json"
        try:
            data = json.loads(file.read_text())
            entries = data["entries"] if data.get("version") == FACTS_VERSION else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            entries = {}
        return cls(file, entries if isinstance(entries, dict) else {})

    @staticmethod
    def _ident(path: Path) -> list | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return [st.st_size, st.st_mtime_ns, st.st_ino]

    def get(self, path: Path) -> dict | None:
        e = self.entries.get(os.path.realpath(path))
        ident = self._ident(path)
        if isinstance(e, dict) and ident is not None and e.get("ident") == ident and isinstance(e.get("facts"), dict):
            return e["facts"]
        return None

    def put(self, path: Path, facts: dict) -> None:
        ident = self._ident(path)
        if ident is not None:
            self.entries[os.path.realpath(path)] = {"ident": ident, "facts": facts}
            self.changed = True

    def save(self) -> None:
        if not self.changed or self.file is None:
            return
        tmp = self.file.with_name(f"{self.file.name}.{os.getpid()}.tmp")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"version": FACTS_VERSION, "entries": self.entries}))
            os.replace(tmp, self.file)
        except OSError:
            tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- ollama:NAME[:TAG]


def parse_ollama_ref(ref: str) -> tuple[str, str, str, str]:
    """`ollama:NAME[:TAG]` (NAME: MODEL, NS/MODEL or HOST/NS/MODEL) → (host, namespace, model, tag)."""
    body = ref[len("ollama:"):].strip()
    name, _, tag = body.rpartition(":") if ":" in body.rsplit("/", 1)[-1] else (body, "", "latest")
    parts = name.split("/")
    if not all(parts) or len(parts) > 3 or not tag:
        raise SpecgenError(f"bad model reference '{ref}' (expected ollama:NAME[:TAG])")
    host, namespace = OLLAMA_HOST, "library"
    if len(parts) == 3:
        host, namespace = parts[0], parts[1]
    elif len(parts) == 2:
        namespace = parts[0]
    return host, namespace, parts[-1], tag


def ollama_file(ref: str) -> Path:
    """The blob of `ollama:NAME[:TAG]` (TAG default latest) in Ollama's store; one line
    naming the closest models there when it is not."""
    root = ollama_dir()
    host, namespace, model, tag = parse_ollama_ref(ref)
    manifest = root / "manifests" / host / namespace / model / tag
    if manifest.is_file():
        return _manifest_blob(root, manifest)
    wanted = ollama_name(host, namespace, model, tag)
    names: list[str] = []
    if (root / "manifests").is_dir():
        items, skipped = _ollama_items(root)
        names = [n for _, n, _ in items] + [s.name for s in skipped]
    close = difflib.get_close_matches(wanted, sorted(set(names)), n=3, cutoff=0.4)
    where = f"Ollama's store ({root})"
    if not names:
        raise SpecgenError(f"ollama model '{wanted}' not found: {where} holds no models")
    hint = f"; closest there: {', '.join(close)}" if close else f"; it holds {len(set(names))} others (`specgen models --local`)"
    raise SpecgenError(f"ollama model '{wanted}' is not in {where}{hint}")
