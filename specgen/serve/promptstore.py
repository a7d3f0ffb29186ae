"""Prompt states kept in host memory, beyond the slots (llama-server's --cache-ram).

When a slot's cache is about to be overwritten or evicted, the server saves
its state here (`Engine.save_seq`: keys and values as llama.cpp serialises
them), keyed by the tokens it holds. A later prompt whose prefix one of them
shares more than any slot does gets it loaded into its slot
(`Engine.load_seq`) and prefills only the rest. The oldest states go first
when the byte budget is spent.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from specgen.engine.llama import common_prefix

MIN_SAVE = 32  # a cache shorter than this is cheaper to prefill again than to keep


class PromptStore:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[int, ...], object] = OrderedDict()  # oldest first
        self.saved = self.loaded = 0  # states put in / taken out, for /metrics

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], int]:
        """The stored tokens sharing the longest prefix with `prompt`, and that length."""
        prompt, best, n = tuple(prompt), (), 0
        for tokens in self._entries:
            m = common_prefix(tokens, prompt)
            if m > n:
                best, n = tokens, m
        return best, n

    def take(self, tokens: tuple[int, ...]):
        """The state saved for `tokens`; it stays stored (and counts as just used)."""
        self._entries.move_to_end(tokens)
        self.loaded += 1
        return self._entries[tokens]

    def put(self, tokens: Sequence[int], state) -> None:
        """Keep a state, unless a stored one already holds these tokens and more;
        stored states this one extends are dropped."""
        tokens = tuple(tokens)
        if len(tokens) < MIN_SAVE or state is None or len(state) > self.max_bytes:
            return
        for old in list(self._entries):
            n = common_prefix(old, tokens)
            if n == len(tokens):
                self._entries.move_to_end(old)
                return
            if n == len(old):
                self._drop(old)
        self._entries[tokens] = state
        self.bytes += len(state)
        self.saved += 1
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Forget every stored state."""
        self._entries.clear()
        self.bytes = 0

    def _drop(self, tokens: tuple[int, ...]) -> None:
        self.bytes -= len(self._entries.pop(tokens))
