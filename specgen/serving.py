"""Concurrent serving: several requests in one llama.cpp context, continuous batching.

Each request gets a slot (a sequence id, 0 … slots-1) for as long as it runs;
when it finishes, the next waiting request takes the slot. Every step builds
ONE `decode_batch` over all active sequences, bounded by n_batch:

- verify rows `[last, d1 … dk]` of each generating sequence (k = 0: a plain
  decode row), planned by that request's own `Generation` state machine;
- prompt prefill chunks of newly admitted requests, with logits only on a
  prompt's last row, in whatever budget the verify rows leave.

Acceptance and rollback stay in `Generation.settle` (each sequence rolls back
its own rejected tail); each request keeps its own seeded rng. A draft model
drafts all sequences together, step by step, in its own context
(`BatchedDraftModel`). The cost-aware policy sees the step it is planned into
(`BatchCostAware`): it maximises the step's expected tokens per second, so
drafting shrinks as the other rows saturate the machine.

The engine must be opened with n_seq_max >= slots; kv_unified=True keeps a
mixed batch in one ubatch (llama.cpp's split cache cuts it into equal-length
pieces) and makes n_ctx one pool, which admission accounts for: a request is
admitted only when its worst-case cache size fits beside the others'.

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

import numpy as np

from specgen.decoding import Generation
from specgen.drafters import Draft
from specgen.errors import SpecgenError
from specgen.policy import CostAware, FixedK
from specgen.sampling import SamplingParams, probs, sample

MAX_SLOTS = 256  # llama.cpp's LLAMA_MAX_SEQ


@dataclass
class Job:
    """A request to serve: prompt tokens and how to generate."""

    id: str
    prompt: list[int]
    max_tokens: int
    params: SamplingParams = SamplingParams()
    meta: dict = field(default_factory=dict)  # carried into the record (category, …)
    draft_max: int | None = None  # this request's ceiling on k (0: plain); None: the server's


@dataclass
class _Active:
    job: Job
    seq: int
    gen: Generation
    t_submit: float
    t_admit: float
    reserve: int  # cache tokens this request may reach
    prefilled: int = 0  # prompt tokens in the cache so far
    t_first: float | None = None
    planned: list[int] | None = None  # this step's verify rows
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


# =============================================================== the batch-aware policy


class BatchCostAware(CostAware):
    """CostAware for one sequence in a shared step.

    Before each choice the server says what the rest of the step holds:
    `others_rows` rows and `others_tokens` tokens they are expected to emit.
    k maximises the whole step's expected tokens per second,
    (others_tokens + E[tokens | k]) / (verify(others_rows + k + 1) + k · draft step):
    alone it is CostAware's rule; on a saturated machine (verify cost linear in
    rows) extra rows buy fewer tokens than they cost everyone, so k falls to 0,
    and it grows back as the batch drains. `choices` counts k by others_rows.
    """

    name = "cost"

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.others_rows = 0
        self.others_tokens = 0.0

    def choose(self, key: int, limit: int) -> int:
        limit = min(limit, self.k_max)
        rows, base = self.others_rows, self.others_tokens
        alphas = self._acc(key).rates(limit)
        best_k, best = 0, (base + 1.0) / self._verify(rows + 1)
        tokens = reach = 1.0
        for k in range(1, limit + 1):
            reach *= alphas[k - 1]
            tokens += reach
            r = (base + tokens) / (self._verify(rows + k + 1) + k * self.draft_step_s)
            if r > best:
                best_k, best = k, r
        return self._explore(key, best_k, limit)  # as CostAware: drift to the prior, probe now and then

    def update(self, key: int, k: int, accepted: int, verify_s: float, draft_s: float) -> None:
        # Acceptance only: a shared step's time is not this sequence's verify cost.
        if k > 0:
            self._acc(key).add(k, accepted, self.decay)

    def expected_tokens(self, key: int, k: int) -> float:
        tokens = reach = 1.0
        for a in self._acc(key).rates(k):
            reach *= a
            tokens += reach
        return tokens


# =============================================================== batched draft model


class BatchedDraftModel:
    """A draft model drafting every active sequence together, in its own context.

    Per step of the server: `prepare` takes each sequence's (context, k,
    params, rng), brings each draft cache up to the accepted context (chunked
    to n_batch, several sequences per decode), then drafts one token for every
    sequence still drafting per decode_batch. `for_seq(seq)` is the drafter a
    Generation holds: its `propose` hands out what `prepare` drafted.
    """

    name = "draft"
    free = False

    def __init__(self, engine, n_shared: int, n_target_vocab: int, p_min: float = 0.0) -> None:
        self.engine = engine
        self.n_shared = n_shared
        self.n_target_vocab = n_target_vocab
        self.p_min = p_min
        self.steps = 0  # draft-model decode_batch calls
        self._ready: dict[int, Draft] = {}

    def for_seq(self, seq: int) -> "_SeqDraft":
        return _SeqDraft(self, seq)

    def reset(self, seq: int) -> None:
        self.engine.truncate(seq, 0)
        self._ready.pop(seq, None)

    def prepare(self, wants: Sequence[tuple[int, list[int], int, SamplingParams, np.random.Generator]]) -> None:
        """wants: (seq, context, k, params, rng) for each sequence drafting this step."""
        self._ready = {}
        wants = [w for w in wants if w[2] > 0]
        if not wants:
            return
        rows = self._catch_up([(seq, ctx) for seq, ctx, *_ in wants])
        out = {seq: Draft([], None if p.greedy else []) for seq, _, _, p, _ in wants}
        live = {seq: (k, p, rng) for seq, _, k, p, rng in wants}
        step = 0
        while live:
            feed = []
            for seq in list(live):
                k, params, rng = live[seq]
                logits = rows[seq][: self.n_shared]
                d = out[seq]
                if step > 0 and self.p_min > 0.0 and _top_prob(logits) < self.p_min:
                    del live[seq]
                    continue
                if params.greedy:
                    tok = int(np.argmax(logits))
                else:
                    q = np.zeros(self.n_target_vocab)
                    q[: self.n_shared] = probs(logits, params)
                    tok = sample(q, rng)
                    d.q.append(q)
                d.tokens.append(tok)
                if len(d.tokens) >= k:
                    del live[seq]  # the last drafted token is never fed
                else:
                    feed.append((seq, [tok], 1))
            if feed:
                views = self.engine.decode_batch(feed)
                self.steps += 1
                rows = {seq: v[0] for (seq, _, _), v in zip(feed, views)}
            step += 1
        self._ready = out

    def _catch_up(self, wants: Sequence[tuple[int, list[int]]]) -> dict[int, np.ndarray]:
        """Make each sequence's draft cache hold its context; each context's last-row logits."""
        eng = self.engine
        todo = []
        for seq, ctx in wants:
            kv = eng.kv_tokens(seq)
            keep = 0
            n = min(len(kv), len(ctx) - 1)
            while keep < n and kv[keep] == ctx[keep]:
                keep += 1
            eng.truncate(seq, keep)
            todo.append([seq, list(ctx[keep:])])
        rows: dict[int, np.ndarray] = {}
        while todo:
            budget, feed = eng.n_batch, []
            for item in todo:
                if budget == 0:
                    break
                seq, rest = item
                chunk, item[1] = rest[:budget], rest[budget:]
                budget -= len(chunk)
                feed.append((seq, chunk, 0 if item[1] else 1))
            views = eng.decode_batch(feed)
            self.steps += 1
            for (seq, _, n_logits), v in zip(feed, views):
                if n_logits:
                    rows[seq] = v[0].copy()  # a view dies with the next decode
            todo = [t for t in todo if t[1]]
        return rows


class _SeqDraft:
    """One sequence's face of a BatchedDraftModel, as a Generation's drafter."""

    name = "draft"
    free = False

    def __init__(self, batched: BatchedDraftModel, seq: int) -> None:
        self.batched, self.seq = batched, seq

    def begin(self) -> None:
        pass

    def propose(self, context, k, params, rng) -> Draft:  # drafted in prepare()
        return self.batched._ready.get(self.seq, Draft()).cut(k)


def _top_prob(logits: np.ndarray) -> float:
    m = float(logits.max())
    return 1.0 / float(np.exp(logits - m, dtype=np.float32).sum())


class _Decided:
    """Wraps a policy so `choose` returns what the server already decided this step."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.k: int | None = None

    def choose(self, key: int, limit: int) -> int:
        k, self.k = self.k, None
        return min(k, limit) if k is not None else self.inner.choose(key, limit)

    def update(self, *args) -> None:
        self.inner.update(*args)


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

    def record(self) -> dict:
        st, gen = self.gen.stats, self.gen
        decode_s = self.latency_s - self.ttft_s
        return {
            "id": self.job.id,
            **self.job.meta,
            "seq": self.seq,
            "prompt_tokens": st.prompt_tokens,
            "generated_tokens": st.generated,
            "queue_s": self.queue_s,
            "ttft_s": self.ttft_s,
            "latency_s": self.latency_s,
            "service_s": self.latency_s - self.queue_s,  # admission → last token: a sequential run's total_s
            "tokens_per_s": (st.generated - 1) / decode_s if st.generated > 1 and decode_s > 0 else 0.0,
            "mean_step_rows": _mean(self.step_rows),  # how full the steps it shared were
            "rounds": st.rounds,
            "drafted": st.drafted,
            "accepted": st.accepted,
            "acceptance_rate": st.acceptance_rate,
            "mean_accepted_len": st.mean_accepted_len,
            "k_hist": {str(k): n for k, n in sorted(st.k_chosen.items())},
            "stop_reason": st.stop_reason,
            "tokens": list(gen.tokens),
        }


