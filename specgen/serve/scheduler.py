"""Concurrent serving: several requests in one llama.cpp context, continuous batching.

Each request gets a slot (a sequence id, 0 … slots-1) for as long as it runs;
when it finishes, the next waiting request takes the slot. Every step builds
ONE `decode_batch` over all active sequences, bounded by n_batch:

- verify rows `[last, d1 … dk]` of each generating sequence (k = 0: a plain
  decode row), planned by that request's own `Generation` state machine;
- prompt prefill chunks of newly admitted requests, with logits only on a
  prompt's last row, in whatever budget the verify rows leave (beside
  generating sequences whose reserved verify rows leave room under
  `SchedulerSettings.shared_step_rows`, the step stays under it: the prompt
  goes in chunks).

Acceptance and rollback stay in `Generation.settle` (each sequence rolls back
its own rejected tail); each request keeps its own seeded rng. Drafting goes
through `specgen.decode.generation.plan_step`, as in a single-sequence run: a draft model
drafts all sequences together, step by step, in its own context, and the
cost-aware policy sees the step it is planned into: it maximises the step's
expected tokens per second, so drafting shrinks as the other rows saturate
the machine. A `gate` (specgen.policy.stepgate, with the cost policy) decides per
step whether a step of several sequences drafts at all, from the measured
throughput of such steps with and without drafts. In a step that prefills a
prompt beside them (`prefill_drafts`) the drafts are planned first, priced as in
a shared step without the prompt (the prompt's rows would make drafts look
free), and the prompt's chunk takes the rest of `shared_step_rows`.

The engine must be opened with n_seq_max >= slots; kv_unified=True keeps a
mixed batch in one ubatch (llama.cpp's split cache cuts it into equal-length
pieces) and makes n_ctx one pool, which admission accounts for: a request is
admitted only when its worst-case cache size fits beside the others'.

Prompt cache (on unless `SchedulerSettings(prompt_cache=False)`): a finished request's cache
stays in its slot. A new request takes the free slot whose cached tokens
share the longest prefix with its prompt (as llama-server picks slots by
similarity; a match under a tenth of the prompt takes the least recently used
slot instead), the rest of that slot is removed, and only the new tail is
prefilled (at least the last prompt token, for its logits); a running request
whose cache shares `min_copy` more of the prompt than any free slot lends that
prefix instead (`Engine.copy_prefix`: the cells are shared, not computed
again; two requests on one passage or one set of instructions). Idle slots' cached
tokens count against the pool: they are evicted, least recently used first,
when an admission needs the room. Drafters need nothing for it: prompt lookup
and suffix indexes start afresh per generation, and a draft model's cache of
the slot keeps the prefix its sync still agrees with. With a `store`
(specgen.serve.promptstore), a slot's cache about to be overwritten or evicted is
saved to host memory, and a prompt that shares more with a saved state than
with any slot has that state loaded into its slot.

Online use (the HTTP server): `submit` queues a job with callbacks, `step`
admits what fits and runs one decode step (reporting settled tokens and
finished requests), `cancel` drops a job at the next step. `serve(jobs)` is
that loop with everything submitted up front.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Sequence


from specgen.decode.generation import Generation, Planned, plan_step
from specgen.engine.llama import common_prefix
from specgen.serve.promptstore import MIN_SAVE
from specgen.errors import SpecgenError
from specgen.policy.base import FixedK
from specgen.rules.sampling import SamplingParams

MAX_SLOTS = 256  # llama.cpp's LLAMA_MAX_SEQ


@dataclass(frozen=True)
class SchedulerSettings:
    """The scheduler's tuning knobs; the defaults are what serving uses.
    The measurements behind each value: docs/notes/2026-11-serving-knobs.md."""

    # The most rows a step that prefills beside generating sequences may hold:
    # llama.cpp's CPU flash attention tiles from 64 query rows on, and then a
    # prompt chunk's attention spans the whole interleaved cache. A prompt
    # alone still takes the whole batch.
    shared_step_rows: int = 63
    # Shared steps are shaped to a multiple of this many rows (drafts lengthened
    # from free offers or cut, a prompt chunk that does not end its prompt cut):
    # llama.cpp's CPU matmuls take rows in gemm blocks of 4. 1: off.
    row_group: int = 4
    # A running request's cached prefix shared with a new prompt is copied into the
    # new request's slot (llama.cpp's seq_cp: the cells are shared, nothing is
    # computed) when it is at least this much longer than the free slots' best.
    min_copy: int = 16
    # A step that prefills beside generating sequences may draft (with the gate, the
    # cost policy's servers): the drafts are planned as in a shared step without the
    # prompt, and the chunk fills the rest of shared_step_rows. False: such steps are
    # planned plain (the verify rows of a prefill step cost only their share of it).
    prefill_drafts: bool = True
    # llama-server's --slot-prompt-similarity: a smaller match takes the least recently used slot
    slot_similarity: float = 0.1
    # Keep a finished request's cache in its slot (and states saved from slots in the
    # store) for later prompts that share its prefix; False: every request prefills
    # from an empty slot, as a sequential run does (`--no-prompt-cache`)
    prompt_cache: bool = True


@dataclass
class Job:
    """A request to serve: prompt tokens and how to generate."""

    id: str
    prompt: list[int]
    max_tokens: int
    params: SamplingParams = SamplingParams()
    meta: dict = field(default_factory=dict)  # carried into the record (category, …)
    draft_max: int | None = None  # this request's ceiling on k (0: plain); None: the server's
    cache_prompt: bool = True  # may reuse a slot's cached prefix (when the server's prompt cache is on)


@dataclass
class _Active:
    job: Job
    seq: int
    gen: Generation
    t_submit: float
    t_admit: float
    reserve: int  # cache tokens this request may reach
    prefilled: int = 0  # prompt tokens in the cache so far
    cached: int = 0  # of them, those found in the slot's cache at admission
    t_first: float | None = None
    planned: Planned | None = None  # this step's round (its verify rows: `planned.rows`)
    chunk: int = 0  # prompt tokens in this step's prefill part

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.job.prompt)


def need_tokens(prompt_tokens: int, max_tokens: int, draft_max: int) -> int:
    """Cache positions one request may occupy: prompt, output, a full draft."""
    return prompt_tokens + max_tokens + draft_max + 1


def max_concurrency(n_ctx: int, need: int) -> int:
    """How many requests of `need` cache tokens one unified context holds at once."""
    return min(n_ctx // max(need, 1), MAX_SLOTS)


# =============================================================== the server


@dataclass
class _Listener:
    """Who hears about one submitted job, and how many of its tokens they have."""

    on_tokens: Callable | None = None
    on_finish: Callable | None = None
    on_drop: Callable | None = None
    sent: int = 0


@dataclass
class ServeResult:
    """One finished request: its Generation and the server's clock readings."""

    job: Job
    gen: Generation
    seq: int
    queue_s: float  # submission → admission
    ttft_s: float  # submission → first token
    latency_s: float  # submission → last token
    step_rows: Counter  # rows of the steps this request was in (how busy the machine was)
    cached_tokens: int = 0  # prompt tokens reused from the slot's cache, not prefilled

    def record(self) -> dict:
        st, gen = self.gen.stats, self.gen
        decode_s = self.latency_s - self.ttft_s
        return {
            "id": self.job.id,
            **self.job.meta,
            "seq": self.seq,
            **st.record(),
            "cached_tokens": self.cached_tokens,
            "queue_s": self.queue_s,
            "ttft_s": self.ttft_s,
            "latency_s": self.latency_s,
            "service_s": self.latency_s - self.queue_s,  # admission → last token: a sequential run's total_s
            "tokens_per_s": (st.generated - 1) / decode_s if st.generated > 1 and decode_s > 0 else 0.0,
            "mean_step_rows": _mean(self.step_rows),  # how full the steps it shared were
            "tokens": list(gen.tokens),
        }


