"""`specgen heads train --kind layer`: a feature-level draft layer (specgen.heads.layer)
trained over the frozen target, the whole command short of printing.

1. Replies: the seed prompts (built-in, none of them benchmark requests; or the
   passages of the given files) and, for `invent` of each round's prompts,
   requests the writer makes up on broad subjects (invented_prompts: the seeds
   alone are too few topics for a layer to reach past them), through the chat
   template, each answered at
   temperature 0.8 (at most `reply_tokens`), by a writer: a draft model of the
   same vocabulary when one is given (several times faster than the target, and
   its replies lie near the target's), else the target itself; `writers` replies
   at once, one decode a step over all of them.
2. Reading: every reply read back through the target in one pass, every row out:
   per position the final hidden state (the layer's input and its regression
   target) and the target's argmax (its label: at every position, the prompt's
   too, under `prompt_labels`; held-out checks read reply positions). Writing
   and reading take turns, a round of replies at a time, for `data_share` of the
   budget.
3. Training: Adam over chunks of `chunk` positions laid end to end, with feature
   noise as EAGLE's, until the budget ends, and for at least a quarter of it where
   the data ran over (Ctrl-C: stops and saves what is trained); every tenth chunk held out, checked every `check_every` steps, the
   best check's weights kept. The readout covers the `vocab` most frequent labels.

Progress goes to a callback (specgen.heads.fit.Progress); nothing here prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from specgen.errors import SpecgenError
from specgen.heads.layer import PARAMS, FeatureLayer, causal_mask, embed_rows, forward, init_params, loss_and_grads


TRAIN_FLOOR = 0.25  # of the budget: what training gets even when the replies and their reading ran over


@dataclass
class LayerOptions:
    minutes: float = 30.0
    data_share: float = 0.65  # of the budget: writing replies and reading them back, in turns
    writers: int = 16  # replies written at once (one decode a step over all of them)
    reply_tokens: int = 256
    chunk: int = 256  # positions of one training sequence (the layer's attention window is one less)
    vocab: int = 4096  # readout rows: the most frequent labels
    attn: int = 256  # attention width, heads of head_dim
    head_dim: int = 64
    mlp: int = 2048
    batch: int = 4  # chunks a step
    lr: float = 1e-3
    n_heads: int = 6  # the longest draft a round
    check_every: int = 50
    ttt: bool = False  # training-time test: each step also trains draft step 2 on the layer's own features
    weight_decay: float = 0.0  # decoupled (AdamW), on the matrices only
    soft: float = 0.0  # the share of each label that is the target's distribution (specgen.heads.layer.readout_loss)
    prompt_labels: bool = True  # train on the prompts' positions too (read anyway); held-out checks stay on replies
    min_chunks: int = 22  # replies go on past their share of the budget until they fill this many chunks
    invent: float = 0.5  # of each round's prompts: requests the writer makes up (invented_prompts), the rest seeds
    max_steps: int | None = None  # tests
    seed: int = 0


def check_layer_options(o: LayerOptions) -> None:
    if o.minutes <= 0 or not 0 < o.data_share < 1 or o.writers < 1:
        raise SpecgenError("--minutes must be > 0 (the data's share of it between 0 and 1, and a writer at least)")
    if not 0 <= o.soft <= 1 or o.weight_decay < 0 or not 0 <= o.invent <= 1:
        raise SpecgenError("the soft share of a label and the invented prompts' share must be between 0 and 1, "
                           "and weight decay at least 0")
    if o.attn % o.head_dim or o.head_dim % 2 or o.chunk < 8 or o.vocab < 16 or not 1 <= o.n_heads <= 8:
        raise SpecgenError("a layer needs attention a multiple of an even head width, chunks of 8+, --vocab >= 16 "
                           "and --n-heads between 1 and 8")


def seed_prompts(writer, seeds: Sequence[str], rng: np.random.Generator):
    """The seeds' prompt tokens (through the writer's chat template where it has one), seed
    after seed in a new order each time round, without end."""
    from specgen.apps.chat import format_for, one_turn

    fmt = format_for(writer) if writer.chat_template() else None
    while True:
        for i in rng.permutation(len(seeds)):
            yield one_turn(fmt, writer, seeds[i]) if fmt is not None else writer.tokenize(seeds[i])


def write_replies(writer, prompts: Sequence[Sequence[int]], opts: LayerOptions, rng: np.random.Generator,
                  on_step=None) -> list[tuple[list[int], int]]:
    """(prompt + reply tokens, the reply's start) for each prompt, by the `writer` engine,
    sampled at temperature 0.8 (top-k 40, top-p 0.95, min-p 0.05) up to an
    end-of-generation token or `reply_tokens`: up to `writers` replies at once (one decode
    a step over all of them, on sequences 0 … writers-1; a finished reply's sequence
    takes the next prompt), since a step of several rows costs far less than as many
    steps. on_step(tokens written so far)."""
    from specgen.engine.llama import prefill
    from specgen.rules.sampling import SamplingParams, sample, support

    params = SamplingParams(temperature=0.8)
    todo = list(enumerate(prompts))[::-1]  # pop() takes the next
    out: list = [None] * len(prompts)
    live: dict[int, tuple[int, list[int], list[int]]] = {}  # seq -> (prompt index, prompt, reply)
    n = 0

    def start(seqs) -> list:
        for seq in seqs:
            i, prompt = todo.pop()
            writer.truncate(seq, 0)
            live[seq] = (i, list(prompt), [])
        return [(seq, live[seq][1], 1) for seq in seqs]

    rows = prefill(writer, [(seq, toks) for seq, toks, _ in start(range(min(max(1, opts.writers), writer.n_seq_max,
                                                                              len(todo))))])
    while live:
        step, free = [], []
        for seq in sorted(live):
            i, prompt, reply = live[seq]
            tok = sample(support(rows[seq], params), rng)
            if writer.is_eog(tok) or len(reply) >= opts.reply_tokens:
                out[i] = (prompt + reply, len(prompt))
                del live[seq]
                free.append(seq)
            else:
                reply.append(tok)
                step.append((seq, [tok], 1))
                n += 1
        new = start(free[: len(todo)]) if free and todo else []
        if sum(len(t) for _, t, _ in step + new) <= writer.n_batch:  # the new prompts in the same decode
            step, new = step + new, []
        views = writer.decode_batch(step) if step else []
        rows = {seq: v[-1] for (seq, _, _), v in zip(step, views)}
        if new:  # a prefill of their own, which would overwrite these rows' buffer
            rows = {seq: r.copy() for seq, r in rows.items()}
            rows.update(prefill(writer, [(seq, toks) for seq, toks, _ in new]))
        if on_step is not None:
            on_step(n)
    for seq in range(min(writer.n_seq_max, len(prompts))):
        writer.truncate(seq, 0)
    return out


INVENT_TOKENS = 64  # at most, of a request the writer makes up


def invented_prompts(writer, n: int, opts: LayerOptions, rng: np.random.Generator) -> list[list[int]]:
    """Up to n prompt token lists, each a user request the writer made up (seeds.INVENT, a kind
    of seeds.KINDS on a subject of seeds.TOPICS, both drawn at random), through its chat
    template: prompts beyond the built-in seeds, so the replies cover more than their topics.
    Written as replies are (write_replies, at most INVENT_TOKENS each); a request shorter
    than 12 characters is dropped. None where the writer has no chat template (a base
    model takes no requests)."""
    from specgen.apps.chat import format_for, one_turn
    from specgen.heads.seeds import INVENT, KINDS, TOPICS

    if n <= 0 or not writer.chat_template():
        return []
    fmt = format_for(writer)
    asks = [one_turn(fmt, writer, INVENT.format(kind=KINDS[rng.integers(len(KINDS))], topic=TOPICS[i]))
            for i in rng.integers(0, len(TOPICS), n)]
    out = []
    for sample, start in write_replies(writer, asks, replace(opts, reply_tokens=INVENT_TOKENS), rng):
        text = writer.detokenize(sample[start:]).strip().strip('"').strip()
        if len(text) >= 12:
            out.append(one_turn(fmt, writer, text))
    return out


def read_sample(engine, sample: Sequence[int], start: int):
    """(tokens, picks, hidden float16, keep) of one prompt + reply read through the target in
    one pass, every row out; keep marks the positions whose pick is of the reply."""
    engine.truncate(0, 0)
    picks = np.argmax(engine.decode_batch([(0, sample, len(sample))])[0], axis=1).astype(np.int32)
    hid = np.stack([engine.hidden_at(0, p) for p in range(len(sample))]).astype(np.float16)
    engine.truncate(0, 0)
    return np.asarray(sample, np.int32), picks, hid, np.arange(len(sample)) >= start - 1


def in_chunks(parts, chunk: int):
    """read_sample's arrays laid end to end and cut in chunks: (chunks, chunk[, d]) each."""
    n = sum(len(p[0]) for p in parts) // chunk * chunk
    cut = [np.concatenate([p[j] for p in parts])[:n] for j in range(4)]
    return tuple(x.reshape(n // chunk, chunk, *x.shape[1:]) for x in cut)


def read_replies(engine, samples, chunk: int, on_step=None):
    """(tokens, picks, hidden float16, keep) of shape (chunks, chunk[, d]): the samples read
    through the target one by one (read_sample), laid end to end and cut in chunks."""
    parts = []
    for sample, start in samples:
        parts.append(read_sample(engine, sample, start))
        if on_step is not None:
            on_step(sum(len(p[0]) for p in parts))
    return in_chunks(parts, chunk)


def collect_replies(engine, writer, seeds: Sequence[str], opts: LayerOptions, *, deadline: float, least: int,
                    clock: Callable[[], float] = time.monotonic, on_write=None, on_read=None):
    """Training data from replies, in rounds until `deadline` once it holds `least` positions:
    each round the writer answers 2 x `writers` seed prompts (write_replies), and the target
    reads them (read_sample). Writing and reading take turns, so the data's share of the
    budget holds whatever the two rates are. Returns (read_replies' chunks, replies)."""
    rng = np.random.default_rng(opts.seed)
    prompts = seed_prompts(writer, seeds, rng)
    parts, replies, written = [], 0, 0
    per_round = 2 * max(1, opts.writers)
    while True:
        asks = invented_prompts(writer, round(opts.invent * per_round), opts, rng)
        batch = write_replies(writer, [next(prompts) for _ in range(per_round - len(asks))] + asks, opts, rng,
                              on_step=None if on_write is None else lambda n: on_write(written + n))
        for sample, start in batch:
            parts.append(read_sample(engine, sample, start))
            written, replies = written + len(sample) - start, replies + 1
            if on_read is not None:
                on_read(sum(len(p[0]) for p in parts))
        if clock() >= deadline and sum(len(p[0]) for p in parts) >= least:
            return in_chunks(parts, opts.chunk), replies


DATA_KEYS = ("tokens", "picks", "hidden", "keep")


def data_path(out: Path) -> Path:
    """Where the data a layer was trained on is kept: beside its file, as the heads keep theirs."""
    return out.with_name(out.stem + ".data.npz")


def save_data(path: Path, data, target: str) -> None:
    """(tokens, picks, hidden, keep) of read_replies, atomically (specgen.heads.model.write_npz)."""
    from specgen.heads.model import write_npz

    write_npz(path, dict(zip(DATA_KEYS, data)), {"target": target, "chunk": int(data[0].shape[1])}, "training data")


def load_data(path: Path, target: str, chunk: int):
    """What `save_data` wrote for this target in chunks of `chunk`; None when there is none,
    it is damaged, or of another target or chunk (the run trains on its new data alone then)."""
    import json

    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            data = tuple(z[k] for k in DATA_KEYS)
    except Exception:  # noqa: BLE001 - missing or damaged: nothing earlier to train on
        return None
    return data if meta.get("target") == target and meta.get("chunk") == chunk else None


def resumed_options(old: FeatureLayer, opts: LayerOptions) -> LayerOptions:
    """`opts` with the shapes of the layer being resumed (its window, heads, widths, draft length)."""
    return replace(opts, chunk=old.window + 1, head_dim=old.head_dim, n_heads=old.n_heads,
                   attn=int(old.params["wq"].shape[1]), mlp=old.width, seed=opts.seed + int(old.info.get("runs", 1)))


class LayerTrainer:
    """Adam over the layer's parameters on chunks of (tokens, picks, hidden, keep), from
    `params` where given (a resumed layer's), else small random ones."""

    def __init__(self, data, out: np.ndarray, ids: np.ndarray, embed, opts: LayerOptions, params=None) -> None:
        tokens, picks, hidden, self.keep = data
        self.labelled = np.ones_like(self.keep) if opts.prompt_labels else self.keep
        self.tokens, self.picks, self.hidden, self.out, self.ids, self.embed, self.o = tokens, picks, hidden, out, ids, embed, opts
        self.slot = np.full(int(max(tokens.max(), picks.max(), ids.max())) + 1, -1, np.int64)
        self.slot[ids] = np.arange(len(ids))
        self.rng = np.random.default_rng(opts.seed)
        self.p = ({k: np.array(v, np.float32) for k, v in params.items()} if params is not None
                  else init_params(hidden.shape[2], opts.attn, opts.mlp, self.rng))
        self.m1 = {k: np.zeros_like(v) for k, v in self.p.items()}
        self.m2 = {k: np.zeros_like(v) for k, v in self.p.items()}
        t = tokens.shape[1] - 1
        self.mask, self.pos = causal_mask(t), np.arange(t)[None].repeat(opts.batch, 0)
        if opts.ttt:
            self.mask2, self.pos2 = second_step_mask(t), np.tile(self.pos, 2)
        self.noise = 0.05 * float(np.sqrt(np.mean(hidden[:4].astype(np.float32) ** 2)))  # EAGLE's feature noise
        self.steps = 0

    def step(self, chunks: np.ndarray) -> float:
        h = self.hidden[chunks, :-1].astype(np.float32)
        h += self.rng.standard_normal(h.shape).astype(np.float32) * self.noise
        labels = np.where(self.labelled[chunks, 1:], self.slot[self.picks[chunks, 1:]], -1)
        e, target, pos, mask = self.embed(self.tokens[chunks, 1:]), self.hidden[chunks, 1:].astype(np.float32), \
            self.pos[:len(chunks)], self.mask
        if self.o.ttt:  # the true positions, then each again reading the layer's own feature from the one before
            f, _ = forward(self.p, h, e, pos, self.o.head_dim, mask)
            h = np.concatenate([h, np.concatenate([h[:, :1], f[:, :-1]], axis=1)], axis=1)
            e, target, labels = (np.concatenate([x, x], axis=1) for x in (e, target, labels))
            pos, mask = self.pos2[:len(chunks)], self.mask2
        loss, g, _ = loss_and_grads(self.p, h, e, pos, target, labels, self.out, head_dim=self.o.head_dim, mask=mask,
                                    soft=self.o.soft)
        self.steps += 1
        lr, b1, b2, t = self.o.lr * min(1.0, self.steps / 50), 0.9, 0.98, self.steps
        for k in PARAMS:
            self.m1[k] = b1 * self.m1[k] + (1 - b1) * g[k]
            self.m2[k] = b2 * self.m2[k] + (1 - b2) * g[k] ** 2
            upd = lr * (self.m1[k] / (1 - b1 ** t)) / (np.sqrt(self.m2[k] / (1 - b2 ** t)) + 1e-8)
            if self.o.weight_decay and self.p[k].ndim == 2:
                upd += lr * self.o.weight_decay * self.p[k]
            self.p[k] -= upd.astype(np.float32)
        return loss

    def hits(self, c: int, step2: bool = True) -> tuple[list, list]:
        """Top-1 hits of chunk c at its reply positions: step 1 (true features), and step 2
        (its own feature and token) at every position where step 1 hit."""
        return layer_hits(self.p, self.out, self.ids, self.o.head_dim, self.hidden[c].astype(np.float32),
                          self.embed(self.tokens[c]), self.picks[c], np.flatnonzero(self.keep[c, 1:-1]),
                          self.tokens[c] if step2 else None)


def second_step_mask(t: int) -> np.ndarray:
    """(2t, 2t): the first t positions causal among themselves; position t + j (draft
    step 2 at j: it reads the layer's own feature from j - 1) sees the true positions
    before j and itself, as a drafting round's second position sees the cache and
    itself (EAGLE-3's training-time test, one step)."""
    m = np.full((2 * t, 2 * t), -np.inf)
    m[:t, :t] = causal_mask(t)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    m[t:, :t] = np.where(j < i, 0.0, -np.inf)
    m[np.arange(t, 2 * t), np.arange(t, 2 * t)] = 0.0
    return m


def layer_hits(p, out, ids, head_dim, hidden, embs, picks, rows, step2_tokens=None) -> tuple[list, list]:
    """Step-1 hits at `rows` of one sequence (row j reads h_j and e(token j+1) and predicts
    picks[j + 1]) and, where `step2_tokens` (the text) went on with the step-1 token,
    step-2 hits from the layer's own feature: row j + 1 reading f_j and e(token j+2) over
    the true rows up to j, as a drafting round's second position does; every such row
    in one pass over the sequence twice (second_step_mask)."""
    t = len(hidden) - 1
    pos = np.arange(t)[None]
    f, _ = forward(p, hidden[None, :-1], embs[None, 1:], pos, head_dim, causal_mask(t))
    first = ids[(f[0] @ out.T).argmax(-1)]
    hits1 = first[rows] == picks[rows + 1]
    hits2 = []
    if step2_tokens is not None:
        js = np.array([j for j in rows[hits1] if j + 2 <= t and step2_tokens[j + 2] == first[j]], np.int64)
        if len(js):
            h2 = np.concatenate([hidden[None, :-1], np.concatenate([hidden[None, :1], f[:, :-1]], axis=1)], axis=1)
            g, _ = forward(p, h2, np.concatenate([embs[None, 1:]] * 2, axis=1), np.tile(pos, 2), head_dim,
                           second_step_mask(t))
            second = ids[(g[0, t + js + 1] @ out.T).argmax(-1)]
            hits2 = list(second == picks[js + 2])
    return list(hits1), hits2


def fit_layer(trainer: LayerTrainer, train_ix: np.ndarray, held_ix: np.ndarray, *, deadline: float,
              clock: Callable[[], float] = time.monotonic, on_step=None) -> tuple[dict, float, bool]:
    """Steps until `deadline` (or max_steps, or Ctrl-C), a held-out check every check_every
    steps (step-1 top-1 of up to 4 held-out chunks); returns the best check's parameters,
    its top-1 and whether training was interrupted."""
    best, best_p, interrupted, loss = -1.0, None, False, float("nan")
    check = held_ix[:4]
    try:
        while trainer.steps == 0 or clock() < deadline:
            if trainer.o.max_steps is not None and trainer.steps >= trainer.o.max_steps:
                break
            loss = trainer.step(trainer.rng.choice(train_ix, min(trainer.o.batch, len(train_ix)), replace=False))
            if len(check) and trainer.steps % trainer.o.check_every == 0:
                score = float(np.mean([x for c in check for x in trainer.hits(int(c), step2=False)[0]] or [0.0]))
                if score > best:
                    best, best_p = score, {k: v.copy() for k, v in trainer.p.items()}
            if on_step is not None:
                on_step(trainer.steps, loss, best)
    except KeyboardInterrupt:
        interrupted = True
    if best_p is None or not len(check):
        return trainer.p, best, interrupted
    score = float(np.mean([x for c in check for x in trainer.hits(int(c), step2=False)[0]] or [0.0]))
    return (trainer.p, score, interrupted) if score >= best else (best_p, best, interrupted)


def train_layer(engine, model_path, opts: LayerOptions, *, writer=None, seeds: Sequence[str] = (),
                out: Path | None = None, resume: bool = False, on_progress=None,
                clock: Callable[[], float] = time.monotonic) -> dict:
    """Train (with `resume`, continue) a layer for the target `engine` (opened with hidden=True,
    from `model_path`), on replies written by `writer` (an engine of the same vocabulary;
    None: the target), to the `seeds` (default: the built-in seed prompts); save it to
    `out` (default: the heads file of the target). Returns what it measured."""
    from specgen.heads.collect import output_rows
    from specgen.heads.fit import Progress
    from specgen.heads.layer import load_any
    from specgen.heads.model import heads_path, target_identity
    from specgen.heads.seeds import builtin_seeds

    check_layer_options(opts)
    t0, budget = clock(), opts.minutes * 60.0
    identity = target_identity(model_path)
    out = Path(out) if out is not None else heads_path(identity)
    old = load_any(out, identity) if resume else None
    if old is not None and old.kind != FeatureLayer.kind:
        raise SpecgenError(f"{out} holds {old.kind} heads, not a layer: --resume continues the kind it holds")
    opts = resumed_options(old, opts) if old is not None else opts
    earlier = load_data(data_path(out), identity, opts.chunk) if old is not None else None
    output_rows(model_path)  # refuse an unreadable output matrix before spending time on data
    report = on_progress or (lambda p: None)
    if seeds:  # the user's own passages: a layer for their text, not for made-up requests on other subjects
        opts = replace(opts, invent=0.0)
    seeds = list(seeds) or [t for _, t in builtin_seeds()]
    data, n_replies = collect_replies(
        engine, writer or engine, seeds, opts, deadline=t0 + budget * opts.data_share,
        least=opts.min_chunks * opts.chunk if earlier is None else 0, clock=clock,
        on_write=lambda n: report(Progress("replies", clock() - t0, budget, n)),
        on_read=lambda n: report(Progress("reading", clock() - t0, budget, n)))
    if earlier is not None:  # the earlier chunks first: the same ones stay held out
        data = tuple(np.concatenate([a, b]) for a, b in zip(earlier, data))
    save_data(data_path(out), data, identity)
    tokens, picks, _, keep = data
    held = np.arange(len(tokens)) % 10 == 9
    vals, counts = np.unique(picks[~held, 1:][keep[~held, 1:]], return_counts=True)
    ids = old.ids if old is not None else vals[np.argsort(-counts)[:opts.vocab]].astype(np.int32)
    if not len(ids):
        raise SpecgenError("too little training data (no reply positions to learn from): raise --minutes")
    rows: dict = {}
    trainer = LayerTrainer(data, output_rows(model_path, ids), ids, lambda t: embed_rows(model_path, t, rows), opts,
                           params=old.params if old is not None else None)
    n_pos = int(keep.sum())
    # training keeps at least TRAIN_FLOOR of the budget where the data ran past its share
    deadline = max(t0 + budget, clock() + TRAIN_FLOOR * budget)
    params, score, interrupted = fit_layer(
        trainer, np.flatnonzero(~held), np.flatnonzero(held), deadline=deadline, clock=clock,
        on_step=lambda s, loss, best: report(Progress("train", clock() - t0, budget, n_pos, s, loss, [best])))
    trainer.p = params
    h1, h2 = [], []
    for c in np.flatnonzero(held):
        a, b = trainer.hits(int(c))
        h1, h2 = h1 + a, h2 + b
    top1 = [float(np.mean(h1)) if h1 else None, float(np.mean(h2)) if h2 else None]
    covered = float(np.isin(picks[keep], ids).mean())
    prev = old.info if old is not None else {}
    info = {"heldout": {"top1": top1, "positions": len(h1)}, "replies": n_replies + prev.get("replies", 0),
            "positions": n_pos, "steps": trainer.steps,  # a file from before runs were counted: one run of "steps"
            "total_steps": trainer.steps + prev.get("total_steps", prev.get("steps", 0)),
            "runs": prev.get("runs", 1 if old is not None else 0) + 1, "covered": round(covered, 4),
            "writer": "draft" if writer is not None else "target"}
    layer = FeatureLayer(params, ids, trainer.out, engine.n_vocab, identity, head_dim=opts.head_dim,
                         window=opts.chunk - 1, n_heads=opts.n_heads, info=info)
    layer.save(out)
    return {"path": str(out), "target": identity, "kind": "layer", "n_heads": opts.n_heads, "vocab": len(ids),
            **info, "interrupted": interrupted, "seconds": round(clock() - t0, 2), "resumed": old is not None}
