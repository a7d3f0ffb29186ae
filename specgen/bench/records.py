"""Bench records: how each record is built, the record file, the CSV export.

Every record dict the bench writes is built here: a run ("runs" of a request
record), a request (its runs, greedy equality, per-config speedup), a serve
batch of the concurrency sweep. The record file is JSONL: a meta line, then
one line per finished request (or serve batch; `--endpoint` writes the same two
kinds from specgen.bench.endpoint.measure's measurements), flushed and fsynced, so Ctrl-C
or a crash loses only the request in flight; `resume` skips the ids already
recorded.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Iterable, Mapping, Sequence

from specgen.errors import SpecgenError


# =============================================================== building records


def by_k(values: Mapping[int, object]) -> dict[str, object]:
    """Values keyed by draft length, as records carry them: string keys, ascending k."""
    return {str(k): v for k, v in sorted(values.items())}


def sum_by_k(hists: Iterable[Mapping[str, int]]) -> Counter:
    """Histograms as records carry them (see by_k), added up."""
    total: Counter = Counter()
    for h in hists:
        total.update({int(k): n for k, n in h.items()})
    return total


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token; None if the sequences are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_record(gen, config, verify_by_k: dict, steady: list, first_draft_s: float) -> dict:
    """One run of one request in one configuration (the Generation after its last round)."""
    st = gen.stats
    drafter = gen.drafter
    return {
        "config": config.name,
        "draft_max": config.round_k,
        **st.record(),
        "ttft_s": st.prefill_s,
        "decode_s": st.decode_s,
        "total_s": st.total_s,
        "tokens_per_s": st.tokens_per_s,
        "draft_s": st.draft_s,
        "draft_prefill_s": st.draft_prefill_s,
        "draft_first_s": first_draft_s,
        "draft_steady": {"rounds": steady[0], "drafted": steady[1], "s": steady[2]},
        "draft_kind": "model" if config.drafts_with_model else (config.kind if drafter is not None else "none"),
        "verify_by_k": by_k(verify_by_k),
        "matches_plain": None,
        "first_diff": None,
        "tokens": list(gen.tokens),
    }


def request_record(p, runs: list[dict], config_names: Sequence[str]) -> dict:
    """A finished request (a runner.Prepared): its runs, greedy token equality, and per-config speedup.

    speedup = median plain latency ÷ median speculative latency (over repeats);
    latency change = median speculative − median plain, in ms.
    """
    greedy = p.params.greedy
    plain_runs = [r for r in runs if r["config"] == "plain"]
    ref = plain_runs[0]["tokens"] if plain_runs else None
    for r in runs:
        if r["config"] != "plain" and greedy and ref is not None:
            diff = first_difference(ref, r["tokens"])
            r["matches_plain"] = diff is None
            r["first_diff"] = diff
    plain_lat = median(r["total_s"] for r in plain_runs)
    speedup, change = {}, {}
    for name in config_names:
        if name == "plain":
            continue
        lat = median(r["total_s"] for r in runs if r["config"] == name)
        speedup[name] = plain_lat / lat if lat > 0 else math.inf
        change[name] = 1000.0 * (lat - plain_lat)
    return {
        "type": "request",
        "id": p.req.id,
        "category": p.req.category,
        "line": p.req.line,
        "prompt_tokens": len(p.tokens),
        "max_tokens": p.max_tokens,
        "temperature": p.params.temperature,
        "seed": p.params.seed,
        "runs": runs,
        "speedup": speedup,
        "latency_change_ms": change,
    }


def serve_record(level: int, config_name: str, requests: list[dict], wall: float, server) -> dict:
    """One batch of the sweep: the whole set served at `level` in one configuration.

    `requests`: each request's record (serving's ServeResult.record, with
    concurrency and config added), in request order.
    """
    generated = sum(r["generated_tokens"] for r in requests)
    k_hist = sum_by_k(r["k_hist"] for r in requests)
    rows = [v + p for _, v, p in server.step_log]
    return {
        "type": "serve",
        "concurrency": level,
        "config": config_name,
        "requests_served": len(requests),
        "wall_s": wall,
        "generated_tokens": generated,
        "throughput_tokens_per_s": generated / wall if wall > 0 else 0.0,
        "steps": server.steps,
        "mean_rows_per_step": sum(rows) / len(rows) if rows else 0.0,
        "mean_sequences_per_step": sum(n for n, _, _ in server.step_log) / len(rows) if rows else 0.0,
        "k_hist": by_k(k_hist),
        **({"shared_steps": server.gate.summary()} if getattr(server, "gate", None) is not None else {}),
        "requests": requests,
    }


# =============================================================== records file


def record_line(path, n: int, line: str) -> tuple[str | None, object]:
    """Line n of a record file: its record type ("meta", "request", "serve"; None
    for anything else) and the parsed object; a line that is not JSON is one error."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        raise SpecgenError(f"{path}:{n}: not a bench record (invalid JSON)") from None
    return (obj.get("type") if isinstance(obj, dict) else None), obj


