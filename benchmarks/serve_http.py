"""specgen serve against `specgen bench` in process and llama.cpp's llama-server, side by side.

One invocation loads everything at once and measures, on the bundled requests
(or a JSONL/text request file), with the same model, threads, prompts and
token counts:

- concurrency 1, one request at a time, each request sent to every system
  in a rotating order (drift on a shared machine hits all alike):
  * `bench[...]`: specgen's sequential bench runner in this process (what
    `specgen bench` times: a Generation from an empty cache, per request);
  * `serve[...]`: `specgen serve` over HTTP, the same drafting configuration;
  * `llama[TYPE]`: `llama-server --spec-type TYPE` (and `none`);
- concurrency N (--concurrency 1,4): the whole set through each server by N
  client threads at once, servers in alternating order (--repeats R: R times,
  the order alternating each time); throughput = completion tokens / wall
  time of the set(s).

Every request goes to /v1/completions with the same raw text (no chat
template), greedy, streamed (SSE, httpx), the same max_tokens and ignore_eos,
so every system generates the same number of tokens: the script checks each
request's prompt and completion token counts across systems (usage), and
reports how many greedy texts equal specgen's.

    python benchmarks/serve_http.py --llama-server LLAMA_CPP_BUILD/bin/llama-server -t 2 -n 64 --concurrency 1

Goals (issue 11): at concurrency 1, serve[lookup:k=8] within 5 % of
bench[lookup:k=8] (median per-request latency ratio); serve[default] median
latency ≤ the best llama-server speculative type's; at concurrency 4,
serve[default] throughput ≥ the best llama-server's. Output: one JSON line per
(system, level), then one "summary" line with the ratios and goals.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.bench import load_requests  # noqa: E402

LLAMA_TYPES = ("none", "ngram-mod", "ngram-map-k")
WARMUP_PROMPT = "Warm-up: list three colours of the rainbow, one per line.\n"
START_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_text(reqs, model: str) -> list:
    """Requests as raw prompt strings: chat messages rendered through the target's
    own template (its special tokens as text, which both servers' /v1/completions
    parse), so every server reads the same prompt tokens."""
    from dataclasses import replace

    from specgen.bench.requests import apply_chat_template
    from specgen.engine.llama import Engine

    if all(r.messages is None for r in reqs):
        return list(reqs)
    with Engine.vocab(model) as vocab:
        return [r if r.messages is None else replace(r, prompt=apply_chat_template(vocab, r.messages), messages=None)
                for r in reqs]


# -- systems -----------------------------------------------------------------------


@dataclass
class HttpSystem:
    """A server process started here, reached over HTTP on 127.0.0.1."""

    name: str
    cmd: list[str]
    log: Path
    port: int
    env: dict | None = None
    cwd: str | None = None  # `python -m specgen` imports from its working directory first: a checkout's own root
    proc: subprocess.Popen | None = None
    extra_body: dict | None = None  # added to every request (e.g. llama-server's cache_prompt)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd)

    def wait_ready(self, client) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
            try:
                if client.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} did not become ready in {START_TIMEOUT_S} s (log: {self.log})")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def complete(self, client, text: str, max_tokens: int) -> dict:
        body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True, **(self.extra_body or {})}
        t0 = time.perf_counter()
        ttft = None
        usage, timings, spec, parts = {}, {}, {}, []
        with client.stream("POST", self.url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{self.name}: HTTP {r.status_code}: {r.read()[:500]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    raise RuntimeError(f"{self.name}: {obj['error']}")
                ch = obj.get("choices") or []
                piece = ch[0].get("text") if ch else None
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    parts.append(piece)
                usage = obj.get("usage") or usage
                timings = obj.get("timings") or timings
                spec = obj.get("speculative") or spec
        latency = time.perf_counter() - t0
        row = {"latency_s": latency, "ttft_s": ttft or latency, "prompt_tokens": usage.get("prompt_tokens"),
               "tokens": usage.get("completion_tokens"), "text": "".join(parts)}
        if timings.get("draft_n") is not None:
            row.update(drafted=timings["draft_n"], accepted=timings.get("draft_n_accepted", 0))
        elif spec:
            row.update(drafted=spec.get("drafted"), accepted=spec.get("accepted"), server_latency_s=spec.get("latency_s"))
        return row


class InProcess:
    """specgen bench's sequential runner for one configuration, in this process."""

    def __init__(self, config: str, model: str | None, threads: int, ctx: int, max_tokens: int) -> None:
        from specgen.bench import Runner, Settings, open_bench, parse_config

        self.name = f"bench[{config}]"
        self.config = parse_config(config)
        self.setup = open_bench(model, [self.config], ctx_size=ctx, threads=threads)
        self.config = self.setup.configs[1]
        self.runner = Runner(self.setup, Settings(max_tokens=max_tokens, ignore_eos=True))
        self._prepared: dict[str, object] = {}

    def prepare(self, reqs) -> None:
        from specgen.bench.requests import Request

        for p in self.runner.prepare(list(reqs) + [Request(id="__warmup__", prompt=WARMUP_PROMPT)]):
            self._prepared[p.req.id] = p

    def run(self, rid: str, max_tokens: int) -> dict:
        p = self._prepared[rid]
        t0 = time.perf_counter()
        rec = self.runner.run_one(p, self.config, max_tokens=max_tokens)
        wall = time.perf_counter() - t0
        target = self.setup.target
        text = b"".join(target.piece(t) for t in rec["tokens"]).decode("utf-8", errors="replace")
        return {"latency_s": rec["total_s"], "wall_s": wall, "ttft_s": rec["ttft_s"], "prompt_tokens": len(p.tokens),
                "tokens": len(rec["tokens"]), "text": text, "drafted": rec.get("drafted"), "accepted": rec.get("accepted")}

    def stop(self) -> None:
        self.setup.close()


