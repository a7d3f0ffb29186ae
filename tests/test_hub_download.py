"""Real Hugging Face downloads (huggingface_hub's own code) without a network:
a local HTTP server imitating the hub's `resolve` endpoint (which can answer
503 first), a closed port on 127.0.0.1, or a host name that a patched
resolver refuses to resolve.
"""

from __future__ import annotations

import hashlib
import http.server
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from typing import ClassVar

import huggingface_hub.constants as hf_constants
import pytest

from specgen.models.catalog import ModelEntry
from specgen.models.registry import is_present, resolve_model

from helpers import error_of
from registry_helpers import COMMIT, isolated, tiny, write_toml  # noqa: F401 (fixtures)


class _Hub(http.server.BaseHTTPRequestHandler):
    files: ClassVar[dict[str, bytes]] = {}
    requests: ClassVar[list[str]] = []
    unavailable: ClassVar[dict[str, int]] = {}  # method -> how many 503s to answer first

    def log_message(self, *args):  # keep pytest output quiet
        pass

    def _reply(self, body: bool):
        if self.unavailable.get(self.command, 0) > 0:
            self.unavailable[self.command] -= 1
            self.requests.append(f"{self.command} {self.path} 503")
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.requests.append(f"{self.command} {self.path}")
        parts = self.path.split("/")  # ['', owner, name, 'resolve', revision, *file]
        repo, key = "/".join(parts[1:3]), "/".join(parts[1:3] + parts[5:])
        if repo not in {"/".join(k.split("/")[:2]) for k in self.files}:
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("X-Error-Message", "Repository not found")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if key not in self.files:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Error-Message", "Entry not found")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = self.files[key]
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_HEAD(self):
        self._reply(body=False)

    def do_GET(self):
        self._reply(body=True)


