"""Tiny GGUF files for tests: real vocabularies that llama.cpp loads with vocab_only (Engine.vocab).

`write_spm_gguf` writes a llama-architecture header (the few hyperparameters
llama.cpp reads even when it loads only the vocabulary) and a small
SentencePiece vocabulary with all 256 byte-fallback tokens, no tensors.
`copy_vocab_gguf` rewrites an existing GGUF's metadata (a real model's full
vocabulary) without its tensors, optionally with some token texts changed.
Both files open only with Engine.vocab: there are no weights to run.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import gguf

# tokenizer.ggml.token_type values (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

DEFAULT_WORDS = (
    "▁the ▁a ▁of ▁to ▁and ▁in ▁is ▁it ▁def ▁return ▁print ▁for ▁if ▁else "
    "▁The ▁quick ▁brown ▁fox ▁jumps ▁over ▁lazy ▁dog ▁hello ▁world "
    "th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng "
    "▁ ▁▁ ▁▁▁▁ e t a o i n s r h l d c u m f p g w y b v k x j q z "
    "E T A O I N S R H L D C U M F P G W Y B V K X J Q Z "
    "0 1 2 3 4 5 6 7 8 9 . , : ; ( ) [ ] { } = + - * / ' \" ! ? # _ < >"
)


def spm_vocab(words: Iterable[str] | str = DEFAULT_WORDS) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types): <unk> <s> </s>, 256 byte tokens, then `words` (a str: split on spaces)."""
    if isinstance(words, str):
        words = words.split()
    tokens = ["<unk>", "<s>", "</s>"]
    types = [UNKNOWN, CONTROL, CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    seen = set(tokens)
    for word in words:
        # Every prefix too, so SentencePiece's pairwise merges can reach the word.
        for end in range(1, len(word) + 1):
            piece = word[:end]
            if piece not in seen:
                seen.add(piece)
                tokens.append(piece)
                types.append(NORMAL)
    # Longer pieces score higher, so the SPM merge prefers them.
    scores = [0.0] * 259 + [float(len(t)) - i * 1e-4 for i, t in enumerate(tokens[259:])]
    return tokens, scores, types


def write_spm_gguf(
    path: str | Path,
    tokens: list[str] | None = None,
    scores: list[float] | None = None,
    types: list[int] | None = None,
    *,
    pre: str | None = "default",
    bos: int = 1,
    eos: int = 2,
    add_bos: bool = True,
    add_eos: bool = False,
    arch: str = "llama",
    name: str = "specgen tiny vocab",
    tensors: dict | None = None,
) -> Path:
    """A llama GGUF with a SentencePiece ("llama") tokenizer: vocab-only, or with `tensors` (name -> array)."""
    if tokens is None:
        tokens, scores, types = spm_vocab()
    scores = scores if scores is not None else [0.0] * len(tokens)
    types = types if types is not None else [NORMAL] * len(tokens)
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(32)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    for tname, data in (tensors or {}).items():
        w.add_tensor(tname, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_SCALAR_FORMAT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _gguf_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def copy_vocab_gguf(
    src: str | Path,
    dst: str | Path,
    tokens: Mapping[int, str] | None = None,
    values: Mapping[str, str | bool | int] | None = None,
) -> Path:
    """Copy `src`'s metadata without its tensors, with token texts in `tokens` and the `values` of keys changed.

    A raw copy of the key/value section (gguf.GGUFReader takes ~10 s on a
    262k-token vocabulary; this takes a fraction of a second): only the token
    list and the named values are re-encoded, each keeping its GGUF type
    (string, bool or integer keys that exist in `src`).
    """
    tokens = dict(tokens or {})
    values = {k.encode(): v for k, v in (values or {}).items()}
    unseen = set(values)
    data = Path(src).read_bytes() if Path(src).stat().st_size < (1 << 20) else None
    with open(src, "rb") as f:
        mm = data if data is not None else mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if mm[:4] != b"GGUF":
            raise ValueError(f"{src} is not a GGUF file")
        version, _n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
        pos = 24
        out = [b"GGUF", struct.pack("<IQQ", version, 0, n_kv)]

        def read_str(at: int) -> tuple[bytes, int]:
            (n,) = struct.unpack_from("<Q", mm, at)
            return mm[at + 8 : at + 8 + n], at + 8 + n

        for _ in range(n_kv):
            start = pos
            key, pos = read_str(pos)
            (vtype,) = struct.unpack_from("<I", mm, pos)
            pos += 4
            vstart = pos
            if key in values:
                unseen.discard(key)
                if vtype not in _SCALAR_FORMAT and vtype != _STRING:
                    raise ValueError(f"cannot override {key.decode()} (GGUF type {vtype})")
                if vtype == _STRING:
                    _, pos = read_str(pos)
                    body = _gguf_string(str(values[key]).encode())
                else:
                    pos += _SCALAR_SIZE[vtype]
                    body = struct.pack("<" + _SCALAR_FORMAT[vtype], values[key])
                out.append(mm[start:vstart] + body)
                continue
            if vtype == _STRING:
                _, pos = read_str(pos)
            elif vtype == _ARRAY:
                sub, n = struct.unpack_from("<IQ", mm, pos)
                pos += 12
                if sub == _STRING:
                    items_at = pos
                    if key == b"tokenizer.ggml.tokens" and tokens:
                        items = []
                        for _ in range(n):
                            item, pos = read_str(pos)
                            items.append(item)
                        for i, text in tokens.items():
                            items[i] = text.encode()
                        body = b"".join(_gguf_string(t) for t in items)
                        out.append(mm[start:items_at] + body)
                        continue
                    for _ in range(n):
                        (ln,) = struct.unpack_from("<Q", mm, pos)
                        pos += 8 + ln
                elif sub in _SCALAR_SIZE:
                    pos += n * _SCALAR_SIZE[sub]
                else:
                    raise ValueError(f"nested GGUF arrays are not supported ({key!r})")
            else:
                pos += _SCALAR_SIZE[vtype]
            out.append(mm[start:pos])
        if data is None:
            mm.close()
    if unseen:
        raise KeyError(f"{src} has no key {sorted(k.decode() for k in unseen)}")
    blob = b"".join(out)
    blob += b"\0" * (-len(blob) % 32)  # the (empty) tensor data starts aligned
    Path(dst).write_bytes(blob)
    return Path(dst)