# -- measuring -----------------------------------------------------------------------


def summarize(name: str, level: int, rows: list[dict], wall: float | None = None) -> dict:
    lat = sorted(r["latency_s"] for r in rows)
    tokens = sum(r["tokens"] or 0 for r in rows)
    out = {"system": name, "concurrency": level, "requests": len(rows), "completion_tokens": tokens,
           "median_latency_s": median(lat), "p90_latency_s": lat[math.ceil(0.9 * len(lat)) - 1],
           "sum_latency_s": sum(lat), "median_ttft_s": median(r["ttft_s"] for r in rows)}
    drafted = [r.get("drafted") for r in rows]
    if all(d is not None for d in drafted) and sum(drafted):
        out["acceptance"] = sum(r["accepted"] or 0 for r in rows) / sum(drafted)
    if wall is not None:
        out.update(wall_s=wall, throughput_tokens_per_s=tokens / wall)
    return out


def level_one(systems, reqs, max_tokens: int, client) -> dict[str, list[dict]]:
    """Each request through every system in turn; the order rotates and reverses per request."""
    rows: dict[str, list[dict]] = {s.name: [] for s in systems}
    for i, req in enumerate(reqs):
        order = systems[i % len(systems):] + systems[: i % len(systems)]
        if i % 2:
            order = order[::-1]
        for s in order:
            r = s.run(req.id, max_tokens) if isinstance(s, InProcess) else s.complete(client, req.prompt, max_tokens)
            rows[s.name].append({"id": req.id, **r})
    return rows


