"""Can a feature-level draft layer (EAGLE-style, specgen/heads/layer.py) trained in numpy
on 2 cores predict the real target's next token, and how does it stand beside the
0.5B draft model? (issue 41's first question, before the layer drafts.)

    python benchmarks/feature_layer.py --f16 --collect-minutes 8 --train-minutes 10 --save layer.npz

1. Collect (--source): `replies` (the default): the 0.5B draft model's replies,
   sampled at temperature 0.8, to the built-in seed prompts (specgen.heads.seeds)
   through the chat template for --collect-minutes, then each read through the
   target in one pass; every position is labelled (reply positions only with
   --reply-labels-only), reply positions checked. `library`:
   teacher-forced chunks of the library text (the Python reference and the
   standard library's source, `specgen.heads.seeds.library_text`) after the chat
   template's one turn. Either way, per position the target's final hidden state
   and its argmax.
2. Train the layer (Adam, the hand-written gradients, feature noise as EAGLE's)
   for --train-minutes: at position j it reads h_j and the embedding of the
   text's token j+1 and predicts h_{j+1}, read out through the target's output
   matrix restricted to the --vocab most frequent labels.
3. Report top-1 against the target's argmax: held-out chunks of the same text
   (step 1: the true features; step 2: its own predicted feature and token),
   and the target's greedy replies to the instruct requests
   (benchmarks/prompts/instruct.jsonl), the 0.5B draft's agreement beside it.

Results are the layer's accuracy, not speed; `--save` writes the trained layer as
a heads file (kind layer) that `--heads FILE` drafts with.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from real_pair import models

HERE = Path(__file__).resolve().parent
INSTRUCT = HERE / "prompts" / "instruct.jsonl"


def collect(engine, minutes: float, chunk: int, seed: int):
    """(tokens (N, T), picks (N, T), hidden (N, T, d) float16) of whole chunks until the budget ends."""
    from specgen.heads.collect import text_chunks, text_prefix
    from specgen.heads.seeds import library_text

    texts = [(0, t) for _, t in library_text()]
    toks_all, picks_all, hid_all = [], [], []
    t0 = time.monotonic()
    for _, toks in text_chunks(engine, texts, chunk, text_prefix(engine), np.random.default_rng(seed)):
        if len(toks) < chunk:
            continue
        engine.truncate(0, 0)
        picks_all.append(np.argmax(engine.decode_batch([(0, toks, len(toks))])[0], axis=1).astype(np.int32))
        hid_all.append(np.stack([engine.hidden_at(0, p) for p in range(len(toks))]).astype(np.float16))
        toks_all.append(np.asarray(toks, np.int32))
        if time.monotonic() - t0 > minutes * 60 and len(toks_all) >= 2:
            break
    engine.truncate(0, 0)
    n = sum(map(len, toks_all))
    print(f"collected {len(toks_all)} chunks, {n} positions in {time.monotonic() - t0:.0f} s "
          f"({n / (time.monotonic() - t0):.0f} tok/s)", flush=True)
    tokens = np.stack(toks_all)
    return tokens, np.stack(picks_all), np.stack(hid_all), np.ones(tokens.shape, bool)


def layer_options(a):
    from specgen.heads.layer_fit import LayerOptions

    return LayerOptions(minutes=a.collect_minutes + a.train_minutes, reply_tokens=a.reply_tokens, chunk=a.chunk,
                        vocab=a.vocab, attn=a.attn, head_dim=a.head_dim, mlp=a.mlp, batch=a.batch, lr=a.lr,
                        seed=a.seed, writers=a.writers, ttt=a.ttt, soft=a.soft, weight_decay=a.weight_decay,
                        max_steps=a.steps, prompt_labels=not a.reply_labels_only)


def draft_replies(draft: str, a):
    """The 0.5B's replies to the built-in seed prompts (specgen.heads.layer_fit.write_replies,
    --writers at once) for --collect-minutes."""
    from specgen.engine.llama import Engine
    from specgen.heads.layer_fit import seed_prompts, write_replies
    from specgen.heads.seeds import builtin_seeds

    t0, out, o = time.monotonic(), [], layer_options(a)
    rng = np.random.default_rng(a.seed)
    with Engine(draft, n_ctx=1024 * a.writers, n_seq_max=a.writers, kv_unified=True, n_threads=a.threads) as writer:
        prompts = seed_prompts(writer, [t for _, t in builtin_seeds()], rng)
        while time.monotonic() < t0 + a.collect_minutes * 60 or sum(len(t) - s for t, s in out) < 2 * a.chunk:
            out += write_replies(writer, [next(prompts) for _ in range(2 * a.writers)], o, rng)
    print(f"the draft replied to {len(out)} seed prompts ({a.writers} at once): {sum(len(t) - s for t, s in out)} "
          f"tokens in {time.monotonic() - t0:.0f} s", flush=True)
    return out


def train(data, out, ids, embed, a, train_ix, held_ix):
    """The layer trained for --train-minutes (specgen.heads.layer_fit), the best held-out check's weights."""
    from specgen.heads.layer_fit import LayerTrainer, fit_layer

    trainer = LayerTrainer(data, out, ids, embed, layer_options(a))
    t0 = time.monotonic()

    def step(s, loss, best):
        if s % 50 == 0:
            print(f"  step {s}, {time.monotonic() - t0:.0f} s: loss {loss:.3f}, best held-out check {best:.3f}", flush=True)

    params, _, _ = fit_layer(trainer, train_ix, held_ix, deadline=t0 + a.train_minutes * 60, on_step=step)
    print(f"trained {trainer.steps} steps of {a.batch} x {a.chunk - 1} positions in {time.monotonic() - t0:.0f} s",
          flush=True)
    trainer.p = params
    return trainer


