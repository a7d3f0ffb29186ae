"""The engine thread: it alone drives the scheduler; the HTTP side only posts to it.

HTTP handlers (asyncio) call `submit` / `cancel`, which put a message in a
thread-safe inbox and never wait on the engine. The engine thread drains the
inbox, runs one scheduler step at a time, turns each request's settled tokens
into text (incremental UTF-8, stop strings held back and cut), and hands the
text to the request's asyncio queue with call_soon_threadsafe. A stop string
or a client that went away cancels the request: its slot is free for the next
step.

After a step that finished requests, the engine waits up to `linger_s` for
their slots' next requests before it steps again: a client that sends its
next request as soon as one ends (an agent, a benchmark's closed loop) would
otherwise miss the next step, which then runs a sequence short, and requests
that come back together are prefilled together.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import queue
import threading
import time
from typing import Callable

from specgen.apps.chat import StopScanner
from specgen.errors import SpecgenError
from specgen.serve.http.metrics import Metrics
from specgen.serve.http.schema import ApiError, Spec
from specgen.serve.scheduler import Job, ServeResult

log = logging.getLogger("specgen.server")
STEP_LOG_KEEP = 10_000
LINGER_S = 0.005  # EngineLoop's default linger_s


class Request:
    """One generation request, shared by the HTTP side and the engine thread.

    Events on `events` (read by the HTTP side): ("text", str) for each run of
    safe text, then ("done", finish, record, text) or ("error", ApiError).
    """

    def __init__(self, job: Job, stops: list[str], spec: Spec, aloop: asyncio.AbstractEventLoop) -> None:
        self.job, self.stops, self.spec, self.aloop = job, stops, spec, aloop
        self.events: asyncio.Queue = asyncio.Queue()
        self.ended = False  # the HTTP side saw "done" or "error"
        # engine thread only
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._scan = StopScanner(stops)
        self._stop_hit = False
        self._cancelled = False
        self._counted = True  # holds a place in the bounded queue

    def post(self, event: tuple) -> None:
        try:
            self.aloop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown)
            pass


class QueueFull(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(503, message, code="server_busy", type="server_error", headers={"Retry-After": "1"})


class EngineLoop:
    """Owns the Server; a bounded number of requests may be in flight (running + waiting)."""

    def __init__(self, new_server: Callable[[], object], target, *, parallel: int, queue_max: int,
                 metrics: Metrics | None = None, linger_s: float = LINGER_S) -> None:
        self.new_server = new_server
        self.server = new_server()
        self.target = target
        self.parallel = parallel
        self.queue_max = queue_max
        self.linger_s = linger_s  # after a step that finished requests: how long to wait for the next ones
        self.metrics = metrics or Metrics()
        self._inbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._inflight = 0
        self._accepting = True
        self._stop_at: float | None = None
        self._thread: threading.Thread | None = None
        self._live: set[Request] = set()
        self.running = 0  # scheduler state as of the last step, for /health and /metrics
        self.waiting = 0
        self.lingers = [0, 0, 0.0]  # waits after steps that finished requests: count, requests caught, seconds

    # -- the HTTP side (any thread) ------------------------------------------------
    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def accepting(self) -> bool:
        return self._accepting

    def check(self, job: Job) -> None:
        """Refuse a job that could never fit the context (read-only on the scheduler)."""
        self.server.check(job)

    def submit(self, req: Request) -> None:
        with self._lock:
            if not self._accepting:
                raise ApiError(503, "the server is shutting down", code="shutting_down", type="server_error")
            if self._inflight >= self.parallel + self.queue_max:
                raise QueueFull(
                    f"the server is busy: {self.parallel} requests running and {self.queue_max} waiting "
                    "(the queue's limit); retry later"
                )
            self._inflight += 1
        self._inbox.put(("submit", req))

    def cancel(self, req: Request) -> None:
        self._inbox.put(("cancel", req))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="specgen-engine", daemon=True)
        self._thread.start()

    def close(self, grace: float = 0.0) -> None:
        """Stop accepting; let running requests finish for `grace` seconds, cancel the rest."""
        with self._lock:
            self._accepting = False
            self._stop_at = time.monotonic() + max(grace, 0.0)
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- the engine thread ------------------------------------------------------------
    def _release(self, req: Request) -> None:
        if req._counted:
            req._counted = False
            with self._lock:
                self._inflight -= 1

    def _run(self) -> None:
        server = self.server
        freed, t_freed = 0, 0.0
        while True:
            try:
                got = self._drain(server, block=not server.busy)
                if freed and self._stop_at is None:
                    self._linger(server, freed - got, t_freed + self.linger_s)
                freed = 0
                if self._stop_at is not None:
                    if time.monotonic() >= self._stop_at:
                        for req in list(self._live):
                            self._cancel(server, req)
                    if not server.busy:
                        break
                if server.busy:
                    freed = len(server.step())
                    t_freed = time.monotonic()
            except Exception as exc:  # an engine failure: fail what runs, start over
                log.exception("engine step failed")
                for req in list(self._live):
                    self._live.discard(req)
                    self._release(req)
                    req.post(("error", ApiError(500, f"generation failed: {type(exc).__name__}: {exc}",
                                                type="server_error", code="engine_error")))
                server = self.server = self.new_server()
            if len(server.step_log) > STEP_LOG_KEEP * 2:  # a server runs for days: keep the recent steps
                del server.step_log[:-STEP_LOG_KEEP]
            self.running, self.waiting = server.running, server.waiting
        # anything still in the inbox arrived after the end
        while True:
            try:
                kind, req = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                self._release(req)
                req.post(("error", ApiError(503, "the server is shutting down", code="shutting_down", type="server_error")))
        self.running = self.waiting = 0

    def _drain(self, server, block: bool) -> int:
        """Handle what the inbox holds (block: wait up to 0.1 s for the first); how many submits."""
        first, got = True, 0
        while True:
            try:
                kind, req = self._inbox.get(timeout=0.1) if (block and first) else self._inbox.get_nowait()
            except queue.Empty:
                return got
            first = False
            got += self._handle(server, kind, req)

    def _handle(self, server, kind: str, req) -> int:
        if kind == "submit":
            self._submit(server, req)
            return 1
        if kind == "cancel":
            self._cancel(server, req)
        return 0

    def _linger(self, server, want: int, deadline: float) -> None:
        """Wait until `want` more requests are submitted, the slots are spoken for, or the deadline."""
        t0, got = time.monotonic(), 0
        if want <= 0 or t0 >= deadline or server.waiting >= self.parallel - server.running:
            return
        while got < want and server.waiting < self.parallel - server.running:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                kind, req = self._inbox.get(timeout=left)
            except queue.Empty:
                break
            got += self._handle(server, kind, req)
        self.lingers[0] += 1
        self.lingers[1] += got
        self.lingers[2] += time.monotonic() - t0

    def _submit(self, server, req: Request) -> None:
        try:
            server.submit(
                req.job,
                on_tokens=lambda job, toks: self._on_tokens(server, req, toks),
                on_finish=lambda res: self._on_finish(req, res),
                on_drop=lambda job: self._on_drop(req),
            )
        except SpecgenError as exc:
            self._release(req)
            req.post(("error", ApiError(400, str(exc), code="context_length_exceeded")))
            return
        self._live.add(req)

    def _cancel(self, server, req: Request) -> None:
        if req not in self._live:
            return
        req._cancelled = True
        self.metrics.cancelled()
        server.cancel(req.job)
        self._release(req)  # the place is free now; the slot at the next step

    def _text(self, req: Request, data: bytes, final: bool = False) -> None:
        text = req._utf8.decode(data, final=final)
        pieces = req._scan.feed(text)
        if final and not req._scan.stopped:
            pieces += req._scan.finish()
        delta = "".join(p for p, _ in pieces)
        if delta:
            req.post(("text", delta))

    def _on_tokens(self, server, req: Request, tokens: list[int]) -> None:
        if req._stop_hit or req._cancelled:
            return
        self._text(req, b"".join(self.target.piece(t) for t in tokens))
        if req._scan.stopped:  # a stop string: cut there, stop generating
            req._stop_hit = True
            server.cancel(req.job)

    def _on_drop(self, req: Request) -> None:
        """Cancelled before it had a slot: a client that is still there hears why."""
        self._live.discard(req)
        self._release(req)
        req.post(("error", ApiError(503, "the request was cancelled before it started (the server is shutting down)",
                                    code="shutting_down", type="server_error")))

    def _on_finish(self, req: Request, res: ServeResult) -> None:
        self._live.discard(req)
        self._release(req)
        if not (req._stop_hit or req._cancelled):
            self._text(req, b"", final=True)
        reason = "stop" if req._stop_hit else "cancelled" if req._cancelled else res.gen.stats.stop_reason
        record = res.record()
        self.metrics.finish(reason, record)
        req.post(("done", reason, record, req._scan.text))
