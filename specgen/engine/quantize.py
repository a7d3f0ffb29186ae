"""Copies of a GGUF in another quantization, through llama.cpp's own quantizer.

The test and benchmark pair where drafting pays comes from here: the embedded
Gemma 3 270M written out all-F32 (a costlier target) and requantized to Q4_0
(a genuinely different draft of the same vocabulary).
"""

from __future__ import annotations

import os
from pathlib import Path

from specgen.errors import SpecgenError

KINDS = ("q4_0", "f32", "f16")


def requantize(source: str | Path, out: str | Path, kind: str) -> Path:
    """`source` written out as `kind` at `out`, once (an existing `out` is kept); atomic."""
    import llama_cpp as L

    if kind not in KINDS:
        raise ValueError(f"unknown kind '{kind}' (choose {', '.join(KINDS)})")
    out = Path(out)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.part")
    p = L.llama_model_quantize_default_params()
    p.allow_requantize = True
    p.nthread = 2
    if kind == "q4_0":
        p.ftype = L.LLAMA_FTYPE_MOSTLY_Q4_0
        p.token_embedding_type = L.GGML_TYPE_Q4_0
    elif kind == "f16":  # rows nearly free on a CPU, as on a GPU: the cheap-row regime's target
        p.ftype = L.LLAMA_FTYPE_MOSTLY_F16
    else:
        p.ftype = L.LLAMA_FTYPE_ALL_F32
    try:
        if L.llama_model_quantize(str(source).encode(), str(tmp).encode(), p) != 0:
            raise SpecgenError(f"llama.cpp could not write {source} as {kind}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def paying_pair() -> tuple[Path, Path]:
    """(all-F32 target, Q4_0 draft) of the embedded Gemma 3 270M, made once in the cache."""
    from specgen.models.cache import cache_dir
    from specgen.models.registry import resolve_model

    source, d = resolve_model("gemma3-270m"), cache_dir() / "test-drafts"
    return (requantize(source, d / "gemma-3-270m-f32.gguf", "f32"),
            requantize(source, d / "gemma-3-270m-q4_0.gguf", "q4_0"))
