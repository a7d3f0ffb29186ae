"""What a step of N sequences costs by its row count: llama.cpp's CPU matmuls on
repacked weights take rows in gemm blocks of 4, the 1-3 left over one by one
through gemv (ggml-cpu/repack.cpp, forward_mul_mat_one_chunk).

Fills N sequences with a --context-token context each, then times one
decode_batch per total row count (rows spread evenly over the sequences,
rolled back after each), the counts in a shuffled order each repeat (so
llama.cpp rebuilds its graph each time, as in a server whose steps change
shape); prints the median per count, one JSON line each.

    flock /tmp/specgen-bench.lock nice -n -5 python benchmarks/row_blocks.py --repeats 8

Measured here (Gemma 3 270M Q4_K_M, 2 threads, 4 sequences of 280 tokens):
4 rows 37 ms, 5-7 rows 60-72, 8 rows 58, 9-11 rows 81-89, 12 rows 81,
13-15 rows 102-112, 16 rows 93: a step a row past a multiple of 4 costs
more than one at the next multiple (specgen.serve.scheduler.ROW_GROUP).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.engine.llama import Engine  # noqa: E402
from specgen.models.registry import resolve_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="gemma3-270m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--context-tokens", type=int, default=280)
    ap.add_argument("--rows", default="4-20,24,28,32", help="counts: a-b ranges and single numbers")
    ap.add_argument("--repeats", type=int, default=8)
    a = ap.parse_args()
    rows = []
    for part in a.rows.split(","):
        lo, _, hi = part.partition("-")
        rows += list(range(int(lo), int(hi or lo) + 1))
    if a.sequences < 1 or a.repeats < 1 or min(rows) < a.sequences or max(rows) > 512:
        sys.exit("row_blocks: need --sequences >= 1, --repeats >= 1 and row counts from --sequences to 512")
    rng = random.Random(0)
    with Engine(resolve_model(a.model), n_ctx=a.sequences * (a.context_tokens + 64) + 512, n_threads=a.threads,
                n_seq_max=a.sequences, kv_unified=True) as e:
        base = [rng.randrange(1000, 20000) for _ in range(a.context_tokens)]
        for s in range(a.sequences):
            e.decode_batch([(s, base[:-1] + [base[-1] + s], 1)])
        times: dict[int, list[float]] = {r: [] for r in rows}
        for _ in range(a.repeats):
            for r in rng.sample(rows, len(rows)):
                per = [r // a.sequences + (i < r % a.sequences) for i in range(a.sequences)]
                parts = [(s, [rng.randrange(1000, 20000) for _ in range(per[s])], per[s]) for s in range(a.sequences)]
                t = time.perf_counter()
                e.decode_batch(parts)
                times[r].append(time.perf_counter() - t)
                for s in range(a.sequences):
                    e.truncate(s, a.context_tokens)
    for r in rows:
        print(json.dumps({"rows": r, "sequences": a.sequences, "median_ms": round(statistics.median(times[r]) * 1e3, 2)}))


if __name__ == "__main__":
    main()
