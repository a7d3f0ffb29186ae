"""`specgen heads train`, the whole command short of printing: collect the target's own text, choose
the vocabulary, train within a time budget, measure on held-out prompts, save.

The budget (`minutes`) covers everything after the model is open: data collection
takes `data_share` of it, training the rest. Ctrl-C while training stops at the
next minibatch and saves what is trained; before training starts it aborts.
Progress goes to a callback; nothing here prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specgen.errors import SpecgenError
from specgen.heads.collect import (
    collect,
    collect_text,
    output_rows,
    prompt_tokens,
    seeds_from_files,
    text_chunks,
    text_prefix,
)
from specgen.heads.model import (
    KINDS,
    Heads,
    heads_path,
    load_heads,
    save_heads,
    target_identity,
    time_heads,
)
from specgen.heads.seeds import builtin_seeds, library_text
from specgen.heads.train import (
    Samples,
    Trainer,
    batches,
    choose_vocab,
    evaluate,
    init_heads,
    load_samples,
    save_samples,
)
from specgen.rules.sampling import SamplingParams


@dataclass
class TrainOptions:
    kind: str = "hydra"
    n_heads: int = 4
    vocab: int = 2048  # restricted vocabulary cap: 4 heads stay near 1 ms a round (docs/notes/2026-12-02-heads-training.md)
    width: int = 128  # each head's hidden width
    minutes: float = 15.0
    data_share: float = 0.75  # training peaks within a minute or two: the rest of the budget buys data
    batch: int = 256
    lr: float = 2e-3
    weight_decay: float = 0.0  # AdamW's, on the heads' matrices
    check_every: int = 50  # minibatches between held-out checks (the best check's weights are kept)
    check_rows: int = 1024  # held-out rows a check scores
    text_share: float = 0.0  # of the data time: teacher-forced passes over text (the rest: generation); off:
    #                          the same minutes of generation trained better heads (docs/notes/2026-12-02-heads-text.md)
    text_tokens: int = 256  # rows of one teacher-forced pass
    round_share: float = 0.10  # the vocabulary is cut until a round of every head costs at most this share of a
    #                            one-row target pass (timed at the start of training); 0: --vocab alone
    n_seq: int = 16  # sequences generated at once
    gen_tokens: int = 160  # tokens generated per seed
    prompt_tokens: int = 192  # a seed's last tokens kept
    kick: float = 0.1  # chance of a sampled (not greedy) token while generating
    max_examples: int | None = None  # stop collecting after this many (tests)
    max_steps: int | None = None  # stop training after this many minibatches (tests)
    seed: int = 0


@dataclass
class Progress:
    phase: str  # "data" | "train"
    elapsed_s: float
    budget_s: float
    examples: int
    steps: int = 0
    loss: float | None = None
    top1: list = field(default_factory=list)  # per head, over the recent minibatches


@dataclass
class Summary:
    path: str
    target: str
    kind: str
    n_heads: int
    vocab: int
    covered: float
    examples: int
    held_out: int
    steps: int
    seconds: float
    examples_per_s: float
    tokens_per_min: float
    heldout: dict
    interrupted: bool
    resumed: bool
    text_examples: int = 0  # of `examples`, those read teacher-forced from text
    timing: dict | None = None  # the round-time bound's figures (heads_round_ms, target_pass_ms, round_share)

    def as_dict(self) -> dict:
        return asdict(self)


def check_options(o: TrainOptions) -> None:
    if o.kind not in KINDS:
        raise SpecgenError(f"--kind must be one of {', '.join(KINDS)}, not {o.kind!r}")
    if not 1 <= o.n_heads <= 8:
        raise SpecgenError("--n-heads must be between 1 and 8")
    if o.vocab < 16 or o.width < 1 or o.minutes <= 0 or o.batch < 1 or o.n_seq < 1:
        raise SpecgenError("--vocab >= 16, --width >= 1, --minutes > 0, --batch >= 1 and --seqs >= 1, please")
    if not 0 <= o.text_share <= 1 or not 0 <= o.round_share <= 1:
        raise SpecgenError("--text-share and --round-share must be between 0 and 1")
    if o.text_tokens < 8:
        raise SpecgenError("text_tokens must be at least 8")


def open_target(path, opts: TrainOptions, n_threads: int | None = None):
    """The target with hidden rows on, room for opts.n_seq sequences of a prompt and its continuation."""
    from specgen.engine.llama import Engine

    n_ctx = max(opts.n_seq * (opts.prompt_tokens + opts.gen_tokens + 8), opts.text_tokens + 64)
    return Engine(path, n_ctx=n_ctx, n_threads=n_threads, n_seq_max=opts.n_seq, kv_unified=True, hidden=True,
                  n_batch=max(512, opts.text_tokens))


def split_prompts(engine, seeds: Sequence[tuple[str, str]], opts: TrainOptions, rng):
    """(prompts (group, tokens, held out?), group names): every fifth seed of each group is held out
    (fixed by position, so resumed runs hold out the same); a group of fewer than two seeds holds
    none out and `held_rows` splits its examples instead."""
    from specgen.apps.chat import format_for

    fmt = format_for(engine) if engine.chat_template() else None
    groups = sorted({g for g, _ in seeds})
    held = held_out(seeds)
    prompts = []
    for gi, g in enumerate(groups):
        for text in [t for sg, t in seeds if sg == g]:
            toks = prompt_tokens(engine, text, fmt, opts.prompt_tokens)
            if toks:
                prompts.append((gi, toks, text in held))
    if not prompts:
        raise SpecgenError("no seed prompt has any tokens")
    train = [prompts[i] for i in rng.permutation(len(prompts)) if not prompts[i][2]]
    held = [prompts[i] for i in rng.permutation(len(prompts)) if prompts[i][2]]
    mixed = []  # one held-out prompt after every four training ones, so a short run has both
    while train or held:
        mixed += train[:4] + held[:1]
        train, held = train[4:], held[1:]
    return mixed, groups


def held_out(seeds: Sequence[tuple[str, str]]) -> set[str]:
    """The seeds held out: every fifth of each group, by position (a group of fewer than two holds none out)."""
    by_group: dict[str, list[str]] = {}
    for g, text in seeds:
        by_group.setdefault(g, []).append(text)
    return {text for texts in by_group.values() if len(texts) >= 2
            for j, text in enumerate(texts) if j % 5 == min(4, len(texts) - 1)}


def forced_corpus(texts: Sequence, seeds: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The text read teacher-forced: the given files' passages (the seeds), else the library's text;
    never a text that begins with a held-out seed, so the held-out check stays unseen."""
    corpus = list(seeds) if texts else library_text()
    held = held_out(seeds)
    return [(g, t) for g, t in corpus if not any(t.strip().startswith(h) for h in held)]


