"""Server metrics in Prometheus' text exposition format (version 0.0.4).

Counters and histograms are updated from both threads (the HTTP side counts
requests, the engine thread counts tokens), so every update takes one lock.

Beside specgen's own names, the speculative counters are exported again
under the names other servers use, so a dashboard built for them reads
specgen unchanged (`ecosystem_families`):

- vLLM (vllm/v1/spec_decode/metrics.py, SpecDecodingProm): counters
  `vllm:spec_decode_num_drafts`, `_num_draft_tokens`, `_num_accepted_tokens`
  (samples with the `_total` suffix, as prometheus_client writes them),
  labelled `model_name` and `engine` ("0": one engine), and
  `vllm:spec_decode_num_accepted_tokens_per_pos` with a `position` label
  from 0 (how many rounds accepted the draft at that position), every
  position up to the server's k present from the start.
- llama-server (tools/server, the speculative counters of recent builds):
  `llamacpp:spec_decode_num_drafts_total`, `_num_draft_tokens_total`,
  `_num_accepted_tokens_total` without labels, and
  `llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`.

A draft there is a verify round that drafted (vLLM counts a step per request
only when it proposed tokens), so `drafts` = specgen's rounds minus the
rounds that drafted nothing; draft tokens = `specgen_drafted_total`,
accepted = `specgen_accepted_total`, and the per-position counts add up to
the accepted total.
"""

from __future__ import annotations

import threading
from collections import defaultdict

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Histogram:
    def __init__(self, buckets) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.n += 1
        self.sum += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = defaultdict(int)  # (endpoint, status code) → count
        self.finished = defaultdict(int)  # finish reason → count
        self.counters = defaultdict(float)
        self.accepted_at: list[int] = []  # rounds that accepted the draft at position i (0-based)
        self.latency = _Histogram(LATENCY_BUCKETS)
        self.ttft = _Histogram(TTFT_BUCKETS)

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def cancelled(self) -> None:
        with self._lock:
            self.finished["cancelled"] += 1

    def finish(self, reason: str, record: dict) -> None:
        """A request that had a slot ended; a cancelled one was counted by `cancelled`."""
        with self._lock:
            if reason != "cancelled":
                self.finished[reason] += 1
            c = self.counters
            c["prompt_tokens"] += record["prompt_tokens"]
            c["prompt_tokens_cached"] += record.get("cached_tokens", 0)
            c["generated_tokens"] += record["generated_tokens"]
            c["rounds"] += record["rounds"]
            c["drafted"] += record["drafted"]
            c["accepted"] += record["accepted"]
            drafted_at, accepted_at = positions(record)
            c["drafting_rounds"] += drafted_at[0] if drafted_at else 0
            self.accepted_at.extend([0] * (len(accepted_at) - len(self.accepted_at)))
            for i, n in enumerate(accepted_at):
                self.accepted_at[i] += n
            if reason != "cancelled":
                self.latency.observe(record["latency_s"])
                if record["generated_tokens"]:
                    self.ttft.observe(record["ttft_s"])

    def render(self, gauges: dict[str, tuple[str, float]], *, model_name: str = "specgen", draft_max: int = 0) -> str:
        """The exposition text; gauges: name → (help, value), read by the caller
        (a name ending in _total is a counter). model_name labels the vLLM
        names; draft_max (the server's k) sets the positions shown from the start."""
        out: list[str] = []

        def metric(name, kind, help_, samples):
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for labels, v in samples:
                lab = "{" + ",".join(f'{k}="{_label(val)}"' for k, val in labels) + "}" if labels else ""
                out.append(f"{name}{lab} {_num(v)}")

        with self._lock:
            metric("specgen_requests_total", "counter", "HTTP generation requests by endpoint and status code.",
                   [((("endpoint", e), ("code", str(s))), n) for (e, s), n in sorted(self.requests.items())])
            metric("specgen_requests_finished_total", "counter", "Requests the engine finished, by finish reason.",
                   [((("reason", r),), n) for r, n in sorted(self.finished.items())])
            c = self.counters
            for key, help_ in (
                ("prompt_tokens", "Prompt tokens of finished requests."),
                ("prompt_tokens_cached", "Of them, tokens the prompt cache served (found in a slot, not prefilled)."),
                ("generated_tokens", "Tokens generated."),
                ("rounds", "Verify passes (target rounds)."),
                ("drafted", "Draft tokens proposed."),
                ("accepted", "Draft tokens accepted."),
            ):
                metric(f"specgen_{key}_total", "counter", help_, [((), c[key])])
            metric("specgen_acceptance_rate", "gauge", "Accepted / drafted over all finished requests.",
                   [((), c["accepted"] / c["drafted"] if c["drafted"] else 0.0)])
            for name, h, help_ in (
                ("specgen_request_latency_seconds", self.latency, "Submission to last token."),
                ("specgen_time_to_first_token_seconds", self.ttft, "Submission to first token."),
            ):
                out.append(f"# HELP {name} {help_}")
                out.append(f"# TYPE {name} histogram")
                for b, n in zip(h.buckets, h.counts):
                    out.append(f'{name}_bucket{{le="{_num(b)}"}} {n}')
                out.append(f'{name}_bucket{{le="+Inf"}} {h.n}')
                out.append(f"{name}_sum {_num(h.sum)}")
                out.append(f"{name}_count {h.n}")
            spec = self.spec_totals(draft_max)
        for name, (help_, v) in gauges.items():
            metric(name, "counter" if name.endswith("_total") else "gauge", help_, [((), v)])
        for name, help_, samples in ecosystem_families(spec, model_name):
            metric(name, "counter", help_, samples)
        return "\n".join(out) + "\n"

    def spec_totals(self, draft_max: int = 0) -> dict:
        """The speculative totals the other servers' names carry (call with the lock held)."""
        c = self.counters
        per_pos = self.accepted_at + [0] * max(draft_max - len(self.accepted_at), 0)
        return {"drafts": c["drafting_rounds"], "draft_tokens": c["drafted"], "accepted_tokens": c["accepted"],
                "accepted_per_pos": per_pos}