def replies(target: str, limit: int | None, n: int, threads: int, requests: Path = INSTRUCT):
    """(id, prompt tokens, the target's greedy reply) for each instruct request."""
    from specgen.bench.requests import load_requests, request_tokens
    from specgen.session import ModelOptions, open_session

    out = []
    with open_session(ModelOptions(model=target, threads=threads, no_spec=True)) as s:
        for r in load_requests(requests)[:limit]:
            toks = request_tokens(s.target, r)
            gen = s.generate(toks, max_tokens=n)
            list(gen)
            out.append((r.id, toks, list(gen.tokens)))
            s.target.truncate(0, 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--f16", action="store_true", help="an F16 copy of the target (where a layer would pay)")
    ap.add_argument("--source", choices=("library", "replies"), default="replies",
                    help="training text: the library's, teacher-forced; or the draft model's sampled replies "
                         "to the built-in seed prompts (--collect-minutes of generating), read by the target")
    ap.add_argument("--collect-minutes", type=float, default=9.0)
    ap.add_argument("--reply-tokens", type=int, default=256, help="at most this many tokens of each draft reply")
    ap.add_argument("--writers", type=int, default=16, help="draft replies written at once (1: one after another)")
    ap.add_argument("--train-minutes", type=float, default=12.0)
    ap.add_argument("--chunk", type=int, default=256, help="positions per teacher-forced chunk")
    ap.add_argument("--vocab", type=int, default=4096, help="readout rows: the most frequent training labels")
    ap.add_argument("--attn", type=int, default=256, help="attention width (heads of --head-dim)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--mlp", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4, help="chunks per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ttt", action="store_true", help="training-time test: also train draft step 2 on the layer's "
                    "own features (about 2.5x the time a step)")
    ap.add_argument("--soft", type=float, default=0.0, help="the share of each label that is the target's "
                    "distribution over the readout (EAGLE's soft labels), the rest its argmax")
    ap.add_argument("--reply-labels-only", action="store_true", help="train on reply positions only (the default "
                    "trains on the prompts' positions too, which are read anyway)")
    ap.add_argument("--weight-decay", type=float, default=0.0, help="decoupled weight decay (AdamW) on the matrices")
    ap.add_argument("--steps", type=int, default=None, help="stop training after this many steps (an A/B at equal "
                    "steps), or at --train-minutes")
    ap.add_argument("--data", type=Path, default=None, help="keep the collected data in this .npz: read it where it "
                    "exists instead of collecting (the same data for several training runs)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N instruct requests")
    ap.add_argument("--requests", type=Path, default=INSTRUCT, help="the instruct requests the target answers for the "
                    "held-out checks (default: prompts/instruct.jsonl; prompts/open.jsonl: none of them the seeds' topics)")
    ap.add_argument("-n", type=int, default=96, help="tokens of each greedy reply")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, default=None, help="write the trained layer to this heads file (kind layer)")
    ap.add_argument("--load", type=Path, default=None, help="skip collecting and training: evaluate this layer file")
    a = ap.parse_args()
    if a.attn % a.head_dim or a.head_dim % 2:
        sys.exit("feature_layer: --attn must be a multiple of --head-dim, and --head-dim even")

    from specgen.engine.llama import Engine

    target, draft = models(a.f16)
    print(f"target {Path(target).name} · draft {Path(draft).name} · {a.threads} threads", flush=True)
    with Engine(target, n_ctx=max(a.chunk, 1024) + 64, n_threads=a.threads, hidden=True,
                n_batch=max(a.chunk, 512)) as eng:
        layer = loaded(a.load, target) if a.load else trained(eng, target, draft, a)
        seqs = replies(target, a.limit, a.n, a.threads, a.requests)
        instruct_eval(eng, draft, layer, seqs, a.threads)
        round_time(eng, layer, seqs)


