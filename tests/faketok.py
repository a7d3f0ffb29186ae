"""Hand-made tokenizers (and fake engines that have one) for the translation tests.

`WordTok` behaves like a byte-level BPE: a GPT-2-like pre-tokenizer (a space
joins the word after it), then greedy longest match over its vocabulary, every
single byte as a fallback, so any text round-trips. Options give it a
SentencePiece-like dummy prefix (a space added at the start of the text) and a
BOS. Control tokens render as b"" and are parsed only with parse_special.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np

from fakes import FakeEngine

_PRE = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+", re.S)


class WordTok:
    def __init__(self, words=(), specials=("<bos>", "<eos>", "<eot>"), *, dummy_prefix=False, add_bos=False):
        self.vocab: list[bytes] = [s.encode() for s in specials]
        self.n_special = len(specials)
        self.vocab += [bytes([b]) for b in range(256)]
        for w in words:
            b = w.encode() if isinstance(w, str) else w
            if b not in self.vocab:
                self.vocab.append(b)
        self.ids = {b: i for i, b in enumerate(self.vocab) if i >= self.n_special}
        self.specials = {s: i for i, s in enumerate(specials)}
        self.dummy_prefix = dummy_prefix
        self.add_bos = add_bos
        self.n_vocab = len(self.vocab)
        self.longest = max(len(b) for b in self.vocab)

    def vocab_info(self):
        return SimpleNamespace(add_bos=self.add_bos, bos=0, eos=1, add_eos=False, eot=2, type=2, n_tokens=self.n_vocab)

    def token_attr(self, t: int) -> int:
        return 8 if t < self.n_special else 4

    def token_text(self, t: int) -> bytes:
        return self.vocab[t]

    def is_eog(self, t: int) -> bool:
        return t in (1, 2)

    def piece(self, t: int, special: bool = False) -> bytes:
        if t < self.n_special:
            return self.vocab[t] if special else b""
        return self.vocab[t]

    def detokenize(self, ids) -> str:
        return b"".join(self.piece(t) for t in ids).decode("utf-8", errors="replace")

    def _words(self, data: bytes) -> list[int]:
        out, i = [], 0
        while i < len(data):
            for n in range(min(self.longest, len(data) - i), 0, -1):
                t = self.ids.get(data[i : i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
        return out

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        out = [0] if add_special and self.add_bos else []
        parts = [text]
        if parse_special:
            pat = "(" + "|".join(re.escape(s) for s in self.specials) + ")"
            parts = re.split(pat, text)
        first = True
        for part in parts:
            if part in self.specials and parse_special:
                out.append(self.specials[part])
                continue
            if first and self.dummy_prefix and part:
                part = " " + part
            if part:
                first = False
            for m in _PRE.finditer(part):
                out += self._words(m.group().encode())
        return out


class TokEngine(FakeEngine):
    """A FakeEngine (next token from the previous one) that also has a tokenizer."""

    def __init__(self, tok: WordTok, table: np.ndarray, **kw) -> None:
        super().__init__(table, **kw)
        self.tok = tok

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def piece(self, t, special=False):
        return self.tok.piece(t, special)

    def detokenize(self, ids) -> str:
        return self.tok.detokenize(ids)

    def is_eog(self, t):
        return self.tok.is_eog(t)


def text_table(tok: WordTok, text: str) -> np.ndarray:
    """A next-token table under which greedy decoding from tok's tokens of `text`
    (a cycle) continues that cycle: each token's successor in the tokenized text."""
    ids = tok.tokenize(text + text, add_special=False, parse_special=False)
    table = np.zeros((tok.n_vocab, tok.n_vocab), dtype=np.float32)
    for a, b in zip(ids, ids[1:]):
        if not table[a].any():
            table[a, b] = 5.0
    return table
