"""Where `specgen bench --endpoint`'s speculative figures come from, per request.

From the first of these a response gives:

- "specgen": specgen serve's `speculative` block;
- "vllm": vLLM's per-request `metrics.speculative_decoding` (a server
  started with --per-request-spec-decode-metrics: num_spec_steps,
  num_draft_tokens, num_accepted_draft_tokens, acceptance_histogram);
- "llama-server": llama-server's `timings` (draft_n / draft_n_accepted,
  which it leaves out when nothing was drafted: a timings object without
  them reads as 0 drafted);
- "metrics-delta:vllm" / "metrics-delta:llamacpp" / "metrics-delta:specgen":
  for a server whose responses carry none of these, its Prometheus counters
  (`scrape_spec_counters`) read just before and just after a request that
  ran alone (sequential runs, concurrency 1), the difference being that
  request's.

Every run says where its figures came from: `spec_source`, and
`spec_sources` per figure (rounds, drafted, accepted, per_position; None
where the source has no such figure).
"""

from __future__ import annotations

import re
from typing import Iterable

import httpx

METRICS_TIMEOUT_S = 10.0

# The servers' speculative counters (Prometheus sample names, summed over their label sets) in
# the bench's names, and their per-position counter (by its `position` label), in the order the
# probe looks for them. specgen serve exports all three families.
COUNTER_FAMILIES = {
    "specgen": ({"specgen_rounds_total": "rounds", "specgen_drafted_total": "drafted",
                 "specgen_accepted_total": "accepted"}, None),
    "vllm": ({"vllm:spec_decode_num_drafts_total": "rounds", "vllm:spec_decode_num_draft_tokens_total": "drafted",
              "vllm:spec_decode_num_accepted_tokens_total": "accepted"},
             "vllm:spec_decode_num_accepted_tokens_per_pos_total"),
    "llamacpp": ({"llamacpp:spec_decode_num_drafts_total": "rounds",
                  "llamacpp:spec_decode_num_draft_tokens_total": "drafted",
                  "llamacpp:spec_decode_num_accepted_tokens_total": "accepted"},
                 "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"),
}
SPEC_FIGURES = ("rounds", "drafted", "accepted", "per_position")


def asks_speculation(body: dict) -> bool | None:
    """What a request body says about speculation: True (asks for it), False (turns it off), None (nothing).

    specgen serve's `speculative` object ({"mode": "none"} or k 0 is off),
    llama-server's `speculative.n_max` (0 is off).
    """
    s = body.get("speculative")
    if isinstance(s, dict):
        return not (s.get("mode") in ("none", "plain") or s.get("k") == 0)
    n_max = body.get("speculative.n_max")
    if isinstance(n_max, (int, float)) and not isinstance(n_max, bool):
        return n_max > 0
    return None


def _sources(source: str | None, *figures: str) -> dict:
    return {f: (source if f in figures else None) for f in SPEC_FIGURES}


def spec_stats(spec: dict | None, timings: dict | None, metrics: dict | None = None) -> dict:
    """The server's own speculative counters for one request, in the bench's names (zeros when it
    reports none), and where each came from (spec_source, spec_sources).

    rounds is known from specgen serve and vLLM (0 otherwise: mean accepted
    length is then not computed); server_latency_s is the server's own
    measure of the request, when it gives one.
    """
    out = {"rounds": 0, "drafted": 0, "accepted": 0, "k_hist": {}, "per_position": [], "draft_max": 0,
           "spec_source": None, "spec_sources": _sources(None), "queue_s": 0.0, "server_latency_s": None,
           "server_spec": None}
    vllm = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if isinstance(timings, dict) and "prompt_ms" in timings and "predicted_ms" in timings:
        out["server_latency_s"] = (float(timings["prompt_ms"]) + float(timings["predicted_ms"])) / 1000
    if isinstance(spec, dict) and "drafted" in spec:
        out.update(
            spec_source="specgen", rounds=int(spec.get("rounds") or 0), drafted=int(spec.get("drafted") or 0),
            accepted=int(spec.get("accepted") or 0), k_hist=dict(spec.get("k_hist") or {}),
            draft_max=int(spec.get("k_max") or 0), queue_s=float(spec.get("queue_s") or 0.0),
            server_latency_s=spec.get("latency_s"), server_spec=spec,
            spec_sources=_sources("specgen", "rounds", "drafted", "accepted"),
        )
    elif isinstance(vllm, dict) and "num_draft_tokens" in vllm:
        out.update(vllm_request_stats(vllm))
    elif isinstance(timings, dict):
        out["server_spec"] = timings
        # llama-server writes draft_n / draft_n_accepted only when it drafted: a timings
        # object of its own (predicted_n) without them is a request that drafted nothing
        if "draft_n" in timings or "predicted_n" in timings:
            out.update(spec_source="llama-server", drafted=int(timings.get("draft_n") or 0),
                       accepted=int(timings.get("draft_n_accepted") or 0),
                       spec_sources=_sources("llama-server", "drafted", "accepted"))
    return out