class Server:
    """Serve jobs on `slots` sequences of one target engine, continuous batching.

    drafter: one drafter for every slot (prompt lookup keeps an index per
    sequence; a draft model drafts all sequences together in its own context),
    None for plain decoding. new_policy(): a fresh policy per request; each
    is told, when it chooses, what the rest of the step holds. settings: the
    scheduler's tuning knobs (`SchedulerSettings`; the defaults serve).
    """

    def __init__(
        self,
        target,
        slots: int,
        *,
        draft_max: int = 0,
        drafter=None,
        new_policy: Callable[[], object] | None = None,
        gate=None,
        store=None,
        settings: SchedulerSettings = SchedulerSettings(),
    ) -> None:
        if not 1 <= slots <= MAX_SLOTS:
            raise SpecgenError(f"concurrency must be in 1..{MAX_SLOTS} (got {slots})")
        if getattr(target, "n_seq_max", slots) < slots:
            raise SpecgenError(f"the context was opened for {target.n_seq_max} sequences, not {slots}")
        if slots > 1 and not getattr(target, "kv_unified", True):
            raise SpecgenError("concurrent serving needs a unified KV cache (Engine(..., kv_unified=True))")
        if slots * (draft_max + 1) > target.n_batch:
            raise SpecgenError(
                f"{slots} sequences × {draft_max + 1} verify rows exceed the batch of {target.n_batch} rows"
            )
        self.target = target
        self.slots = slots
        self.settings = settings
        self.draft_max = draft_max if drafter is not None else 0
        self.drafter = drafter if self.draft_max else None
        self.new_policy = new_policy or FixedK
        self.gate = gate if self.drafter is not None else None  # a StepGate: do shared steps draft at all?
        self.prompt_cache = settings.prompt_cache
        self.store = store if settings.prompt_cache else None  # a PromptStore for states saved from slots
        self.cached_tokens = 0  # prompt tokens admissions found cached, all requests
        self.steps = 0  # decode_batch calls on the target
        self.step_log: list[tuple[int, int, int]] = []  # (sequences, verify rows, prefill rows) per step
        # the online queue (submit / cancel / step)
        self._waiting: deque[tuple[Job, int, float]] = deque()  # (job, cache need, submitted at)
        self._free = list(range(slots))
        self._last_used = [0] * slots  # admission count when each slot last took a request (LRU order)
        self._admissions = 0
        self._active: list[_Active] = []
        self._used = 0  # cache tokens reserved by active requests
        self._rows_seen: dict[int, Counter] = {}
        self._listeners: dict[int, _Listener] = {}  # by id(job)
        self._cancelled: set[int] = set()  # id(job) of requests to drop at the next step

    def check(self, job: Job) -> int:
        """Cache positions the job may need; refuses one that could never fit."""
        need = need_tokens(len(job.prompt), job.max_tokens, self.draft_max)
        if not job.prompt:
            raise SpecgenError(f"request '{job.id}': empty prompt")
        if need > self.target.n_ctx:
            raise SpecgenError(
                f"request '{job.id}': {len(job.prompt)} prompt + {job.max_tokens} generated tokens "
                f"(+{self.draft_max + 1} for drafts) do not fit a context of {self.target.n_ctx} (raise -c/--ctx-size)"
            )
        return need

    def serve(self, jobs: Sequence[Job], on_finish: Callable[[ServeResult], None] | None = None) -> list[ServeResult]:
        """Serve every job (all submitted now); results in finishing order."""
        for j in jobs:
            self.check(j)
        done: list[ServeResult] = []

        def finished(res: ServeResult) -> None:
            done.append(res)
            if on_finish:
                on_finish(res)

        for j in jobs:
            self.submit(j, on_finish=finished)
        while self.busy:
            self.step()
        return done

    # -- online: submit / cancel / step, all from the thread that owns the engine
    @property
    def busy(self) -> bool:
        """Requests waiting or running (or cancellations not yet applied)."""
        return bool(self._waiting or self._active or self._cancelled)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._active)

    def submit(
        self,
        job: Job,
        *,
        on_tokens: Callable[[Job, list[int]], None] | None = None,
        on_finish: Callable[[ServeResult], None] | None = None,
        on_drop: Callable[[Job], None] | None = None,
    ) -> Job:
        """Queue a job (checked now: raises SpecgenError if it can never fit).

        on_tokens(job, new_tokens) runs after each step that settled tokens of
        it; on_finish(result) once, when it ends (also when cancelled while
        running: stop_reason "interrupted"); on_drop(job) instead, when it is
        cancelled before it had a slot. The job is its own handle.
        """
        need = self.check(job)
        self._waiting.append((job, need, time.perf_counter()))
        self._listeners[id(job)] = _Listener(on_tokens, on_finish, on_drop)
        return job

    def cancel(self, job: Job) -> None:
        """Drop a job at the start of the next step; safe inside a callback."""
        if id(job) in self._listeners:
            self._cancelled.add(id(job))

    def step(self) -> list[ServeResult]:
        """Apply cancellations, admit what fits, run ONE decode step; the requests it finished."""
        finished_now = self._apply_cancels()
        # admit in arrival order while a slot and the cache have room
        while self._waiting and self._free and self._used + self._waiting[0][1] <= self.target.n_ctx:
            job, need, t_submit = self._waiting.popleft()
            seq, keep, saved = self._pick_slot(job)
            self._free.remove(seq)
            self._used += need
            self._make_room()
            self._active.append(self._admit(job, seq, need, t_submit, keep, saved))
            self._rows_seen[seq] = Counter()
        active = self._active
        if not active:
            return finished_now
        generating = [a for a in active if not a.prefilling]
        t0 = time.perf_counter()
        before = sum(len(a.gen.tokens) for a in generating)
        prefill = len(generating) < len(active)
        plain_prefill = prefill and not self.settings.prefill_drafts
        drafts = self.gate.drafts(len(generating), plain_prefill) if self.gate is not None else True
        parts, owners = self._build_step(active, generating, drafts)
        views = self.target.decode_batch(parts) if parts else []
        self.steps += bool(parts)
        n_rows = sum(len(p[1]) for p in parts)
        for a in active:
            self._rows_seen[a.seq][n_rows] += 1
        finished = self._settle(generating, owners, views)
        if self.gate is not None and all(kind == "verify" for _, kind in owners):  # prefill rows would skew its time
            settled = sum(len(a.gen.tokens) for a in generating) - before
            self.gate.observe(len(generating), drafts, settled, time.perf_counter() - t0)
        for a in list(active):
            lis = self._listeners[id(a.job)]
            new = a.gen.tokens[lis.sent :]
            if new and lis.on_tokens:
                lis.sent += len(new)
                lis.on_tokens(a.job, list(new))
        for a in finished:
            finished_now.append(self._release(a))
        return finished_now

    def _release(self, a: _Active) -> ServeResult:
        """Free a's slot and cache reservation; its result, reported to its listener."""
        self._active.remove(a)
        self._free.append(a.seq)
        self._free.sort()
        self._used -= a.reserve
        if not self.prompt_cache:  # its cells go back to the pool now
            self._evict(a.seq)
        now = time.perf_counter()
        res = ServeResult(
            a.job, a.gen, a.seq, a.t_admit - a.t_submit, (a.t_first or now) - a.t_submit,
            now - a.t_submit, self._rows_seen.pop(a.seq), a.cached,
        )
        lis = self._listeners.pop(id(a.job))
        self._cancelled.discard(id(a.job))  # a cancel that came as it finished
        if lis.on_finish:
            lis.on_finish(res)
        return res

    def _apply_cancels(self) -> list[ServeResult]:
        if not self._cancelled:
            return []
        gone, self._cancelled = self._cancelled, set()
        kept = deque()
        for item in self._waiting:  # never admitted: no result
            if id(item[0]) in gone:
                lis = self._listeners.pop(id(item[0]))
                if lis.on_drop:
                    lis.on_drop(item[0])
            else:
                kept.append(item)
        self._waiting = kept
        out = []
        for a in [a for a in self._active if id(a.job) in gone]:
            a.gen.interrupt()  # the cache holds what was settled (a prefix to reuse); _release frees it if uncached
            out.append(self._release(a))
        return out

    # -- slots and the prompt cache ---------------------------------------
    def _pick_slot(self, job: Job) -> tuple[int, int, tuple | int | None]:
        """The free slot for a job, how many of its prompt tokens are cached for it
        (always fewer than the prompt: the last one is decoded for its logits), and
        where they come from: None, the slot's own cache; a running request's slot
        (an int) to copy them from; or a stored state (a tuple) to load."""
        if not self.prompt_cache:
            return self._free[0], 0, None
        lru = min(self._free, key=lambda s: self._last_used[s])
        if not job.cache_prompt:  # a fresh prefill: in the slot whose cache is least likely wanted
            return lru, 0, None
        prompt, cap = job.prompt, len(job.prompt) - 1
        shared = {s: min(common_prefix(self.target.kv_tokens(s), prompt), cap) for s in self._free}
        best = max(self._free, key=lambda s: (shared[s], -self._last_used[s]))
        if shared[best] < self.settings.slot_similarity * len(prompt):
            best = lru
        if self._active:
            # a running request's prefix (two requests on one passage, one
            # instruction): its cells are shared, not computed again
            src = max(self._active, key=lambda a: common_prefix(self.target.kv_tokens(a.seq), prompt))
            n = min(common_prefix(self.target.kv_tokens(src.seq), prompt), cap)
            if n >= shared[best] + self.settings.min_copy:  # into the slot whose own cache is least likely wanted
                return lru, n, src.seq
        if self.store is not None:
            saved, n = self.store.best(prompt)
            if min(n, cap) >= shared[best] + MIN_SAVE:  # loading beats the slot's own cache by enough to pay
                return best, min(n, cap), saved
        return best, shared[best], None

    def _idle_cells(self) -> int:
        return sum(len(self.target.kv_tokens(s)) for s in self._free)

    def _make_room(self) -> None:
        """Evict idle slots' caches, least recently used first, until every running
        request's worst case fits beside what stays cached."""
        for s in sorted(self._free, key=lambda s: self._last_used[s]):
            if self._used + self._idle_cells() <= self.target.n_ctx:
                return
            self._evict(s)

    def _evict(self, seq: int) -> None:
        """Empty a slot's cache (and the draft model's cache of it), saved first if there is a store."""
        self._save(seq, 0)
        self.target.truncate(seq, 0)
        draft = self._draft_engine()
        if draft is not None:
            draft.truncate(seq, 0)

    def _save(self, seq: int, keep: int) -> None:
        """Save the slot's state before all but `keep` of its tokens go, if that loses enough."""
        if self.store is not None and len(self.target.kv_tokens(seq)) - keep >= MIN_SAVE:
            self.store.put(self.target.kv_tokens(seq), self.target.save_seq(seq))

    def _load(self, seq: int, need: int, saved: tuple) -> bool:
        """Load a stored state into the slot, if the pool has room for all of it for a moment."""
        if self._used - need + self._idle_cells() + len(saved) > self.target.n_ctx:
            return False
        return self.target.load_seq(seq, saved, self.store.take(saved))

    def _draft_engine(self):
        engine = self.drafter.engine if self.drafter is not None else None
        return engine if engine is not None and engine is not self.target else None

    # -- one step ---------------------------------------------------------
    def _admit(self, job: Job, seq: int, need: int, t0: float, keep: int = 0,
               saved: tuple | int | None = None) -> _Active:
        k = self.draft_max if job.draft_max is None else max(0, min(job.draft_max, self.draft_max))
        gen = Generation(
            self.target, job.prompt, self.drafter, draft_max=k, max_tokens=job.max_tokens,
            params=job.params, seq=seq, policy=self.new_policy(),
        )
        if isinstance(saved, int):  # another slot's prefix, shared
            self._save(seq, 0)
            self.target.copy_prefix(saved, seq, keep)
        elif saved is not None:
            self._save(seq, 0)
            if not self._load(seq, need, saved):
                keep = 0
        else:
            self._save(seq, keep)
        self.target.truncate(seq, keep)
        draft = self._draft_engine()
        if draft is not None and not keep:
            draft.truncate(seq, 0)
        elif draft is not None and not self.drafter.translated:
            # the draft's cache of the slot: at most what agrees with this prompt (its sync keeps that)
            draft.truncate(seq, common_prefix(draft.kv_tokens(seq), job.prompt))
        self._admissions += 1
        self._last_used[seq] = self._admissions
        self.cached_tokens += keep
        gen.begin()
        return _Active(job, seq, gen, t0, time.perf_counter(), need, prefilled=keep, cached=keep)

    def _build_step(self, active: list[_Active], generating: list[_Active], drafts: bool = True):
        """The step's parts: verify rows of generating sequences (drafts: False plans
        every one plain), then prefill chunks."""
        prefilling = [a for a in active if a.prefilling]
        group, cap = self.settings.row_group, self.settings.shared_step_rows
        # a plain shared step of 4m + r sequences: its gemv rows cost about a whole
        # block, so a free drafter's offers may fill the block (the policies choose
        # within it; a step that prefills is planned plain, its chunk fills the block)
        fill = (not drafts and not prefilling and group > 1 and len(generating) % group > 0
                and len(generating) > 1 and self.drafter is not None and self.drafter.free)
        max_rows = -(-len(generating) // group) * group if fill else None
        # a gated step that prefills beside drafting sequences: their drafts are planned
        # first, priced as a shared step without the prompt, and the chunk takes the rest
        plan_first = (self.settings.prefill_drafts and drafts and self.gate is not None
                      and bool(prefilling and generating))
        if plan_first:
            # a prompt tail that ends in this step cannot be cut to a block: the drafts
            # fit around its rows (a cached prompt's last token: 1 row beside them)
            tail = sum(len(a.job.prompt) - a.prefilled for a in prefilling)
            self._plan(generating, self.drafter, tail % group if tail <= cap // 2 else 0, None)
            reserved = sum(len(a.planned.rows) for a in generating if a.planned is not None)
        else:
            reserved = len(generating) * (self.draft_max + 1 if drafts and self.drafter is not None else 1)
        budget = self.target.n_batch - reserved
        # prefill beside decoding sequences: in chunks under shared_step_rows, unless their
        # reservation fills that already (capping then would starve prompts of a busy server)
        if generating and reserved < cap:
            budget = min(budget, cap - reserved)
        prefill_parts = []
        for a in prefilling:
            if budget <= 0:
                break
            prompt = a.job.prompt
            chunk = prompt[a.prefilled : a.prefilled + budget]
            last = a.prefilled + len(chunk) == len(prompt)
            a.chunk = len(chunk)
            prefill_parts.append((a, chunk, 1 if last else 0))
            budget -= len(chunk)
        if generating and prefill_parts and (plan_first or not (drafts and self.drafter is not None)):
            self._fit_chunks(prefill_parts, reserved if plan_first else len(generating))
        prefill_rows = sum(len(c) for _, c, _ in prefill_parts)
        if not plan_first:
            self._plan(generating, self.drafter if drafts or fill else None, prefill_rows, max_rows)
        parts, owners = [], []
        for a in generating:
            if a.planned is not None:
                parts.append((a.seq, a.planned.rows, len(a.planned.rows)))
                owners.append((a, "verify"))
        for a, chunk, n_logits in prefill_parts:
            parts.append((a.seq, chunk, n_logits))
            owners.append((a, "prefill"))
        self.step_log.append((len(parts), sum(len(a.planned.rows) for a in generating if a.planned is not None), prefill_rows))
        return parts, owners

    def _plan(self, generating: list[_Active], drafter, busy_rows: int, max_rows: int | None) -> None:
        gens = [a.gen for a in generating]
        for a, rows in zip(generating, plan_step(gens, drafter, busy_rows, self.settings.row_group, max_rows)):
            a.planned = rows

    def _fit_chunks(self, prefill_parts: list, verify_rows: int) -> None:
        """Cut a chunk that does not end its prompt so the step's rows are a
        multiple of settings.row_group (its rows go in the next step); in place."""
        r = (verify_rows + sum(len(c) for _, c, _ in prefill_parts)) % self.settings.row_group
        for i in reversed(range(len(prefill_parts)) if r else ()):
            a, chunk, n_logits = prefill_parts[i]
            if n_logits == 0 and len(chunk) > r:
                a.chunk = len(chunk) - r
                prefill_parts[i] = (a, chunk[: a.chunk], 0)
                return

    def _settle(self, generating: list[_Active], owners, views) -> list[_Active]:
        finished = [a for a in generating if a.planned is None]  # plan() said done (context full)
        for (a, kind), rows in zip(owners, views):
            if kind == "verify":
                a.gen.settle(a.planned, rows, shared=len(owners) > 1)  # a pass of its own times its verify cost
                if a.gen.done:
                    finished.append(a)
                continue
            a.prefilled += a.chunk
            if not a.prefilling:
                a.gen.first(rows[0])
                a.t_first = time.perf_counter()
                if a.gen.done:
                    finished.append(a)
        return finished


def _mean(hist: Counter) -> float:
    n = sum(hist.values())
    return sum(k * v for k, v in hist.items()) / n if n else 0.0
