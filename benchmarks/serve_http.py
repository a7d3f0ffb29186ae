"""Latency and throughput of an OpenAI-compatible server on the bundled requests.

Sends every bundled request (or a JSONL file's) to BASE_URL at concurrency 1
and then at each --concurrency level, greedy, with the same max_tokens for
every server, and prints one JSON line per level: median / p90 latency,
median TTFT (first streamed token), total generated tokens and throughput.
Works against `specgen serve` and llama.cpp's `llama-server` alike, so the two
are measured by the same client:

    specgen serve -t 4 --parallel 4 --port 8080 &
    python benchmarks/serve_http.py --url http://127.0.0.1:8080 --concurrency 1,4 -n 64
    llama-server -m MODEL -t 4 -np 4 --port 8081 --spec-type ngram-mod &
    python benchmarks/serve_http.py --url http://127.0.0.1:8081 --concurrency 1,4 -n 64

The figure to hold next to the first is `specgen bench -n 64` in process
(its per-request latency at concurrency 1). Token counts are the server's
own usage.completion_tokens; a server that stops early at EOS generates fewer,
so pass --ignore-eos to both (llama-server: ignore_eos is sent in the body).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgen.bench import load_requests  # noqa: E402


def one(client, url: str, req, max_tokens: int, ignore_eos: bool, key: str | None) -> dict:
    if req.messages:
        path = "/v1/chat/completions"
        body = {"messages": [{"role": r, "content": c} for r, c in req.messages]}
    else:
        path = "/v1/completions"
        body = {"prompt": req.prompt}
    body.update(max_tokens=min(max_tokens, req.max_tokens or max_tokens), temperature=0, stream=True,
                stream_options={"include_usage": True})
    if ignore_eos:
        body["ignore_eos"] = True  # llama-server's field; specgen serve takes --ignore-eos on its command line
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    with client.stream("POST", url + path, json=body, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            ch = obj.get("choices") or []
            if ch and ttft is None and ((ch[0].get("delta") or {}).get("content") or ch[0].get("text")):
                ttft = time.perf_counter() - t0
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
    return {"id": req.id, "latency_s": time.perf_counter() - t0, "ttft_s": ttft or 0.0, "tokens": tokens}


def level(url: str, reqs, n: int, max_tokens: int, ignore_eos: bool, key: str | None) -> dict:
    import httpx

    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(n) as pool:
        t0 = time.perf_counter()
        rows = list(pool.map(lambda r: one(client, url, r, max_tokens, ignore_eos, key), reqs))
        wall = time.perf_counter() - t0
    lat = sorted(r["latency_s"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    return {
        "url": url, "concurrency": n, "requests": len(rows), "generated_tokens": tokens, "wall_s": wall,
        "throughput_tokens_per_s": tokens / wall if wall else 0.0,
        "median_latency_s": median(lat), "p90_latency_s": lat[int(0.9 * (len(lat) - 1))],
        "median_ttft_s": median(r["ttft_s"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--requests", type=Path, default=None, help="JSONL request file (default: the bundled set)")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--api-key", default=None)
    a = ap.parse_args()
    reqs = load_requests(a.requests)
    if a.limit:
        reqs = reqs[: a.limit]
    for n in [int(x) for x in a.concurrency.split(",")]:
        print(json.dumps(level(a.url.rstrip("/"), reqs, n, a.max_tokens, a.ignore_eos, a.api_key)), flush=True)


if __name__ == "__main__":
    main()
