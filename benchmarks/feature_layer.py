"""Can a feature-level draft layer (EAGLE-style, specgen/heads/layer.py) trained in numpy
on 2 cores predict the real target's next token, and how does it stand beside the
0.5B draft model? (issue 41's first question, before the layer drafts.)

    python benchmarks/feature_layer.py --f16 --collect-minutes 8 --train-minutes 10 --save layer.npz

1. Collect (--source): `replies` (the default): the 0.5B draft model's replies,
   sampled at temperature 0.8, to the built-in seed prompts (specgen.heads.seeds)
   through the chat template for --collect-minutes, then each read through the
   target in one pass; only reply positions are labelled. `library`:
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


def draft_replies(draft: str, minutes: float, n: int, threads: int, seed: int, least: int):
    """(tokens, reply start) of the built-in seed prompts (specgen.heads.seeds, none of them
    the instruct requests) through the chat template, each with the draft model's reply
    sampled at temperature 0.8 (at most n tokens), round after round of the seeds in a
    new order, until the budget ends (and they hold at least `least` tokens)."""
    from specgen.apps.chat import format_for, one_turn
    from specgen.heads.seeds import builtin_seeds
    from specgen.rules.sampling import SamplingParams
    from specgen.session import ModelOptions, open_session

    seeds, out, t0, rng = [t for _, t in builtin_seeds()], [], time.monotonic(), np.random.default_rng(seed)
    with open_session(ModelOptions(model=draft, threads=threads, no_spec=True)) as s:
        fmt = format_for(s.target)
        while True:
            for i in rng.permutation(len(seeds)):
                prompt = one_turn(fmt, s.target, seeds[i])
                gen = s.generate(prompt, max_tokens=n, params=SamplingParams(temperature=0.8, seed=len(out) + seed))
                list(gen)
                s.target.truncate(0, 0)
                out.append((list(prompt) + list(gen.tokens), len(prompt)))
                if time.monotonic() - t0 > minutes * 60 and sum(len(t) for t, _ in out) >= least:
                    n_tok = sum(len(t) - a for t, a in out)
                    print(f"the draft replied to {len(out)} seed prompts: {n_tok} tokens in "
                          f"{time.monotonic() - t0:.0f} s", flush=True)
                    return out


def collect_replies(engine, samples, chunk: int):
    """(tokens, picks, hidden, keep) as `collect`'s, of the samples read one by one through the
    target and laid end to end in chunks; keep: positions whose pick is a reply's token."""
    toks, picks, hid, keep, t0 = [], [], [], [], time.monotonic()
    for sample, start in samples:
        engine.truncate(0, 0)
        picks.append(np.argmax(engine.decode_batch([(0, sample, len(sample))])[0], axis=1).astype(np.int32))
        hid.append(np.stack([engine.hidden_at(0, p) for p in range(len(sample))]).astype(np.float16))
        toks.append(np.asarray(sample, np.int32))
        keep.append(np.arange(len(sample)) >= start - 1)
    engine.truncate(0, 0)
    n = sum(map(len, toks)) // chunk * chunk
    print(f"read {len(samples)} samples, {n} positions in {time.monotonic() - t0:.0f} s", flush=True)
    cut = [np.concatenate(x)[:n] for x in (toks, picks, hid, keep)]
    return tuple(x.reshape(n // chunk, chunk, *x.shape[1:]) for x in cut)


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


class Embed:
    """The layer's token embeddings (specgen.heads.layer.embed_rows), cached."""

    def __init__(self, model: str) -> None:
        self.model, self.rows = model, {}

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        from specgen.heads.layer import embed_rows

        return embed_rows(self.model, tokens, self.rows)


def train(data, out, ids, embed, a, train_ix):
    from specgen.heads.layer import PARAMS, causal_mask, init_params, loss_and_grads

    tokens, picks, hidden, keep = data
    n, t, d = hidden.shape
    slot = np.full(int(max(tokens.max(), picks.max(), ids.max())) + 1, -1, np.int64)
    slot[ids] = np.arange(len(ids))
    rng = np.random.default_rng(a.seed)
    p = init_params(d, a.attn, a.mlp, rng)
    m1 = {k: np.zeros_like(v) for k, v in p.items()}
    m2 = {k: np.zeros_like(v) for k, v in p.items()}
    mask, pos = causal_mask(t - 1), np.arange(t - 1)[None].repeat(a.batch, 0)
    scale = float(np.sqrt(np.mean(hidden[:4].astype(np.float32) ** 2)))
    t0, step, b1, b2 = time.monotonic(), 0, 0.9, 0.98
    while step == 0 or time.monotonic() - t0 < a.train_minutes * 60:
        ix = rng.choice(train_ix, min(a.batch, len(train_ix)), replace=False)
        h = hidden[ix, :-1].astype(np.float32)
        h += rng.standard_normal(h.shape).astype(np.float32) * (0.05 * scale)  # noise, as EAGLE's
        loss, g, top = loss_and_grads(p, h, embed(tokens[ix, 1:]), pos[:len(ix)], hidden[ix, 1:].astype(np.float32),
                                      np.where(keep[ix, 1:], slot[picks[ix, 1:]], -1), out, head_dim=a.head_dim,
                                      mask=mask)
        step += 1
        lr = a.lr * min(1.0, step / 50)
        for k in PARAMS:
            m1[k] = b1 * m1[k] + (1 - b1) * g[k]
            m2[k] = b2 * m2[k] + (1 - b2) * g[k] ** 2
            p[k] -= (lr * (m1[k] / (1 - b1 ** step)) / (np.sqrt(m2[k] / (1 - b2 ** step)) + 1e-8)).astype(np.float32)
        if step % 50 == 0:
            print(f"  step {step}, {time.monotonic() - t0:.0f} s: loss {loss:.3f}", flush=True)
    print(f"trained {step} steps of {a.batch} x {t - 1} positions in {time.monotonic() - t0:.0f} s", flush=True)
    return p


def top1(p, out, ids, head_dim, hidden, embs, picks, rows, step2_tokens=None):
    """Step-1 hits at `rows` of one sequence (row j predicts picks[j + 1]) and, where
    `step2_tokens` (the text) continued with the step-1 token, step-2 hits."""
    from specgen.heads.layer import causal_mask, forward

    t = len(hidden) - 1
    f, _ = forward(p, hidden[None, :-1], embs[None, 1:], np.arange(t)[None], head_dim, causal_mask(t))
    first = ids[(f[0] @ out.T).argmax(-1)]
    hits1 = first[rows] == picks[rows + 1]
    hits2 = []
    if step2_tokens is not None:
        for j in [j for j in rows[hits1] if j + 2 <= t and step2_tokens[j + 2] == first[j]][::3]:
            h2 = np.concatenate([hidden[None, :j + 1], f[:, j:j + 1]], 1)
            e2 = embs[None, 1:j + 3]  # the text's tokens, the last one the step-1 token itself
            g2, _ = forward(p, h2, e2, np.arange(j + 2)[None], head_dim, causal_mask(j + 2))
            if j + 2 < len(picks):
                hits2.append(ids[(g2[0, j + 1] @ out.T).argmax()] == picks[j + 2])
    return hits1, hits2


def replies(target: str, limit: int | None, n: int, threads: int):
    """(id, prompt tokens, the target's greedy reply) for each instruct request."""
    from specgen.bench.requests import load_requests, request_tokens
    from specgen.session import ModelOptions, open_session

    out = []
    with open_session(ModelOptions(model=target, threads=threads, no_spec=True)) as s:
        for r in load_requests(INSTRUCT)[:limit]:
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
    ap.add_argument("--train-minutes", type=float, default=12.0)
    ap.add_argument("--chunk", type=int, default=256, help="positions per teacher-forced chunk")
    ap.add_argument("--vocab", type=int, default=4096, help="readout rows: the most frequent training labels")
    ap.add_argument("--attn", type=int, default=256, help="attention width (heads of --head-dim)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--mlp", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4, help="chunks per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--limit", type=int, default=None, help="only the first N instruct requests")
    ap.add_argument("-n", type=int, default=96, help="tokens of each greedy reply")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, default=None, help="write the trained layer to this heads file (kind layer)")
    a = ap.parse_args()
    if a.attn % a.head_dim or a.head_dim % 2:
        sys.exit("feature_layer: --attn must be a multiple of --head-dim, and --head-dim even")

    from specgen.engine.llama import Engine
    from specgen.heads.collect import output_rows

    target, draft = models(a.f16)
    print(f"target {Path(target).name} · draft {Path(draft).name} · {a.threads} threads", flush=True)
    with Engine(target, n_ctx=max(a.chunk, 1024) + 64, n_threads=a.threads, hidden=True,
                n_batch=max(a.chunk, 512)) as eng:
        if a.source == "library":
            data = collect(eng, a.collect_minutes, a.chunk, a.seed)
        else:
            data = collect_replies(eng, draft_replies(draft, a.collect_minutes, a.reply_tokens, a.threads, a.seed, 2 * a.chunk),
                                   a.chunk)
        tokens, picks, hidden, keep = data
        held = np.arange(len(tokens)) % 10 == 9 if len(tokens) >= 10 else np.arange(len(tokens)) == len(tokens) - 1
        vals, counts = np.unique(picks[~held, 1:][keep[~held, 1:]], return_counts=True)
        ids = vals[np.argsort(-counts)[:a.vocab]]
        out, embed = output_rows(target, ids), Embed(target)
        p = train(data, out, ids, embed, a, np.flatnonzero(~held))
        h1, h2 = [], []
        for c in np.flatnonzero(held):
            x, y = top1(p, out, ids, a.head_dim, hidden[c].astype(np.float32), embed(tokens[c]), picks[c],
                        np.flatnonzero(keep[c, 1:a.chunk - 1]), tokens[c])
            h1 += list(x)
            h2 += y
        print(f"{a.source}, held out: step-1 top-1 {np.mean(h1):.3f} ({len(h1)} positions), "
              f"step-2 given step 1 {np.mean(h2) if h2 else float('nan'):.3f} ({len(h2)})")
        if a.save:
            from specgen.heads.layer import FeatureLayer
            from specgen.heads.model import target_identity

            info = {"heldout": {"top1": [float(np.mean(h1)), float(np.mean(h2)) if h2 else None]},
                    "source": a.source, "positions": int(tokens.size)}
            FeatureLayer(p, ids, out, eng.n_vocab, target_identity(target), head_dim=a.head_dim,
                         window=a.chunk - 1, info=info).save(a.save)
            print(f"saved the layer to {a.save}", flush=True)
        seqs = replies(target, a.limit, a.n, a.threads)
        with Engine(draft, n_ctx=1024, n_threads=a.threads) as drf:
            print(f"{'request':10} {'layer step-1':>13} {'0.5B draft':>11} {'in readout':>11}")
            all1, all2, alld, inside = [], [], [], []
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
                x, y = top1(p, out, ids, a.head_dim, hid, embed(toks), tp, rows, toks)
                d = dp[rows + 1] == tp[rows + 1]
                ins = np.isin(tp[rows + 1], ids)
                all1 += list(x)
                all2 += y
                alld += list(d)
                inside += list(ins)
                print(f"{rid:10} {np.mean(x):13.2f} {np.mean(d):11.2f} {np.mean(ins):11.2f}")
            print(f"{'all':10} {np.mean(all1):13.3f} {np.mean(alld):11.3f} {np.mean(inside):11.3f}   "
                  f"layer step-2 given step 1: {np.mean(all2) if all2 else float('nan'):.3f} ({len(all2)})")


if __name__ == "__main__":
    main()
