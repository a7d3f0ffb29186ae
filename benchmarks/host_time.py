"""Host (Python) time per round, in CPU time: what the loop does around the model passes.

Gemma 3 270M target; plain (`--no-spec`) and *alone* (`-d smollm2-135m
--no-lookup`, the translated draft under the cost policy), greedy and sampled
(temperature 0.8, seed 1), on the first bundled request of each category.
Every llama_decode (target and draft) is timed with `time.process_time`; the
host time of a round is the round's process time less its passes. Run with
--threads 1 (the default) so no llama.cpp worker thread spins into the host
figures; the target pass figure is then one thread's whole pass.

No wall clock is read for the figures, so a busy machine does not disturb
them; the cost policy's profiles are not measured either (a fixed synthetic
profile, from the figures in BENCHMARKING.md, stands in: the rounds' own
timings still teach the policy as in a run). --profile prints the heaviest
host functions (cProfile over process time, passes excluded by name).

    nice -n 19 python benchmarks/host_time.py [--n 48] [--per-category 1] [--f32] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # this checkout's specgen, never an installed copy

DRAFT = "smollm2-135m"
CONFIGS = [("plain", dict(no_spec=True)), ("alone", dict(draft=DRAFT, lookup=False))]


def synthetic_profile(engine) -> dict:
    """A fixed verify curve and feed cost (BENCHMARKING.md: Gemma ≈ 48 tok/s at
    2 threads, SmolLM2 ≈ 110 tok/s), instead of timing passes on this machine."""
    step = 0.021 if engine.n_vocab > 100_000 else 0.009
    return {"verify_s": [0.0] + [step * (1 + 0.6 * n) for n in range(32)], "feed_s": step / 8}


class PassClock:
    """Process time spent inside an engine's llama_decode (and the logits wait)."""

    def __init__(self, engine) -> None:
        self.s, self.passes = 0.0, 0
        run = engine._run

        def timed(rows):
            t = time.process_time()
            try:
                return run(rows)
            finally:
                self.s += time.process_time() - t
                self.passes += 1

        engine._run = timed


def run_one(loaded, clocks, prompt, n, params):
    from specgen.decode.generation import Generation

    loaded.target.truncate(0, 0)
    if loaded.draft_engine is not None:
        loaded.draft_engine.truncate(0, 0)
    gen = Generation(loaded.target, prompt, loaded.drafter, draft_max=loaded.draft_max, max_tokens=n,
                     params=params, ignore_eos=True, policy=loaded.new_policy())
    rounds = []  # (k, host process seconds, target pass seconds, draft pass seconds)
    it = iter(gen)
    next(it)  # the prompt's prefill and first token: not a round of the loop
    while True:
        t, before = time.process_time(), [c.s for c in clocks]
        try:
            r = next(it)
        except StopIteration:
            break
        spent = time.process_time() - t
        passes = [c.s - b for c, b in zip(clocks, before)]
        rounds.append((r.drafted, spent - sum(passes), passes[0], sum(passes[1:])))
    return rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--temp", type=float, default=0.8, help="the sampled runs' temperature")
    ap.add_argument("--f32", action="store_true", help="an all-F32 copy of the target")
    ap.add_argument("--profile-lines", type=int, default=18)
    ap.add_argument("--profile", action="store_true", help="cProfile (process time) each configuration's host work")
    args = ap.parse_args()

    import specgen.engine.costs
    from specgen.bench.requests import request_tokens
    from specgen.session import ModelOptions, open_session
    from specgen.models.cache import cache_dir
    from specgen.models.registry import resolve_model
    from specgen.rules.sampling import SamplingParams

    specgen.engine.costs.cost_profile = lambda engine, **_: synthetic_profile(engine)
    sys.path.insert(0, str(HERE))
    from translate import requests

    tpath = resolve_model("gemma3-270m")
    if args.f32:
        from conftest import make_f32_target

        tpath = make_f32_target(tpath, cache_dir() / "test-drafts" / "gemma-3-270m-f32.gguf")
    reqs = requests(args.per_category, set())
    print(f"target {tpath.name}, n={args.n}, threads={args.threads}, {len(reqs)} requests; "
          f"host ms per round (process time), as % of the round's target pass (process time)")
    print(f"{'config':<16} {'rounds':>6} {'k>0':>4} {'pass ms':>8} {'host ms':>8} {'host %':>7}"
          f" {'k=0 host ms':>11} {'k=0 %':>6} {'draft ms':>8}")
    for name, kw in CONFIGS:
        loaded = open_session(ModelOptions(model=str(tpath), threads=args.threads, **kw))
        clocks = [PassClock(loaded.target)] + ([PassClock(loaded.draft_engine)] if loaded.draft_engine else [])
        try:
            for params in (SamplingParams(), SamplingParams(args.temp, seed=1)):
                label = f"{name} {'greedy' if params.greedy else 'sampled'}"
                prof = cProfile.Profile(time.process_time) if args.profile else None
                rounds = []
                for r in reqs:
                    prompt = request_tokens(loaded.target, r)
                    if prof:
                        prof.enable()
                    rounds += run_one(loaded, clocks, prompt, args.n, params)
                    if prof:
                        prof.disable()
                zero = [x for x in rounds if x[0] == 0]
                pass_ms = 1e3 * statistics.mean(x[2] for x in rounds)
                host_ms = 1e3 * statistics.mean(x[1] for x in rounds)
                zero_ms = 1e3 * statistics.mean(x[1] for x in zero) if zero else float("nan")
                zero_pass = 1e3 * statistics.mean(x[2] for x in zero) if zero else float("nan")
                draft_ms = 1e3 * statistics.mean(x[3] for x in rounds)
                print(f"{label:<16} {len(rounds):6d} {len(rounds) - len(zero):4d} {pass_ms:8.2f} {host_ms:8.3f}"
                      f" {host_ms / pass_ms:7.2%} {zero_ms:11.3f} {zero_ms / zero_pass:6.2%} {draft_ms:8.2f}",
                      flush=True)
                if prof:
                    st = pstats.Stats(prof)
                    st.sort_stats("tottime").print_stats(args.profile_lines)
        finally:
            loaded.close()


if __name__ == "__main__":
    main()