def vocab_for_time(engine, opts: TrainOptions, n_labels: int) -> tuple[int, float, float]:
    """(vocabulary size, one-row target pass s, heads round s at that size): the largest size, at most
    min(opts.vocab, n_labels), whose round of opts.n_heads heads (random weights) costs at most
    opts.round_share of a one-row pass of `engine` (the median of a few, on a spare sequence), each
    round timed right after a target pass (`_round_after_pass`), as the loop meets it."""
    cap = max(min(opts.vocab, n_labels), 1)
    pass_s = _time_passes(engine)
    rng = np.random.default_rng(0)
    d = engine.n_embd
    size = cap
    while True:
        h = init_heads(opts.kind, opts.n_heads, np.arange(size), rng.standard_normal((size, d)).astype(np.float32),
                  max(engine.n_vocab, size), "timing", opts.width, 1.0)
        round_s = _round_after_pass(engine, h)
        if opts.round_share <= 0 or round_s <= opts.round_share * pass_s or size <= 64:
            return size, pass_s, round_s
        size = max(64, int(size * 0.8))


def _time_passes(engine, n: int = 9, between=None, rows: int = 1) -> float:
    """The median of n passes of `rows` rows on a spare sequence after the same 8 tokens (one
    row: a plain step); `between()` runs after each, untimed here."""
    seq = engine.n_seq_max - 1
    engine.truncate(seq, 0)
    engine.decode_batch([(seq, [1] * 8, 1)])
    times = []
    for _ in range(n):
        engine.truncate(seq, 8)
        t = time.perf_counter()
        engine.decode_batch([(seq, [1] * rows, rows)])
        times.append(time.perf_counter() - t)
        if between is not None:
            between()
    engine.truncate(seq, 0)
    return float(np.median(times))


# A round of every head is timed as the loop's dearest: sampled (each pick filtered and
# drawn, q kept), after the verify pass of a round of every head (more rows evict more).
TIMED_PICKS = SamplingParams(temperature=0.8)


def _round_after_pass(engine, heads, n: int = 7) -> float:
    """The median of n rounds of every head, each right after a target pass of n_heads + 1
    rows: the pass evicts the heads' weights and output rows from the caches, as the loop's
    verify pass does, where a round costs more than `time_heads`'s warm figure; the picks
    sampled (docs/notes/2026-12-03-heads-round-bound.md)."""
    rounds: list[float] = []
    _time_passes(engine, n, rows=heads.n_heads + 1, between=lambda: rounds.append(
        time_heads(heads, engine.n_embd, repeats=1, params=TIMED_PICKS) * heads.n_heads))
    return float(np.median(rounds))


def held_rows(train: Samples, held: Samples, share: float = 0.2) -> tuple[Samples, Samples]:
    """Without held-out prompts (one seed per group), the last `share` of the training rows."""
    if len(held) or len(train) < 5:
        return train, held
    cut = int(len(train) * (1 - share))
    return train.take(np.arange(cut)), train.take(np.arange(cut, len(train)))


