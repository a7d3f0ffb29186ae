"""Suffix-index drafting: the longest earlier match of the context, of any length.

`SuffixAutomaton` is an incremental suffix automaton over token ids (Blumer et
al.; each appended token costs O(1) amortised states and transitions). Every
state is one class of substrings sharing their end positions, and keeps two
statistics of that class: how often it occurred (`count`) and where it last
ended (`last_end`). Both hold for every state at all times, so the
continuation of any match can be read from the state it reached: the tokens
after its latest occurrence, or the most frequent next token, step by step.

`SuffixDrafter` keeps one automaton per sequence over its context (prompt and
output, the request's own history) and, optionally, a global one over earlier
requests of the process: each finished generation is remembered when the next
one begins on its sequence, or through `remember(tokens)`. The global index is
bounded: past `max_global_tokens` it is rebuilt from the most recent documents
(half the cap), so rebuilding costs O(1) amortised per remembered token.
The longer of the local and the global match drafts; the local one on ties,
a global one only from MIN_GLOBAL_MATCH tokens, and not at a varying field when
the request has a match of its own (`continuations.global_drafts`).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from specgen.continuations import (  # noqa: F401 - KEY_*, key_bucket, MIN_GLOBAL_MATCH: this module's API too
    AGREED_SHARE, KEY_AGREED, KEY_GLOBAL, KEY_SINGLE, KEY_SPLIT, MAX_AGREE_FANOUT, MIN_GLOBAL_MATCH, agreement,
    global_drafts, key_bucket, match_bucket, path_counts, split_depth,
)
from specgen.drafters import Draft, PerSequence
from specgen.trees import DraftTree

LATEST = "latest"  # copy what followed the latest earlier occurrence (as prompt lookup does)
FREQUENT = "frequent"  # step by step, the next token seen most often after the match so far
CHOICES = (LATEST, FREQUENT)


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


# -- the drafter -------------------------------------------------------------


class _Local:
    def __init__(self, sam: SuffixAutomaton, matcher: Matcher | None, version: int) -> None:
        self.sam = sam
        self.matcher = matcher  # this context against the global index
        self.version = version  # the global index the matcher was fed against


class GlobalIndex:
    """An automaton over earlier requests' documents (prompt + output), bounded by
    `max_tokens`: when a document would pass the cap, the automaton is rebuilt
    from the most recent documents that fit in half of it."""

    def __init__(self, max_tokens: int = 1 << 16, max_walk: int = 64) -> None:
        if max_tokens < 2:
            raise ValueError("the global index needs max_tokens >= 2")
        self.max_tokens = max_tokens
        self.max_walk = max_walk
        self.docs: deque[list[int]] = deque()
        self.sam = SuffixAutomaton(max_walk)
        self.version = 0  # bumped on every change: matchers fed before it restart
        self._seps = 0

    @property
    def n_tokens(self) -> int:
        return sum(len(d) for d in self.docs)

    def add(self, tokens: Sequence[int]) -> None:
        half = self.max_tokens // 2
        doc = list(tokens)[-(half - 1):]  # with its separator, at most half the cap
        if not doc:
            return
        if len(self.sam) + len(doc) + 1 > self.max_tokens:
            # keep at most half: the next rebuild is >= max_tokens / 2 tokens away (O(1) amortised)
            self._rebuild(half - len(doc) - 1)
        self._append(doc)
        self.docs.append(doc)
        self.version += 1

    def _append(self, doc: list[int]) -> None:
        self._seps += 1
        self.sam.extend(doc)
        self.sam.append(-self._seps)  # a separator no other document shares

    def _rebuild(self, budget: int) -> None:
        kept: list[list[int]] = []
        while self.docs and len(self.docs[-1]) + 1 <= budget:  # each with its separator
            doc = self.docs.pop()
            budget -= len(doc) + 1
            kept.append(doc)
        self.docs = deque(reversed(kept))
        self.sam = SuffixAutomaton(self.max_walk)
        self._seps = 0
        for doc in self.docs:
            self._append(doc)


class SuffixDrafter(PerSequence):
    """Drafts the continuation of the context's longest earlier match, in the
    request's own history or (global_cache) in earlier requests.

    Draft.key: the match length in buckets (`match_bucket`), plus how the match
    went on before (`agreement`: once, always alike, or in different ways),
    plus KEY_GLOBAL when the global index matched, so the policy learns the
    acceptance of each apart (a form's fixed text against its varying fields).
    """

    name = "suffix"
    free = True

    def __init__(self, *, global_cache: bool = False, choice: str = LATEST, min_match: int = 1,
                 min_global_match: int = MIN_GLOBAL_MATCH, max_global_tokens: int = 1 << 16,
                 max_walk: int = 64, cut_at_split: bool = True, counts: bool = False,
                 local_at_split: bool = True) -> None:
        if choice not in CHOICES:
            raise ValueError(f"unknown continuation choice '{choice}' (choose {', '.join(CHOICES)})")
        if min_match < 1:
            raise ValueError("min_match must be >= 1")
        self.choice = choice
        self.min_match = min_match
        self.min_global_match = max(min_global_match, min_match)
        self.max_walk = max_walk
        self.cut_at_split = cut_at_split  # end a draft before a varying field (`split_depth`)
        self.local_at_split = local_at_split  # a varying field's value from this request (`global_drafts`)
        # give the policy the index's counts along each draft (`path_counts`). Off: replayed on
        # the agent and bundled workloads they did not choose better lengths (README)
        self.counts = counts
        self.global_index = GlobalIndex(max_global_tokens, max_walk) if global_cache else None
        # With the global index, the process also remembers what its drafts were worth:
        # one cost policy's acceptance statistics by Draft.key, shared by the requests that
        # draft from this index (`make_policy(..., shared=drafter.policy_stats)`), as a
        # server's requests share theirs. Replayed on the agent workload, fresh statistics
        # per request re-learned each key's acceptance every request (1.38x against 1.45x
        # llama.cpp's best type, first 6 requests; benchmarks/suffix_replay.py).
        self.policy_stats: dict | None = {} if global_cache else None
        self._seqs: dict[int, _Local] = {}

    def _fresh(self) -> _Local:
        g = self.global_index
        return _Local(SuffixAutomaton(self.max_walk), Matcher(g.sam) if g else None, g.version if g else 0)

    def remember(self, tokens: Sequence[int]) -> None:
        """Add a document (a finished request's prompt + output) to the global index."""
        if self.global_index is not None:
            self.global_index.add(tokens)

    def begin(self, seq: int = 0) -> None:
        """A new generation on `seq`: the one it replaces, if not finished, is remembered first."""
        old = self._seqs.get(seq)
        if old is not None and len(old.sam):
            self.remember(old.sam.tokens)
        self._seqs[seq] = self._fresh()

    def finish(self, seq: int, context: Sequence[int]) -> None:
        """The generation on `seq` is over: remember its whole context (the final
        round's tokens, which no proposal saw, included) and drop its state."""
        self._seqs.pop(seq, None)
        if len(context):
            self.remember(context)

    def forget(self, seq: int = 0) -> None:
        """Drop a sequence's state without remembering it (an aborted request)."""
        self._seqs.pop(seq, None)

    def _extend(self, seq: int, context: Sequence[int]) -> _Local:
        state = self._seqs.get(seq)
        if state is None:
            state = self._seqs[seq] = self._fresh()
        sam = state.sam
        seen = len(sam)
        if len(context) < seen or (seen and context[seen - 1] != sam.tokens[seen - 1]):
            state = self._seqs[seq] = self._fresh()  # not an extension: index afresh
            sam, seen = state.sam, 0
        g = self.global_index
        if g is not None and state.version != g.version:  # the global index changed: match again
            state.matcher, state.version = Matcher(g.sam), g.version
            for t in context[:seen]:
                state.matcher.feed(t)
        for t in context[seen:]:
            sam.append(t)
            if state.matcher is not None:
                state.matcher.feed(t)
        return state

    def _source(self, state: _Local):
        """(automaton, match state, latest end, key) of the match that drafts, or None."""
        sam = state.sam
        local = sam.length[sam.match] if sam.match else 0
        m = state.matcher
        if m is not None and m.length > local and m.length >= self.min_global_match:
            g = self.global_index.sam
            first = g.continuation(m.state, g.last_end[m.state], 1, self.choice)
            varies = (bool(first) and self.local_at_split and local >= self.min_match
                      and agreement(g, m.state, first[0]) == KEY_SPLIT)
            if first and global_drafts(local, m.length, varies, min_match=self.min_match,
                                       min_global_match=self.min_global_match, local_at_split=self.local_at_split):
                return g, m.state, g.last_end[m.state], KEY_GLOBAL + match_bucket(m.length)
        if local >= self.min_match:
            return sam, sam.match, sam.match_end, match_bucket(local)
        return None

    def propose_one(self, context, k, params=None, rng=None, seq=0) -> Draft:  # noqa: ARG002
        state = self._extend(seq, context)
        if k <= 0:
            return Draft()
        src = self._source(state)
        if src is None:
            return Draft()
        sam, v, end, key = src
        tokens = sam.continuation(v, end, k, self.choice)
        if not tokens:
            return Draft()
        if self.cut_at_split:
            tokens = tokens[: split_depth(sam, v, tokens)]
        draft = Draft(tokens, key=key + agreement(sam, v, tokens[0]))
        if self.counts:
            draft.counts = path_counts(sam, v, tokens)
        return draft

    def propose_tree(self, context, k: int, width: int, seq: int = 0) -> DraftTree:
        """Branch 0: `propose_one`'s draft; up to width - 1 more branches that leave it
        where the index saw other continuations, the most frequent first (see
        `branch_tree`). probs: each node's share of the index's continuations."""
        state = self._extend(seq, context)
        src = self._source(state) if k > 0 else None
        if src is None:
            return DraftTree()
        sam, v, end, key = src
        main = sam.continuation(v, end, k, self.choice)
        if main and self.cut_at_split:
            main = main[: split_depth(sam, v, main)]
        return branch_tree(sam, v, main, k, width, key + agreement(sam, v, main[0])) if main else DraftTree()


MAX_BRANCH_FANOUT = 256  # a state with more continuations than this (a 1-token match) is not branched


def _reach(sam: SuffixAutomaton, v: int, tokens: Sequence[int], reach: float) -> list[float]:
    """Reach of each of `tokens` walked from state v: the product of each step's share
    of its state's continuation counts (a step the automaton lacks keeps the reach)."""
    out = []
    for t in tokens:
        kids = sam.nxt[v] if v >= 0 else {}
        w = kids.get(t)
        if w is not None and len(kids) <= MAX_BRANCH_FANOUT:
            total = sum(sam.count[x] for tok, x in kids.items() if tok >= 0)
            reach *= sam.count[w] / total if total else 1.0
        v = -1 if w is None else w
        out.append(reach)
    return out


def branch_tree(sam: SuffixAutomaton, v: int, main: Sequence[int], k: int, width: int, key: int = 0) -> DraftTree:
    """A draft tree: `main` as branch 0, and the width - 1 likeliest alternatives met
    walking it from state v (a continuation token at depth d other than main[d],
    scored by its reach), each continued by what followed its latest occurrence
    up to depth k."""
    tokens, parents = list(main), list(range(-1, len(main) - 1))
    probs = _reach(sam, v, main, 1.0)
    cands = []
    reach, s = 1.0, v
    for d in range(len(main)):
        kids = sam.nxt[s]
        if len(kids) > MAX_BRANCH_FANOUT:
            break
        total = sum(sam.count[x] for tok, x in kids.items() if tok >= 0)
        if not total:
            break
        for tok, w in kids.items():
            if tok >= 0 and tok != main[d]:
                cands.append((reach * sam.count[w] / total, -d, tok, w))
        w = kids.get(main[d])
        if w is None:
            break
        reach *= sam.count[w] / total
        s = w
    cands.sort(reverse=True)
    for score, neg_d, tok, w in cands[: max(width - 1, 0)]:
        d = -neg_d
        tokens.append(tok)
        parents.append(d - 1)  # main's node d - 1 (-1: the root)
        probs.append(score)
        cont = sam.after(sam.last_end[w], k - d - 1)
        for t, r in zip(cont, _reach(sam, w, cont, score)):
            parents.append(len(tokens) - 1)
            tokens.append(t)
            probs.append(r)
    return DraftTree(tokens, parents, probs, key)


def suffix_draft(tokens: Sequence[int], k: int, choice: str = LATEST, docs: Sequence[Sequence[int]] = (),
                 min_match: int = 1, min_global_match: int = MIN_GLOBAL_MATCH,
                 cut_at_split: bool = True, local_at_split: bool = True) -> tuple[list[int], int, bool]:
    """Reference (brute-force scan), the specification of SuffixDrafter.

    The longest suffix of `tokens` that ended earlier in `tokens`, and the
    longest that occurs in one of `docs` (if at least min_global_match long);
    the longer drafts (tokens on a tie; with local_at_split, tokens too when the
    docs' match went on in different ways and tokens has a match), cut before a
    varying field (`split_depth`). Returns (draft, match length, from docs).
    """
    local = _longest_earlier(tokens)
    glob = max((_longest_in(tokens, d) for d in docs), default=0)
    if glob > local and glob >= max(min_global_match, min_match):
        pattern, sources = tokens[len(tokens) - glob:], [list(d) for d in docs]
        draft = _continue(pattern, sources, k, choice)
        if draft and not (local_at_split and local >= min_match and _varies(pattern, draft[0], sources)):
            return (_cut(pattern, draft, sources) if cut_at_split else draft), glob, True
    if local >= min_match:
        n = len(tokens)  # earlier occurrences end before the last token
        pattern = tokens[n - local:]
        draft = _continue(pattern, [list(tokens)], k, choice, ends_before=n - 1)
        if draft:
            return (_cut(pattern, draft, [list(tokens)]) if cut_at_split else draft), local, False
    return [], 0, False


def _cut(pattern, draft: list[int], docs: list[list[int]]) -> list[int]:
    """`split_depth` by counting: the draft up to its first token (past the first)
    where the earlier occurrences of pattern + the draft so far went on in different
    ways (at least two, the drafted token in fewer than AGREED_SHARE of them)."""
    for d in range(1, len(draft)):
        if _varies(list(pattern) + draft[:d], draft[d], docs):
            return draft[:d]
    return draft


def _varies(s, tok: int, docs: list[list[int]]) -> bool:
    """KEY_SPLIT by counting: s went on in more than MAX_AGREE_FANOUT ways, or at least
    twice with tok in fewer than AGREED_SHARE of them."""
    nxt = [doc[e + 1] for doc in docs for e in _ends(s, doc) if e + 1 < len(doc)]
    return len(set(nxt)) > MAX_AGREE_FANOUT or (len(nxt) >= 2 and nxt.count(tok) < AGREED_SHARE * len(nxt))


def _ends(pattern: Sequence[int], doc: Sequence[int]) -> list[int]:
    n = len(pattern)
    pattern = list(pattern)
    return [e for e in range(n - 1, len(doc)) if list(doc[e - n + 1 : e + 1]) == pattern]


def _longest_earlier(tokens: Sequence[int]) -> int:
    n = len(tokens)
    for length in range(n - 1, 0, -1):
        if any(e < n - 1 for e in _ends(tokens[n - length:], tokens)):
            return length
    return 0


def _longest_in(tokens: Sequence[int], doc: Sequence[int]) -> int:
    n = len(tokens)
    for length in range(min(n, len(doc)), 0, -1):
        if _ends(tokens[n - length:], doc):
            return length
    return 0


def _continue(pattern, docs: list[list[int]], k: int, choice: str, ends_before: int | None = None) -> list[int]:
    """What followed `pattern` in docs (in order; later is more recent)."""
    pattern = list(pattern)
    if choice == LATEST:
        occ = [(i, e) for i, d in enumerate(docs) for e in _ends(pattern, d)
               if ends_before is None or e < ends_before]
        i, e = max(occ)
        out = []
        doc = docs[i]
        for j in range(e + 1, e + 1 + k):  # past the context's end the copy goes on with itself
            if j >= len(doc) and ends_before is None:
                break  # an earlier document ends
            t = doc[j] if j < len(doc) else out[j - len(doc)]
            if t < 0:
                break
            out.append(t)
        return out
    out: list[int] = []
    s = pattern
    while len(out) < k:
        best, best_score = None, None
        nexts = {d[e + 1] for d in docs for e in _ends(s, d) if e + 1 < len(d)}
        for tok in nexts:
            occ = [(i, e) for i, d in enumerate(docs) for e in _ends(s + [tok], d)]
            score = (len(occ), max(occ))
            if best_score is None or score > best_score:
                best, best_score = tok, score
        if best is None:
            break
        out.append(best)
        s = s + [best]
    return out
