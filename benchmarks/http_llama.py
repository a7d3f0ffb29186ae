"""`specgen bench --endpoint` against llama-server, checked against llama.cpp's own timings.

Starts two llama-server processes built from the same sdist as the installed
llama-cpp-python, on 127.0.0.1, same model and threads: `--spec-type none`
(the baseline) and `--spec-type ngram-mod` (or --spec-type). Then runs the
real command, `python -m specgen bench --endpoint plain=… --endpoint spec=…`,
one request at a time, endpoints alternating per repeat, greedy, ignore_eos,
prompt caching off (so every repeat prefills as the first did), and reads its
records file. Per request it compares two measures of the same latency
change (spec − plain, medians over repeats):

- the client's: what specgen bench measured (end-to-end, `total_s`);
- the server's: llama.cpp's own `timings` of each response
  (`prompt_ms + predicted_ms`), which no HTTP or client cost reaches.

They agree when their difference is within the noise: the 95 % bootstrap
interval of its median over requests holds 0, or it is under 2 ms and under
5 % of the change itself. Both
servers are stopped at the end, whatever happens; every step is bounded.

    python benchmarks/http_llama.py --llama-server LLAMA_CPP_BUILD/bin/llama-server --limit 12 --repeats 3 -n 64
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(binary: str, model: Path, threads: int, spec_type: str, draft_max: int, log: Path):
    port = free_port()
    cmd = [binary, "-m", str(model), "-t", str(threads), "-tb", str(threads), "-c", "4096", "-np", "1",
           "--host", "127.0.0.1", "--port", str(port), "--no-webui", "--spec-type", spec_type]
    if spec_type != "none":
        cmd += ["--spec-draft-n-max", str(draft_max)]
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc, url: str, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode}: {log.read_text(errors='replace')[-1500:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"llama-server did not become ready in {START_TIMEOUT_S} s (log: {log})")


def stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def server_ms(run: dict) -> float | None:
    t = run.get("server_spec") or {}
    if "prompt_ms" in t and "predicted_ms" in t:
        return float(t["prompt_ms"]) + float(t["predicted_ms"])
    return None


def bootstrap_median_ci(values: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    import numpy as np

    v = np.asarray(values)
    meds = np.median(np.random.default_rng(seed).choice(v, size=(n, len(v))), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def compare(records: list[dict], base: str, spec: str) -> dict:
    """Per request: the latency change as the client measured it and as llama.cpp timed it."""
    rows = []
    for rec in records:
        if rec.get("type") != "request":
            continue
        by = {c: [r for r in rec["runs"] if r["config"] == c] for c in (base, spec)}
        if not all(by.values()):
            continue
        client = {c: median(1000 * r["total_s"] for r in runs) for c, runs in by.items()}
        srv = {c: [server_ms(r) for r in runs] for c, runs in by.items()}
        if any(x is None for v in srv.values() for x in v):
            continue
        server = {c: median(v) for c, v in srv.items()}
        # the noise: how far the baseline's own repeats spread (client-measured)
        plain_runs = [1000 * r["total_s"] for r in by[base]]
        rows.append({
            "id": rec["id"], "category": rec["category"],
            "client_change_ms": client[spec] - client[base], "server_change_ms": server[spec] - server[base],
            "client_speedup": client[base] / client[spec], "server_speedup": server[base] / server[spec],
            "client_overhead_ms": {c: client[c] - server[c] for c in (base, spec)},
            "repeat_spread_ms": max(plain_runs) - min(plain_runs),
            "drafted": sum(r.get("drafted", 0) for r in by[spec]), "accepted": sum(r.get("accepted", 0) for r in by[spec]),
        })
    if not rows:
        return {"requests": 0}
    diff = [r["client_change_ms"] - r["server_change_ms"] for r in rows]
    ratio = [r["client_speedup"] / r["server_speedup"] for r in rows]
    gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    noise = median(r["repeat_spread_ms"] for r in rows)
    return {
        "requests": len(rows),
        "client_geomean_speedup": gm([r["client_speedup"] for r in rows]),
        "server_geomean_speedup": gm([r["server_speedup"] for r in rows]),
        "median_client_change_ms": median(r["client_change_ms"] for r in rows),
        "median_server_change_ms": median(r["server_change_ms"] for r in rows),
        "median_change_difference_ms": median(diff),
        "max_abs_change_difference_ms": max(map(abs, diff)),
        "median_speedup_ratio_client/server": median(ratio),
        "median_repeat_spread_ms": noise,
        "median_client_overhead_ms": median(r["client_overhead_ms"][base] for r in rows),
        "median_change_difference_ci95_ms": bootstrap_median_ci(diff),
        # within noise: the difference's interval holds 0, or it is under 2 ms and 5 % of the change
        "agree_within_noise": (bootstrap_median_ci(diff)[0] <= 0 <= bootstrap_median_ci(diff)[1]
                               or abs(median(diff)) <= max(2.0, 0.05 * abs(median(r["server_change_ms"] for r in rows)))),
        "per_request": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", default=None, help="llama-server binary (default: the one on PATH)")
    ap.add_argument("--model", default=None, help="GGUF (default: gemma3-270m, Gemma 3 270M Q4_K_M base)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=12, help="bundled requests (prompt ones)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spec-type", default="ngram-mod")
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=420, help="seconds for the whole bench command")
    a = ap.parse_args()
    server = a.llama_server or shutil.which("llama-server")
    if not server or not Path(server).is_file():
        raise SystemExit(f"http_llama: llama-server not found ({a.llama_server or 'not on PATH'}; build llama.cpp's "
                         "tools and give --llama-server PATH: benchmarks/README.md)")
    a.llama_server = server
    from specgen.bench import load_requests
    from specgen.models.registry import resolve_model

    model = Path(a.model) if a.model else resolve_model("gemma3-270m")
    tmp = Path(tempfile.mkdtemp(prefix="http_llama."))
    # raw-text requests only: /v1/completions, the same string on both servers
    reqs = [r for r in load_requests(None) if r.prompt is not None][: a.limit]
    req_file = tmp / "requests.jsonl"
    req_file.write_text("".join(json.dumps({"id": r.id, "category": r.category, "prompt": r.prompt}) + "\n" for r in reqs))
    procs = []
    try:
        urls = {}
        for name, st in (("plain", "none"), ("spec", a.spec_type)):
            proc, url = start_server(a.llama_server, model, a.threads, st, a.draft_max, tmp / f"{name}.log")
            procs.append(proc)
            urls[name] = (proc, url)
        for name, (proc, url) in urls.items():
            wait_ready(proc, url, tmp / f"{name}.log")
        out = tmp / "records.jsonl"
        no_cache = json.dumps({"cache_prompt": False})
        cmd = [sys.executable, "-m", "specgen", "bench", str(req_file),
               "--endpoint", f"plain={urls['plain'][1]}", "--endpoint", f"spec={urls['spec'][1]}",
               "--endpoint-body", f"plain={no_cache}", "--endpoint-body", f"spec={no_cache}",
               "-n", str(a.max_tokens), "--ignore-eos", "--repeats", str(a.repeats), "--out", str(out), "--json"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
        if p.returncode != 0:
            raise SystemExit(f"specgen bench failed ({p.returncode}): {p.stderr[-2000:]}")
        summary = json.loads(p.stdout)
        records = [json.loads(line) for line in out.read_text().splitlines()[1:] if line.strip()]
    finally:
        for proc in procs:
            stop(proc)
    res = compare(records, "plain", "spec")
    res["spec_type"] = a.spec_type
    res["client"] = summary["client"]
    res["command"] = " ".join(cmd[1:])
    print(json.dumps(res, indent=1))
    print(f"{res['requests']} requests × {a.repeats} repeats, llama-server --spec-type {a.spec_type} vs none, "
          f"{a.max_tokens} tokens: specgen bench geomean speedup {res['client_geomean_speedup']:.3f}, llama.cpp's timings "
          f"{res['server_geomean_speedup']:.3f}; latency change per request, median: client "
          f"{res['median_client_change_ms']:+.1f} ms vs server {res['median_server_change_ms']:+.1f} ms (difference "
          f"{res['median_change_difference_ms']:+.1f} ms, 95% CI {res['median_change_difference_ci95_ms'][0]:+.1f} … "
          f"{res['median_change_difference_ci95_ms'][1]:+.1f}; repeats spread {res['median_repeat_spread_ms']:.1f} ms): "
          f"{'agree' if res['agree_within_noise'] else 'DISAGREE'} · client CPU "
          f"{res['client']['cpu_per_request_ms']:.2f} ms a request", file=sys.stderr)


if __name__ == "__main__":
    main()