class _Notes:
    """Progress reports to `report`, at most one each half second."""

    def __init__(self, report: Callable[[Progress], None] | None, clock: Callable[[], float], t0: float,
                 budget: float) -> None:
        self.report, self.clock, self.t0, self.budget = report or (lambda p: None), clock, t0, budget
        self.last = 0.0

    def due(self) -> float | None:
        """The time now if a report is due (it counts as sent), else None."""
        now = self.clock()
        if now - self.last <= 0.5:
            return None
        self.last = now
        return now

    def send(self, stage: str, now: float, *figures) -> None:
        self.report(Progress(stage, now - self.t0, self.budget, *figures))


def train_heads(engine, model_path, opts: TrainOptions, *, texts: Sequence = (), out: Path | None = None,
                resume: bool = False, on_progress: Callable[[Progress], None] | None = None,
                clock: Callable[[], float] = time.monotonic) -> Summary:
    """Train (or with `resume`, continue) heads for the target `engine` runs (from `model_path`)."""
    check_options(opts)
    t0 = clock()
    budget = opts.minutes * 60.0
    identity = target_identity(model_path)
    out = Path(out) if out is not None else heads_path(identity)
    old = load_heads(out, identity) if resume else None
    if old is not None:
        opts = TrainOptions(**{**asdict(opts), "kind": old.kind, "n_heads": old.n_heads, "width": old.width})
    output_rows(model_path)  # refuse an unreadable output matrix before spending time on data
    seeds = seeds_from_files(texts) if texts else builtin_seeds()
    rng = np.random.default_rng(opts.seed + (int(old.info.get("runs", 0)) if old else 0))
    prompts, groups = split_prompts(engine, seeds, opts, rng)
    corpus = forced_corpus(texts, seeds) if opts.text_share > 0 else []
    groups = groups + sorted({g for g, _ in corpus} - set(groups))
    notes = _Notes(on_progress, clock, t0, budget)

    t_data = clock()
    train, held, n_forced = _gather(engine, opts, prompts, groups, corpus, rng, notes,
                                    start=t_data, end=t0 + budget * opts.data_share)
    tokens_per_min = (len(train) + len(held)) / max(clock() - t_data, 1e-9) * 60.0
    store = out.with_name(out.stem + ".data.npz")
    earlier = load_samples(store, identity, opts.n_heads, groups) if old is not None else None
    if earlier is not None:  # resume: the data of earlier runs too
        train, held = _join(earlier[0], train), _join(earlier[1], held)
    save_samples(train, held, store, identity)
    train, held = held_rows(train, held)
    if len(train) < 2:
        raise SpecgenError(f"too little training data ({len(train)} examples): raise --minutes")
    heads, h_rms, timing = _start_heads(engine, model_path, opts, identity, train, old)
    covered = _covered(heads, train)
    trainer = Trainer(heads, h_rms, lr=opts.lr, weight_decay=opts.weight_decay)
    best = _Best(trainer, held.take(rng.permutation(len(held))[: opts.check_rows]) if len(held) else None)
    t_train = clock()
    steps, interrupted = _fit(trainer, best, train, opts, rng, notes, deadline=t0 + budget)
    train_s = max(clock() - t_train, 1e-9)
    result = evaluate(trainer, held) if len(held) else {"top1": [], "per_group": {}, "examples": 0}
    prev = old.info if old else {}
    info = {"examples": len(train), "held_out": len(held), "covered": covered,
            "heldout": result, "steps": int(prev.get("steps", 0)) + steps, "runs": int(prev.get("runs", 0)) + 1,
            "seeds": "files" if texts else "built-in", "groups": groups, "width": heads.width,
            "best_step": int(prev.get("steps", 0)) + (best.step if best.params is not None else steps),
            "weight_decay": opts.weight_decay, "text_examples": n_forced + int(prev.get("text_examples", 0)),
            "timing": timing or prev.get("timing"),
            "tokens_per_min": round(tokens_per_min, 1)}
    trained = trainer.to_heads(info)
    save_heads(trained, out)
    return Summary(str(out), identity, trained.kind, trained.n_heads, len(trained.ids), covered, len(train),
                   len(held), steps, round(clock() - t0, 2), round(steps * min(opts.batch, len(train)) / train_s, 1),
                   round(tokens_per_min, 1), result, interrupted, old is not None,
                   text_examples=int(info["text_examples"]), timing=info["timing"])


