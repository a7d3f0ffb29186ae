"""A fake engine for the loop's bookkeeping tests: a tiny deterministic 'model'.

Its next-token distribution depends only on the previous token, so tests can
predict every output. It checks what a real context would enforce: positions
are contiguous, the cache never exceeds n_ctx, and rolled-back positions are
gone.
"""

from __future__ import annotations

import numpy as np

from specgen.errors import SpecgenError


class FakeEngine:
    def __init__(self, table: np.ndarray, n_ctx: int = 256, eog: int | None = None) -> None:
        self.table = table  # table[prev] = logits of the token after prev
        self.n_vocab = table.shape[1]
        self.n_ctx = n_ctx
        self.eog = eog
        self.kv: dict[int, list[int]] = {}
        self.decodes: list[tuple[int, list[int], int]] = []  # (seq, tokens, n_logits)
        self.truncations: list[tuple[int, int]] = []

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

    def decode(self, seq: int, tokens, n_logits: int = 1) -> np.ndarray:
        kv = self.kv.setdefault(seq, [])
        if len(kv) + len(tokens) > self.n_ctx:
            raise SpecgenError("context full")
        self.decodes.append((seq, list(tokens), n_logits))
        kv.extend(tokens)
        return np.stack([self.table[t] for t in tokens[len(tokens) - n_logits :]]) if n_logits else np.empty((0, self.n_vocab))

    def sync(self, seq: int, tokens) -> np.ndarray:
        kv = self.kv.setdefault(seq, [])
        keep = 0
        while keep < min(len(kv), len(tokens) - 1) and kv[keep] == tokens[keep]:
            keep += 1
        self.truncate(seq, keep)
        return self.decode(seq, tokens[keep:], 1)[0]


def chain_table(n_vocab: int, step: int = 1) -> np.ndarray:
    """Greedy next token of t is (t + step) % n_vocab, with a clear margin."""
    table = np.zeros((n_vocab, n_vocab), dtype=np.float32)
    for t in range(n_vocab):
        table[t, (t + step) % n_vocab] = 5.0
    return table