def loaded(path: Path, target: str):
    from specgen.heads.layer import load_any
    from specgen.heads.model import target_identity

    layer = load_any(path, target_identity(target))
    if layer.kind != "layer":
        sys.exit(f"feature_layer: {path} holds {layer.kind} heads, not a layer")
    layer.model_path = target
    print(f"loaded the layer of {path}: held-out top-1 {layer.info.get('heldout', {}).get('top1')}", flush=True)
    return layer


def trained(eng, target: str, draft: str, a):
    """Collect (--source), train, report held-out top-1; the layer (saved to --save)."""
    from specgen.heads.collect import output_rows
    from specgen.heads.layer import FeatureLayer, embed_rows
    from specgen.heads.layer_fit import read_replies
    from specgen.heads.model import target_identity

    if a.data is not None and a.data.exists():
        with np.load(a.data) as z:
            data = tuple(z[k] for k in ("tokens", "picks", "hidden", "keep"))
        print(f"read {data[0].size} positions from {a.data}", flush=True)
    elif a.source == "library":
        data = collect(eng, a.collect_minutes, a.chunk, a.seed)
    else:
        t0 = time.monotonic()
        data = read_replies(eng, draft_replies(draft, a), a.chunk)
        print(f"read them through the target: {data[0].size} positions in {time.monotonic() - t0:.0f} s", flush=True)
    if a.data is not None and not a.data.exists():
        np.savez(a.data, **dict(zip(("tokens", "picks", "hidden", "keep"), data)))
    tokens, picks, hidden, keep = data
    held = np.arange(len(tokens)) % 10 == 9 if len(tokens) >= 10 else np.arange(len(tokens)) == len(tokens) - 1
    vals, counts = np.unique(picks[~held, 1:][keep[~held, 1:]], return_counts=True)
    ids = vals[np.argsort(-counts)[:a.vocab]]
    if not len(ids):
        sys.exit("feature_layer: too little training data (no labelled position outside the held-out chunks)")
    rows: dict = {}
    out = output_rows(target, ids)
    trainer = train(data, out, ids, lambda t: embed_rows(target, t, rows), a, np.flatnonzero(~held),
                    np.flatnonzero(held))
    h1, h2 = [], []
    for c in np.flatnonzero(held):
        x, y = trainer.hits(int(c))
        h1 += x
        h2 += y
    fit = [x for c in np.flatnonzero(~held)[:12] for x in trainer.hits(int(c), step2=False)[0]]
    print(f"{a.source}, held out: step-1 top-1 {np.mean(h1):.3f} ({len(h1)} positions), "
          f"step-2 given step 1 {np.mean(h2) if h2 else float('nan'):.3f} ({len(h2)}); "
          f"on its first 12 training chunks {np.mean(fit):.3f}")
    info = {"heldout": {"top1": [float(np.mean(h1)), float(np.mean(h2)) if h2 else None]},
            "source": a.source, "positions": int(tokens.size)}
    layer = FeatureLayer(trainer.p, ids, out, eng.n_vocab, target_identity(target), head_dim=a.head_dim,
                         window=a.chunk - 1, info=info)
    layer.model_path = target
    if a.save:
        layer.save(a.save)
        print(f"saved the layer to {a.save}", flush=True)
    return layer


