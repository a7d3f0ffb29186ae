"""Load shapes for `specgen bench --endpoint`: sequential, closed loop, open loop (Poisson).

Sequential (the default): every request through every endpoint, one at a
time, endpoints in alternating order per repeat, as the in-process bench
runs them; one "request" record per request. Closed loop (`--concurrency
1,4,16`): at each level the requests are sent with that many in flight, a
new one as soon as one finishes. Open loop (`--rate 2,5`): requests arrive
at Poisson times at that rate per second, whether or not earlier ones have
finished. Each (level, endpoint, repeat) is one "serve" record. Everything
is bounded: a request count per level, an optional duration per open-loop
level, a timeout per request. One asyncio loop, no thread per request: the
timed streams go through specgen.bench.endpoint.client's pool of kept-alive
connections, everything else (the probe, /metrics) through one
httpx.AsyncClient.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import httpx
import numpy as np

from specgen.bench.endpoint.measure import Endpoint, Sampling, probe, request_body, run_measures, stream_one
from specgen.bench.records import endpoint_failure, endpoint_request_record, endpoint_run, load_record
from specgen.bench.requests import Request
from specgen.bench.runner import run_order
from specgen.bench.endpoint.spec_sources import counter_delta, counter_stats, scrape_spec_counters
from specgen.bench.endpoint.client import StreamPool
from specgen.errors import SpecgenError

MAX_RATE = 1000.0
MAX_LEVEL = 1024
MAX_COUNT = 100_000
WARMUP_TOKENS = 4


def poisson_arrivals(rate: float, count: int, duration: float | None = None, seed: int = 0) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process at `rate` per second:
    exponential gaps of mean 1/rate, at most `count`, all before `duration` when given."""
    if rate <= 0 or count < 1:
        return []
    t = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=count))
    if duration is not None:
        t = t[t < duration]
    return [float(x) for x in t]


def parse_levels(text: str, flag: str, *, integer: bool) -> list:
    """`1,4,16` (integers ≥ 1) or `0.5,2,5` (rates > 0, per second; a trailing /s allowed) → sorted, distinct."""
    out = []
    for part in text.split(","):
        raw = part.strip().removesuffix("/s")
        try:
            v = int(raw) if integer else float(raw)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise SpecgenError(f"{flag}: '{part.strip()}' is not {kind} (expected e.g. {'1,4,16' if integer else '2,5'})") from None
        top = MAX_LEVEL if integer else MAX_RATE
        if not (v > 0 and v <= top):
            raise SpecgenError(f"{flag}: levels must be in (0, {top:g}] (got {part.strip()})")
        out.append(int(v) if not integer and float(v).is_integer() else v)
    return sorted(set(out))


@dataclass
class LoadSettings:
    sampling: Sampling = field(default_factory=Sampling)
    repeats: int = 1
    warmup: bool = True
    timeout: float = 300.0  # seconds per request
    count: int | None = None  # requests per level (default: the set's size; cycled when larger)
    duration: float | None = None  # seconds of arrivals per open-loop level
    seed: int = 0  # the arrival schedule's

    def validate(self) -> None:
        if self.repeats < 1:
            raise SpecgenError(f"--repeats must be >= 1 (got {self.repeats})")
        if self.sampling.max_tokens < 1:
            raise SpecgenError(f"-n/--max-tokens must be >= 1 (got {self.sampling.max_tokens})")
        if not self.timeout > 0:
            raise SpecgenError(f"--timeout must be > 0 seconds (got {self.timeout:g})")
        if self.count is not None and not 1 <= self.count <= MAX_COUNT:
            raise SpecgenError(f"--count must be in 1..{MAX_COUNT} (got {self.count})")
        if self.duration is not None and not self.duration > 0:
            raise SpecgenError(f"--duration must be > 0 seconds (got {self.duration:g})")


@dataclass
class ClientTiming:
    """The client's own cost: CPU seconds of this process while measuring, per request sent."""

    cpu_s: float = 0.0
    wall_s: float = 0.0
    requests: int = 0
    request_s: float = 0.0  # sum of every request's end-to-end latency

    def to_dict(self) -> dict:
        per = self.cpu_s / self.requests if self.requests else 0.0
        return {"cpu_s": self.cpu_s, "wall_s": self.wall_s, "requests": self.requests,
                "cpu_per_request_ms": 1000 * per,
                "cpu_share_of_request_time": self.cpu_s / self.request_s if self.request_s else 0.0}


