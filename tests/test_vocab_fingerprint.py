"""The tokenizer fingerprint read from the GGUF header, its cache, and open_draft's use of it.

Tiny vocabularies (tests/ggufs.py) differing in one thing each; the real
Gemma 3 270M in three quantizations (one vocabulary) and SmolLM2 (another).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ggufs import CONTROL, NORMAL, copy_vocab_gguf, spm_vocab, write_spm_gguf

import specgen.models.vocab as vocab
from specgen.errors import SpecgenError
from specgen.models.vocab import compute_fingerprint, fingerprint, same_tokenizer


def tiny(path: Path, *, edit=None, **kw) -> Path:
    """The tiny SPM vocabulary, `edit(tokens, scores, types)` applied first."""
    tokens, scores, types = spm_vocab()
    tokens, scores, types = list(tokens), list(scores), list(types)
    if edit:
        edit(tokens, scores, types)
    return write_spm_gguf(path, tokens, scores, types, **kw)


# --------------------------------------------------------------------------- what the fingerprint covers


def test_the_same_vocabulary_written_twice_has_one_fingerprint(tmp_path):
    a, b = tiny(tmp_path / "a.gguf"), tiny(tmp_path / "b.gguf")
    assert compute_fingerprint(a) == compute_fingerprint(b)
    assert len(compute_fingerprint(a)) == 32


def _text(tokens, scores, types):
    tokens[tokens.index("▁fox")] = "▁cat"


def _type(tokens, scores, types):
    assert types[tokens.index("▁fox")] == NORMAL
    types[tokens.index("▁fox")] = CONTROL


def _score(tokens, scores, types):
    scores[tokens.index("▁fox")] += 1.0


@pytest.mark.parametrize(
    ("what", "edit", "kw"),
    [
        ("one token text", _text, {}),
        ("one token type", _type, {}),
        ("one score", _score, {}),
        ("the BOS id", None, {"bos": 2}),
        ("the EOS id", None, {"eos": 1}),
        ("the add-BOS flag", None, {"add_bos": False}),
        ("the add-EOS flag", None, {"add_eos": True}),
        ("the pre-tokenizer", None, {"pre": "llama3"}),
        ("no pre-tokenizer", None, {"pre": None}),
    ],
)
def test_one_difference_changes_the_fingerprint(tmp_path, what, edit, kw):
    base = compute_fingerprint(tiny(tmp_path / "base.gguf"))
    other = compute_fingerprint(tiny(tmp_path / "other.gguf", edit=edit, **kw))
    assert other != base, what


def test_the_model_name_counts_only_where_llama_cpp_reads_it(tmp_path):
    base = tiny(tmp_path / "base.gguf")
    renamed = copy_vocab_gguf(base, tmp_path / "renamed.gguf", values={"general.name": "another name"})
    phi = copy_vocab_gguf(base, tmp_path / "phi.gguf", values={"general.name": "Phi-3 mini"})
    assert compute_fingerprint(renamed) == compute_fingerprint(base)
    # llama.cpp gives a "phi-3"-named model's special tokens an rstrip attribute
    assert compute_fingerprint(phi) != compute_fingerprint(base)


def test_a_file_without_a_vocabulary_has_no_fingerprint(tmp_path):
    none = copy_vocab_gguf(tiny(tmp_path / "base.gguf"), tmp_path / "none.gguf",
                           values={"tokenizer.ggml.model": "none"})
    assert compute_fingerprint(none) is None
    assert not same_tokenizer(none, none, cache=tmp_path / "cache")
    assert not same_tokenizer(None, none, cache=tmp_path / "cache")


def test_a_corrupt_header_is_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny(tmp_path / "base.gguf").read_bytes()[:5000])
    with pytest.raises(SpecgenError, match="truncated or corrupt"):
        fingerprint(bad, cache=tmp_path / "cache")
    with pytest.raises(SpecgenError, match="not found"):
        fingerprint(tmp_path / "missing.gguf", cache=tmp_path / "cache")
    assert not same_tokenizer(bad, bad, cache=tmp_path / "cache")  # no shortcut; no error either


@pytest.mark.model
def test_requantized_copies_share_the_fingerprint_and_smollm_differs(gemma_path, draft_path, f32_path, smollm_path):
    fps = {p.name: compute_fingerprint(p) for p in (gemma_path, draft_path, f32_path)}
    assert len(set(fps.values())) == 1, fps
    assert compute_fingerprint(smollm_path) not in fps.values()


@pytest.mark.model
def test_one_changed_token_of_gemma_changes_it(gemma_path, tmp_path):
    copy = copy_vocab_gguf(gemma_path, tmp_path / "same.gguf")
    changed = copy_vocab_gguf(gemma_path, tmp_path / "changed.gguf", tokens={123456: "specgen-changed"})
    assert compute_fingerprint(copy) == compute_fingerprint(gemma_path)  # tensors do not count
    assert compute_fingerprint(changed) != compute_fingerprint(gemma_path)


# --------------------------------------------------------------------------- the cache


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = vocab.compute_fingerprint

    def counting(path):
        calls.append(Path(path))
        return real(path)

    monkeypatch.setattr(vocab, "compute_fingerprint", counting)
    return calls


def test_the_cache_is_keyed_by_file_identity(tmp_path, counted):
    cache = tmp_path / "cache"
    f = tiny(tmp_path / "a.gguf")
    first = fingerprint(f, cache=cache)
    assert fingerprint(f, cache=cache) == first and len(counted) == 1
    entries = list(cache.glob("*.json"))
    assert len(entries) == 1
    assert json.loads(entries[0].read_text())["fingerprint"] == first

    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: recomputed
    assert fingerprint(f, cache=cache) == first and len(counted) == 2
    assert fingerprint(f, cache=cache) == first and len(counted) == 2

    tiny(f, edit=_text)  # rewritten: the new vocabulary's fingerprint, not the cached one
    assert fingerprint(f, cache=cache) == compute_fingerprint(f) != first
    assert len(list(cache.glob("*.json"))) == 1  # one entry per path, replaced

    # the same file by another name resolves to the same entry
    os.symlink(f, tmp_path / "link.gguf")
    n = len(counted)
    fingerprint(tmp_path / "link.gguf", cache=cache)
    assert len(counted) == n


@pytest.mark.parametrize("damage", ["", "{not json", "[1, 2]", '{"fingerprint": 7}', "null"])
def test_a_damaged_cache_entry_is_recomputed(tmp_path, counted, damage):
    cache = tmp_path / "cache"
    f = tiny(tmp_path / "a.gguf")
    good = fingerprint(f, cache=cache)
    (entry,) = cache.glob("*.json")
    entry.write_text(damage)
    assert fingerprint(f, cache=cache) == good and len(counted) == 2
    assert json.loads(entry.read_text())["fingerprint"] == good  # rewritten whole
    assert fingerprint(f, cache=cache) == good and len(counted) == 2
    assert not list(cache.glob("*.tmp"))


def test_an_entry_of_another_version_is_recomputed(tmp_path, counted, monkeypatch):
    cache = tmp_path / "cache"
    f = tiny(tmp_path / "a.gguf")
    fingerprint(f, cache=cache)
    monkeypatch.setattr(vocab, "FINGERPRINT_VERSION", vocab.FINGERPRINT_VERSION + 1)
    fingerprint(f, cache=cache)
    assert len(counted) == 2


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    f = tiny(tmp_path / "a.gguf")
    assert fingerprint(f, cache=blocker) == compute_fingerprint(f)


def test_the_default_cache_is_under_specgen_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "sc"))
    f = tiny(tmp_path / "a.gguf")
    fingerprint(f)
    assert len(list((tmp_path / "sc" / "vocab").glob("*.json"))) == 1


# --------------------------------------------------------------------------- open_draft


@pytest.fixture
def engines_built(monkeypatch, tmp_path):
    """Every Engine that open_draft constructs, with its arguments; a fresh fingerprint cache."""
    import specgen.session
    from specgen.engine.llama import Engine

    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "sc"))
    built = []

    class Counting(Engine):
        def __init__(self, path, **kw):
            built.append((Path(path), kw))
            super().__init__(path, **kw)

    monkeypatch.setattr(specgen.session, "Engine", Counting)
    return built


@pytest.fixture
def compare_calls(monkeypatch):
    calls = []
    real = vocab.compare

    def counting(target, draft, *a, **kw):
        calls.append(draft)
        return real(target, draft, *a, **kw)

    monkeypatch.setattr(vocab, "compare", counting)
    return calls


@pytest.mark.model
def test_open_draft_with_equal_fingerprints_opens_one_engine_and_compares_nothing(
    gemma_path, draft_path, engines_built, compare_calls, monkeypatch
):
    from specgen.engine.llama import Engine
    from specgen.session import open_draft

    def no_token_by_token(*a, **kw):
        raise AssertionError("token-by-token comparison with equal fingerprints")

    monkeypatch.setattr(vocab, "_texts", no_token_by_token)
    monkeypatch.setattr(vocab, "_attrs", no_token_by_token)
    with Engine.vocab(gemma_path) as target:
        opened = open_draft(target, draft_path, n_ctx=256, n_threads=2)
        try:
            assert engines_built == [(draft_path, {"n_ctx": 256, "n_threads": 2})]  # once, with its weights
            assert compare_calls == []
            assert opened.same_vocab and opened.n_shared == target.n_vocab == 262144
            assert opened.engine.n_ctx == 256
        finally:
            opened.engine.close()


@pytest.mark.model
def test_open_draft_with_another_vocabulary_compares_on_the_drafting_engine(
    gemma_path, smollm_path, engines_built, compare_calls
):
    from specgen.engine.llama import Engine
    from specgen.session import open_draft

    with Engine.vocab(gemma_path) as target:
        opened = open_draft(target, smollm_path, n_ctx=256, n_threads=2)
        try:
            assert engines_built == [(smollm_path, {"n_ctx": 256, "n_threads": 2})]
            assert compare_calls == [opened.engine]  # the detailed comparison ran, on that engine
            assert not opened.same_vocab and opened.n_shared == 49152  # drafts through text
        finally:
            opened.engine.close()


@pytest.mark.model
def test_a_refused_draft_closes_its_engine(gemma_path, smollm_path, engines_built, monkeypatch):
    import specgen.drafters.translated
    from specgen.engine.llama import Engine
    from specgen.session import open_draft

    monkeypatch.setattr(specgen.drafters.translated, "translation_problem", lambda t, d: "it cannot")
    closed = []
    monkeypatch.setattr(Engine, "close", lambda self, real=Engine.close: (closed.append(self.path), real(self)))
    with Engine.vocab(gemma_path) as target:
        with pytest.raises(SpecgenError, match=r"does not match the target's \(.+\) and it cannot draft by translation: it cannot$") as err:
            open_draft(target, smollm_path, n_ctx=256, n_threads=2)
        # closed by open_draft itself: the traceback `err` holds keeps the engine alive
        assert closed == [smollm_path] and err.traceback
