"""The concurrency sweep: `specgen bench --concurrency 1,2,4,8`.

At each level the whole request set is served at once through
specgen.serve.scheduler (plain, then every speculative configuration, alternating
order), all requests submitted together. One "serve" record per (level,
configuration, repeat) carries the level, the total throughput and every
request's queue wait, ttft, latency, tok/s and acceptance.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from specgen.bench.configs import Config
from specgen.bench.setup import Setup
from specgen.bench.records import serve_record
from specgen.bench.runner import WARMUP_TOKENS, Prepared, Settings, Timing, run_order
from specgen.errors import SpecgenError
from specgen.session import make_gate
from specgen.serve.scheduler import MAX_SLOTS, Job, SchedulerSettings, Server, max_concurrency, need_tokens



def parse_concurrency(text: str) -> list[int]:
    """`1,2,4,8` → [1, 2, 4, 8] (sorted, distinct); each level in 1..256."""
    levels = []
    for part in text.split(","):
        part = part.strip()
        try:
            n = int(part)
        except ValueError:
            raise SpecgenError(f"--concurrency: '{part}' is not an integer (expected e.g. 1,2,4,8)") from None
        if n < 1:
            raise SpecgenError(f"--concurrency: levels must be >= 1 (got {n})")
        if n > MAX_SLOTS:
            raise SpecgenError(f"--concurrency: at most {MAX_SLOTS} sequences share a llama.cpp context (got {n})")
        levels.append(n)
    return sorted(set(levels))


def check_concurrency(levels: Sequence[int], prepared: Sequence[Prepared], n_ctx: int, k_max: int, n_batch: int = 512) -> None:
    """Refuse a level the context cannot hold with every slot busy (one pool of n_ctx tokens),
    or whose verify rows (k_max + 1 per sequence) would not fit one batch."""
    if max(levels) * (k_max + 1) > n_batch:
        raise SpecgenError(
            f"--concurrency {max(levels)}: {max(levels)} sequences × {k_max + 1} verify rows exceed a batch of "
            f"{n_batch} rows; at most {n_batch // (k_max + 1)} at once with k = {k_max} (lower k or the level)"
        )
    need = max(need_tokens(len(p.tokens), p.max_tokens, k_max) for p in prepared)
    limit = max_concurrency(n_ctx, need)
    if max(levels) > limit:
        raise SpecgenError(
            f"--concurrency {max(levels)}: a context of {n_ctx} tokens holds at most {limit} requests of up to "
            f"{need} tokens (prompt + max_tokens + draft) at once; raise -c/--ctx-size to at least {max(levels) * need}"
        )


class SweepRunner:
    """Serves the prepared requests at each concurrency level, in every configuration."""

    def __init__(self, setup: Setup, settings: Settings, levels: Sequence[int]) -> None:
        settings.validate()
        self.setup, self.settings, self.levels = setup, settings, list(levels)
        self.timing = Timing()

    def server(self, config: Config, level: int) -> Server:
        """The server for one configuration, with its drafter and policies: built here only."""
        setup, k = self.setup, config.round_k
        draft_engine = setup.draft_engines.get(config.name)
        drafter = setup.drafters.get(config.name)  # one drafter for every slot (a draft model: its own context)
        if config.kind in ("lookup", "suffix"):
            # fresh indexes for this server: a global suffix index (if on) per batch, so no
            # request sees its own earlier output
            drafter = setup.new_drafter(config)
        # Each request learns its own acceptance, as in a sequential run; only a
        # drafter that carries an index across requests carries its statistics too.
        shared = drafter.policy_stats if drafter is not None else None

        def new_policy():  # through the session, which keeps the passes each policy times
            return setup.session.new_policy(k, config.policy, shared=shared, draft_engine=draft_engine,
                                            heads_step_s=setup.heads_step_s.get(config.name), heads=setup.heads.get(config.name))

        new_policy()  # costs are read (or probed) now, before serving: timing passes uses sequence 0
        return Server(setup.target, level, draft_max=k, drafter=drafter, new_policy=new_policy,
                      gate=make_gate(config.policy),
                      settings=SchedulerSettings(prompt_cache=False))  # every request prefills from an empty slot, as a sequential run does

    def serve_once(self, prepared: Sequence[Prepared], config: Config, level: int, max_tokens: int | None = None) -> dict:
        """The whole set at one level in one configuration; its "serve" record."""
        jobs = [
            Job(p.req.id, p.tokens, min(max_tokens or p.max_tokens, p.max_tokens), p.params,
                {"category": p.req.category, "temperature": p.params.temperature})
            for p in prepared
        ]
        server = self.server(config, level)
        for seq in range(level):
            self.setup.target.truncate(seq, 0)
        t0 = time.perf_counter()
        results = server.serve(jobs)
        wall = time.perf_counter() - t0
        by_id = {r.job.id: r for r in results}
        requests = []
        for j in jobs:  # records in request order
            rec = by_id[j.id].record()
            rec.update(concurrency=level, config=config.name)
            requests.append(rec)
        return serve_record(level, config.name, requests, wall, server)

    def warm_up(self, prepared: Sequence[Prepared]) -> None:
        if not prepared or not self.settings.warmup:
            return
        t0 = time.perf_counter()
        for c in self.setup.configs:
            self.serve_once(prepared[:1], c, 1, max_tokens=WARMUP_TOKENS)
        self.timing.warmup_s += time.perf_counter() - t0

    def run(self, prepared: Sequence[Prepared], sink: Callable[[dict], None], *, on_run=None) -> None:
        """Every level × repeat × configuration (alternating order); `sink` gets each serve record."""
        configs = self.setup.configs
        total = len(self.levels) * self.settings.repeats * len(configs)
        done = 0
        t_start = time.perf_counter()
        try:
            for li, level in enumerate(self.levels):
                for rep, order in enumerate(run_order(len(configs), self.settings.repeats, li)):
                    plain_tokens = None
                    batch = []
                    for ci in order:
                        if on_run:
                            on_run(done, total, level, configs[ci])
                        rec = self.serve_once(prepared, configs[ci], level)
                        rec["repeat"] = rep
                        self.timing.generation_s += rec["wall_s"]
                        self.timing.runs += 1
                        done += 1
                        batch.append(rec)
                        if configs[ci].kind == "plain":
                            plain_tokens = {r["id"]: r["tokens"] for r in rec["requests"]}
                    for rec in batch:  # greedy equality with plain at the same level
                        for r in rec["requests"]:
                            greedy = r.get("temperature", 0.0) == 0.0
                            r["matches_plain"] = (
                                None if rec["config"] == "plain" or plain_tokens is None or not greedy
                                else plain_tokens[r["id"]] == r["tokens"]
                            )
                        sink(rec)
        finally:
            self.timing.measured_s += time.perf_counter() - t_start