def vllm_request_stats(m: dict) -> dict:
    """vLLM's per-request `metrics.speculative_decoding` in the bench's names.

    num_spec_steps are the verify steps that drafted (rounds); the
    acceptance histogram counts steps by how many drafts they accepted, so
    the steps accepting at position i+1 are those that accepted more than i;
    vLLM drafts num_spec_tokens at every step, so that many steps drafted
    there (per_position = accepted_at / steps, when the counts say so).
    """
    steps, drafted = int(m.get("num_spec_steps") or 0), int(m.get("num_draft_tokens") or 0)
    k = int(m.get("num_spec_tokens") or 0)
    hist = [int(x) for x in m.get("acceptance_histogram") or []]
    per_position = []
    if steps and k and drafted == steps * k and len(hist) > 1:
        per_position = [sum(hist[i + 1:]) / steps for i in range(min(k, len(hist) - 1))]
    return {"spec_source": "vllm", "rounds": steps, "drafted": drafted,
            "accepted": int(m.get("num_accepted_draft_tokens") or 0), "draft_max": k, "per_position": per_position,
            "k_hist": {str(k): steps} if steps and k and drafted == steps * k else {}, "server_spec": m,
            "spec_sources": _sources("vllm", "rounds", "drafted", "accepted", *(["per_position"] * bool(per_position)))}


def counter_stats(delta: dict, family: str) -> dict:
    """A request's speculative figures from the counters' difference around it (it ran alone)."""
    source = f"metrics-delta:{family}"
    pos = delta.get("per_pos") or []
    rounds = delta.get("rounds", 0)
    per_position = [n / rounds for n in pos] if rounds and family != "specgen" else []
    return {"spec_source": source, "rounds": delta.get("rounds", 0), "drafted": delta.get("drafted", 0),
            "accepted": delta.get("accepted", 0), "per_position": per_position, "server_spec": delta,
            "spec_sources": _sources(source, "rounds", "drafted", "accepted", *(["per_position"] * bool(per_position)))}


# =============================================================== /metrics counters


def sample_names(text: str) -> set[str]:
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}


_POSITION_RE = re.compile(r'position="(\d+)"')


def _samples(text: str):
    """(name, labels text, value) of every sample line of a Prometheus text (a timestamp allowed)."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] == "#":
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            labels, _, rest = rest.rpartition("}")
        else:
            name, _, rest = line.partition(" ")
            labels = ""
        try:
            yield name.strip(), labels, float(rest.split()[0])
        except (ValueError, IndexError):
            pass


def parse_counters(text: str, names: Iterable[str]) -> dict[str, float]:
    """Prometheus text → the named counters, each summed over its label sets."""
    want = set(names)
    out = {n: 0.0 for n in want}
    for name, _, v in _samples(text):
        if name in want:
            out[name] += v
    return out


def parse_positions(text: str, name: str) -> list[float]:
    """A per-position counter (`position` label from 0), summed over its other labels, as a list."""
    by_pos: dict[int, float] = {}
    for n, labels, v in _samples(text):
        m = _POSITION_RE.search(labels) if n == name else None
        if m:
            by_pos[int(m.group(1))] = by_pos.get(int(m.group(1)), 0.0) + v
    return [by_pos.get(i, 0.0) for i in range(max(by_pos) + 1)] if by_pos else []


async def scrape_spec_counters(client: httpx.AsyncClient, ep) -> dict | None:
    """The endpoint's speculative counters now (its family, probe's ep.counters; vLLM's by
    default), in the bench's names, with per_pos where the family has one; None if unreadable."""
    family = ep.counters or "vllm"
    try:
        r = await client.get(ep.url + "/metrics", headers=ep.headers, timeout=METRICS_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    names, per_pos = COUNTER_FAMILIES[family]
    c = parse_counters(r.text, names)
    out: dict = {names[k]: v for k, v in c.items()}
    if per_pos is not None:
        out["per_pos"] = parse_positions(r.text, per_pos)
    return out


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """after − before, counter by counter (per_pos position by position); None if either is missing."""
    if before is None or after is None:
        return None
    out: dict = {}
    for k, v in before.items():
        if k == "per_pos":
            a = after.get(k) or []
            b = v + [0.0] * (len(a) - len(v))
            out[k] = [int(round(x - y)) for x, y in zip(a + [0.0] * (len(b) - len(a)), b)]
        else:
            out[k] = int(round(after[k] - v))
    return out
