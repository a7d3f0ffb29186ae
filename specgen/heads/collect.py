"""What heads are trained on: the target's output matrix (a few rows of it) and its own text.

Self-distillation: the target continues seed prompts, several sequences per
decode, mostly greedily with a sampled token now and then for diversity. Each
step yields the row the heads need: the hidden state that picked the token.
Labels are the target's own greedy choices; a head whose label (or a token
before it) was sampled has no label there.

Teacher-forced text (`collect_text`) is the cheaper source: one pass over a
chunk of text scores every row at once. The text's token after a row stands
for the drafting round's `last` (as a sampled pick does while generating), and
head i is labelled with the target's own argmax i rows on, while the text
between agrees with the target's argmax (the same rule as above, the text in
the place of the generated tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specgen.engine.llama import prefill
from specgen.errors import SpecgenError, read_text_file
from specgen.heads.train import Samples

OUTPUT_TENSORS = ("output.weight", "token_embd.weight")


def output_rows(path, ids: np.ndarray | None = None) -> np.ndarray:
    """Rows `ids` (None: row 0 only, a check) of the model's output matrix (`output.weight`, else the
    tied `token_embd.weight`), dequantized to float32; one SpecgenError line when they cannot be read."""
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    from specgen.models.gguf import find_tensor

    path = Path(path)
    info = find_tensor(path, OUTPUT_TENSORS)
    if info is None:
        raise SpecgenError(f"{path.name} has no output matrix (neither {' nor '.join(OUTPUT_TENSORS)})")
    if info.ggml_type not in GGML_QUANT_SIZES or len(info.shape) != 2:
        raise SpecgenError(f"cannot read {info.name} of {path.name} (tensor type {info.ggml_type})")
    n_embd, n_rows = info.shape
    block, size = GGML_QUANT_SIZES[info.ggml_type]
    row_bytes = n_embd // block * size
    ids = np.arange(1) if ids is None else np.asarray(ids, dtype=np.int64)
    if len(ids) and (ids.min() < 0 or ids.max() >= n_rows):
        raise SpecgenError(f"token id outside {info.name} of {path.name} ({n_rows} rows)")
    try:
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=info.offset, shape=(n_rows, row_bytes))
        rows = dequantize(np.ascontiguousarray(raw[ids]), info.ggml_type)
    except (OSError, ValueError, NotImplementedError) as e:
        raise SpecgenError(f"cannot dequantize {info.name} of {path.name}: {e}") from None
    rows = np.asarray(rows, dtype=np.float32).reshape(len(ids), n_embd)
    if not np.isfinite(rows).all():
        raise SpecgenError(f"{info.name} of {path.name} holds non-finite values")
    return rows


def seeds_from_files(paths: Sequence, chunk_chars: int = 800) -> list[tuple[str, str]]:
    """(file stem, text) chunks of each text file, cut at paragraph breaks; unreadable or empty files
    are one SpecgenError line."""
    out = []
    for p in paths:
        text = read_text_file(p, "training text")
        parts, cur = [], ""
        for para in text.split("\n\n"):
            if cur and len(cur) + len(para) > chunk_chars:
                parts.append(cur)
                cur = ""
            cur = f"{cur}\n\n{para}" if cur else para
        parts.append(cur)
        parts = [c[:chunk_chars * 2].strip() for c in parts if c.strip()]
        if not parts:
            raise SpecgenError(f"training text is empty: {p}")
        out += [(Path(p).stem, c) for c in parts]
    return out


def prompt_tokens(engine, text: str, fmt, max_tokens: int) -> list[int]:
    """A seed as the target sees it: one chat turn when it has a template (`fmt`), else raw text;
    its last `max_tokens` tokens."""
    if fmt is not None:
        from specgen.apps.chat import one_turn

        toks = one_turn(fmt, engine, text)
    else:
        toks = engine.tokenize(text)
    return toks[-max_tokens:]


@dataclass
class Seq:
    group: int
    held: bool
    tokens: list  # generated: tokens[j] was picked from rows[j]
    rows: list
    greedy: list


def examples(seq: Seq, n_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(hidden (N, d), tokens (N, n_heads + 1)) of one generated sequence: row j with last = tokens[j]
    and head i labelled tokens[j + 1 + i] while every token from j + 1 on is the target's greedy pick."""
    g, ok = seq.tokens, seq.greedy
    n = len(g) - 1
    if n <= 0:
        return np.zeros((0, len(seq.rows[0]) if seq.rows else 0), np.float32), np.zeros((0, n_heads + 1), np.int32)
    toks = np.full((n, n_heads + 1), -1, dtype=np.int32)
    for j in range(n):
        toks[j, 0] = g[j]
        for i in range(n_heads):
            k = j + 1 + i
            if k >= len(g) or not ok[k]:
                break
            toks[j, i + 1] = g[k]
    keep = toks[:, 1] >= 0
    return np.asarray(seq.rows[:n], dtype=np.float32)[keep], toks[keep]


