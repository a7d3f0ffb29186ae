"""A fake engine for the loop's bookkeeping tests: a tiny deterministic 'model'.

Its next-token distribution depends only on the previous token, so tests can
predict every output. It checks what a real context would enforce: positions
are contiguous, the cache never exceeds n_ctx, and rolled-back positions are
gone.
"""

from __future__ import annotations

import numpy as np

from specgen.engine.llama import sync_many
from specgen.errors import SpecgenError


class FakeEngine:
    def __init__(self, table: np.ndarray, n_ctx: int = 256, eog: int | None = None, n_batch: int = 64) -> None:
        self.table = table  # table[prev] = logits of the token after prev
        self.n_vocab = table.shape[1]
        self.n_ctx = n_ctx
        self.eog = eog
        self.kv: dict[int, list[int]] = {}
        self.n_batch = n_batch
        self.decodes: list[tuple[int, list[int], int]] = []  # (seq, tokens, n_logits)
        self.batches: list[list[tuple[int, int, list[int], int]]] = []  # (seq, first position, tokens, n_logits)
        self.truncations: list[tuple[int, int]] = []
        self.copies: list[tuple[int, int, int]] = []  # (from, to, positions) of copy_prefix

    def is_eog(self, tok: int) -> bool:
        return tok == self.eog

    def piece(self, tok: int) -> bytes:
        return f"<{tok}>".encode()

    def detokenize(self, toks) -> str:
        return "".join(f"<{t}>" for t in toks)

    def kv_tokens(self, seq: int = 0) -> list[int]:
        return list(self.kv.get(seq, []))

    def truncate(self, seq: int, n: int) -> None:
        self.truncations.append((seq, n))
        del self.kv.setdefault(seq, [])[n:]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        self.copies.append((src, dst, n))
        self.kv[dst] = list(self.kv.get(src, []))[:n]
        if sum(len(kv) for kv in self.kv.values()) > self.n_ctx:  # counted twice: as a pool would without sharing
            raise SpecgenError("context full")

    def save_seq(self, seq: int):
        kv = self.kv.get(seq)
        return list(kv) if kv else None

    def load_seq(self, seq: int, tokens, state) -> bool:
        assert list(tokens) == state, "a state loaded for other tokens than it was saved with"
        self.kv[seq] = list(state)
        if sum(len(kv) for kv in self.kv.values()) > self.n_ctx:
            raise SpecgenError("context full")
        return True

    def decode(self, seq: int, tokens, n_logits: int = 1) -> np.ndarray:
        return self.decode_batch([(seq, tokens, n_logits)])[0]

    def decode_batch(self, parts):
        """One pass over several sequences; the cache is one pool of n_ctx cells."""
        rows = sum(len(t) for _, t, _ in parts)
        assert rows <= self.n_batch, f"batch of {rows} rows exceeds n_batch"
        assert len({s for s, _, _ in parts}) == len(parts), "a sequence twice in one batch"
        if sum(len(kv) for kv in self.kv.values()) + rows > self.n_ctx:
            raise SpecgenError("context full")
        self.batches.append([(s, len(self.kv.get(s, [])), list(t), n) for s, t, n in parts])
        out = []
        for s, t, n in parts:
            self.decodes.append((s, list(t), n))
            self.kv.setdefault(s, []).extend(t)
            out.append(np.stack([self.table[x] for x in t[len(t) - n :]]) if n else np.empty((0, self.n_vocab)))
        return out

    def sync(self, seq: int, tokens) -> np.ndarray:
        return self.sync_many([(seq, tokens)])[seq]

    def sync_many(self, items):
        return sync_many(self, items)


def chain_table(n_vocab: int, step: int = 1) -> np.ndarray:
    """Greedy next token of t is (t + step) % n_vocab, with a clear margin."""
    table = np.zeros((n_vocab, n_vocab), dtype=np.float32)
    for t in range(n_vocab):
        table[t, (t + step) % n_vocab] = 5.0
    return table


class RowRecorder:
    """Wraps a real engine; `_record(first_pos, rows)` sees every row read, by position
    (subclasses keep what their near-tie rule needs in `self.at`)."""

    def __init__(self, engine):
        self.engine = engine
        self.at: dict = {}

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def _record(self, first_pos, rows):
        raise NotImplementedError

    def decode(self, seq, tokens, n_logits=1):
        first = len(self.engine.kv_tokens(seq)) + len(tokens) - n_logits
        rows = self.engine.decode(seq, tokens, n_logits)
        self._record(first, rows)
        return rows

    def sync(self, seq, tokens):
        row = self.engine.sync(seq, tokens)
        self._record(len(tokens) - 1, [row])
        return row