class Server:
    """Serve jobs on `slots` sequences of one target engine, continuous batching.

    drafter_for(seq): the drafter of a new request in that slot (None: plain),
    or pass `batched` (a BatchedDraftModel) for a draft model. new_policy():
    a fresh policy per request; BatchCostAware ones are told about the step.
    """

    def __init__(
        self,
        target,
        slots: int,
        *,
        draft_max: int = 0,
        drafter_for: Callable[[int], object] | None = None,
        batched: BatchedDraftModel | None = None,
        new_policy: Callable[[], object] | None = None,
        ignore_eos: bool = False,
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
        self.draft_max = draft_max if (drafter_for or batched) else 0
        self.drafter_for = drafter_for
        self.batched = batched
        self.new_policy = new_policy or FixedK
        self.ignore_eos = ignore_eos
        self.steps = 0  # decode_batch calls on the target
        self.step_log: list[tuple[int, int, int]] = []  # (sequences, verify rows, prefill rows) per step
        # the online queue (submit / cancel / step)
        self._waiting: deque[tuple[Job, int, float]] = deque()  # (job, cache need, submitted at)
        self._free = list(range(slots))
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
            seq = self._free.pop(0)
            self._used += need
            self._active.append(self._admit(job, seq, need, t_submit))
            self._rows_seen[seq] = Counter()
        active = self._active
        if not active:
            return finished_now
        generating = [a for a in active if not a.prefilling]
        parts, owners = self._build_step(active, generating)
        views = self.target.decode_batch(parts) if parts else []
        self.steps += bool(parts)
        n_rows = sum(len(p[1]) for p in parts)
        for a in active:
            self._rows_seen[a.seq][n_rows] += 1
        finished = self._settle(generating, owners, views)
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
        now = time.perf_counter()
        res = ServeResult(
            a.job, a.gen, a.seq, a.t_admit - a.t_submit, (a.t_first or now) - a.t_submit,
            now - a.t_submit, self._rows_seen.pop(a.seq),
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
            a.gen.interrupt()
            self.target.truncate(a.seq, 0)  # the slot's cells go back to the pool now
            out.append(self._release(a))
        return out

    # -- one step ---------------------------------------------------------
    def _admit(self, job: Job, seq: int, need: int, t0: float) -> _Active:
        drafter = None
        if self.batched is not None:
            self.batched.reset(seq)
            drafter = self.batched.for_seq(seq)
        elif self.drafter_for is not None:
            drafter = self.drafter_for(seq)
        policy = self.new_policy()
        if drafter is not None and self.batched is not None:
            policy = _Decided(policy)
        k = self.draft_max if job.draft_max is None else max(0, min(job.draft_max, self.draft_max))
        gen = Generation(
            self.target, job.prompt, drafter, draft_max=k, max_tokens=job.max_tokens,
            params=job.params, ignore_eos=self.ignore_eos, seq=seq, policy=policy,
        )
        self.target.truncate(seq, 0)
        gen.begin()
        return _Active(job, seq, gen, t0, time.perf_counter(), need)

    def _build_step(self, active: list[_Active], generating: list[_Active]):
        """The step's parts: verify rows of generating sequences, then prefill chunks."""
        prefilling = [a for a in active if a.prefilling]
        budget = self.target.n_batch - len(generating) * (self.draft_max + 1)
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
        prefill_rows = sum(len(c) for _, c, _ in prefill_parts)
        self._plan(generating, prefill_rows)
        parts, owners = [], []
        for a in generating:
            if a.planned is not None:
                parts.append((a.seq, a.planned, len(a.planned)))
                owners.append((a, "verify"))
        for a, chunk, n_logits in prefill_parts:
            parts.append((a.seq, chunk, n_logits))
            owners.append((a, "prefill"))
        self.step_log.append((len(parts), sum(len(a.planned or ()) for a in generating), prefill_rows))
        return parts, owners

    def _plan(self, generating: list[_Active], prefill_rows: int) -> None:
        """Each generating sequence's verify rows, its policy told about the rest of the step."""
        rows_known = prefill_rows
        tokens_known = 0.0
        if self.batched is not None:
            self._plan_batched(generating, rows_known)
            return
        for i, a in enumerate(generating):
            pol = a.gen.policy
            if isinstance(pol, BatchCostAware):
                pol.others_rows = rows_known + (len(generating) - i - 1)  # later sequences: a row each, at least
                pol.others_tokens = tokens_known + (len(generating) - i - 1)
            a.planned = a.gen.plan()
            if a.planned is not None:
                rows_known += len(a.planned)
                tokens_known += 1.0 + (len(a.planned) - 1) * _acceptance_guess(pol, a.gen)

    def _plan_batched(self, generating: list[_Active], prefill_rows: int) -> None:
        """A draft model: choose every k first, draft all sequences together, then plan."""
        wants = []
        rows_known, tokens_known = prefill_rows, 0.0
        for i, a in enumerate(generating):
            gen, wrapper = a.gen, a.gen.policy
            limit = _draft_limit(gen)
            inner = wrapper.inner
            if isinstance(inner, BatchCostAware):
                inner.others_rows = rows_known + (len(generating) - i - 1)
                inner.others_tokens = tokens_known + (len(generating) - i - 1)
            k = inner.choose(0, limit) if limit > 0 else 0
            wrapper.k = k
            rows_known += k + 1
            tokens_known += 1.0 + (inner.expected_tokens(0, k) - 1.0 if isinstance(inner, BatchCostAware) else k)
            if k > 0:
                wants.append((a.seq, gen._context, k, gen.params, gen.rng))
        self.batched.prepare(wants)
        for a in generating:
            a.planned = a.gen.plan()

    def _settle(self, generating: list[_Active], owners, views) -> list[_Active]:
        finished = [a for a in generating if a.planned is None]  # plan() said done (context full)
        for (a, kind), rows in zip(owners, views):
            if kind == "verify":
                a.gen.settle(rows)
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


def _draft_limit(gen: Generation) -> int:
    """The longest draft this round may verify (as Generation.plan computes it)."""
    base = len(gen._context) - 1
    return max(0, min(gen.draft_max, gen.max_tokens - len(gen.tokens) - 1, gen.target.n_ctx - base - 1))


def _acceptance_guess(policy, gen: Generation) -> float:
    """Tokens a draft row is expected to add: the request's acceptance so far (0.5 before any)."""
    st = gen.stats
    return st.acceptance_rate if st.drafted else 0.5
