"""Reading an index's continuations: how a match went on before, and which match drafts.

The suffix drafter (specgen/suffix.py) finds the longest earlier match of the
context in the request itself (local) and in earlier requests (global); this
module holds what it reads from the automaton's statistics there: the key a
draft is learned under (`match_bucket`, `agreement`), where a draft ends
(`split_depth`: before a varying field), the evidence along a draft
(`path_counts`), and which of the two matches drafts (`global_drafts`).
"""

from __future__ import annotations

from typing import Sequence

from specgen.drafters.automaton import SuffixAutomaton

# Draft.key = match_bucket(length) + agreement (KEY_SINGLE, KEY_AGREED, KEY_SPLIT)
# + KEY_GLOBAL for a global match: the policy learns the acceptance of each apart.
KEY_SINGLE = 0  # the match was followed once before: nothing to compare
KEY_AGREED = 8  # followed at least twice, (nearly) always by the drafted token: structure
KEY_SPLIT = 16  # followed by different tokens: a slot whose value varies (a field of a form)
KEY_GLOBAL = 32  # added to the key of a global match
AGREED_SHARE = 0.75
MAX_AGREE_FANOUT = 8  # a state followed by more kinds of token than this is split
# Shorter matches in other requests are chance: few of their drafts are accepted
# (the figures: docs/notes/2026-11-drafting-and-policy.md).
MIN_GLOBAL_MATCH = 5


def agreement(sam: SuffixAutomaton, v: int, tok: int) -> int:
    """KEY_SINGLE, KEY_AGREED or KEY_SPLIT: how the earlier occurrences of state v's
    strings went on, against the drafted first token `tok`."""
    kids = sam.nxt[v]
    if len(kids) > MAX_AGREE_FANOUT:
        return KEY_SPLIT
    count = sam.count
    total = sum(count[w] for t, w in kids.items() if t >= 0)
    if total <= 1:
        return KEY_SINGLE
    w = kids.get(tok)
    return KEY_AGREED if w is not None and count[w] >= AGREED_SHARE * total else KEY_SPLIT


def split_depth(sam: SuffixAutomaton, v: int, tokens: Sequence[int]) -> int:
    """How many of a draft's tokens to keep: up to the first one, past the first,
    where the earlier occurrences of the match so far went on in different ways
    (seen at least twice, the drafted token in fewer than AGREED_SHARE of them): a
    varying field after fixed text. Verifying the fixed text alone lets the target's
    own token fill the field; a guess there would mostly be rejected. Walking
    stops where the index has no evidence (a continuation past its end)."""
    count, nxt = sam.count, sam.nxt
    for d, tok in enumerate(tokens):
        kids = nxt[v]
        w = kids.get(tok)
        if w is None:
            break
        if d and len(kids) > 1:
            if len(kids) > MAX_AGREE_FANOUT:
                return d
            total = sum(count[x] for t, x in kids.items() if t >= 0)
            if total >= 2 and count[w] < AGREED_SHARE * total:
                return d
        v = w
    return len(tokens)


def path_counts(sam: SuffixAutomaton, v: int, tokens: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The index's evidence for each of a draft's tokens walked from state v: (seen,
    total), how many earlier occurrences of the match so far went on with that
    token, of all that went on (a separator ends a document: not counted). Past a
    step the automaton lacks (an overlapping copy beyond the stream's end): (0, 0),
    no evidence. `policy.with_counts` turns them into the draft's acceptance."""
    count, nxt, out = sam.count, sam.nxt, []
    for tok in tokens:
        w = nxt[v].get(tok) if v >= 0 else None
        out.append((count[w], sum(count[x] for t, x in nxt[v].items() if t >= 0)) if w is not None else (0, 0))
        v = -1 if w is None else w
    return tuple(out)


def key_bucket(key: int) -> int:
    """The match-length bucket of a Draft.key."""
    return key % KEY_AGREED


def match_bucket(length: int) -> int:
    """A match length grouped for the policy: 1, 2, 3, then 4-7, 8-15, 16+ (measured:
    acceptance rises steeply to ~8 tokens of match and is flat beyond 16)."""
    if length < 4:
        return length
    if length < 8:
        return 4
    if length < 16:
        return 5
    return 6



def global_drafts(local: int, glob: int, glob_varies: bool, *, min_match: int = 1,
                  min_global_match: int = MIN_GLOBAL_MATCH, local_at_split: bool = True) -> bool:
    """Whether the global match drafts rather than the local one (match lengths
    `local` and `glob`, 0 for none): the longer one, the local one on ties, a
    global one only from min_global_match tokens. With local_at_split, a global
    match whose next token varies among earlier requests (`glob_varies`: a field
    whose value differs from request to request) leaves the draft to the
    request's own match, when there is one: earlier requests know the form,
    this one its content (a summary copying this request's ticket, not the last
    one's). Replayed: docs/notes/2026-11-drafting-and-policy.md."""
    if glob <= local or glob < min_global_match:
        return False
    return not (local_at_split and glob_varies and local >= min_match)
