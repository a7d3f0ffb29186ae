"""Engine(hidden=True): each output row's final hidden state, kept per sequence while its position is cached.

The check that it is the right vector: the GGUF's (tied) output matrix times it gives the logits."""

import numpy as np
import pytest

from specgen.engine.llama import Engine


@pytest.fixture(scope="module")
def hidden_engine(gemma_path):
    with Engine(gemma_path, n_ctx=256, n_threads=2, hidden=True, n_seq_max=2) as e:
        yield e


def _output_rows(path, ids):
    """Rows `ids` of the model's output matrix (Gemma ties it to token_embd), dequantized."""
    from specgen.heads.collect import output_rows

    return output_rows(path, np.asarray(ids))


def test_hidden_rows_times_the_output_matrix_are_the_logits(hidden_engine, gemma_path):
    e = hidden_engine
    toks = e.tokenize("The capital of France is")
    e.truncate(0, 0)
    rows = np.array(e.decode(0, toks, 3))
    n = len(toks)
    assert e.hidden_at(0, n - 4) is None  # no output on that row
    for j, pos in enumerate(range(n - 3, n)):
        h = e.hidden_at(0, pos)
        assert h.shape == (e.n_embd,)
        top = np.argsort(rows[j])[-5:]
        low = np.argsort(rows[j])[:5]
        ids = np.concatenate([top, low])
        got = _output_rows(gemma_path, ids) @ h
        assert np.allclose(got, rows[j][ids], rtol=1e-2, atol=0.05 * np.abs(rows[j][ids]).max())
        assert got[:5].min() > got[5:].max()  # the top tokens stay on top


def test_rollback_and_new_decodes_drop_stale_rows(hidden_engine):
    e = hidden_engine
    toks = e.tokenize("One two three four five")
    e.truncate(0, 0)
    e.decode(0, toks, len(toks))
    n = len(toks)
    before = e.hidden_at(0, n - 2).copy()
    e.truncate(0, n - 2)  # positions n-2 and n-1 leave the cache
    assert e.hidden_at(0, n - 2) is None and e.hidden_at(0, n - 3) is not None
    e.decode(0, toks[n - 2:], 0)  # re-fed without outputs: the old rows must not come back
    assert e.hidden_at(0, n - 2) is None and e.hidden_at(0, n - 3) is not None  # below the re-fed part: kept
    e.truncate(0, n - 2)
    e.decode(0, toks[n - 2:], 2)
    assert np.allclose(e.hidden_at(0, n - 2), before, atol=1e-3)


@pytest.mark.parametrize("history", [0, 3])
def test_earlier_decodes_rows_are_kept_within_the_history(hidden_engine, history):
    """hidden_history rows of earlier decodes stay beside the last one's where the
    decodes run on without a gap (a draft layer reads the rows of steps it sat out);
    a gap (a decode without outputs) and a rollback drop them."""
    e = hidden_engine
    toks = e.tokenize("One two three four five six seven")
    n = len(toks)
    e.hidden_history = history
    try:
        e.truncate(0, 0)
        e.decode(0, toks[:n - 2], n - 2)
        first = [e.hidden_at(0, p).copy() for p in range(n - 2)]
        e.decode(0, toks[n - 2:n - 1], 1)
        e.decode(0, toks[n - 1:], 1)
        kept = [p for p in range(n) if e.hidden_at(0, p) is not None]
        assert kept == list(range(n - 2 - max(history - 1, 0) if history else n - 1, n))
        for p in kept:
            if p < n - 2:
                assert np.array_equal(e.hidden_at(0, p), first[p])
        e.truncate(0, n - 1)  # the last position leaves: its row and none before it
        assert e.hidden_at(0, n - 1) is None and (e.hidden_at(0, n - 2) is not None) == (history > 0)
        e.decode(0, toks[n - 1:], 0)  # a gap: no outputs
        e.decode(0, e.tokenize(" eight", add_special=False), 1)
        assert [p for p in range(n + 1) if e.hidden_at(0, p) is not None] == [n]
    finally:
        e.hidden_history = 0


def test_sequences_keep_their_own_rows(hidden_engine):
    e = hidden_engine
    a, b = e.tokenize("Red green blue"), e.tokenize("Cats and dogs and birds")
    e.truncate(0, 0)
    e.truncate(1, 0)
    e.decode_batch([(0, a, 1), (1, b, 1)])
    ha, hb = e.hidden_at(0, len(a) - 1), e.hidden_at(1, len(b) - 1)
    assert ha is not None and hb is not None and not np.allclose(ha, hb)
    e.decode(1, e.tokenize(" and fish", add_special=False), 1)
    assert np.array_equal(e.hidden_at(0, len(a) - 1), ha)  # seq 0's rows stay


def test_without_hidden_there_are_none(target):
    target.truncate(0, 0)
    target.decode(0, target.tokenize("Hello"), 1)
    assert target.hidden_at(0, 0) is None
