"""The GGUF header: is a file a complete GGUF v2/v3 model? And a digest of its
tokenizer's metadata (reads the header only).

Hand-written rather than `gguf.GGUFReader`: the reader builds a numpy view for
every array element, about 10 s for the embedded model's 262k-token vocabulary
against about 30 ms here, far too slow for a check made on every run. Only the
tensor block sizes come from the `gguf` package.

`tokenizer_digest` hashes the raw bytes of every `tokenizer.ggml.*` value (the
token list, types, scores, merges, special ids and flags) in one pass over the
mapped header, never turning the arrays into Python objects; what makes it a
fingerprint of compatibility is specgen.models.vocab's business.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from specgen.errors import SpecgenError

# Metadata value types (gguf.constants.GGUFValueType): the scalars by their struct format.
_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_SUPPORTED_VERSIONS = (2, 3)


class _Corrupt(Exception):
    pass


@dataclass
class Header:
    version: int
    metadata: dict  # scalar values; arrays appear as their length
    n_tensors: int
    data_end: int  # byte offset just past the last tensor's data (or the header)
    file_size: int
    spans: dict = field(default_factory=dict)  # key -> (value type, first byte, byte past the end) of its value
    n_params: int = 0  # elements over all tensors (the parameter count)


def check_gguf(path: Path) -> None:
    """Raise SpecgenError unless `path` is a complete GGUF v2/v3 file (reads the header only)."""
    read_header(path)


def read_header(path: Path) -> Header:
    """The header of a GGUF file, checked: every failure is one SpecgenError line."""
    with _mapped(path) as (buf, size):
        header = _parse_header(buf, size)
    if header.data_end > size:
        raise SpecgenError(
            f"{path} is a truncated or corrupt GGUF file "
            f"(tensor data ends at byte {header.data_end}, the file has {size})"
        )
    return header


TOKENIZER_PREFIX = "tokenizer.ggml."


def tokenizer_digest(path: Path, prefix: str = TOKENIZER_PREFIX) -> tuple[str, dict]:
    """(a hash over every metadata value whose key starts with `prefix`, the header's
    scalar metadata). Each value enters as key, GGUF type, length and raw bytes, in
    key order (files that list their keys in another order hash alike); the
    tensor entries are not read. Failures as read_header's."""
    with _mapped(path) as (buf, size):
        cur, _, _, n_kv = _start(buf, size)
        metadata, spans = _read_metadata(cur, n_kv)
        digest = _digest(buf, spans, prefix)
    return digest, metadata


def read_header_digest(path: Path, prefix: str = TOKENIZER_PREFIX) -> tuple[Header, str]:
    """read_header and tokenizer_digest in one pass over the header (a local scan's cold path)."""
    with _mapped(path) as (buf, size):
        header = _parse_header(buf, size)
        digest = _digest(buf, header.spans, prefix)
    if header.data_end > size:
        raise SpecgenError(
            f"{path} is a truncated or corrupt GGUF file "
            f"(tensor data ends at byte {header.data_end}, the file has {size})"
        )
    return header, digest


def _digest(buf, spans: dict, prefix: str) -> str:
    h = hashlib.blake2b(digest_size=20)
    for key in sorted(k for k in spans if k.startswith(prefix)):
        vtype, start, end = spans[key]
        name = key.encode()
        h.update(struct.pack("<Q", len(name)) + name + struct.pack("<IQ", vtype, end - start))
        h.update(buf[start:end])
    return h.hexdigest()


