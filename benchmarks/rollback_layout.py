"""Does a cache fragmented by rolled-back drafts slow later plain steps of 4 sequences?

Four sequences of a 301-token prompt each grow to 475 tokens in one unified
context either by plain steps (one row each) or by draft-like steps (9 rows
each, 6 of them rolled back), then 30 plain 4-row steps are timed; the median
step per layout, the two layouts alternating over --repeats.

    flock /tmp/specgen-bench.lock nice -n -5 python benchmarks/rollback_layout.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.engine.llama import Engine  # noqa: E402
from specgen.models.registry import resolve_model  # noqa: E402


def plain_step_ms(layout: str, threads: int) -> tuple[float, list[int]]:
    e = Engine(resolve_model("gemma3-270m"), n_ctx=4096, n_threads=threads, n_batch=512, n_seq_max=4, kv_unified=True)
    try:
        for s in range(4):
            e.decode_batch([(s, [2] + [100 + 7 * s + i % 50 for i in range(300)], 1)])
        for step in range(48):  # +3 tokens a sequence each way
            if layout == "drafts":
                e.decode_batch([(s, [200 + (step + j) % 30 for j in range(9)], 9) for s in range(4)])
                for s in range(4):
                    e.truncate(s, len(e.kv_tokens(s)) - 6)
            else:
                for j in range(3):
                    e.decode_batch([(s, [200 + (step + j) % 30], 1) for s in range(4)])
        times = []
        for step in range(30):
            t = time.perf_counter()
            e.decode_batch([(s, [300 + step % 30], 1) for s in range(4)])
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000, [len(e.kv_tokens(s)) for s in range(4)]
    finally:
        e.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    for rep in range(a.repeats):
        for layout in ("plain", "drafts") if rep % 2 == 0 else ("drafts", "plain"):
            ms, lens = plain_step_ms(layout, a.threads)
            print(f"{layout:6s} repeat {rep}: plain 4-sequence step {ms:.2f} ms (sequences {lens})", flush=True)


if __name__ == "__main__":
    main()