class HttpBench:
    """Measures requests against endpoints; records go to `sink` as each request (or batch) finishes."""

    def __init__(self, endpoints: Sequence[Endpoint], requests: Sequence[Request], settings: LoadSettings) -> None:
        settings.validate()
        self.endpoints, self.requests, self.settings = list(endpoints), list(requests), settings
        self.baseline = self.endpoints[0].name
        self.names = [e.name for e in self.endpoints]
        self.timing = ClientTiming()
        self.models: dict[str, list[str]] = {}
        self.streams: StreamPool | None = None

    @contextlib.asynccontextmanager
    async def client(self):
        """The httpx client for the probe and /metrics (yielded), and the stream pool (self.streams) meanwhile."""
        t = self.settings.timeout
        self.streams = StreamPool(connect_timeout=min(t, 10.0))
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(t, connect=min(t, 10.0)),
                                         limits=httpx.Limits(max_connections=None, max_keepalive_connections=256)) as c:
                yield c
        finally:
            self.streams.close()
            self.streams = None

    async def stream(self, client: httpx.AsyncClient, ep: Endpoint, path: str, body: dict) -> dict:
        """One streamed request, read as its bytes arrive (http.stream_one's dict)."""
        return await stream_one(self.streams, ep, path, body, self.settings.timeout)

    async def prepare(self, client: httpx.AsyncClient) -> None:
        """Probe every endpoint, then one short untimed request each (warm-up, and proof it streams).

        The warm-up also says whether an endpoint's responses carry their own
        speculative statistics (ep.per_request): if they do, its /metrics
        counters are not read around each request.
        """
        for ep in self.endpoints:
            self.models[ep.name] = await probe(client, ep)
        if not self.settings.warmup:
            return
        req = self.requests[0]
        for ep in self.endpoints:
            path, body = request_body(ep, req, self.settings.sampling, WARMUP_TOKENS)
            raw = await self.stream(client, ep, path, body)
            if raw["error"] is not None:
                raise SpecgenError(f"endpoint {ep.name} ({ep.url}): the warm-up request failed: {raw['error']}")
            ep.per_request = run_measures(raw)["spec_source"] is not None

    async def one(self, client, ep: Endpoint, req: Request, alone: bool = True) -> dict:
        """One measured request: run measures, or a failure dict (`error` set).

        alone: no other request is in flight to this endpoint, so the
        difference of its /metrics counters around this one is this one's
        (read only for an endpoint whose responses carry no statistics of their own).
        """
        path, body = request_body(ep, req, self.settings.sampling)
        scrape = alone and ep.counters is not None and not ep.per_request
        before = await scrape_spec_counters(client, ep) if scrape else None
        raw = await self.stream(client, ep, path, body)
        self.timing.requests += 1
        self.timing.request_s += raw["total_s"]
        if raw["error"] is not None:
            return raw
        m = run_measures(raw)
        if before is not None and m["spec_source"] is None:
            d = counter_delta(before, await scrape_spec_counters(client, ep))
            if d is not None:
                m.update(counter_stats(d, ep.counters))
        return m

    # -- sequential: per-request speedup ---------------------------------------------------

    async def sequential(self, client, pending: Sequence[Request], sink: Callable[[dict], None], *,
                         on_run=None, on_request=None) -> None:
        eps, s = self.endpoints, self.settings
        for i, req in enumerate(pending):
            runs, failed = [], []
            for rep, order in enumerate(run_order(len(eps), s.repeats, i)):
                for ci in order:
                    if on_run:
                        on_run(req, eps[ci])
                    m = await self._timed(self.one(client, eps[ci], req))
                    if m["error"] is None:
                        runs.append(endpoint_run(eps[ci].name, rep, m))
                    else:
                        failed.append(endpoint_failure(eps[ci].name, rep, m))
            temp = s.sampling.temperature if req.temperature is None else req.temperature
            rec = endpoint_request_record(req, runs, failed, self.names, self.baseline, temp == 0,
                                          req.max_tokens or s.sampling.max_tokens)
            if rec["temperature"] is None:
                rec["temperature"] = temp
            sink(rec)
            if on_request:
                on_request(rec)

    async def _timed(self, coro):
        """Await `coro`, adding the process's CPU and wall time to the client's timing."""
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            return await coro
        finally:
            self.timing.cpu_s += time.process_time() - c0
            self.timing.wall_s += time.perf_counter() - w0

    # -- load levels ---------------------------------------------------------------------

    def jobs(self) -> list[Request]:
        n = self.settings.count or len(self.requests)
        return [self.requests[i % len(self.requests)] for i in range(n)]

    def plan(self, concurrency: Sequence[int], rates: Sequence[float]) -> list[tuple[str, object, int, list[Endpoint]]]:
        """Every group of batches, in order: (load, level, repeat, endpoints in alternating order)."""
        out = []
        levels = [("concurrency", c) for c in concurrency] + [("rate", r) for r in rates]
        for li, (load, level) in enumerate(levels):
            for rep, order in enumerate(run_order(len(self.endpoints), self.settings.repeats, li)):
                out.append((load, level, rep, [self.endpoints[ci] for ci in order]))
        return out

    async def sweep(self, client, concurrency: Sequence[int], rates: Sequence[float], sink: Callable[[dict], None], *,
                    done: set[str] = frozenset(), on_batch=None) -> None:
        """Every level × repeat × endpoint whose record id is not in `done`.

        The endpoints of one level and repeat run one after the other and are
        recorded together, once greedy outputs are compared with the baseline's.
        """
        plan = self.plan(concurrency, rates)
        total = sum(len(eps) for *_, eps in plan)
        i = 0
        for load, level, rep, eps in plan:
            batch = []
            for ep in eps:
                i += 1
                if f"{load}={level}/{ep.name}/{rep}" in done:
                    continue
                if on_batch:
                    on_batch(i, total, load, level, ep)
                batch.append(await self.batch(client, ep, load, level, rep))
            _compare(batch, self.baseline)
            for rec in batch:
                sink(rec)

    async def batch(self, client, ep: Endpoint, load: str, level, rep: int) -> dict:
        """One level in one endpoint: its "serve" record."""
        before = await scrape_spec_counters(client, ep) if ep.counters is not None else None
        if load == "concurrency":
            results, wall = await self._timed(self.closed_loop(client, ep, self.jobs(), level))
        else:
            arrivals = self.arrivals(level, rep)
            results, wall = await self._timed(self.open_loop(client, ep, self.jobs()[: len(arrivals)], arrivals))
        counters = counter_delta(before, await scrape_spec_counters(client, ep)) if before is not None else None
        if counters is not None:
            counters["source"] = f"metrics-delta:{ep.counters}"
        return load_record(load, level, ep.name, rep, results, wall, counters)

    def arrivals(self, rate: float, repeat: int) -> list[float]:
        s = self.settings
        count = s.count or (MAX_COUNT if s.duration else len(self.requests))
        # the same schedule for every endpoint at a level and repeat: they see the same load
        return poisson_arrivals(rate, count, s.duration, s.seed + 7919 * repeat)

    async def _request(self, client, ep: Endpoint, n: int, req: Request, t0: float, scheduled: float | None,
                       alone: bool = False) -> dict:
        sent = time.perf_counter() - t0
        m = await self.one(client, ep, req, alone)
        temp = self.settings.sampling.temperature if req.temperature is None else req.temperature
        head = {"id": req.id, "category": req.category, "n": n, "temperature": temp, "scheduled_s": scheduled,
                "sent_s": sent}
        if m["error"] is not None:
            return {**head, "status": m["status"], "error": m["error"], "latency_s": m["total_s"],
                    "ttft_s": m["ttft_s"], "queue_s": 0.0, "service_s": m["total_s"], "tokens_per_s": 0.0,
                    "drafted": 0, "accepted": 0, "generated_tokens": 0}
        return {**head, **m, "latency_s": m["total_s"], "service_s": m["total_s"] - m["queue_s"]}

    async def closed_loop(self, client, ep: Endpoint, jobs: Sequence[Request], concurrency: int) -> tuple[list[dict], float]:
        """`concurrency` requests in flight until `jobs` are done; (results in order sent, wall seconds)."""
        results: list[dict | None] = [None] * len(jobs)
        it = iter(enumerate(jobs))
        t0 = time.perf_counter()

        async def worker():
            for n, req in it:
                results[n] = await self._request(client, ep, n, req, t0, None, alone=concurrency == 1)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(jobs)))))
        return [r for r in results if r is not None], time.perf_counter() - t0

    async def open_loop(self, client, ep: Endpoint, jobs: Sequence[Request], arrivals: Sequence[float]) -> tuple[list[dict], float]:
        """Each job sent at its arrival time, whatever is still in flight; (results in order sent, wall seconds).

        Wall time runs from the start of the schedule to the last response.
        """
        t0 = time.perf_counter()
        tasks = []
        try:
            for n, (req, at) in enumerate(zip(jobs, arrivals)):
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self._request(client, ep, n, req, t0, at)))
            results = await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        return list(results), time.perf_counter() - t0


def _compare(batch: list[dict], baseline: str) -> None:
    """Greedy text equality of each request with the baseline's same request (n) in the same group."""
    base = next((b for b in batch if b["config"] == baseline), None)
    ref = {r["n"]: r["text"] for r in base["requests"] if r.get("error") is None} if base else {}
    for b in batch:
        for r in b["requests"]:
            if r.get("error") is None:
                r["matches_plain"] = (None if b["config"] == baseline or r["temperature"] != 0 or r["n"] not in ref
                                      else ref[r["n"]] == r["text"])


def run(coro):
    """asyncio.run for the CLI: Ctrl-C cancels the measuring task and comes back as KeyboardInterrupt."""
    return asyncio.run(coro)
