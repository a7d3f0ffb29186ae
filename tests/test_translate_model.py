"""The real pair with different vocabularies: Gemma 3 270M target, SmolLM2 135M draft.

Translation round-trips on both real tokenizers, and the loop: greedy output
equals plain greedy output (the near-tie rule of test_model), sampled drafts
reach the target as point masses.
"""

import pytest

from specgen.decode.generation import Generation
from specgen.engine.llama import Engine
from specgen.rules.sampling import SamplingParams
from specgen.drafters.translated import Stream, TranslatedDraftModel, continue_tokens, to_target, valid_utf8_prefix
from test_model import PROMPTS, assert_equal_or_near_tie, plain_run
from dataclasses import replace

pytestmark = pytest.mark.model

TEXTS = [
    "Hello world. The quick brown fox jumps over the lazy dog.\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🙂👍🏽 and   spaces\t\ttabs\n\n",
]


@pytest.fixture(scope="module")
def vocabs(gemma_path, smollm_path):
    with Engine.vocab(gemma_path) as g, Engine.vocab(smollm_path) as s:
        yield g, s


def joined(tok, ids):
    return b"".join(tok.piece(t) for t in ids)


def test_continue_tokens_on_real_tokenizers(vocabs):
    for tok in vocabs:
        for text in TEXTS:
            data = text.encode()
            for cut in range(1, len(data), 3):
                ids = continue_tokens(tok, data[:cut], data[cut:])
                assert ids is not None and joined(tok, ids) == data[cut:], (tok.path.name, text, cut)


def test_stream_of_a_chat_prompt_and_its_growth(vocabs):
    g, s = vocabs
    text = "<start_of_turn>user\nWrite 日本 twice<end_of_turn>\n<start_of_turn>model\n" + TEXTS[2]
    ids = g.tokenize(text)  # with <bos> and the control tokens of the turns
    st = Stream()
    for n in range(1, len(ids) + 1, 2):
        st.update(g, s, ids[:n])
        assert st.text == joined(g, ids[:n])
        assert joined(s, st.draft) == st.text[: st.covered] and st.covered == valid_utf8_prefix(st.text)
    st.update(g, s, ids)
    assert b"<start_of_turn>" not in st.text and st.text.startswith(b"user\nWrite")


def test_proposals_become_gemma_tokens(vocabs):
    g, s = vocabs
    st = Stream()
    st.update(g, s, g.tokenize("The capital of France"))
    draft_ids = s.tokenize(" is Paris, a city of 日本", add_special=False)
    proposed = joined(s, draft_ids)
    ids = to_target(g, st, proposed, 16)
    assert joined(g, ids) == " is Paris, a city of 日本".encode()
    assert ids == g.tokenize(" is Paris, a city of 日本", add_special=False)
    # cut inside 本: the unfinished character is left out
    assert joined(g, to_target(g, st, proposed[:-1], 16)) == " is Paris, a city of 日".encode()


@pytest.fixture(scope="module")
def smol(smollm_path):
    with Engine(smollm_path, n_ctx=1024, n_threads=2) as e:
        yield e


@pytest.mark.parametrize("which", [0, 1])
def test_translated_greedy_equals_plain(target, smol, which):
    prompt = target.tokenize(PROMPTS[which])
    plain, top2 = plain_run(target, prompt, n=32)
    drafter = TranslatedDraftModel(target, smol)
    gen = Generation(target, prompt, drafter, draft_max=4, max_tokens=32, params=SamplingParams(ignore_eos=True))
    for _ in gen:
        pass
    assert_equal_or_near_tie(plain, top2, gen.tokens)
    assert gen.stats.drafted > 0 and gen.stats.accepted > 0
    assert drafter.translate_s > 0


def test_sampled_translated_drafts_are_point_masses(target, smol):
    prompt = target.tokenize(PROMPTS[1])
    drafter = TranslatedDraftModel(target, smol)
    seen = []
    propose = drafter.propose
    drafter.propose = lambda wants: seen.extend(out := propose(wants)) or out
    params = SamplingParams(temperature=0.7, seed=3)
    runs = []
    for _ in range(2):
        gen = Generation(target, prompt, drafter, draft_max=4, max_tokens=24, params=replace(params, ignore_eos=True))
        for _ in gen:
            pass
        runs.append(gen.tokens)
    assert runs[0] == runs[1]  # a seed makes a sampled run reproducible
    assert seen and any(d.tokens for d in seen) and all(d.q is None for d in seen)


def test_a_character_the_target_split_into_byte_tokens(vocabs):
    g, s = vocabs
    lead = next(t for t in range(1000) if g.piece(t) == b"\xc3")  # Gemma's byte tokens sit below id 500
    ctx = g.tokenize("Un caf") + [lead]
    st = Stream()
    st.update(g, s, ctx)
    assert st.text.endswith(b"caf\xc3") and st.covered == len(st.text) - 1
    ids = to_target(g, st, "é noir".encode(), 8)
    assert joined(g, ids) == "é noir".encode()[1:]