TEXT_TURN = "Write a passage of text or code."  # the user turn before teacher-forced text, for a chat model


def text_prefix(engine) -> list[int]:
    """What each teacher-forced chunk starts with: a chat model's one turn (`TEXT_TURN`), so the text
    stands where its replies do; else the tokens the model starts any text with (BOS, if any)."""
    from specgen.apps.chat import format_for, one_turn

    if engine.chat_template():
        return one_turn(format_for(engine), engine, TEXT_TURN)
    return engine.tokenize("", add_special=True)


def forced_labels(tokens: Sequence[int], picks: np.ndarray, n_heads: int) -> np.ndarray:
    """(T - 1, n_heads + 1) tokens of a teacher-forced chunk: row j (the state after tokens[j]) has
    last = tokens[j + 1]; head i is labelled picks[j + i] (the target's argmax after tokens[j + i])
    while tokens[j + m + 1] == picks[j + m] for every 1 <= m < i; -1 past that, or past the chunk."""
    t = np.asarray(tokens, dtype=np.int64)
    picks = np.asarray(picks, dtype=np.int64)
    n = len(t) - 1
    out = np.full((max(n, 0), n_heads + 1), -1, dtype=np.int32)
    if n <= 0:
        return out
    out[:, 0] = t[1:]
    agree = np.append(t[1:] == picks[:-1], False)  # agree[r]: the text's next token is the target's pick at r
    j = np.arange(n)
    ok = np.ones(n, dtype=bool)
    for i in range(1, n_heads + 1):
        k = j + i
        if i > 1:
            ok &= agree[np.minimum(k - 1, n)]
        ok &= k <= n
        out[ok, i] = picks[k[ok]]
    return out


def text_chunks(engine, texts: Sequence[tuple[int, str]], n_tokens: int, prefix: Sequence[int],
                rng: np.random.Generator, max_chars: int = 60_000):
    """(group, tokens) chunks of `texts` ((group, text), in random order): `prefix` then at most
    n_tokens - len(prefix) tokens of the text; a text is tokenized only when its turn comes (its
    first `max_chars` characters)."""
    room = max(n_tokens - len(prefix), 2)
    for i in rng.permutation(len(texts)):
        group, text = texts[i]
        toks = engine.tokenize(text[:max_chars], add_special=False, parse_special=False)
        for a in range(0, len(toks) - 1, room):
            yield group, [*prefix, *toks[a:a + room]]


def collect_text(engine, chunks, groups: list[str], n_heads: int, *, deadline: float, seq: int = 0,
                 picked_only: bool = False, max_examples: int | None = None,
                 on_step: Callable[[int], None] | None = None) -> Samples:
    """Teacher-forced samples: each (group, tokens) chunk in one decode of sequence `seq` with every row
    out (logits and hidden states), until `deadline`, `max_examples` or the chunks end. `picked_only`
    keeps only rows whose `last` is the target's own pick (heads that do not see `last`, medusa: at a
    greedy round it always is)."""
    parts, made = [], 0
    for group, toks in chunks:
        if time.monotonic() >= deadline or (max_examples is not None and made >= max_examples):
            break
        if len(toks) < 2:
            continue
        engine.truncate(seq, 0)
        picks = np.argmax(engine.decode_batch([(seq, toks, len(toks))])[0], axis=1)
        labels = forced_labels(toks, picks, n_heads)
        keep = labels[:, 1] >= 0
        if picked_only:
            keep &= labels[:, 0] == picks[:-1]
        rows = np.stack([engine.hidden_at(seq, p) for p in range(len(toks) - 1)]).astype(np.float32)
        parts.append((rows[keep], labels[keep], np.full(int(keep.sum()), group, np.int32)))
        made += int(keep.sum())
        if on_step:
            on_step(made)
    engine.truncate(seq, 0)
    return _samples(parts, groups, engine.n_embd, n_heads)