class RecordFile:
    """The JSONL record file: a meta line, then one line per finished request.

    Each line is written whole, flushed and fsynced. A half-written last line
    (a crash mid-write) is dropped when the file is resumed.
    """

    def __init__(self, path: Path, meta: dict, *, resume: bool) -> None:
        self.path = path
        self.records: list[dict] = []
        self._fh = None
        exists = path.exists() and not path.is_dir() and path.stat().st_size > 0
        if exists and not resume:
            raise SpecgenError(f"{path} already holds records: use --resume to continue it, or another --out")
        try:
            if exists:
                self._load(meta)
                self._fh = open(path, "a", encoding="utf-8")
            else:
                self._fh = open(path, "w", encoding="utf-8")
                self._write({"type": "meta", **meta})
        except IsADirectoryError:
            raise SpecgenError(f"cannot write --out {path}: it is a directory") from None
        except OSError as e:
            raise SpecgenError(f"cannot write --out {path}: {e.strerror or e}") from None

    def _load(self, meta: dict) -> None:
        raw = self.path.read_bytes()
        end = raw.rfind(b"\n") + 1
        if end < len(raw):  # a torn last line: that request never finished
            with open(self.path, "r+b") as f:
                f.truncate(end)
        lines = raw[:end].decode("utf-8", errors="replace").splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            kind, obj = record_line(self.path, n, line)
            if kind == "meta":
                _check_meta(self.path, obj, meta)
            elif kind in ("request", "serve"):
                self.records.append(obj)
            else:
                raise SpecgenError(f"{self.path}:{n}: not a bench record")

    def _write(self, obj: dict) -> None:
        try:
            self._fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as e:
            raise SpecgenError(f"cannot write --out {self.path}: {e.strerror or e}") from None

    def done_ids(self) -> set[str]:
        return {r["id"] for r in self.records if "id" in r}

    def append(self, record: dict) -> None:
        self._write(record)
        self.records.append(record)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


_RESUME_KEYS = ("model", "configs", "max_tokens", "repeats", "ignore_eos", "temperature", "endpoints", "loads")


def _check_meta(path: Path, old: dict, new: dict) -> None:
    for key in _RESUME_KEYS:
        if key in new and old.get(key) != new.get(key):
            raise SpecgenError(f"--resume: {path} was recorded with {key} = {old.get(key)!r}, not {new.get(key)!r}")

# =============================================================== export

CSV_COLUMNS = (
    "id", "category", "config", "repeat", "slot", "prompt_tokens", "generated_tokens", "ttft_s", "decode_s",
    "total_s", "tokens_per_s", "rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted_len",
    "per_position", "k_hist", "stop_reason", "matches_plain", "first_diff", "request_speedup",
    "request_latency_change_ms",
)


def csv_rows(records: Sequence[dict]) -> Iterable[dict]:
    """One flat row per run (per_position space-separated, k_hist as JSON)."""
    for r in records:
        for x in r["runs"]:
            row = {c: x.get(c) for c in CSV_COLUMNS}
            row["id"], row["category"] = r["id"], r["category"]
            row["per_position"] = " ".join(f"{v:.4f}" for v in x["per_position"])
            row["k_hist"] = json.dumps(x["k_hist"], separators=(",", ":"))
            row["request_speedup"] = r["speedup"].get(x["config"])
            row["request_latency_change_ms"] = r["latency_change_ms"].get(x["config"])
            yield row


def write_csv(path: Path, records: Sequence[dict]) -> None:
    import csv

    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for row in csv_rows(records):
                w.writerow(row)
    except OSError as e:
        raise SpecgenError(f"cannot write --csv {path}: {e.strerror or e}") from None


# =============================================================== records of `specgen bench --endpoint`


def endpoint_run(config: str, repeat: int, measures: dict) -> dict:
    """One streamed request to one endpoint (http.run_measures's dict), as a run of a request record.

    The keys the in-process statistics read are all present: acceptance from
    the server's own counters (zeros when it reports none), no verify costs
    (so no Leviathan prediction: a server reports its acceptance, not its
    costs per draft length).
    """
    return {
        "config": config,
        "repeat": repeat,
        **measures,
        "verify_by_k": {},
        "draft_steady": {"rounds": 0, "drafted": 0, "s": 0.0},
        "draft_kind": "http",
        "matches_plain": None,
        "first_diff": None,
    }


def endpoint_failure(config: str, repeat: int, raw: dict) -> dict:
    """A request that failed (HTTP status, error text, time until it failed): counted, kept apart from runs."""
    return {"config": config, "repeat": repeat, "status": raw.get("status"), "error": raw.get("error"),
            "total_s": raw.get("total_s"), "ttft_s": raw.get("ttft_s")}


