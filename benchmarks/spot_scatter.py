"""How far a cost profile's spot check scatters on this machine: the threshold's evidence.

Per model, a fresh verify curve (`costs.measure_verify`, as a cached profile is
taken), then N spot checks (`costs.spot_check`: a pass of each of SPOT_ROWS
rows, the least disturbed of 3), each as a ratio to the curve at those rows.
A ratio under `costs.INFLATED` would retake a profile that was in fact fine;
the lowest ratio seen is how close to the threshold an honest profile comes.
Run it under the bench lock, at nice -5, and say the machine's load.

    PYTHONPATH=$PWD python benchmarks/spot_scatter.py [--checks 12] [--models default,f32,smollm2-135m]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # this checkout's specgen, never an installed copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", type=int, default=12)
    ap.add_argument("--models", default="default,f32,smollm2-135m",
                    help="default (gemma3-270m, Gemma 3 270M base), f32 (its all-F32 copy), or any model name or path")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from specgen.engine.costs import INFLATED, SPOT_ROWS, measure_verify, spot_check
    from specgen.engine.llama import Engine
    from specgen.models.cache import cache_dir
    from specgen.models.registry import resolve_model

    for name in args.models.split(","):
        if name == "default":
            path = resolve_model("gemma3-270m")
        elif name == "f32":
            from conftest import make_f32_target

            path = make_f32_target(resolve_model("gemma3-270m"), cache_dir() / "test-drafts" / "gemma-3-270m-f32.gguf")
        else:
            path = resolve_model(name)
        with Engine(path, n_ctx=4096, n_threads=args.threads) as e:
            curve = measure_verify(e)
            ratios = {n: [] for n in SPOT_ROWS}
            for _ in range(args.checks):
                for n, t in spot_check(e).items():
                    ratios[n].append(t / curve[n])
        cells = "; ".join(f"{n} rows {min(r):.3f}-{max(r):.3f} (median {sorted(r)[len(r) // 2]:.3f})"
                          for n, r in ratios.items())
        print(f"{Path(path).name}: spot check / fresh profile, {args.checks} checks: {cells}; "
              f"retakes below {INFLATED}", flush=True)


if __name__ == "__main__":
    main()
