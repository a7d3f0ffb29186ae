"""specgen.engine.quantize: copies made once, atomically; a failure leaves no file behind."""

import pytest

from specgen.engine.quantize import requantize
from specgen.errors import SpecgenError


def test_a_failed_copy_leaves_nothing(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    out = tmp_path / "out" / "copy.gguf"
    with pytest.raises(SpecgenError, match="could not write"):
        requantize(bad, out, "q4_0")
    assert list(out.parent.iterdir()) == []


def test_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown kind"):
        requantize(tmp_path / "a.gguf", tmp_path / "b.gguf", "q9")


def test_the_copies_share_the_vocabulary_and_differ_in_size(draft_path, f32_path, gemma_path):
    from specgen.models.vocab import fingerprint

    assert f32_path.stat().st_size > gemma_path.stat().st_size > draft_path.stat().st_size * 0.5
    assert fingerprint(f32_path) == fingerprint(draft_path) == fingerprint(gemma_path)
    before = draft_path.stat().st_mtime_ns
    assert requantize(gemma_path, draft_path, "q4_0") == draft_path  # made once: kept
    assert draft_path.stat().st_mtime_ns == before