def instruct_eval(eng, draft: str, layer, seqs, threads: int) -> None:
    """Top-1 of the layer at steps 1 and 2 on the target's greedy replies, beside the 0.5B draft's
    agreement; and the layer's acceptance at draft step 1 when sampling at 0.8 (`overlap`)."""
    from specgen.engine.llama import Engine
    from specgen.heads.layer_fit import layer_hits

    with Engine(draft, n_ctx=1024, n_threads=threads) as drf:
        print(f"{'request':10} {'layer step-1':>13} {'0.5B draft':>11} {'in readout':>11} {'sampled 0.8':>12}")
        all1, all2, alld, inside, accs = [], [], [], [], []
        for rid, prompt, reply in seqs:
            toks = np.asarray(prompt + reply)
            if len(reply) < 2:
                continue
            eng.truncate(0, 0)
            tp = np.argmax(eng.decode_batch([(0, list(toks), len(toks))])[0], axis=1)
            hid = np.stack([eng.hidden_at(0, i) for i in range(len(toks))]).astype(np.float32)
            drf.truncate(0, 0)
            dp = np.argmax(drf.decode_batch([(0, list(toks), len(toks))])[0], axis=1)
            rows = np.arange(len(prompt) - 1, len(toks) - 2)  # rows that picked reply tokens 2 ...
            x, y = layer_hits(layer.params, layer.out, layer.ids, layer.head_dim, hid, layer.embed(toks), tp, rows, toks)
            d = dp[rows + 1] == tp[rows + 1]
            ins = np.isin(tp[rows + 1], layer.ids)
            acc = overlap(layer, hid, toks, rows)
            all1, all2, alld, inside, accs = all1 + list(x), all2 + y, alld + list(d), inside + list(ins), accs + list(acc)
            print(f"{rid:10} {np.mean(x):13.2f} {np.mean(d):11.2f} {np.mean(ins):11.2f} {np.mean(acc):12.2f}")
        print(f"{'all':10} {np.mean(all1):13.3f} {np.mean(alld):11.3f} {np.mean(inside):11.3f} {np.mean(accs):12.3f}   "
              f"layer step-2 given step 1: {np.mean(all2) if all2 else float('nan'):.3f} ({len(all2)})")


def overlap(layer, hid, toks, rows, temp: float = 0.8) -> np.ndarray:
    """Per row: Σ_v min(p_v, q_v), the chance rejection sampling accepts the layer's draft at
    step 1, p the target's distribution and q the layer's at `temp`, both over the readout
    (the target's mass outside it is left out, so this bounds the full figure from above)."""
    from specgen.heads.layer import causal_mask, forward

    t = len(toks) - 1
    f, _ = forward(layer.params, hid[None, :-1], layer.embed(toks)[None, 1:], np.arange(t)[None], layer.head_dim,
                   causal_mask(t))

    def dist(h):
        z = h @ layer.out.T / temp
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return np.minimum(dist(hid[rows + 1]), dist(f[0][rows])).sum(axis=-1)


def round_time(eng, layer, seqs, repeats: int = 5) -> None:
    """A drafting round of the layer (catch-up of k + 1 rows, then k tokens; BLAS at one thread,
    as when it drafts) against a one-row pass of the target, the least of `repeats`, on the
    first reply's context."""
    from specgen.drafters.base import Want
    from specgen.drafters.layer import LayerDrafter
    from specgen.heads.blas import hold_one_blas_thread, release_blas

    _, prompt, reply = seqs[0]
    ctx = list(prompt) + list(reply)
    eng.truncate(0, 0)
    eng.decode_batch([(0, ctx[:-1], 1)])
    passes = []
    for _ in range(repeats):
        eng.truncate(0, len(ctx) - 1)
        t = time.perf_counter()
        eng.decode(0, ctx[-1:], 1)
        passes.append(time.perf_counter() - t)
    one = min(passes)
    eng.truncate(0, 0)
    eng.decode_batch([(0, ctx, len(ctx))])  # every row's hidden state, for the rounds
    hold_one_blas_thread()
    try:
        cells = []
        for k in (1, 2, 3, 4):
            best = float("inf")
            for _ in range(repeats):
                d = LayerDrafter(eng, layer)
                d.propose([Want(0, ctx[:-(k + 1)], 1)])  # the cache up to k + 1 rows before the end
                t = time.perf_counter()
                got = d.propose([Want(0, ctx, k)])[0]
                best = min(best, time.perf_counter() - t)
                assert len(got.tokens) == k, "the round drafted nothing: its rows were missing"
            cells.append(f"k={k} {1000 * best:.1f} ms ({best / one:.1%})")
    finally:
        release_blas()
    print(f"a drafting round of the layer: {', '.join(cells)} of a one-row target pass ({1000 * one:.0f} ms)")


if __name__ == "__main__":
    main()