class HiddenFakeEngine(FakeEngine):
    """A FakeEngine opened as with hidden=True: `hidden_at(seq, pos)` is the one-hot of the
    token at `pos` (n_embd = n_vocab), for the rows of the sequence's last decode with
    outputs (and `hidden_history` rows of the decodes right before it, without a gap)
    while they stay cached, as the real engine keeps them; None otherwise."""

    def __init__(self, table: np.ndarray, **kw) -> None:
        super().__init__(table, **kw)
        self.n_embd = self.n_vocab
        self._hid: dict[int, tuple[int, int]] = {}  # seq -> (first position, rows) of its last decode with outputs
        self.hidden_reads: list[tuple[int, int]] = []  # (seq, pos) asked for
        self.hidden_history = 0

    def decode_batch(self, parts):
        starts = {s: len(self.kv.get(s, [])) for s, _, _ in parts}
        out = super().decode_batch(parts)
        for s, t, n in parts:
            self._trim(s, starts[s])
            if n:
                first, (old_first, old_rows) = starts[s] + len(t) - n, self._hid.get(s, (0, 0))
                keep = min(old_rows, self.hidden_history) if old_rows and old_first + old_rows == first else 0
                self._hid[s] = (first - keep, n + keep)
        return out

    def truncate(self, seq: int, n: int) -> None:
        super().truncate(seq, n)
        self._trim(seq, n)

    def _trim(self, seq: int, n: int) -> None:
        if seq in self._hid:
            first, rows = self._hid[seq]
            if n <= first:
                del self._hid[seq]
            else:
                self._hid[seq] = (first, min(rows, n - first))

    def hidden_at(self, seq: int, pos: int):
        self.hidden_reads.append((seq, pos))
        first, rows = self._hid.get(seq, (0, 0))
        if not first <= pos < first + rows:
            return None
        h = np.zeros(self.n_embd, dtype=np.float32)
        h[self.kv[seq][pos]] = 1.0
        return h


class FakeHeads:
    """Hydra-like heads on the Heads interface: head i's logits over `ids` are
    `tables[i][prev]`, prev = the token drafted at head i-1 (head 0: `last`). It
    records what `begin` was given: the hidden rows' one-hot tokens and `last`."""

    kind = "hydra"

    def __init__(self, tables: np.ndarray, ids, n_vocab: int, target: str = "fake") -> None:
        self.tables = np.asarray(tables, dtype=np.float32)  # (n_heads, n_vocab, len(ids))
        self.ids = np.asarray(ids, dtype=np.int32)
        self.n_vocab = n_vocab
        self.target = target
        self.n_heads = self.tables.shape[0]
        self.begun: list[tuple[list[int], list[int]]] = []  # (argmax of each hidden row, last) per begin

    def begin(self, hidden, last):
        self.begun.append(([int(x) for x in np.argmax(hidden, axis=1)], [int(x) for x in last]))
        return np.asarray(last, dtype=np.int64)

    def step(self, state, i):
        return self.tables[i][state], None

    def advance(self, state, chosen):
        return np.asarray(chosen, dtype=np.int64)


def chain_heads(n_vocab: int, n_heads: int, step: int = 1, ids=None) -> FakeHeads:
    """Heads that predict chain_table's text: each head's argmax is prev + step."""
    ids = np.arange(n_vocab) if ids is None else np.asarray(ids)
    tables = np.zeros((n_heads, n_vocab, len(ids)), dtype=np.float32)
    for t in range(n_vocab):
        hit = np.flatnonzero(ids == (t + step) % n_vocab)
        tables[:, t, hit] = 5.0
    return FakeHeads(tables, ids, n_vocab)


def squared_q(drafter_cls):
    """`drafter_cls`, broken on purpose: it reports q² renormalised instead of the q it sampled
    from (the negative control of a sampled-losslessness test)."""
    from specgen.rules.sampling import Support

    class SquaredQ(drafter_cls):
        def propose(self, wants):
            out = super().propose(wants)
            for d in out:
                if d.q is not None:
                    d.q = [Support(q.ids, q.probs ** 2 / (q.probs ** 2).sum(), q.n_vocab) for q in d.q]
            return out

    return SquaredQ