def shared_steps(system, client) -> dict[str, float]:
    """specgen serve's shared-step gate counters (/metrics): steps of several sequences
    that could draft, and those kept plain; {} for other servers or without a gate."""
    if not system.name.startswith("serve["):
        return {}
    out = {}
    for line in client.get(system.url + "/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("specgen_shared_steps_"):
            out[name[len("specgen_"):-len("_total")]] = float(value)
    return out


def level_n(system: HttpSystem, reqs, max_tokens: int, n: int, client) -> tuple[list[dict], float]:
    with ThreadPoolExecutor(n) as pool:
        t0 = time.perf_counter()
        rows = list(pool.map(lambda r: {"id": r.id, **system.complete(client, r.prompt, max_tokens)}, reqs))
        wall = time.perf_counter() - t0
    return rows, wall


def check_counts(rows: dict[str, list[dict]], reference: str) -> dict:
    """Per request: equal prompt and completion token counts everywhere; texts equal to the reference's."""
    ref = {r["id"]: r for r in rows[reference]}
    bad, same_text = [], {}
    for name, rs in rows.items():
        same_text[name] = sum(r["text"] == ref[r["id"]]["text"] for r in rs)
        for r in rs:
            o = ref[r["id"]]
            if (r["prompt_tokens"], r["tokens"]) != (o["prompt_tokens"], o["tokens"]):
                bad.append(f"{name}/{r['id']}: prompt {r['prompt_tokens']} vs {o['prompt_tokens']}, "
                           f"completion {r['tokens']} vs {o['tokens']}")
    return {"count_mismatches": bad, "texts_equal_to_" + reference: same_text}


def ratio(a: list[dict], b: list[dict]) -> float:
    """Median over requests of a's latency / b's (same request ids)."""
    bl = {r["id"]: r["latency_s"] for r in b}
    return median(r["latency_s"] / bl[r["id"]] for r in a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default=None, help="llama-server binary (omit: specgen only)")
    ap.add_argument("-m", "--model", default="gemma3-270m", help="model (default: gemma3-270m, Gemma 3 270M base)")
    ap.add_argument("--requests", type=Path, default=None, help="request file (default: the bundled set)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("-np", "--parallel", type=int, default=4, help="server slots (both servers)")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--llama-types", default=",".join(LLAMA_TYPES))
    ap.add_argument("--specgen", action="append", default=None, metavar="CONFIG::FLAGS",
                    help="a specgen configuration: its bench --config name, '::', its specgen serve flags (repeatable; "
                         "default: 'lookup:k=8::--lookup -k 8' and 'lookup:k=16,policy=cost::' (serve's defaults)); "
                         "the last one is the one held against llama-server; CONFIG@DIR serves it from the specgen "
                         "checkout in DIR (e.g. the code before a change, side by side)")
    ap.add_argument("--llama-args", default="-kvu", help="extra llama-server flags (default: -kvu, one KV pool as specgen's)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="at concurrency > 1: the set through every server this many times, alternating the "
                         "servers' order; throughput over all repeats (and per repeat)")
    ap.add_argument("--no-prompt-cache", action="store_true",
                    help="send every server \"cache_prompt\": false (a prompt cache otherwise reuses the KV of a "
                         "prompt sent before: later --repeats run faster)")
    ap.add_argument("--no-bench", action="store_true", help="skip the in-process runs")
    ap.add_argument("--rows", type=Path, default=None, help="write every per-request row here (JSONL)")
    a = ap.parse_args()
    if a.llama_server and not Path(a.llama_server).is_file():
        sys.exit(f"serve_http: llama-server not found at {a.llama_server} (build llama.cpp's tools: "
                 "benchmarks/README.md; omit --llama-server for specgen alone)")

    from specgen.models.registry import resolve_model

    model = str(resolve_model(a.model))
    reqs = as_text(load_requests(a.requests), model)  # the same string on every server
    if a.limit:
        reqs = reqs[: a.limit]
    levels = [int(x) for x in a.concurrency.split(",")]
    specgen_cfgs = a.specgen or ["lookup:k=8::--lookup -k 8", "lookup:k=16,policy=cost::"]
    logdir = Path(tempfile.mkdtemp(prefix="serve_http."))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    common = ["-t", str(a.threads), "-c", str(a.ctx_size), "-np", str(a.parallel), "--host", "127.0.0.1"]
    servers: list[HttpSystem] = []
    bench: list[InProcess] = []
    pairs: list[tuple[str, str]] = []  # (serve name, bench name) with the same configuration
    for spec in specgen_cfgs:
        cfg, sep, flags = spec.partition("::")
        if not sep:
            sys.exit(f"--specgen {spec!r}: expected CONFIG::FLAGS")
        cfg, at, root = cfg.partition("@")  # CONFIG@DIR: served from another checkout (a before/after in one run)
        if at and not (Path(root) / "specgen" / "__init__.py").is_file():
            sys.exit(f"--specgen {spec!r}: {root} holds no specgen checkout")
        name = f"serve[{cfg}@{Path(root).name}]" if at else f"serve[{cfg}]"
        port = free_port()
        servers.append(HttpSystem(name, [sys.executable, "-m", "specgen", "serve", "-m", model, *common,
                                         "--port", str(port), "--ignore-eos", "-n", str(a.max_tokens),
                                         *flags.split()], logdir / f"serve-{len(servers)}.log", port,
                                  {**env, "PYTHONPATH": str(Path(root).resolve())} if at else env,
                                  str(Path(root).resolve()) if at else env["PYTHONPATH"],
                                  extra_body={"cache_prompt": False} if a.no_prompt_cache else None))
        if not a.no_bench and not at:
            pairs.append((name, f"bench[{cfg}]"))
    if a.llama_server:
        for t in a.llama_types.split(","):
            port = free_port()
            servers.append(HttpSystem(f"llama[{t}]", [a.llama_server, "-m", model, *common, "-tb", str(a.threads),
                                                        "--port", str(port), "--spec-type", t, "--temp", "0",
                                                        "-n", str(a.max_tokens), "--no-webui", *a.llama_args.split()],
                                      logdir / f"llama-{t}.log", port,
                                      extra_body={"cache_prompt": False} if a.no_prompt_cache else None))
    import httpx

    # no keep-alive: a pooled connection the server closed while idle fails the next request
    limits = httpx.Limits(max_keepalive_connections=0)
    with ExitStack() as stack, httpx.Client(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        for s in servers:
            stack.callback(s.stop)
            s.start()
        if 1 in levels and not a.no_bench:
            for serve_name, bench_name in pairs:
                ip = InProcess(bench_name[len("bench["):-1], a.model, a.threads, a.ctx_size, a.max_tokens)
                stack.callback(ip.stop)
                ip.prepare(reqs)
                bench.append(ip)
        for s in servers:
            s.wait_ready(client)
        for s in [*servers, *bench]:  # warm-up: a prompt outside the set
            if isinstance(s, InProcess):
                s.run("__warmup__", 8)
            else:
                s.complete(client, WARMUP_PROMPT, 8)
        all_rows: dict[int, dict[str, list[dict]]] = {}
        report = []
        for n in levels:
            if n == 1:
                rows = level_one([*bench, *servers], reqs, a.max_tokens, client)
                summaries = [summarize(name, 1, rs) for name, rs in rows.items()]
            else:
                rows = {s.name: [] for s in servers}
                walls = {s.name: [] for s in servers}
                before = {s.name: shared_steps(s, client) for s in servers}
                for rep in range(a.repeats):  # the servers in alternating order, repeat by repeat
                    order = servers if (len(all_rows) + rep) % 2 == 0 else servers[::-1]
                    for s in order:
                        rs, wall = level_n(s, reqs, a.max_tokens, n, client)
                        rows[s.name] += [{**r, "repeat": rep} for r in rs]
                        walls[s.name].append(wall)
                summaries = []
                for s in servers:
                    sm = summarize(s.name, n, rows[s.name], sum(walls[s.name]))
                    sm["throughput_by_repeat"] = [sum(r["tokens"] or 0 for r in rows[s.name] if r["repeat"] == i) / w
                                                  for i, w in enumerate(walls[s.name])]
                    after = shared_steps(s, client)  # this level's shared steps, drafting or kept plain
                    sm.update({k: v - before[s.name].get(k, 0.0) for k, v in after.items()})
                    summaries.append(sm)
            all_rows[n] = rows
            for sm in summaries:
                print(json.dumps(sm), flush=True)
            report.append((n, rows, summaries))

    summary = {"summary": True, "model": Path(model).name, "requests": len(reqs), "max_tokens": a.max_tokens,
               "threads": a.threads, "parallel": a.parallel}
    default = servers[len(specgen_cfgs) - 1].name  # the last specgen configuration
    for n, rows, summaries in report:
        by = {s["system"]: s for s in summaries}
        summary[f"c{n}_checks"] = check_counts(rows, default)
        llama = [s for name, s in by.items() if name.startswith("llama[") and name != "llama[none]"]
        if n == 1:
            for serve_name, bench_name in pairs:
                if bench_name in rows:
                    summary[f"c1_{serve_name}/{bench_name}_latency_ratio"] = ratio(rows[serve_name], rows[bench_name])
            if llama:
                best = min(llama, key=lambda s: s["median_latency_s"])
                summary["c1_best_llama"] = best["system"]
                summary["c1_median_latency_ratio_specgen/best_llama"] = by[default]["median_latency_s"] / best["median_latency_s"]
        elif llama:
            best = max(llama + ([by["llama[none]"]] if "llama[none]" in by else []),
                       key=lambda s: s["throughput_tokens_per_s"])
            summary[f"c{n}_best_llama"] = best["system"]
            summary[f"c{n}_throughput_ratio_specgen/best_llama"] = by[default]["throughput_tokens_per_s"] / best["throughput_tokens_per_s"]
    print(json.dumps(summary), flush=True)
    if a.rows:
        with a.rows.open("w") as f:
            for n, rows, _ in report:
                for name, rs in rows.items():
                    for r in rs:
                        f.write(json.dumps({"concurrency": n, "system": name, **r}) + "\n")


if __name__ == "__main__":
    main()