def endpoint_request_record(req, runs: list[dict], failed: list[dict], config_names: Sequence[str], baseline: str,
                            greedy: bool, max_tokens: int) -> dict:
    """A request measured against every endpoint: its runs, its failures, greedy text equality, speedups.

    speedup = median baseline latency ÷ median latency of the configuration
    (over its successful repeats); no speedup where either side has none.
    """
    base = [r for r in runs if r["config"] == baseline]
    ref = base[0]["text"] if base else None
    for r in runs:
        if r["config"] != baseline and greedy and ref is not None:
            diff = first_difference(ref, r["text"])
            r["matches_plain"], r["first_diff"] = diff is None, diff
    speedup, change = {}, {}
    if base:
        base_lat = median(r["total_s"] for r in base)
        for name in config_names:
            lat = [r["total_s"] for r in runs if r["config"] == name]
            if name == baseline or not lat:
                continue
            speedup[name] = base_lat / median(lat) if median(lat) > 0 else math.inf
            change[name] = 1000.0 * (median(lat) - base_lat)
    prompt = next((r["prompt_tokens"] for r in runs if r.get("prompt_tokens") is not None), None)
    return {
        "type": "request",
        "id": req.id,
        "category": req.category,
        "line": req.line,
        "prompt_tokens": prompt,
        "max_tokens": max_tokens,
        "temperature": req.temperature,
        "seed": req.seed,
        "runs": runs,
        "failed": failed,
        "speedup": speedup,
        "latency_change_ms": change,
    }


def load_record(load: str, level, config: str, repeat: int, requests: list[dict], wall: float,
                counters: dict | None = None) -> dict:
    """One batch of a load level (closed loop at a concurrency, or Poisson arrivals at a rate).

    `requests`: each request's measures (failed ones carry `error`), in the
    order sent; `counters`: the server's spec-decode counters over the batch
    (vLLM's /metrics, after − before), when it has them.
    """
    ok = [r for r in requests if r.get("error") is None]
    generated = sum(r["generated_tokens"] for r in ok)
    return {
        "type": "serve",
        "id": f"{load}={level}/{config}/{repeat}",
        "load": load,
        "concurrency": level if load == "concurrency" else None,
        "rate": level if load == "rate" else None,
        "config": config,
        "repeat": repeat,
        "requests_sent": len(requests),
        "requests_served": len(ok),
        "failed": len(requests) - len(ok),
        "wall_s": wall,
        "generated_tokens": generated,
        "throughput_tokens_per_s": generated / wall if wall > 0 else 0.0,
        "k_hist": by_k(sum_by_k(r.get("k_hist") or {} for r in ok)),
        "mean_rows_per_step": None,
        "server_counters": counters,
        "requests": requests,
    }


def speculation_check(records: Sequence[dict], endpoints) -> list[dict]:
    """Per endpoint: did its requests draft? What the warning "speculation did not engage" reads.

    Over every successful request of the endpoint (sequential runs, load
    levels' requests, and the levels' counter differences): how many
    reported speculative figures, how many tokens they drafted, from which
    sources. engaged: True (some drafted), False (figures were reported and
    none drafted), None (nothing reported: unknown). speculative: the
    endpoint is named as speculative (Endpoint.speculative).
    """
    out = []
    for ep in endpoints:
        runs, counters = [], []
        for r in records:
            if r.get("type") == "request":
                runs += [x for x in r.get("runs") or () if x.get("config") == ep.name]
            elif r.get("type") == "serve" and r.get("config") == ep.name:
                ok = [x for x in r.get("requests") or () if x.get("error") is None]
                runs += ok
                # the batch's counter difference where its requests have no figures of their own
                if isinstance(r.get("server_counters"), dict) and not any(x.get("spec_source") for x in ok):
                    counters.append(r["server_counters"])
        reported = [x for x in runs if x.get("spec_source")]
        drafted = sum(int(x.get("drafted") or 0) for x in reported) + sum(int(c.get("drafted") or 0) for c in counters)
        sources = sorted({x["spec_source"] for x in reported} | {c.get("source") or "metrics-delta" for c in counters})
        out.append({"endpoint": ep.name, "speculative": ep.speculative, "requests": len(runs),
                    "reported": len(reported), "drafted": drafted, "sources": sources,
                    "engaged": (drafted > 0) if (reported or counters) else None})
    return out


def speculation_lines(checks: list[dict]) -> list[str]:
    """One line per endpoint named as speculative whose requests never drafted (a warning), or
    that reported nothing to tell (a note); nothing for the others."""
    out = []
    for c in checks:
        if not c["speculative"] or not c["requests"]:
            continue
        if c["engaged"] is False:
            n = c["reported"]
            out.append(f"warning: endpoint {c['endpoint']}: speculation did not engage: none of its {n} "
                       f"request{'s' * (n != 1)} drafted a token (from {', '.join(c['sources'])})")
        elif c["engaged"] is None:
            out.append(f"note: endpoint {c['endpoint']} is compared as speculative but reports no speculative "
                       "statistics (no specgen block, vLLM per-request metrics, llama-server timings or /metrics "
                       "counters): whether speculation engaged is unknown")
    return out
