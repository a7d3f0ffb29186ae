"""A thin layer over llama-cpp-python's low-level API: one model, one context.

What it does and nothing more: load a GGUF, tokenize and detokenize, decode a
batch with logits on chosen rows (read back as numpy views, no copies), and
roll back a sequence's KV cache. Each sequence's cached tokens are tracked so
a caller can ask for "this exact token list in the cache" (`sync`) and pay
only for what is new. Every call takes a sequence id, so several requests can
share one context.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from specgen.errors import SpecgenError

import llama_cpp as llama


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet_log(level, text, user_data):  # noqa: ARG001 - llama.cpp's signature
    if level == 4 and os.environ.get("SPECGEN_LLAMA_LOG"):  # GGML_LOG_LEVEL_ERROR
        os.write(2, text)


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        llama.llama_log_set(_quiet_log, None)
        llama.llama_backend_init()
        _backend_ready = True


@dataclass(frozen=True)
class VocabInfo:
    """What the tokenizer check compares between two models."""

    type: int
    n_tokens: int
    add_bos: bool
    add_eos: bool
    bos: int
    eos: int
    eot: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def prefill(engine, items: Sequence[tuple[int, Sequence[int]]]) -> dict[int, np.ndarray]:
    """Append each sequence's tokens to its cache, in as few decodes as n_batch allows
    (several sequences per decode), with logits only on each sequence's last token.

    items: (seq, tokens), tokens non-empty. Returns seq → that last row. Rows
    read before a later decode are copied (a view dies with the next decode).
    engine: anything with `decode_batch` and `n_batch` (the Engine, or a fake).
    """
    todo = [[seq, list(toks)] for seq, toks in items if len(toks)]
    rows: dict[int, np.ndarray] = {}
    fresh: list[int] = []  # rows that are views into the last decode's buffer
    while todo:
        for seq in fresh:  # keep them past the next decode
            rows[seq] = rows[seq].copy()
        fresh = []
        budget, feed = engine.n_batch, []
        for item in todo:
            if budget == 0:
                break
            seq, rest = item
            chunk, item[1] = rest[:budget], rest[budget:]
            budget -= len(chunk)
            feed.append((seq, chunk, 0 if item[1] else 1))
        for (seq, _, n_logits), v in zip(feed, engine.decode_batch(feed)):
            if n_logits:
                rows[seq] = v[0]
                fresh.append(seq)
        todo = [t for t in todo if t[1]]
    return rows


def sync_many(engine, items: Sequence[tuple[int, Sequence[int]]]) -> dict[int, np.ndarray]:
    """Make each sequence's cache hold exactly its tokens: keep the longest cached
    prefix (the last token is always re-fed, for its logits), prefill the rest.
    Returns seq → the logits row of its last token."""
    feed = []
    for seq, tokens in items:
        if not tokens:
            raise ValueError("sync needs at least one token")
        keep = min(common_prefix(engine.kv_tokens(seq), tokens), len(tokens) - 1)
        engine.truncate(seq, keep)
        feed.append((seq, tokens[keep:]))
    return prefill(engine, feed)


class Engine:
    """One GGUF model with one llama.cpp context."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        n_batch: int = 512,
        n_seq_max: int = 1,
        kv_unified: bool = False,
        hidden: bool = False,
    ) -> None:
        self._load(path, n_gpu_layers, vocab_only=False, hidden=hidden)
        threads = n_threads or os.cpu_count() or 1
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq_max
        # Unified: n_ctx is one pool shared by all sequences, and a batch that
        # mixes sequences of different row counts stays one ubatch. Split
        # (llama.cpp's default) gives each sequence n_ctx / n_seq_max and cuts
        # such a batch into equal-length ubatches of consecutive sequence ids.
        cparams.kv_unified = kv_unified
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        # A full-size sliding-window cache, so rolling back to any position
        # (draft rejection, a new chat turn) never needs a re-prefill.
        cparams.swa_full = True
        if hidden:  # each output row's final hidden state too, in the same pass (prediction heads)
            cparams.embeddings = True
            cparams.pooling_type = llama.LLAMA_POOLING_TYPE_NONE
        self._ctx = llama.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise SpecgenError(f"could not create a llama.cpp context of {n_ctx} tokens for {self.path}")
        self.n_ctx = llama.llama_n_ctx(self._ctx)
        self.n_batch = llama.llama_n_batch(self._ctx)  # llama.cpp caps it at n_ctx
        self.n_threads = threads
        self.n_seq_max = n_seq_max
        self.kv_unified = kv_unified
        self._mem = llama.llama_get_memory(self._ctx)
        self._batch = llama.llama_batch_init(self.n_batch, 0, n_seq_max)
        self._seq_ids = [ctypes.c_int32(s) for s in range(n_seq_max)]
        self._kv: list[list[int]] = [[] for _ in range(n_seq_max)]
        self._kv_valid = [True] * n_seq_max
        self.n_decodes = 0  # llama_decode calls, for accounting and tests
        self._views: dict[tuple[int, int], np.ndarray] = {}
        # hidden=True: per sequence, the first position and the hidden rows of its
        # last decode with outputs (copies), while those positions stay cached
        self._hid: list[tuple[int, np.ndarray] | None] = [None] * n_seq_max
        self._embd_on = hidden  # llama.cpp's embeddings flag (decode_batch turns it per decode)
        # rows of earlier decodes kept besides the last one's, where they run on
        # without a gap (a draft layer reads the rows of the plain steps it sat out)
        self.hidden_history = 0

    @classmethod
    def vocab(cls, path: str | Path) -> "Engine":
        """The model's vocabulary alone, without its weights or a context: tokenizing,
        pieces and the vocabulary checks, for the cost of reading its header."""
        self = cls.__new__(cls)
        self._load(path, 0, vocab_only=True, hidden=False)
        return self

    def _load(self, path: str | Path, n_gpu_layers: int, *, vocab_only: bool, hidden: bool) -> None:
        _init_backend()
        self.path = Path(path)
        self._model = self._ctx = self._batch = None
        mparams = llama.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.vocab_only = vocab_only
        self._model = llama.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise SpecgenError(f"llama.cpp could not load {self.path} (unsupported architecture or corrupt file)")
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self.n_embd = llama.llama_model_n_embd(self._model)
        self.hidden = hidden
        self._eog: dict[int, bool] = {}

    # -- vocabulary -------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama.llama_token * cap)()
        n = llama.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama.llama_token * cap)()
            n = llama.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> bytes:
        return llama.llama_vocab_get_text(self._vocab, token) or b""

    def token_attr(self, token: int) -> int:
        return int(llama.llama_vocab_get_attr(self._vocab, token))

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama.llama_vocab_is_eog(self._vocab, token))
        return eog

    def vocab_info(self) -> VocabInfo:
        v = self._vocab
        return VocabInfo(
            type=int(llama.llama_vocab_type(v)),
            n_tokens=self.n_vocab,
            add_bos=bool(llama.llama_vocab_get_add_bos(v)),
            add_eos=bool(llama.llama_vocab_get_add_eos(v)),
            bos=int(llama.llama_vocab_bos(v)),
            eos=int(llama.llama_vocab_eos(v)),
            eot=int(llama.llama_vocab_eot(v)),
        )

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        tmpl = llama.llama_model_chat_template(self._model, None)
        return tmpl.decode("utf-8", errors="replace") if tmpl else None

    # -- KV cache ---------------------------------------------------------
    def kv_tokens(self, seq: int = 0) -> list[int]:
        """The tokens whose keys and values the sequence holds (a copy)."""
        return list(self._kv[seq]) if self._kv_valid[seq] else []

    def truncate(self, seq: int, n: int) -> None:
        """Drop every cached position >= n of sequence `seq`."""
        kv = self._kv[seq]
        if n >= len(kv) and self._kv_valid[seq]:
            return
        if not self._kv_valid[seq]:
            n = 0
        if not llama.llama_memory_seq_rm(self._mem, seq, n, -1):
            raise SpecgenError(f"llama.cpp cannot roll back the cache of {self.path.name} (recurrent model?)")
        del kv[n:]
        self._kv_valid[seq] = True
        self._trim_hidden(seq, n)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """dst's cache becomes src's first n positions. In the unified pool the
        cells are shared, not computed again: llama.cpp marks them as dst's too,
        and each sequence's later rollbacks and evictions leave the other's."""
        self.truncate(dst, 0)
        if n and self._kv_valid[src]:
            llama.llama_memory_seq_cp(self._mem, src, dst, 0, n)
            self._kv[dst] = self._kv[src][:n]

    def save_seq(self, seq: int):
        """A copy of the sequence's cache state (keys and values, in llama.cpp's format),
        for `load_seq`; None when llama.cpp gives none."""
        if not self._kv_valid[seq] or not self._kv[seq]:
            return None
        n = llama.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_uint8 * n)()
        got = llama.llama_state_seq_get_data(self._ctx, buf, n, seq)
        return buf if got == n else None

    def load_seq(self, seq: int, tokens: Sequence[int], state) -> bool:
        """Replace the sequence's cache with a state `save_seq` gave for `tokens`;
        False (and an empty sequence) when llama.cpp finds no room for it."""
        self.truncate(seq, 0)
        if not llama.llama_state_seq_set_data(self._ctx, state, len(state), seq):
            llama.llama_memory_seq_rm(self._mem, seq, -1, -1)
            return False
        self._kv[seq] = list(tokens)
        return True

    def decode(self, seq: int, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append `tokens` to the sequence; logits on its last `n_logits` rows.

        Returns an (n_logits, n_vocab) float32 view into llama.cpp's buffer,
        valid until the next decode on this engine.
        """
        return self.decode_batch([(seq, tokens, n_logits)])[0]

    def decode_batch(self, parts: Sequence[tuple[int, Sequence[int], int]]) -> list[np.ndarray]:
        """One llama_decode over several sequences' new tokens.

        parts: (seq, tokens, n_logits) for each sequence. The rows of all
        parts must fit in n_batch. Returns one logits view per part.
        """
        if self.hidden:
            return self._decode_hidden(parts)
        return self._decode(parts)

    def _decode_hidden(self, parts) -> list[np.ndarray]:
        """decode_batch with hidden states: while embeddings are on, llama.cpp
        outputs every row of a decode (it overrides the rows' output flags), so
        a decode that wants logits on some rows only (a prompt's prefill: its
        last) is split in two: the rows before the wanted ones with embeddings
        off, then the wanted rows with them on (a prefill pays one more decode
        of one row; a verify pass, which wants every row, is one decode)."""
        if all(n == len(toks) for _, toks, n in parts):
            self._embeddings(True)
            return self._decode(parts)
        before = [(seq, toks[: len(toks) - n], 0) for seq, toks, n in parts if len(toks) > n]
        wanted = [(seq, toks[len(toks) - n :], n) for seq, toks, n in parts if n]
        self._embeddings(False)
        self._decode(before)
        views = {}
        if wanted:
            self._embeddings(True)
            views = {seq: v for (seq, _, _), v in zip(wanted, self._decode(wanted))}
        empty = np.empty((0, self.n_vocab), dtype=np.float32)
        return [views.get(seq, empty) if n else empty for seq, _, n in parts]

    def _embeddings(self, on: bool) -> None:
        if self._embd_on != on:
            llama.llama_set_embeddings(self._ctx, on)
            self._embd_on = on

    def _decode(self, parts: Sequence[tuple[int, Sequence[int], int]]) -> list[np.ndarray]:
        b = self._batch
        i = 0
        for seq, tokens, n_logits in parts:
            if not self._kv_valid[seq]:
                self.truncate(seq, 0)
            pos = len(self._kv[seq])
            first_logit = len(tokens) - n_logits
            sid = self._seq_ids[seq]
            for j, tok in enumerate(tokens):
                b.token[i] = tok
                b.pos[i] = pos + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = sid
                b.logits[i] = j >= first_logit
                i += 1
        if i > self.n_batch:
            raise ValueError(f"batch of {i} rows exceeds n_batch={self.n_batch}")
        b.n_tokens = i
        for seq, _, _ in parts:
            self._kv_valid[seq] = False  # until the decode is known to have landed
        self._run(i)  # on failure the cache may hold part of the batch: its tokens stay unknown
        n_out = sum(n for _, _, n in parts)
        views = []
        if n_out:
            allrows = self._logits(n_out)
            r = 0
            for _, _, n in parts:
                views.append(allrows[r : r + n])
                r += n
        else:
            views = [np.empty((0, self.n_vocab), dtype=np.float32) for _ in parts]
        if self.hidden:
            self._keep_hidden(parts, n_out)
        for seq, tokens, _ in parts:
            self._kv[seq].extend(tokens)
            self._kv_valid[seq] = True
        return views

    # -- hidden states (Engine(hidden=True)) ----------------------------------
    def _keep_hidden(self, parts, n_out: int) -> None:
        base = llama.llama_get_embeddings(self._ctx) if n_out else None
        allrows = np.ctypeslib.as_array(base, shape=(n_out, self.n_embd)) if base else None
        r = 0
        for seq, tokens, n in parts:
            start = len(self._kv[seq])  # before this decode's tokens are counted
            self._trim_hidden(seq, start)
            if n and allrows is not None:
                first, rows, kept = start + len(tokens) - n, allrows[r : r + n], self._hid[seq]
                if kept is not None and self.hidden_history and kept[0] + len(kept[1]) == first:
                    old = kept[1][-self.hidden_history :]  # earlier decodes' rows, right before these
                    self._hid[seq] = (first - len(old), np.concatenate([old, rows]))
                else:
                    self._hid[seq] = (first, rows.copy())
            r += n

    def _trim_hidden(self, seq: int, n: int) -> None:
        kept = self._hid[seq]
        if kept is not None:
            start, rows = kept
            self._hid[seq] = (start, rows[: n - start]) if n > start else None

    def hidden_at(self, seq: int, pos: int) -> np.ndarray | None:
        """The final hidden state (n_embd floats, after the output norm: the logits are
        the output matrix times it) of the row at `pos` of `seq`, when the sequence's
        last decode with outputs computed that row (or, within `hidden_history` rows
        before it, an earlier decode that ran on up to it) and the position is still
        cached; None otherwise (or without hidden=True)."""
        kept = self._hid[seq] if self.hidden else None
        if kept is None:
            return None
        start, rows = kept
        return rows[pos - start] if start <= pos < start + len(rows) else None

    # -- draft trees --------------------------------------------------------
    def _run(self, rows: int) -> None:
        """llama_decode the filled batch of `rows` rows; one clear error if it fails."""
        rc = llama.llama_decode(self._ctx, self._batch)
        self.n_decodes += 1
        if rc == 1:
            raise SpecgenError(f"context full: no KV slot for {rows} more tokens (n_ctx={self.n_ctx}; raise -c)")
        if rc != 0:
            raise SpecgenError(f"llama_decode failed with code {rc}")

    def decode_tree(self, seq: int, scratch: Sequence[int], last: int, tokens: Sequence[int],
                    parents: Sequence[int]) -> tuple[np.ndarray, list[int]]:
        """Verify a draft tree in one llama_decode; logits on every row.

        Row 0 is `last` (appended to `seq` at the next position), row i + 1 is
        node i (`parents[i]`: its parent node, -1 for the root, parents before
        children). Each leaf's path is a sequence: the first leaf's is `seq`,
        the others' the `scratch` ids, which get `seq`'s cache (metadata only
        in a unified cache) before the pass. A row carries the ids of every
        leaf below it, its first id is one of them, and llama.cpp masks by a
        row's first id and by position: each row sees its own ancestors only.
        Needs kv_unified and n_seq_max > max(scratch). Returns the
        (1 + len(tokens), n_vocab) logits view and each leaf's sequence id
        (`leaf_seq[j]` for the j-th leaf in node order); `keep_path` settles.
        """
        if not self.kv_unified:
            raise SpecgenError("draft trees need a unified KV cache (Engine(kv_unified=True))")
        n = len(tokens)
        has_child = set(parents)
        leaves = [i for i in range(n) if i not in has_child]
        ids = [seq, *scratch][: max(len(leaves), 1)]
        if len(ids) < len(leaves):
            raise ValueError(f"a tree of {len(leaves)} leaves needs {len(leaves) - 1} scratch sequences")
        if 1 + n > self.n_batch:
            raise ValueError(f"batch of {1 + n} rows exceeds n_batch={self.n_batch}")
        below: list[list[int]] = [[] for _ in range(n)]  # leaf sequence ids under each node
        depth = [0] * n
        for i, par in enumerate(parents):
            depth[i] = 1 if par < 0 else depth[par] + 1
        for j, leaf in enumerate(leaves):
            v = leaf
            while v >= 0:
                below[v].append(ids[j])
                v = parents[v]
        prefix = self._kv[seq] if self._kv_valid[seq] else []
        for s in ids[1:]:  # each branch starts from seq's cache
            llama.llama_memory_seq_rm(self._mem, s, -1, -1)
            llama.llama_memory_seq_cp(self._mem, seq, s, -1, -1)
        b, base = self._batch, len(prefix)
        rows = [(last, base, ids)] + [(tokens[i], base + depth[i], below[i]) for i in range(n)]
        for r, (tok, pos, sids) in enumerate(rows):
            b.token[r] = tok
            b.pos[r] = pos
            b.n_seq_id[r] = len(sids)
            for j, sid in enumerate(sids):
                b.seq_id[r][j] = sid
            b.logits[r] = True
        b.n_tokens = len(rows)
        for s in ids:
            self._kv_valid[s] = False
            self._hid[s] = None  # a tree's rows are not kept (heads do not draft trees)
        self._run(len(rows))
        for j, leaf in enumerate(leaves):
            path = []
            v = leaf
            while v >= 0:
                path.append(tokens[v])
                v = parents[v]
            self._kv[ids[j]] = list(prefix) + [last] + path[::-1]
            self._kv_valid[ids[j]] = True
        return self._logits(len(rows)), ids

    def keep_path(self, seq: int, scratch: Sequence[int], via: int, root: int, n_accepted: int) -> None:
        """After `decode_tree` (its root at position `root`): `seq` keeps the prefix, the
        root and the first n_accepted nodes of leaf sequence `via`'s path (which
        holds the accepted ones); the scratch sequences are emptied."""
        end = root + 1 + n_accepted
        if via != seq:
            llama.llama_memory_seq_rm(self._mem, seq, root + 1, -1)
            if n_accepted:
                llama.llama_memory_seq_cp(self._mem, via, seq, root + 1, end)
            self._kv[seq] = self._kv[via][:end]
        else:
            self.truncate(seq, end)
        for s in scratch:
            llama.llama_memory_seq_rm(self._mem, s, -1, -1)
            self._kv[s] = []
            self._kv_valid[s] = True

    def _logits(self, n_out: int) -> np.ndarray:
        """The output rows as one numpy view (cached while llama.cpp keeps its buffer)."""
        base = llama.llama_get_logits(self._ctx)  # also waits for the graph and orders rows
        key = (ctypes.cast(base, ctypes.c_void_p).value, n_out)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 64:
                self._views.clear()
            view = self._views[key] = np.ctypeslib.as_array(base, shape=(n_out, self.n_vocab))
        return view

    def sync(self, seq: int, tokens: Sequence[int]) -> np.ndarray:
        """Make the sequence's cache hold exactly `tokens`; a (n_vocab,) row of the last's logits."""
        return self.sync_many([(seq, tokens)])[seq]

    def sync_many(self, items: Sequence[tuple[int, Sequence[int]]]) -> dict[int, np.ndarray]:
        """`sync` for several sequences at once (see the module function)."""
        return sync_many(self, items)

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        if self._batch is not None:
            llama.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass

