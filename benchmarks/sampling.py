"""What does a sampled row cost specgen's own rules? The filters and a rejection-sampling
step on `Support`s (the tokens a row keeps) against the same work on whole dense rows,
side by side on the same rows in one run.

Rows are synthetic logits of a large vocabulary (default 262,144, Gemma 3's) drawn
as a language model's look (a heavy right tail over a normal body); the sampling
parameters are specgen's defaults at --temp. Each operation runs on every row,
--repeats times, interleaved; the median per row is printed, and the ratio
(dense ÷ support) for the pairs:

- top-k ids: `np.argpartition` of the whole row against `top_ids` (a sample's floor first);
- filters: the whole row in float64, partitioned, filtered, as a dense row, against `support`;
- rejection: `accept_sampled` over dense p and q rows against the same over `Support`s
  (k = 4 drafts, q a drafter's row over the same logits plus noise).

  python benchmarks/sampling.py --rows 64 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's specgen


def logits_rows(n_rows: int, n_vocab: int, rng: np.random.Generator) -> np.ndarray:
    """float32 rows: a normal body, and a few hundred tokens lifted far above it (the plausible ones)."""
    x = rng.standard_normal((n_rows, n_vocab)).astype(np.float32) * 2.0
    for row in x:
        lifted = rng.choice(n_vocab, 300, replace=False)
        row[lifted] += rng.exponential(4.0, 300).astype(np.float32) + 4.0
    return x


def dense_filters(x: np.ndarray, params) -> np.ndarray:
    """The filters over the whole row, as a dense float64 row (top-k by partitioning the row)."""
    z = x.astype(np.float64) / params.temperature
    n = len(z)
    keep = np.argpartition(z, n - params.top_k)[n - params.top_k:] if params.top_k and params.top_k < n else np.arange(n)
    w = np.exp(z[keep] - z[keep].max())
    w /= w.sum()
    order = np.argsort(-w, kind="stable")
    cut = int(np.searchsorted(np.cumsum(w[order]), params.top_p - 1e-12)) + 1
    keep, w = keep[order[:cut]], w[order[:cut]]
    m = w >= params.min_p * w.max()
    out = np.zeros(n)
    out[keep[m]] = w[m] / w[m].sum()
    return out


def timed(fn, rows) -> list[float]:
    out = []
    for r in rows:
        t = time.perf_counter()
        fn(r)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64, help="rows per repeat")
    ap.add_argument("--vocab", type=int, default=262144, help="vocabulary size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.rows < 6 or args.vocab < 1024 or args.repeats < 1 or args.temp <= 0:
        sys.exit("sampling.py: --rows >= 6, --vocab >= 1024, --repeats >= 1 and --temp > 0, please")
    from specgen.rules.acceptance import accept_sampled
    from specgen.rules.sampling import SamplingParams, support, top_ids

    params = SamplingParams(temperature=args.temp)
    rng = np.random.default_rng(args.seed)
    x = logits_rows(args.rows, args.vocab, rng)
    noisy = x + rng.standard_normal(x.shape).astype(np.float32) * 0.5  # a drafter's logits: near the target's
    k = params.top_k
    groups = [list(range(i, i + 5)) for i in range(0, args.rows - 4, 5)]  # 4 drafts + the bonus row

    def rejection(rule_rows):
        def go(g):
            p, q = rule_rows[0], rule_rows[1]
            draft = [int(np.argmax(noisy[i])) for i in g[:4]]
            accept_sampled(draft, [p[i] for i in g], [q[i] for i in g[:4]], np.random.default_rng(g[0]))
        return go

    dense_p = [dense_filters(r, params) for r in x]
    dense_q = [dense_filters(r, params) for r in noisy]
    sup_p = [support(r, params) for r in x]
    sup_q = [support(r, params) for r in noisy]
    for a, b in zip(dense_p[:4], sup_p[:4]):  # the two paths agree before either is timed
        assert np.allclose(a, b.dense(), atol=1e-12), "sampling.py: dense and support rows differ"
    ops = {
        "top-k ids: argpartition of the row": lambda r: np.argpartition(r, len(r) - k)[len(r) - k:],
        "top-k ids: top_ids": lambda r: top_ids(r, k),
        "filters: dense row": lambda r: dense_filters(r, params),
        "filters: support": lambda r: support(r, params),
        "rejection (k=4): dense rows": rejection((dense_p, dense_q)),
        "rejection (k=4): supports": rejection((sup_p, sup_q)),
    }
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(args.repeats):
        for name, fn in ops.items():  # interleaved: every operation once per repeat
            times[name] += timed(fn, groups if name.startswith("rejection") else x)
    med = {name: statistics.median(ts) * 1000 for name, ts in times.items()}
    print(f"{args.rows} rows of {args.vocab} logits · temperature {args.temp:g}, top-k {k}, top-p {params.top_p}, "
          f"min-p {params.min_p} · {args.repeats} repeats · median per row (rejection: per round of 4 drafts)")
    for name, ms in med.items():
        print(f"  {name:<40} {ms:8.3f} ms")
    names = list(med)
    for dense, sparse in zip(names[0::2], names[1::2]):
        print(f"  {dense.split(':')[0]:<40} {med[dense] / med[sparse]:8.1f}x  (dense ÷ support)")


if __name__ == "__main__":
    main()
