"""The sequential bench: every request through plain and each speculative configuration.

A warm-up, then for each request every configuration, in an order that
reverses from one (request, repeat) to the next (plain, spec | spec, plain |
...), so slow drift on a shared machine hits both sides. Each run starts from
an empty KV cache, so every run pays the same prefill. Records are handed to a
sink as each request finishes (see records.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from specgen.bench.configs import Config
from specgen.bench.setup import Setup
from specgen.bench.records import request_record, run_record
from specgen.bench.requests import Request, request_tokens
from specgen.decode.generation import Generation
from specgen.errors import SpecgenError
from specgen.rules.sampling import SamplingParams

WARMUP_TOKENS = 8


def run_order(n_configs: int, repeats: int, offset: int = 0) -> list[list[int]]:
    """Configuration indices to run, per repeat; each repeat reverses the last.

    With plain (0) and one speculative configuration (1): [0, 1], [1, 0], [0, 1] …
    — plain, spec, spec, plain — so drift over time hits both sides alike.
    `offset` (the request's index) continues the alternation across requests.
    """
    if repeats < 1:
        raise SpecgenError(f"--repeats must be >= 1 (got {repeats})")
    forward = list(range(n_configs))
    return [forward if (offset + r) % 2 == 0 else forward[::-1] for r in range(repeats)]


@dataclass
class Settings:
    max_tokens: int = 64
    repeats: int = 1
    ignore_eos: bool = False
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0
    warmup: bool = True

    def validate(self) -> None:
        if self.repeats < 1:
            raise SpecgenError(f"--repeats must be >= 1 (got {self.repeats})")
        if self.max_tokens < 1:
            raise SpecgenError(f"-n/--max-tokens must be >= 1 (got {self.max_tokens})")
        SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.seed).validate()

    def meta(self) -> dict:
        return {"max_tokens": self.max_tokens, "repeats": self.repeats, "ignore_eos": self.ignore_eos}


@dataclass
class Prepared:
    """A request, tokenized, with its effective generation parameters."""

    req: Request
    index: int
    tokens: list[int]
    max_tokens: int
    params: SamplingParams


@dataclass
class Timing:
    """Where this session's time went: generation vs the bench's own work."""

    prepare_s: float = 0.0  # tokenizing, checks
    warmup_s: float = 0.0
    measured_s: float = 0.0  # wall time of the measured phase
    generation_s: float = 0.0  # sum of every measured run's latency
    runs: int = 0

    @property
    def overhead_s(self) -> float:
        return max(self.measured_s - self.generation_s, 0.0)

    def to_dict(self) -> dict:
        share = self.overhead_s / self.measured_s if self.measured_s > 0 else 0.0
        per_run = self.overhead_s / self.runs if self.runs else 0.0
        return {
            "prepare_s": self.prepare_s,
            "warmup_s": self.warmup_s,
            "measured_s": self.measured_s,
            "generation_s": self.generation_s,
            "overhead_s": self.overhead_s,
            "overhead_share": share,
            "overhead_per_run_ms": 1000 * per_run,
            "runs": self.runs,
        }


RunHook = Callable[[int, int, Prepared, Config], None]  # (done, total, request, config) before a run
RequestHook = Callable[[dict], None]  # after a request's record is written


class Runner:
    """Runs prepared requests through every configuration and hands out records."""

    def __init__(self, setup: Setup, settings: Settings) -> None:
        settings.validate()
        self.setup = setup
        self.settings = settings
        self.timing = Timing()
        self._suffix: dict[tuple[str, int], object] = {}  # (config, repeat) → its suffix drafter

    # -- preparation ------------------------------------------------------
    def prepare(self, requests: Sequence[Request]) -> list[Prepared]:
        t0 = time.perf_counter()
        s, target = self.settings, self.setup.target
        k_max = max(c.round_k for c in self.setup.configs)
        out = []
        for i, r in enumerate(requests):
            tokens = request_tokens(target, r)
            max_tokens = r.max_tokens or s.max_tokens
            need = len(tokens) + max_tokens + k_max + 1
            if need > target.n_ctx:
                raise SpecgenError(
                    f"request '{r.id}' (line {r.line}): {len(tokens)} prompt + {max_tokens} generated tokens "
                    f"do not fit a context of {target.n_ctx} (raise -c/--ctx-size)"
                )
            temp = s.temperature if r.temperature is None else r.temperature
            seed = s.seed if r.seed is None else r.seed
            params = SamplingParams(temp, s.top_k, s.top_p, s.min_p, seed, s.ignore_eos)
            out.append(Prepared(r, i, tokens, max_tokens, params))
        self.timing.prepare_s += time.perf_counter() - t0
        return out

    # -- one run ----------------------------------------------------------
    def drafter(self, config: Config, repeat: int | None):
        """The configuration's drafter. A suffix index with a global cache is one per repeat,
        so a request drafts from the earlier requests of its repeat, never from its own
        earlier output (another repeat of itself); a warm-up (repeat None) gets a fresh one."""
        if config.kind != "suffix" or not config.global_cache:
            return self.setup.drafters[config.name]
        if repeat is None:
            return self.setup.new_drafter(config)
        key = (config.name, repeat)
        if key not in self._suffix:
            self._suffix[key] = self.setup.new_drafter(config)
        return self._suffix[key]

    def run_one(self, p: Prepared, config: Config, max_tokens: int | None = None, repeat: int | None = None) -> dict:
        """One request through one configuration, from an empty cache; the run's record."""
        setup = self.setup
        target = setup.target
        drafter = self.drafter(config, repeat)
        draft_engine = setup.draft_engines.get(config.name)
        target.truncate(0, 0)
        if draft_engine is not None:
            draft_engine.truncate(0, 0)
        gen = Generation(
            target, p.tokens, drafter, draft_max=config.round_k, max_tokens=max_tokens or p.max_tokens,
            params=p.params,
            # a global suffix index carries its acceptance statistics across the requests it serves
            policy=setup.session.new_policy(config.round_k, config.policy, draft_engine=draft_engine,
                                            heads_step_s=setup.heads_step_s.get(config.name), heads=setup.heads.get(config.name),
                                            shared=drafter.policy_stats if drafter is not None else None),
        )
        # Verify time by draft length, and drafting after the first decode
        # round (whose draft cost includes the drafter reading the prompt).
        verify_by_k: dict[int, list] = {}
        steady = [0, 0, 0.0]  # rounds, drafted, draft_s
        first_draft_s = 0.0
        n = 0
        for r in gen:
            n += 1
            if n == 1:
                continue
            v = verify_by_k.get(r.drafted)
            if v is None:
                v = verify_by_k[r.drafted] = [0, 0.0]
            v[0] += 1
            v[1] += r.verify_s
            if n == 2:
                first_draft_s = r.draft_s
            else:
                steady[0] += 1
                steady[1] += r.drafted
                steady[2] += r.draft_s
        return run_record(gen, config, verify_by_k, steady, first_draft_s)

    # -- the whole set ----------------------------------------------------
    def warm_up(self, prepared: Sequence[Prepared]) -> None:
        if not prepared or not self.settings.warmup:
            return
        t0 = time.perf_counter()
        for c in self.setup.configs:
            self.run_one(prepared[0], c, max_tokens=min(WARMUP_TOKENS, prepared[0].max_tokens))
        self.timing.warmup_s += time.perf_counter() - t0

    def run(
        self,
        prepared: Sequence[Prepared],
        sink: Callable[[dict], None],
        *,
        on_run: RunHook | None = None,
        on_request: RequestHook | None = None,
    ) -> None:
        """Every request in every configuration; `sink` gets each request's record when it finishes.

        KeyboardInterrupt propagates; the request in flight is not recorded.
        """
        configs = self.setup.configs
        s = self.settings
        total = len(prepared) * len(configs) * s.repeats
        done = 0
        t_start = time.perf_counter()
        try:
            for p in prepared:
                runs = []
                for rep, order in enumerate(run_order(len(configs), s.repeats, p.index)):
                    for slot, ci in enumerate(order):
                        if on_run:
                            on_run(done, total, p, configs[ci])
                        rec = self.run_one(p, configs[ci], repeat=rep)
                        rec["repeat"], rec["slot"] = rep, slot
                        self.timing.generation_s += rec["total_s"]
                        self.timing.runs += 1
                        runs.append(rec)
                        done += 1
                record = request_record(p, runs, [c.name for c in configs])
                sink(record)
                if on_request:
                    on_request(record)
        finally:
            self.timing.measured_s += time.perf_counter() - t_start
