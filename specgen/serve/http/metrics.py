"""Server metrics in Prometheus' text exposition format (version 0.0.4).

Counters and histograms are updated from both threads (the HTTP side counts
requests, the engine thread counts tokens), so every update takes one lock.
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
            if reason != "cancelled":
                self.latency.observe(record["latency_s"])
                if record["generated_tokens"]:
                    self.ttft.observe(record["ttft_s"])

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        """The exposition text; gauges: name → (help, value), read by the caller
        (a name ending in _total is a counter)."""
        out: list[str] = []

        def metric(name, kind, help_, samples):
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for labels, v in samples:
                lab = "{" + ",".join(f'{k}="{val}"' for k, val in labels) + "}" if labels else ""
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
        for name, (help_, v) in gauges.items():
            metric(name, "counter" if name.endswith("_total") else "gauge", help_, [((), v)])
        return "\n".join(out) + "\n"


def _num(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))
