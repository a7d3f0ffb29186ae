"""`specgen serve`'s ecosystem names: /metrics read by prometheus_client's own
parser (vLLM's and llama-server's speculative counters beside specgen's), and
llama-server-style `timings` in responses, streamed and not.

The server is the real HTTP app on 127.0.0.1 over a fake engine (tests/fakes)
with a scripted drafter: every request drafts and has some drafts rejected,
so the per-position counts are not all equal. No model is loaded.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from fakes import chain_table
from test_serving import MultiFakeEngine, WrongAfter
from specgen.serve.http.metrics import Metrics, positions
from specgen.serve.scheduler import Server

prometheus_parser = pytest.importorskip("prometheus_client.parser")

K = 4
MODEL = "fake-model"
VLLM = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos")
LLAMACPP = ("llamacpp:spec_decode_num_drafts", "llamacpp:spec_decode_num_draft_tokens",
            "llamacpp:spec_decode_num_accepted_tokens", "llamacpp:spec_decode_num_accepted_tokens_per_pos")


class FakeServe:
    """The app over an EngineLoop of a fake engine, served by uvicorn in a thread."""

    def __init__(self, good: int = 2) -> None:
        from specgen.rules.sampling import SamplingParams
        from specgen.serve.http.app import AppConfig, create_app, http_server, listen
        from specgen.serve.http.loop import EngineLoop
        from specgen.serve.http.schema import Defaults

        eng = MultiFakeEngine(chain_table(50), n_ctx=512, n_batch=64)
        self.engine = EngineLoop(lambda: Server(eng, 2, draft_max=K, drafter=WrongAfter(50, good=good)), eng,
                                 parallel=2, queue_max=4)
        cfg = AppConfig(MODEL, Defaults(SamplingParams(), 16, "draft", K, "fixed"))
        self.engine.start()
        self.sock = listen("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.http = http_server(create_app(self.engine, cfg), grace=1.0)
        self.thread = threading.Thread(target=self.http.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        t0 = time.monotonic()
        while not self.http.started:
            assert time.monotonic() - t0 < 30, "the server did not start"
            time.sleep(0.02)

    def post(self, body: dict, path: str = "/v1/completions") -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30)

    def metrics_text(self) -> str:
        r = httpx.get(self.url + "/metrics", timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        return r.text

    def close(self) -> None:
        self.http.should_exit = True
        self.thread.join(30)
        self.engine.close()
        self.sock.close()


@pytest.fixture(scope="module")
def fake_srv():
    s = FakeServe()
    yield s
    s.close()


def families(text: str) -> dict:
    """name → (type, [(sample name, labels, value)]), every line of the text parsed."""
    return {f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples])
            for f in prometheus_parser.text_string_to_metric_families(text)}


def value(fams: dict, name: str, **labels) -> float:
    _, samples = fams[name]
    hits = [v for _, lab, v in samples if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, samples)
    return hits[0]


def test_positions_come_back_from_k_hist_and_per_position_rates():
    # rounds drafting 4, 4, 2, 0; accepted at positions 1..4: 3, 2, 1, 0
    record = {"k_hist": {"0": 1, "2": 1, "4": 2}, "per_position": [1.0, 2 / 3, 1 / 2, 0.0]}
    assert positions(record) == ([3, 3, 2, 2], [3, 2, 1, 0])
    assert positions({"k_hist": {"0": 5}, "per_position": []}) == ([], [])


def test_an_unused_server_exports_every_name_at_zero_with_the_positions_of_its_k():
    fams = families(Metrics().render({}, model_name='a "quoted" model', draft_max=3))
    for name in VLLM + LLAMACPP:
        assert fams[name][0] == "counter", name
    per_pos = fams["vllm:spec_decode_num_accepted_tokens_per_pos"][1]
    assert [(s[1]["position"], s[2]) for s in per_pos] == [("0", 0), ("1", 0), ("2", 0)]
    assert per_pos[0][1]["model_name"] == 'a "quoted" model' and per_pos[0][1]["engine"] == "0"
    assert value(fams, "llamacpp:spec_decode_num_drafts") == 0


def test_metrics_text_parses_whole_and_the_ecosystem_names_agree_with_specgens(fake_srv):
    replies = []
    for i, n in enumerate((12, 9, 15)):
        r = fake_srv.post({"prompt": [1 + i], "max_tokens": n})
        assert r.status_code == 200, r.text
        replies.append(r.json())
    r = fake_srv.post({"prompt": [30], "max_tokens": 5, "speculative": {"mode": "none"}})  # rounds that draft nothing
    assert r.status_code == 200
    replies.append(r.json())
    fams = families(fake_srv.metrics_text())  # every line parses, or this raises

    # specgen's own names are still there, unchanged
    assert fams["specgen_drafted"][0] == "counter" and fams["specgen_request_latency_seconds"][0] == "histogram"
    drafted, accepted = value(fams, "specgen_drafted"), value(fams, "specgen_accepted")
    assert drafted == sum(x["speculative"]["drafted"] for x in replies) > 0
    assert accepted == sum(x["speculative"]["accepted"] for x in replies) > 0
    assert accepted < drafted  # the drafter is wrong after two tokens

    for name in VLLM + LLAMACPP:
        assert fams[name][0] == "counter", name
    lab = {"model_name": MODEL, "engine": "0"}
    assert {s[0] for s in fams["vllm:spec_decode_num_drafts"][1]} == {"vllm:spec_decode_num_drafts_total"}
    assert fams["vllm:spec_decode_num_drafts"][1][0][1] == lab
    drafts = sum(n for x in replies for k, n in x["speculative"]["k_hist"].items() if k != "0")
    rounds = value(fams, "specgen_rounds")
    assert 0 < drafts < rounds  # the plain request's rounds drafted nothing: they are not drafts
    for prefix, labels in (("vllm", lab), ("llamacpp", {})):
        assert value(fams, f"{prefix}:spec_decode_num_drafts", **labels) == drafts
        assert value(fams, f"{prefix}:spec_decode_num_draft_tokens", **labels) == drafted
        assert value(fams, f"{prefix}:spec_decode_num_accepted_tokens", **labels) == accepted
        per_pos = fams[f"{prefix}:spec_decode_num_accepted_tokens_per_pos"][1]
        assert [s[1]["position"] for s in per_pos] == [str(i) for i in range(K)]
        counts = [s[2] for s in per_pos]
        assert sum(counts) == accepted
        assert counts[0] >= counts[1] > 0 and counts[2] == counts[3] == 0  # right for two tokens, then wrong
        if prefix == "vllm":
            assert all({k: v for k, v in s[1].items() if k != "position"} == lab for s in per_pos)
        else:
            assert all(set(s[1]) == {"position"} for s in per_pos)
        assert counts[0] == value(fams, f"{prefix}:spec_decode_num_drafts", **labels)  # position 0 always right


def test_responses_carry_llama_server_timings_beside_the_speculative_block(fake_srv):
    body = {"prompt": [3], "max_tokens": 10}
    whole = fake_srv.post(body).json()
    t, spec = whole["timings"], whole["speculative"]
    assert t["draft_n"] == spec["drafted"] > 0 and t["draft_n_accepted"] == spec["accepted"] > 0
    assert t["predicted_n"] == whole["usage"]["completion_tokens"] == 10
    assert t["prompt_n"] + t["cache_n"] == whole["usage"]["prompt_tokens"]
    assert t["prompt_ms"] >= 0 and t["predicted_ms"] > 0
    assert t["predicted_per_second"] == pytest.approx(1000 * t["predicted_n"] / t["predicted_ms"])

    for include_usage in (False, True):
        with httpx.stream("POST", fake_srv.url + "/v1/completions", timeout=30,
                          json={**body, "stream": True, "stream_options": {"include_usage": include_usage}}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all("timings" not in c for c in chunks[:-1])  # only the final chunk carries it
        last = chunks[-1]
        assert (last["choices"] == []) is include_usage
        assert last["timings"]["draft_n"] == last["speculative"]["drafted"] == spec["drafted"]
        assert last["timings"]["draft_n_accepted"] == last["speculative"]["accepted"] == spec["accepted"]
        assert last["timings"]["predicted_n"] == 10


def test_a_request_that_turns_speculation_off_reports_zero_drafts_in_its_timings(fake_srv):
    r = fake_srv.post({"messages": [{"role": "user", "content": "x"}]}, "/v1/chat/completions")
    assert r.status_code == 400  # the fake has no chat template: completions only
    t = fake_srv.post({"prompt": [5], "max_tokens": 6, "speculative": {"k": 0}}).json()["timings"]
    assert t["draft_n"] == 0 and t["draft_n_accepted"] == 0 and t["predicted_n"] == 6