@contextmanager
def _mapped(path: Path) -> Iterator[tuple[mmap.mmap, int]]:
    """The file mapped read-only, with its size; every failure (in the body too) is one SpecgenError line."""
    path = Path(path)
    _check_readable(path)
    try:
        with open(path, "rb") as f:
            _check_start(path, f.read(24))
            size = os.fstat(f.fileno()).st_size
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                yield buf, size
    except SpecgenError:
        raise
    except PermissionError:
        raise SpecgenError(f"cannot read {path}: permission denied") from None
    except (_Corrupt, struct.error, ValueError, OverflowError) as e:
        raise SpecgenError(f"{path} is a truncated or corrupt GGUF file ({e})") from None
    except OSError as e:
        raise SpecgenError(f"cannot read {path}: {e.strerror or e}") from None


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise SpecgenError(f"model file not found: {path}")
    if path.is_dir():
        raise SpecgenError(f"{path} is a directory, not a GGUF file")
    if not path.is_file():
        raise SpecgenError(f"{path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise SpecgenError(f"cannot read {path}: permission denied")


def _check_start(path: Path, head: bytes) -> None:
    """The magic, enough bytes for the counts, and a version this parser reads."""
    if head[:4] != b"GGUF":
        raise SpecgenError(f"{path} is not a GGUF file")
    if len(head) < 24:
        raise SpecgenError(f"{path} is a truncated or corrupt GGUF file (only {len(head)} bytes)")
    version = struct.unpack_from("<I", head, 4)[0]
    if version not in _SUPPORTED_VERSIONS:
        raise SpecgenError(f"{path} has unsupported GGUF version {version} (supported: 2, 3)")


class _Cursor:
    """Reads a GGUF header forward from a buffer, never past `size`.

    Big arrays (the vocabulary) are stepped over, never turned into Python objects.
    """

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0
        self.n_elems = 0  # summed over the tensor entries read

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise _Corrupt(f"header runs past the end of the file at byte {self.pos}")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def skip(self, nbytes: int, what: str) -> None:
        if self.pos + nbytes > self.size:
            raise _Corrupt(f"{what} runs past the end of the file")
        self.pos += nbytes

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > self.size:
            raise _Corrupt(f"string runs past the end of the file at byte {self.pos}")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_strings(self, count: int) -> None:
        buf, size, unpack = self.buf, self.size, struct.Struct("<Q").unpack_from
        p = self.pos
        for _ in range(count):
            if p + 8 > size:
                raise _Corrupt("string array runs past the end of the file")
            p += 8 + unpack(buf, p)[0]
        if p > size:
            raise _Corrupt("string array runs past the end of the file")
        self.pos = p

    def value(self, vtype: int):
        """A metadata value: a scalar, a string, or an array's length (its elements skipped)."""
        if vtype in _SCALAR_FMT:
            return self.take(_SCALAR_FMT[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.skip_array()
        raise _Corrupt(f"unknown metadata value type {vtype}")

    def skip_array(self) -> int:
        etype, count = self.take("<I"), self.take("<Q")
        if etype in _SCALAR_FMT:
            self.skip(count * struct.calcsize(_SCALAR_FMT[etype]), "array")
        elif etype == _STRING:
            if self.pos + 8 * count > self.size:
                raise _Corrupt("array runs past the end of the file")
            self.skip_strings(count)
        elif etype == _ARRAY:
            if count > self.size - self.pos:
                raise _Corrupt("array runs past the end of the file")
            for _ in range(count):
                self.skip_array()
        else:
            raise _Corrupt(f"unknown array element type {etype}")
        return count

    def tensor_end(self, sizes: dict) -> int:
        """One tensor's entry → the offset (from the data start) just past its data."""
        self.string()  # name
        n_dims = self.take("<I")
        if n_dims > 8:
            raise _Corrupt(f"tensor with {n_dims} dimensions")
        n_elems = 1
        for _ in range(n_dims):
            n_elems *= self.take("<Q")
        ttype, offset = self.take("<I"), self.take("<Q")
        self.n_elems += n_elems
        # A tensor type newer than the installed gguf package: only its offset is checked.
        block, type_size = sizes.get(ttype, (1, 0))
        return offset + n_elems // block * type_size


def _start(buf, size: int) -> tuple[_Cursor, int, int, int]:
    """A cursor just past the counts, and (version, tensor count, metadata key count)."""
    if bytes(buf[:4]) != b"GGUF":
        raise _Corrupt("bad magic")
    cur = _Cursor(buf, size)
    cur.pos = 4
    version = cur.take("<I")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    if n_tensors > size or n_kv > size:
        raise _Corrupt(f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")
    return cur, version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int) -> tuple[dict, dict]:
    """(key -> scalar value or array length, key -> (type, start, end) of its value's bytes)."""
    metadata, spans = {}, {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.take("<I")
        start = cur.pos
        metadata[key] = cur.value(vtype)
        spans[key] = (vtype, start, cur.pos)
    return metadata, spans


def _parse_header(buf, size: int) -> Header:
    """Walk the header: magic, counts, metadata, tensor entries, then where the data ends."""
    from gguf.constants import GGML_QUANT_SIZES

    cur, version, n_tensors, n_kv = _start(buf, size)
    metadata, spans = _read_metadata(cur, n_kv)
    end = max((cur.tensor_end(GGML_QUANT_SIZES) for _ in range(n_tensors)), default=0)
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0:
        raise _Corrupt(f"bad general.alignment {align!r}")
    data_start = -(-cur.pos // align) * align
    data_end = data_start + end if n_tensors else cur.pos
    return Header(version, metadata, n_tensors, data_end, size, spans, cur.n_elems)


@dataclass
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple  # GGUF order: the fastest-varying dimension first (a row's length)
    offset: int  # absolute byte offset of the data in the file


def find_tensor(path: Path, names: tuple[str, ...]) -> TensorInfo | None:
    """The first of `names` among the file's tensors (walks the header only); None if none is there.
    For reading a few rows of a big matrix without gguf.GGUFReader's seconds over the vocabulary."""
    with _mapped(path) as (buf, size):
        cur, _, n_tensors, n_kv = _start(buf, size)
        metadata, _ = _read_metadata(cur, n_kv)
        found = {}
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.take("<I")
            if n_dims > 8:
                raise _Corrupt(f"tensor with {n_dims} dimensions")
            shape = tuple(cur.take("<Q") for _ in range(n_dims))
            ttype, offset = cur.take("<I"), cur.take("<Q")
            if name in names:
                found[name] = (ttype, shape, offset)
        align = metadata.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0:
            raise _Corrupt(f"bad general.alignment {align!r}")
        start = -(-cur.pos // align) * align
    for name in names:
        if name in found:
            ttype, shape, offset = found[name]
            return TensorInfo(name, ttype, shape, start + offset)
    return None