def positions(record: dict) -> tuple[list[int], list[int]]:
    """Per draft position (0-based): rounds that drafted that far, rounds that accepted there.

    A record has the draft length of every round (k_hist) and the acceptance
    rate per position (per_position = accepted_at / drafted_at), so both
    counts come back exactly (rounded: the rate is a float).
    """
    hist = {int(k): int(n) for k, n in (record.get("k_hist") or {}).items()}
    depth = max((k for k, n in hist.items() if n), default=0)
    drafted_at = [sum(n for k, n in hist.items() if k > i) for i in range(depth)]
    rates = list(record.get("per_position") or [])
    accepted_at = [int(round(r * d)) for r, d in zip(rates, drafted_at)]
    return drafted_at, accepted_at + [0] * (len(drafted_at) - len(accepted_at))


def ecosystem_families(spec: dict, model_name: str) -> list[tuple[str, str, list]]:
    """The speculative counters under vLLM's and llama-server's names: (name, help, samples)."""
    lab = (("model_name", model_name), ("engine", "0"))
    pos = spec["accepted_per_pos"]
    return [
        ("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", [(lab, spec["drafts"])]),
        ("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", [(lab, spec["draft_tokens"])]),
        ("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", [(lab, spec["accepted_tokens"])]),
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "Accepted tokens per draft position.",
         [(lab + (("position", str(i)),), n) for i, n in enumerate(pos)]),
        ("llamacpp:spec_decode_num_drafts_total", "Speculative: verification steps that drafted.",
         [((), spec["drafts"])]),
        ("llamacpp:spec_decode_num_draft_tokens_total", "Speculative: draft tokens generated.",
         [((), spec["draft_tokens"])]),
        ("llamacpp:spec_decode_num_accepted_tokens_total", "Speculative: draft tokens accepted by the target model.",
         [((), spec["accepted_tokens"])]),
        ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "Accepted tokens per draft position.",
         [((("position", str(i)),), n) for i, n in enumerate(pos)]),
    ]


def _label(v) -> str:
    """A label value escaped as the exposition format asks (backslash, quote, newline)."""
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))