def _gather(engine, opts: TrainOptions, prompts, groups, corpus, rng, notes: _Notes, *, start: float, end: float):
    """The examples of this run: teacher-forced text first (its share of the data
    time), then the target's own continuations until `end`. Returns (train, held,
    the teacher-forced count)."""
    def data_step(made: int) -> None:
        now = notes.due()
        if now is not None:
            notes.send("data", now, made)

    forced, n_forced = None, 0
    if corpus:
        chunks = text_chunks(engine, [(groups.index(g), t) for g, t in corpus], opts.text_tokens,
                             text_prefix(engine), rng)
        cap = None if opts.max_examples is None else int(opts.max_examples * opts.text_share)
        forced = collect_text(engine, chunks, groups, opts.n_heads, picked_only=opts.kind == "medusa",
                              max_examples=cap, on_step=data_step,
                              deadline=start + (end - start) * opts.text_share)
        n_forced = len(forced)
    rest = None if opts.max_examples is None else max(opts.max_examples - n_forced, 1)
    train, held = collect(engine, prompts, groups, opts.n_heads, gen_tokens=opts.gen_tokens,
                          deadline=end, rng=rng, kick=opts.kick, max_examples=rest,
                          on_step=lambda made: data_step(n_forced + made))
    if n_forced:
        train = _join(forced, train)
    return train, held, n_forced


def _start_heads(engine, model_path, opts: TrainOptions, identity, train, old):
    """Fresh heads over the vocabulary the time budget allows (and that budget's
    timing), or the resumed ones. Returns (heads, hidden RMS, timing or None)."""
    if old is not None:
        return old, float(old.info.get("h_rms", 1.0)), None
    lab = train.tokens[:, 1:]
    size, pass_s, round_s = vocab_for_time(engine, opts, len(np.unique(lab[lab >= 0])))
    timing = {"target_pass_ms": round(1000 * pass_s, 4), "heads_round_ms": round(1000 * round_s, 4),
              "round_share": opts.round_share}
    ids, _ = choose_vocab(lab, size)
    h_rms = float(np.sqrt(np.mean(train.hidden.astype(np.float64) ** 2)))
    heads = init_heads(opts.kind, opts.n_heads, ids, output_rows(model_path, ids), engine.n_vocab,
                       identity, opts.width, h_rms, seed=opts.seed)
    return heads, h_rms, timing


def _fit(trainer, best, train, opts: TrainOptions, rng, notes: _Notes, *, deadline: float) -> tuple[int, bool]:
    """Minibatch steps until `deadline` (or max_steps, or Ctrl-C), checking the
    held-out rows every check_every steps; the best state is kept. Returns
    (steps, interrupted)."""
    steps, interrupted, recent = 0, False, []
    try:
        for rows in batches(len(train), min(opts.batch, len(train)), rng):
            if notes.clock() >= deadline or (opts.max_steps is not None and steps >= opts.max_steps):
                break
            loss, top1 = trainer.step(train.hidden[rows], train.tokens[rows])
            steps += 1
            if steps % opts.check_every == 0:
                best.check(steps)
            recent = (recent + [(loss, top1)])[-20:]
            now = notes.due()
            if now is not None:
                notes.send("train", now, len(train), steps, *_recent(recent))
    except KeyboardInterrupt:
        interrupted = True
    best.check(steps)
    best.keep()
    return steps, interrupted


class _Best:
    """Early stopping without stopping: held-out top-1 (heads weighted as the loss weights them) at
    each check; `keep` puts back the best check's weights. Without held-out rows the last weights stay."""

    def __init__(self, trainer: Trainer, rows: Samples | None) -> None:
        self.trainer, self.rows = trainer, rows
        self.score, self.params, self.step = -1.0, None, 0

    def check(self, step: int) -> None:
        if self.rows is None or not len(self.rows) or step == self.step and self.params is not None:
            return
        _, top1, _ = self.trainer.loss_and_grads(self.rows.hidden, self.rows.tokens, grads=False)
        w = self.trainer.weights
        score = sum(wi * hit / max(n, 1) for wi, (hit, n) in zip(w, top1)) / sum(w)
        if score > self.score:
            self.score, self.params, self.step = score, self.trainer.snapshot(), step

    def keep(self) -> None:
        if self.params is not None:
            self.trainer.restore(self.params)


def _join(a: Samples, b: Samples) -> Samples:
    return Samples(np.concatenate([a.hidden, b.hidden]), np.concatenate([a.tokens, b.tokens]),
                   np.concatenate([a.group, b.group]), b.groups)


def _covered(heads: Heads, data: Samples) -> float:
    lab = data.tokens[:, 1:]
    lab = lab[lab >= 0]
    return round(float((heads.slots(lab) >= 0).mean()), 4) if len(lab) else 0.0


def _recent(recent: list) -> tuple[float, list]:
    loss = float(np.mean([r[0] for r in recent]))
    k = len(recent[0][1])
    top1 = [sum(r[1][i][0] for r in recent) / max(sum(r[1][i][1] for r in recent), 1) for i in range(k)]
    return loss, top1