def pick(row: np.ndarray, rng: np.random.Generator, kick: float, top_k: int = 40) -> tuple[int, bool]:
    """The next token: the argmax, or with probability `kick` a sample from the top-k (temperature 1)."""
    best = int(np.argmax(row))
    if kick <= 0 or rng.random() >= kick:
        return best, True
    top = np.argpartition(row, -top_k)[-top_k:]
    z = row[top].astype(np.float64)
    p = np.exp(z - z.max())
    tok = int(rng.choice(top, p=p / p.sum()))
    return tok, tok == best


def collect(engine, prompts: Sequence[tuple[int, list[int], bool]], groups: list[str], n_heads: int, *,
            gen_tokens: int, deadline: float, rng: np.random.Generator, kick: float = 0.1,
            max_examples: int | None = None, on_step: Callable[[int], None] | None = None) -> tuple[Samples, Samples]:
    """Generate from `prompts` ((group, tokens, held out?), cycled) on every sequence of `engine`
    (Engine(hidden=True), kv_unified) until `deadline` (time.monotonic) or `max_examples`;
    returns (training, held-out) samples. on_step(examples so far) after each decode."""
    n_seq = engine.n_seq_max
    parts: dict[bool, list] = {False: [], True: []}
    made, nxt = 0, 0
    active: dict[int, Seq] = {}
    rows: dict[int, np.ndarray] = {}

    def start(seqs: list[int]) -> None:
        """Fresh prompts on `seqs`, prefilled in one go."""
        nonlocal nxt
        items = []
        for seq in seqs:
            group, toks, held = prompts[nxt % len(prompts)]
            nxt += 1
            engine.truncate(seq, 0)
            active[seq] = Seq(group, held, [], [], [])
            items.append((seq, toks))
        got = prefill(engine, items)
        for seq, toks in items:
            rows[seq] = np.array(got[seq])
            active[seq].rows.append(np.array(engine.hidden_at(seq, len(toks) - 1)))

    def finish(seq: int) -> None:
        nonlocal made
        s = active.pop(seq)
        h, t = examples(s, n_heads)
        if len(h):
            parts[s.held].append((h, t, np.full(len(h), s.group, np.int32)))
            made += len(h)

    start(list(range(n_seq)))
    while active and time.monotonic() < deadline and (max_examples is None or made < max_examples):
        feed = []
        for seq, s in active.items():
            tok, greedy = pick(rows[seq], rng, kick)
            s.tokens.append(tok)
            s.greedy.append(greedy)
            if len(s.tokens) < gen_tokens and not engine.is_eog(tok):
                feed.append((seq, [tok], 1))
        done = [seq for seq in active if seq not in {f[0] for f in feed}]
        if feed:
            for (seq, _, _), v in zip(feed, engine.decode_batch(feed)):
                rows[seq] = np.array(v[0])
                active[seq].rows.append(np.array(engine.hidden_at(seq, len(engine.kv_tokens(seq)) - 1)))
        for seq in done:
            finish(seq)
        if done and time.monotonic() < deadline:
            start(done)
        if on_step:
            on_step(made + sum(max(len(q.tokens) - 1, 0) for q in active.values()))
    for seq in list(active):
        finish(seq)
    return _samples(parts[False], groups, engine.n_embd, n_heads), _samples(parts[True], groups, engine.n_embd, n_heads)


def _samples(parts: list, groups: list[str], d: int, n_heads: int) -> Samples:
    if not parts:
        return Samples(np.zeros((0, d), np.float32), np.zeros((0, n_heads + 1), np.int32), np.zeros(0, np.int32), groups)
    return Samples(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                   np.concatenate([p[2] for p in parts]), groups)
