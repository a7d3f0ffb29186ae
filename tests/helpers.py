"""Helpers shared by the tests: the one-line error of a call, a byte-level tokenizer, specgen in a real process."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specgen.errors import SpecgenError

ROOT = Path(__file__).resolve().parent.parent  # the tree under test: subprocesses run its code, not an installed copy


def error_of(fn, *args, **kw) -> str:
    """The message of the SpecgenError that fn(*args, **kw) raises: one line, no traceback."""
    with pytest.raises(SpecgenError) as ei:
        fn(*args, **kw)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert "Traceback" not in msg
    return msg


SPECIALS = {"<bos>": 1, "<eos>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}
NAMES = {v: k for k, v in SPECIALS.items()}


class ByteTok:
    """One token per byte (1000 + b) plus four control tokens: easy to reason about."""

    def __init__(self, add_bos=True):
        self.add_bos = add_bos

    def vocab_info(self):
        return SimpleNamespace(add_bos=self.add_bos, bos=1, eos=2)

    def token_text(self, t):
        return NAMES[t].encode() if t in NAMES else bytes([t - 1000])

    def tokenize(self, text, add_special=True, parse_special=True):
        out = [1] if add_special and self.add_bos else []
        i = 0
        while i < len(text):
            for s, t in SPECIALS.items():
                if parse_special and text.startswith(s, i):
                    out.append(t)
                    i += len(s)
                    break
            else:
                out += [1000 + b for b in text[i].encode()]
                i += 1
        return out

    def piece(self, t, special=False):
        if t in NAMES:
            return NAMES[t].encode() if special else b""
        return bytes([t - 1000])


def specgen_env(extra: dict | None = None) -> dict:
    """The environment for a specgen subprocess: this tree first on PYTHONPATH, plus `extra`."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def specgen(*args, env: dict | None = None, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`python -m specgen ARGS` to its end, output captured; kw as for subprocess.run (input=, text=, stdin=)."""
    return subprocess.run([sys.executable, "-m", "specgen", *args], capture_output=True, timeout=timeout,
                          env=specgen_env(env), **kw)


def sigint_default() -> None:
    """In a child before exec: SIGINT back to its default. A suite started in the
    background by a shell (`cmd &`) inherits SIGINT ignored, and a Python child
    that starts with it ignored never raises KeyboardInterrupt: the Ctrl-C tests
    would test the launcher, not specgen."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_specgen(*args, env: dict | None = None, **kw) -> subprocess.Popen:
    """`python -m specgen ARGS` started, SIGINT as at a terminal; kw as for
    subprocess.Popen (stdin=, stdout=, stderr=)."""
    return subprocess.Popen([sys.executable, "-m", "specgen", *args], env=specgen_env(env),
                            preexec_fn=sigint_default, **kw)


# -- stub HTTP servers on 127.0.0.1 (the bench client's tests) ------------------------


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """A stub server's side of one request: its head, its body read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(int(re.search(rb"(?i)content-length: *(\d+)", head).group(1)))
    return head


async def loopback_server(handle) -> tuple[asyncio.AbstractServer, str]:
    """An asyncio server for `handle` on a free loopback port, and its URL."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
