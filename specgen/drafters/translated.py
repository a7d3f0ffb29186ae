"""Draft models with another tokenizer: speculation translated through text.

The draft keeps its own token stream of the accepted text, per sequence: when
the accepted target tokens change, only the changed tail of the text is
re-tokenized with the draft's tokenizer, and the draft's cache keeps the
prefix that still agrees (`engine.sync_many` rolls back the rest). Its
proposal (k draft tokens, greedy) is turned back into bytes and re-encoded
with the target's tokenizer after the accepted text.

Proposals reach the target as point-mass drafts (`Draft.q` None): greedy
acceptance keeps exactly the target's argmax, sampled acceptance accepts a
token with the target's own probability and resamples from the target
without it, so the output is distributed exactly as plain decoding's.
Translation can only lower acceptance, never change the output.

The boundary, in bytes (both tokenizers see the same byte stream; control
tokens render as nothing):
- `continue_tokens(tok, left, right)`: the tokens of `right` as the tokenizer
  splits `left + right`, cut at the end of `left`. The left context gives the
  tokenizer its word/space context (a leading space joins the word after it),
  a dummy prefix the tokenizer adds is measured and skipped, and a token that
  would straddle the cut is split: its part in `right` is tokenized alone.
- A multi-byte UTF-8 character may be split across tokens on either side:
  the draft's stream covers the longest valid UTF-8 prefix of the accepted
  text, its proposal must start with the pending bytes, and a proposal that
  ends inside a character is cut before it.
- A draft's control or end-of-generation token ends its proposal.

The tokenizers are duck typed (specgen.engine.llama.Engine or a test fake):
`tokenize(text, add_special=, parse_special=)`, `piece(token) -> bytes`
(control tokens as b""), `vocab_info()` (add_bos, bos), `token_attr(token)`.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Sequence

from specgen.drafters.base import Draft, Drafter, Want
from specgen.drafters.model import DraftModel
from specgen.engine.llama import common_prefix
from specgen.rules.sampling import SamplingParams
from specgen.models.vocab import VocabSource

CONTEXT_TOKENS = 4  # tokens of left context re-tokenized with a changed tail
NOT_TEXT = 1 | 2 | 8  # llama_token_attr unknown | unused | control: ends a proposal

_GREEDY = SamplingParams()


# -- text and tokens, pure -----------------------------------------------------


def valid_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that ends on a whole UTF-8 character
    (`data` is valid UTF-8 but for a character cut at its end)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII): does its character fit?
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4
            return n if need <= back else n - back
    return n


def skip_continuation(data: bytes) -> bytes:
    """`data` without the continuation bytes of a character begun before it."""
    i = 0
    while i < len(data) and i < 3 and data[i] & 0xC0 == 0x80:
        i += 1
    return data[i:]


def pieces_of(tok, ids: Sequence[int]) -> list[bytes]:
    return [tok.piece(t) for t in ids]


def _split_at(pieces: Sequence[bytes], cut: int) -> tuple[int, int]:
    """(index of the first piece at or after byte `cut`, bytes of the piece straddling it
    that lie before the cut; 0 when a piece ends exactly there)."""
    pos = 0
    for i, p in enumerate(pieces):
        if pos >= cut:
            return i, 0
        if pos + len(p) > cut:
            return i, cut - pos
        pos += len(p)
    return len(pieces), 0


_BYTE_TOKENS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer → its byte tokens


def byte_tokens(tok) -> dict[int, int]:
    """byte → a token whose piece is that single byte, for the UTF-8 continuation
    bytes at least (scanned once per tokenizer, on first need, until those are
    found: byte tokens come first in the usual vocabularies, ids < 500 in Gemma's)."""
    table = _BYTE_TOKENS.get(tok)
    if table is None:
        table = {}
        for t in range(int(tok.n_vocab)):
            p = tok.piece(t)
            if len(p) == 1 and p[0] not in table:
                table[p[0]] = t
                if all(b in table for b in range(0x80, 0xC0)):
                    break
        _BYTE_TOKENS[tok] = table
    return table


def encode_exact(tok, text: bytes) -> list[int] | None:
    """Tokens of `text` on its own whose pieces are exactly its bytes, or None.
    A tokenizer that adds a dummy prefix is given a newline before the text
    (a boundary nearly every tokenizer keeps) and the tokens after it."""
    rest = skip_continuation(text)
    if len(rest) < len(text):  # the end of a character begun before: byte tokens
        table = byte_tokens(tok)
        head = [table.get(b) for b in text[: len(text) - len(rest)]]
        tail = encode_exact(tok, rest) if rest else []
        return None if None in head or tail is None else head + tail
    for sep in (b"", b"\n"):
        try:
            s = (sep + text).decode("utf-8")
        except UnicodeDecodeError:
            return None
        ids = list(tok.tokenize(s, add_special=False, parse_special=False))
        pcs = pieces_of(tok, ids)
        got = b"".join(pcs)
        lead = len(got) - len(sep) - len(text)
        if lead < 0 or got[lead:] != sep + text:
            return None
        i, inside = _split_at(pcs, lead + len(sep))
        if not inside and (sep or not lead):
            return ids[i:]
    return None


def continue_tokens(tok, left: bytes, right: bytes) -> list[int] | None:
    """Tokens whose pieces are exactly `right`, split as the tokenizer splits
    `left + right` after `left`; None where no such split exists. With no left
    context the pieces may begin with the tokenizer's dummy prefix."""
    if not right:
        return []
    left = skip_continuation(left)
    joined = left + right
    try:
        s = joined.decode("utf-8")
    except UnicodeDecodeError:
        return None
    ids = list(tok.tokenize(s, add_special=False, parse_special=False))
    pcs = pieces_of(tok, ids)
    got = b"".join(pcs)
    lead = len(got) - len(joined)  # a dummy prefix (SentencePiece's leading space)
    if lead < 0 or got[lead:] != joined:
        return None  # the tokenizer normalised the text: no byte-exact split
    if not left:
        return ids  # a dummy prefix at the start of the text is the tokenizer's own convention
    i, inside = _split_at(pcs, lead + len(left))
    if not inside:
        return ids[i:]
    # A token straddles the end of `left`: its part in `right` on its own.
    head = encode_exact(tok, pcs[i][inside:])
    return None if head is None else head + ids[i + 1 :]


@dataclass
class Stream:
    """One sequence's accepted text, as target tokens and as the draft's tokens.

    `text` is the bytes of `target` (pieces joined); `draft` tokenizes
    `text[:covered]` (the longest whole-character prefix) after `fixed`
    (the draft's BOS); `draft_ends[i]` is the byte end of `draft[i]`.
    """

    fixed: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    target_ends: list[int] = field(default_factory=list)
    text: bytes = b""
    draft: list[int] = field(default_factory=list)
    draft_ends: list[int] = field(default_factory=list)

    @property
    def covered(self) -> int:
        return self.draft_ends[-1] if self.draft_ends else 0

    def draft_context(self) -> list[int]:
        return self.fixed + self.draft

    def update(self, target_tok, draft_tok, context: Sequence[int]) -> None:
        """Follow the accepted target tokens `context`: the changed tail of the text
        is re-tokenized for the draft, starting CONTEXT_TOKENS draft tokens early."""
        n = common_prefix(self.target, context)
        kept = self.target_ends[n - 1] if n else 0
        pcs = pieces_of(target_tok, context[n:])
        ends, pos = self.target_ends[:n], kept
        for p in pcs:
            pos += len(p)
            ends.append(pos)
        text = self.text[:kept] + b"".join(pcs)
        self.target, self.target_ends = list(context), ends
        # The draft's tokens up to the text that still agrees, less a few
        # (merges reach back), stay; the rest is tokenized again.
        same = common_bytes(self.text, text)
        self.text = text
        j = _count_le(self.draft_ends, same)
        j = max(j - CONTEXT_TOKENS, 0)
        start = self.draft_ends[j - 1] if j else 0
        left_from = self.draft_ends[j - 1 - CONTEXT_TOKENS] if j > CONTEXT_TOKENS else 0
        end = valid_utf8_prefix(text)
        tail = continue_tokens(draft_tok, text[left_from:start], text[start:end])
        if tail is None:  # no byte-exact split after the anchor: the whole text again
            j, start, tail = 0, 0, continue_tokens(draft_tok, b"", text[:end]) or []
        del self.draft[j:], self.draft_ends[j:]
        tail_pieces = pieces_of(draft_tok, tail)
        pos = start - max(sum(map(len, tail_pieces)) - (end - start), 0)  # less a dummy prefix
        for t, p in zip(tail, tail_pieces):
            pos += len(p)
            self.draft.append(t)
            self.draft_ends.append(pos)


def common_bytes(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two byte strings."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _count_le(ends: Sequence[int], limit: int) -> int:
    """How many of the ascending `ends` are <= limit."""
    lo, hi = 0, len(ends)
    while lo < hi:
        mid = (lo + hi) // 2
        if ends[mid] <= limit:
            lo = mid + 1
        else:
            hi = mid
    return lo


def proposal_text(draft_tok, tokens: Sequence[int]) -> bytes:
    """The bytes of the draft's tokens, up to its first control token."""
    out = []
    for t in tokens:
        if draft_tok.token_attr(t) & NOT_TEXT:
            break
        out.append(draft_tok.piece(t))
    return b"".join(out)


def to_target(target_tok, stream: Stream, proposed: bytes, k: int) -> list[int]:
    """The draft's proposed bytes (which continue `stream.text[:stream.covered]`)
    as at most k target tokens after the accepted target tokens."""
    pending = stream.text[stream.covered :]  # a character the target has begun
    if not proposed.startswith(pending):
        return []
    proposed = proposed[len(pending) :]
    ends, n = stream.target_ends, len(stream.target_ends)
    left_from = ends[n - 1 - CONTEXT_TOKENS] if n > CONTEXT_TOKENS else 0
    left = stream.text[left_from:]
    # Cut a character the draft has not finished.
    whole = valid_utf8_prefix(skip_continuation(left) + proposed) - len(skip_continuation(left))
    ids = continue_tokens(target_tok, left, proposed[: max(whole, 0)])
    return (ids or [])[:k]


# -- the drafter -----------------------------------------------------------------


class TranslatedDraftModel(Drafter):
    """A draft model whose vocabulary differs from the target's: drafts through text.

    Same interface as DraftModel (one or many sequences, drafted together in
    the draft's own context; `prefill` reads a prompt before the first token).
    Each proposal says what it cost: `steps`/`step_s`
    the draft's passes, `fed`/`fed_s` a bulk catch-up of its cache, `extra_s`
    the time spent turning text into tokens both ways.
    """

    name = "draft"
    free = False
    prefills = True
    translated = True

    def __init__(self, target_vocab, engine, p_min: float = 0.0) -> None:
        self.target_vocab = target_vocab  # the target's tokenizer (its Engine)
        self.engine = engine
        self.inner = DraftModel(engine, engine.n_vocab, engine.n_vocab, p_min=p_min)
        info = engine.vocab_info()
        self.fixed = [int(info.bos)] if info.add_bos and info.bos >= 0 else []
        self._streams: dict[int, Stream] = {}
        self._proposed: dict[int, list[int]] = {}  # seq → the target ids last proposed
        self.translate_s = 0.0  # all translation time, for measurements
        self.proposals = 0

    @property
    def steps(self) -> int:
        return self.inner.steps

    def _stream(self, seq: int) -> Stream:
        s = self._streams.get(seq)
        if s is None:
            s = self._streams[seq] = Stream(fixed=list(self.fixed))
        return s

    def begin(self, seq: int = 0) -> None:
        """Nothing to do: the next proposal keeps whatever still agrees."""

    def prefill(self, seq: int, context: Sequence[int]) -> Draft:
        """Read the context's text now, as the draft's own tokens in one batched feed
        (with the target's prompt, before the first token), so the first drafting
        round feeds only what is new. Its cost is reported apart from draft steps:
        the feed in `fed`/`fed_s`, the prompt's re-tokenizing in `extra_s`."""
        t = time.perf_counter()
        s = self._stream(seq)
        s.update(self.target_vocab, self.engine, context)
        ctx = s.draft_context()
        dt = time.perf_counter() - t
        d = self.inner.prefill(seq, ctx) if ctx else Draft()
        d.extra_s = dt
        return d

    def lag(self, seq: int, context: Sequence[int]) -> int:
        """Target tokens of `context` beyond what the draft's stream has seen (its text
        and its last proposal), a proxy for the draft tokens to feed, plus the
        draft tokens of its stream of the text `context` shares that its cache
        no longer holds (a cache truncated or reused since)."""
        s = self._streams.get(seq)
        if s is None:
            return len(context)
        seen = s.target + self._proposed.get(seq, [])
        n = common_prefix(s.target, context)  # the stream's draft tokens of that text are of use
        ctx = s.fixed + s.draft[: _count_le(s.draft_ends, s.target_ends[n - 1] if n else 0)]
        missing = len(ctx) - common_prefix(self.engine.kv_tokens(seq), ctx)
        return len(context) - min(common_prefix(seen, context), len(context)) + missing

    def propose(self, wants: Sequence[Want]) -> list[Draft]:
        """Each want's context into the draft's stream, k draft tokens drafted greedily
        for all together (the proposal most likely accepted as a point mass), their
        text re-encoded as at most k target tokens; q is None."""
        wants = list(wants)
        out = [Draft() for _ in wants]
        live, inner_wants, tr = [], [], []
        for i, w in enumerate(wants):
            if w.k <= 0:
                continue
            t = time.perf_counter()
            s = self._stream(w.seq)
            s.update(self.target_vocab, self.engine, w.context)
            ctx = s.draft_context()
            if ctx:  # else nothing the draft can condition on (an empty text, no BOS)
                live.append(i)
                inner_wants.append(Want(w.seq, ctx, w.k, _GREEDY))
                tr.append(time.perf_counter() - t)
        for i, d, t0 in zip(live, self.inner.propose(inner_wants), tr):
            w = wants[i]
            t = time.perf_counter()
            s = self._streams[w.seq]
            ids = to_target(self.target_vocab, s, proposal_text(self.engine, d.tokens), w.k)
            dt = t0 + time.perf_counter() - t
            self._proposed[w.seq] = ids
            self.translate_s += dt
            self.proposals += 1
            res = Draft(ids, None)
            res.steps, res.step_s, res.fed, res.fed_s = d.steps, d.step_s, d.fed, d.fed_s
            res.extra_s = dt  # translation: part of every drafting round's cost, apart from the passes
            out[i] = res
        return out


def translatable(target_vocab, draft_vocab, probe: str) -> str:
    """Why the draft cannot draft for the target by translation ("" when it can):
    it must encode text byte-exactly (the probe), and so must the target."""
    for who, tok in (("draft", draft_vocab), ("target", target_vocab)):
        data = probe.encode("utf-8")
        ids = tok.tokenize(probe, add_special=False, parse_special=False)
        got = b"".join(pieces_of(tok, ids))
        if got != data and got[len(got) - len(data) :] != data:
            i = common_bytes(got, data)
            return f"the {who} model's tokenizer cannot reproduce text (probe differs at byte {i})"
    return ""


# Text every tokenizer must reproduce byte for byte for drafting through text.
TRANSLATION_PROBE = "The quick brown fox, 42 times:\n    def f(x):\n        return x + 1\n"


def translation_problem(target: VocabSource, draft: VocabSource) -> str:
    """Why a draft with another vocabulary cannot draft for the target through
    text ("" when it can): both tokenizers must reproduce plain text exactly."""
    return translatable(target, draft, TRANSLATION_PROBE)
