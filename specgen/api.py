"""specgen's Python API: open a target with a drafter, generate round by round, bench a request set.

    import specgen

    with specgen.load(threads=2) as s:                     # the embedded model, prompt lookup
        gen = s.generate("The capital of France is", max_tokens=32)
        for r in gen:                                          # one Round per target pass
            print(r.tokens, r.drafted, r.accepted)
        print(gen.text, gen.stats.acceptance_rate)

    result = specgen.run_bench(configs=["lookup:k=8"], max_tokens=32, limit=2)
    print(result.summary["lookup:k=8"]["overall"]["geomean_speedup"])

The CLI is built on these (`specgen run` is `load` + `Session.generate`);
everything not exported by `specgen/__init__.py` is internal and may move.
docs/api.md describes each name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from specgen.session import ModelOptions, Session, open_session


def load(model: str | None = None, draft: str | None = None, **options) -> Session:
    """Open a target (a .gguf path, a models.toml name, hf:OWNER/REPO/FILE.gguf; None:
    the embedded default) with its drafter. `options` are `ModelOptions` fields:
    lookup, no_spec, pair, draft_max, ctx_size, threads, gpu_layers, ngram_max,
    ngram_min, adaptive, p_min, drafter ("suffix"), global_cache, tree_width.
    Close the session (or use it as a context manager) to free the models."""
    return open_session(ModelOptions(model=model, draft=draft, **options))


@dataclass
class BenchResult:
    """A bench run: one record per request (its runs in every configuration), and their summary."""

    records: list[dict]
    summary: dict  # specgen.bench.stats.summarize: per configuration, speedups and latency changes
    configs: list[str]  # configuration names, plain first


def run_bench(requests: str | Path | None = None, configs: Sequence[str] = ("lookup:k=8",), *,
              model: str | None = None, max_tokens: int = 64, repeats: int = 1, temperature: float = 0.0,
              seed: int = 0, warmup: bool = True, limit: int | None = None, ctx_size: int = 4096,
              threads: int | None = None, on_record: Callable[[dict], None] | None = None) -> BenchResult:
    """Run a request set (a JSONL file or one prompt a line; None: the bundled requests)
    through plain decoding and each `--config` string, side by side, as `specgen bench`;
    `on_record` gets each request's record (all its configurations) as it is done."""
    from specgen.bench.configs import parse_configs
    from specgen.bench.setup import open_bench
    from specgen.bench.requests import load_requests
    from specgen.bench.runner import Runner, Settings
    from specgen.bench.stats import summarize

    settings = Settings(max_tokens, repeats, temperature=temperature, seed=seed, warmup=warmup)
    settings.validate()
    parsed = parse_configs(list(configs))
    reqs = load_requests(Path(requests) if requests is not None else None)[:limit]
    setup = open_bench(model, parsed, ctx_size=ctx_size, threads=threads)
    try:
        runner = Runner(setup, settings)
        prepared = runner.prepare(reqs)
        if prepared and warmup:
            runner.warm_up(prepared)
        records: list[dict] = []

        def keep(record: dict) -> None:
            records.append(record)
            if on_record is not None:
                on_record(record)

        runner.run(prepared, keep)
        names = [c.name for c in setup.configs]
        return BenchResult(records, summarize(records, names), names)
    finally:
        setup.close()
