"""A suffix automaton over token ids, extended one token at a time, and a matcher that walks it.

Every state is one class of substrings sharing their end positions, and keeps
how often it occurred (`count`) and where it last ended (`last_end`), so the
continuation of any match can be read from the state it reached.
"""

from __future__ import annotations

from typing import Sequence

from specgen.plan import FREQUENT, LATEST, SUFFIX_CHOICES as CHOICES


class SuffixAutomaton:
    """Suffix automaton of a token stream, extended one token at a time.

    States: 0 is the root (the empty string). For state v: `length[v]` is its
    longest string, `link[v]` its suffix link, `nxt[v]` its transitions,
    `count[v]` the occurrences of its strings, `last_end[v]` the position of
    their latest end. After each `append`, `match` is the state of the
    longest suffix of the stream that also ended earlier (0: none) and
    `match_end` where it did so last.

    Negative ids are separators: give each document a distinct one and no
    match crosses from one document into the next.

    Cost: construction is O(1) amortised per token (at most 2n states and 3n
    transitions). The statistics are added along the suffix-link path of the
    new state, whose lengths fall strictly below the longest repeat: a few
    states on ordinary text, but ~n / period in a long periodic run (a model
    repeating itself). `max_walk` caps that path, so a token costs O(1)
    amortised whatever the text; past the cap, shorter states keep an older
    occurrence (still a true one: every recorded end is a real end of the
    state's strings) and a smaller count. Exact while no path exceeds the cap.
    """

    def __init__(self, max_walk: int = 64) -> None:
        self.max_walk = max_walk
        self.tokens: list[int] = []
        self.length = [0]
        self.link = [-1]
        self.nxt: list[dict[int, int]] = [{}]
        self.count = [0]
        self.last_end = [-1]
        self.last = 0
        self.match = 0
        self.match_end = -1
        self.walked = 0  # states the statistics were added to, for measurements

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_states(self) -> int:
        return len(self.length)

    def _new_state(self, length: int, link: int, nxt: dict, count: int, last_end: int) -> int:
        self.length.append(length)
        self.link.append(link)
        self.nxt.append(nxt)
        self.count.append(count)
        self.last_end.append(last_end)
        return len(self.length) - 1

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(t)

    def append(self, tok: int) -> None:
        pos = len(self.tokens)
        self.tokens.append(tok)
        length, link, nxt = self.length, self.link, self.nxt
        cur = self._new_state(length[self.last] + 1, 0, {}, 0, -1)
        p = self.last
        while p != -1 and tok not in nxt[p]:
            nxt[p][tok] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][tok]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:  # split q: its strings up to length[p] + 1 also end here
                clone = self._new_state(length[p] + 1, link[q], dict(nxt[q]), self.count[q], self.last_end[q])
                while p != -1 and nxt[p].get(tok) == q:
                    nxt[p][tok] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur
        self.match = link[cur]
        self.match_end = self.last_end[self.match] if self.match else -1
        count, last_end = self.count, self.last_end
        v, left = cur, self.max_walk
        while v > 0 and left:  # every suffix of the stream gains an occurrence ending at pos
            count[v] += 1
            last_end[v] = pos
            v = link[v]
            left -= 1
        self.walked += self.max_walk - left

    # -- reading continuations -------------------------------------------------
    def after(self, end: int, k: int) -> list[int]:
        """Up to k tokens following position `end`, stopping at a separator.

        A continuation that reaches the end of the stream goes on with itself
        (an overlapping copy, as LZ77's): the match repeats with its period, so
        a periodic run drafts k tokens, not just one period."""
        toks, n = self.tokens, len(self.tokens)
        out: list[int] = []
        for i in range(end + 1, end + 1 + k):
            t = toks[i] if i < n else out[i - n]
            if t < 0:
                break
            out.append(t)
        return out

    def frequent(self, state: int, k: int) -> list[int]:
        """Up to k tokens from `state`, each the most frequent next one (ties: the latest)."""
        out: list[int] = []
        count, last_end = self.count, self.last_end
        while len(out) < k:
            best, best_score = -1, None
            for tok, w in self.nxt[state].items():
                if tok < 0:
                    continue
                score = (count[w], last_end[w])
                if best_score is None or score > best_score:
                    best, best_score = tok, score
            if best_score is None:
                break
            out.append(best)
            state = self.nxt[state][best]
        return out

    def continuation(self, state: int, end: int, k: int, choice: str = LATEST) -> list[int]:
        """What followed the match in `state` (latest occurrence ending at `end`)."""
        if choice == FREQUENT:
            return self.frequent(state, k)
        return self.after(end, k)


class Matcher:
    """The longest suffix of a growing stream that occurs in an automaton (matching
    statistics): O(1) amortised per fed token while the automaton stays as it is."""

    def __init__(self, sam: SuffixAutomaton) -> None:
        self.sam = sam
        self.state = 0
        self.length = 0

    def feed(self, tok: int) -> None:
        sam = self.sam
        v, n = self.state, self.length
        while v and tok not in sam.nxt[v]:
            v = sam.link[v]
            n = sam.length[v]
        w = sam.nxt[v].get(tok)
        if w is None:
            self.state, self.length = 0, 0
        else:
            self.state, self.length = w, n + 1