@pytest.fixture
def hub(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hf_constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(_Hub, "files", {})
    monkeypatch.setattr(_Hub, "requests", [])
    monkeypatch.setattr(_Hub, "unavailable", {})
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    try:  # huggingface_hub >= 2 fetches an agent registry from the endpoint once per process: not in our counts
        from huggingface_hub.utils import _detect_agent

        monkeypatch.setattr(_detect_agent, "_registry", {"standardEnvVars": [], "harnesses": {}})
    except ImportError:
        pass
    yield _Hub
    server.shutdown()
    server.server_close()


def test_hf_download_from_local_hub(hub, tiny, isolated):
    data = tiny.read_bytes()
    hub.files["Owner/Repo/tiny.gguf"] = data
    entry = ModelEntry("t", repo="Owner/Repo", file="tiny.gguf")
    assert not is_present(entry)
    path = resolve_model("hf:Owner/Repo/tiny.gguf")
    assert path.read_bytes() == data
    assert str(path).startswith(str(isolated))
    assert any(r.startswith("GET ") for r in hub.requests)
    assert is_present(entry)
    # Once cached: no network needed at all.
    hub.requests.clear()
    assert resolve_model("hf:Owner/Repo/tiny.gguf") == path
    assert hub.requests == []


def test_hf_download_errors_are_one_line(hub, tiny):
    hub.files["Owner/Repo/tiny.gguf"] = tiny.read_bytes()
    msg = error_of(resolve_model, "hf:Owner/Repo/other.gguf")
    assert msg == "could not download Owner/Repo/other.gguf: no such file in the repository"
    msg = error_of(resolve_model, "hf:Nobody/Nothing/x.gguf")
    assert msg.startswith("could not download Nobody/Nothing/x.gguf: repository not found")


def test_hf_download_bad_file_is_caught(hub):
    hub.files["Owner/Repo/fake.gguf"] = b"<html>not a model</html>"
    assert "is not a GGUF file" in error_of(resolve_model, "hf:Owner/Repo/fake.gguf")


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def point_hub_at(monkeypatch, endpoint: str) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(hf_constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")


@pytest.fixture
def attempts(monkeypatch):
    """Counts TCP connection attempts and backoff sleeps (sleeping none of them)."""
    seen = {"connects": [], "sleeps": []}
    connect = socket.create_connection

    def counting_connect(address, *args, **kwargs):
        seen["connects"].append(address)
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", counting_connect)
    monkeypatch.setattr(time, "sleep", lambda s: seen["sleeps"].append(s))
    return seen


def hub_log(caplog) -> list[str]:
    """What huggingface_hub logged (pytest sees records even where its handler is muted)."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")]


def test_hf_connection_refused_fails_at_once(monkeypatch, hub, attempts, capfd, caplog):
    port = closed_port()
    point_hub_at(monkeypatch, f"http://127.0.0.1:{port}")
    msg = error_of(resolve_model, "hf:Owner/Repo/tiny.gguf")
    assert msg == (
        f"could not download Owner/Repo/tiny.gguf: cannot reach 127.0.0.1:{port} (connection refused); "
        "nothing cached (check the network, or HF_ENDPOINT / HF_HUB_OFFLINE)"
    )
    assert attempts["connects"] == [("127.0.0.1", port)]  # one try: no retry, no backoff
    assert attempts["sleeps"] == []
    assert capfd.readouterr() == ("", "")  # nothing from huggingface_hub
    assert hub_log(caplog) == []


def test_hf_unresolvable_host_fails_at_once(monkeypatch, hub, attempts, capfd):
    resolve = socket.getaddrinfo

    def no_such_host(host, *args, **kwargs):
        if host == "hub.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    point_hub_at(monkeypatch, "http://hub.invalid")
    msg = error_of(resolve_model, "hf:Owner/Repo/tiny.gguf")
    assert msg == (
        "could not download Owner/Repo/tiny.gguf: cannot reach hub.invalid (host name not resolved); "
        "nothing cached (check the network, or HF_ENDPOINT / HF_HUB_OFFLINE)"
    )
    assert attempts["connects"] == [("hub.invalid", 80)]
    assert attempts["sleeps"] == []
    assert capfd.readouterr() == ("", "")


def test_hf_503_then_200_retries_quietly(hub, tiny, attempts, capfd, caplog):
    data = tiny.read_bytes()
    hub.files["Owner/Repo/tiny.gguf"] = data
    hub.unavailable["HEAD"] = 2  # the metadata call is the one huggingface_hub retries on 5xx
    path = resolve_model("hf:Owner/Repo/tiny.gguf")
    assert path.read_bytes() == data
    assert hub.requests == [
        "HEAD /Owner/Repo/resolve/main/tiny.gguf 503",
        "HEAD /Owner/Repo/resolve/main/tiny.gguf 503",
        "HEAD /Owner/Repo/resolve/main/tiny.gguf",
        "GET /Owner/Repo/resolve/main/tiny.gguf",
    ]
    assert attempts["sleeps"]  # huggingface_hub's own backoff did the waiting
    assert capfd.readouterr() == ("", "")  # ... silently
    assert hub_log(caplog) == []


def test_hub_logs_show_with_specgen_hf_log(monkeypatch, hub, tiny, attempts, caplog):
    monkeypatch.setenv("SPECGEN_HF_LOG", "1")
    hub.files["Owner/Repo/tiny.gguf"] = tiny.read_bytes()
    hub.unavailable["HEAD"] = 2
    resolve_model("hf:Owner/Repo/tiny.gguf")
    assert any("HTTP Error 503" in m for m in hub_log(caplog))


def test_hub_settings_are_restored_after_a_download(monkeypatch, hub):
    from huggingface_hub.utils import _http as hub_http

    factory = hub_http._GLOBAL_CLIENT_FACTORY
    level = logging.getLogger("huggingface_hub").level
    point_hub_at(monkeypatch, f"http://127.0.0.1:{closed_port()}")
    error_of(resolve_model, "hf:Owner/Repo/tiny.gguf")
    assert hub_http._GLOBAL_CLIENT_FACTORY is factory
    assert logging.getLogger("huggingface_hub").level == level


@pytest.mark.parametrize("via", ["hf", "catalog", "run"])
def test_cli_offline_download_is_one_line(tmp_path, via):
    port = closed_port()
    catalog = write_toml(tmp_path / "models.toml", """
        [models.far]
        repo = "Owner/Repo"
        file = "tiny.gguf"
    """)
    args = {
        "hf": ["pull", "hf:Owner/Repo/tiny.gguf"],
        "catalog": ["pull", "far"],
        "run": ["run", "-m", "hf:Owner/Repo/tiny.gguf", "hello"],
    }[via]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", SPECGEN_MODELS=str(catalog))
    proc = subprocess.run(
        [sys.executable, "-m", "specgen", *args],
        capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=60,
    )
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"specgen: error: could not download Owner/Repo/tiny.gguf: cannot reach 127.0.0.1:{port} (connection refused); "
        "nothing cached (check the network, or HF_ENDPOINT / HF_HUB_OFFLINE)"
    ]

