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

from specgen.drafters.continuations import (
    AGREED_SHARE, KEY_GLOBAL, KEY_SPLIT, MAX_AGREE_FANOUT, MIN_GLOBAL_MATCH, agreement, global_drafts, match_bucket, path_counts, split_depth,
)
from specgen.drafters.automaton import CHOICES, LATEST, Matcher, SuffixAutomaton  # noqa: F401 - CHOICES: this module's API too
from specgen.drafters.base import Draft, PerSequence
from specgen.rules.trees import DraftTree


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
    trees = True
    # The rules its experiments compared (SWITCHES), kept switchable for the benchmarks'
    # variants, which turn them on their own instance (benchmarks/suffixlib/runs.suffix_variant):
    cut_at_split = True  # end a draft before a varying field (`split_depth`)
    local_at_split = True  # a varying field's value from this request (`global_drafts`)
    # give the policy the index's counts along each draft (`path_counts`). Off: replayed,
    # they did not choose better lengths (docs/notes/2026-11-drafting-and-policy.md)
    counts = False

    def __init__(self, *, global_cache: bool = False, choice: str = LATEST, min_match: int = 1,
                 min_global_match: int = MIN_GLOBAL_MATCH, max_global_tokens: int = 1 << 16,
                 max_walk: int = 64) -> None:
        if choice not in CHOICES:
            raise ValueError(f"unknown continuation choice '{choice}' (choose {', '.join(CHOICES)})")
        if min_match < 1:
            raise ValueError("min_match must be >= 1")
        self.choice = choice
        self.min_match = min_match
        self.min_global_match = max(min_global_match, min_match)
        self.max_walk = max_walk
        self.global_index = GlobalIndex(max_global_tokens, max_walk) if global_cache else None
        # With the global index, the process also remembers what its drafts were worth:
        # one cost policy's acceptance statistics by Draft.key, shared by the requests that
        # draft from this index (`make_policy(..., shared=drafter.policy_stats)`), as a
        # server's requests share theirs: fresh statistics per request re-learn each key's
        # acceptance every request (docs/notes/2026-11-drafting-and-policy.md).
        self.policy_stats: dict | None = {} if global_cache else None
        self._seqs: dict[int, _Local] = {}

    SWITCHES = ("cut_at_split", "local_at_split", "counts")

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
