"""The timed stream of `specgen bench --endpoint`: HTTP/1.1 read by an asyncio Protocol and httptools (llhttp).

Reading a streamed response through httpx wakes a task for every chunk
(httpx, httpcore, anyio, h11). Here the bytes are handed in the protocol's
`data_received` callback to llhttp (httptools), which frames the response
(head, chunked / sized / close-delimited body, keep-alive) in C; what the
body holds goes to a sink (the bench's reader, in specgen.bench.endpoint.measure) with
the time its bytes arrived. The request's task wakes once, when the response
has ended or failed.

Connections are kept alive and reused, one request at a time each, in a pool
per host; a kept connection that the server closed before answering is
replaced once. https goes through asyncio's own TLS (`create_connection(ssl=…)`)
with httpx's default context (certifi, or SSL_CERT_FILE / SSL_CERT_DIR), so
the stream trusts what the probe (httpx) trusted. No proxy: the stream goes
straight to the server, whatever HTTP(S)_PROXY says.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from typing import Protocol
from urllib.parse import unquote, urlsplit

import httptools

USER_AGENT = "specgen-bench"
CONNECT_TIMEOUT_S = 10.0


class Sink(Protocol):
    """What a response is handed to, inside the protocol's callbacks (its exceptions fail the request)."""

    def response(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    def data(self, data: bytes, now: float) -> None: ...

    def end(self) -> None: ...


class StreamError(Exception):
    """A request that could not be made or read (the subclasses say which)."""


class ConnectFailed(StreamError):
    """The connection (or its TLS handshake) could not be made; the cause is chained."""


class ServerClosed(StreamError):
    """The server closed the connection before the response ended."""


class BadResponse(StreamError):
    """The bytes are not an HTTP/1.1 response, or the request cannot be written as one."""


class _Stale(Exception):
    """A kept-alive connection closed before any byte of the answer: safe to send again on a new one."""


class SseLines:
    """Server-sent events cut into lines as bytes arrive; only `data:` lines are kept (their payload, stripped).

    Lines end with \\n, \\r\\n or \\r. Comments, `event:` lines and the blank
    lines between events are dropped: every data line is one JSON object in
    OpenAI's streams.
    """

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._rest + data if self._rest else bytes(data)
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._rest = lines.pop()
        return [ln[5:].strip() for ln in lines if ln.startswith(b"data:")]

    def tail(self) -> list[bytes]:
        """The last line, when the stream ended without a line break after it."""
        rest, self._rest = self._rest, b""
        return [rest[5:].strip()] if rest.startswith(b"data:") else []


_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 §5.6.2
_VALUE = re.compile(rb"[\x21-\x7e\x80-\xff]([\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?|")  # no CR, LF, NUL
_TARGET = re.compile(rb"/[\x21-\x7e]*")


def request_bytes(target: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """A POST as bytes; ValueError when a header or the target cannot be one line of HTTP/1.1."""
    t = target.encode("ascii")
    if not _TARGET.fullmatch(t):
        raise ValueError("bad target")
    out = [b"POST ", t, b" HTTP/1.1\r\n"]
    for name, value in headers:
        n, v = name.encode("ascii"), value.encode("latin-1")
        if not _TOKEN.fullmatch(n) or not _VALUE.fullmatch(v):
            raise ValueError("bad header")
        out += [n, b": ", v, b"\r\n"]
    out += [b"\r\n", body]
    return b"".join(out)


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time: llhttp (httptools) frames the response, its callbacks hand
    the head and the body's bytes to a sink."""

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None  # the current response's
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.done: asyncio.Future | None = None
        self.closed = False
        self.reusable = False  # set when a response ended with the connection fit for the next request
        self.requests = 0
        self.heard = False  # any byte of the current answer
        self.now = 0.0  # when the bytes being parsed arrived
        self.headers: list[tuple[bytes, bytes]] = []
        self.in_body = False  # the final response's head is read (not a 1xx)
        self.to_close = False  # its body runs to the connection's close
        self.ended = False
        self.extra = False  # bytes after the response's end: not ours (the connection is not reused)
        self.keep_alive = False

    # -- asyncio's callbacks

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        if self.sink is None:  # nothing asked: a server talking out of turn (a 408 before closing, …)
            self.close()
            return
        self.heard = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:  # the sink raised: its exception is the failure
            self._settle(e.__context__ or BadResponse(f"not an HTTP/1.1 response: {e}"))
            return
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            if not self.ended:
                why = "the server switched protocols" if isinstance(e, httptools.HttpParserUpgrade) else str(e)
                self._settle(BadResponse(f"not an HTTP/1.1 response: {why}"))
                return
            self.extra = True
        if self.ended:
            self._end()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost says what it meant

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.sink is None:
            return
        if not self.heard:
            self._settle(_Stale() if self.requests > 1 else ServerClosed("before answering"))
        elif self.to_close:  # a body that runs to the close ends here
            self._end()
        elif not self.in_body:
            self._settle(ServerClosed(str(exc) if exc else "in the response's head"))
        else:
            self._settle(ServerClosed(str(exc) if exc else "the connection closed before the body's end"))

    # -- llhttp's callbacks, inside feed_data (what they raise fails the request)

    def on_message_begin(self) -> None:
        self.extra = self.ended
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if self.ended or 100 <= status < 200:  # after the end, or a 1xx (wait for the real one)
            return
        self.in_body = True
        framed = any(n == b"content-length" or n == b"transfer-encoding" and v.rstrip().lower().endswith(b"chunked")
                     for n, v in self.headers)  # else llhttp reads the body to the close (RFC 9112 §6.3)
        self.to_close = status not in (204, 304) and not framed
        self.sink.response(status, self.headers)

    def on_body(self, data: bytes) -> None:
        if not self.ended:
            self.sink.data(data, self.now)

    def on_message_complete(self) -> None:
        if self.in_body and not self.ended:
            self.ended = True
            self.keep_alive = self.parser.should_keep_alive()

    # -- the response

    def _end(self) -> None:
        reusable = self.keep_alive and not self.to_close and not self.extra
        try:
            self.sink.end()
        except Exception as e:
            self._settle(e, reusable)
            return
        self._settle(None, reusable)

    def _settle(self, exc: BaseException | None, reusable: bool = False) -> None:
        self.sink, self.parser = None, None
        if reusable and not self.closed:
            self.reusable = True
        else:
            self.close()
        if self.done is not None and not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)

    # -- the request

    def send(self, request: bytes, sink: Sink, done: asyncio.Future) -> None:
        """Write `request` (whole, as bytes) and hand its response to `sink`; `done` is settled at its end."""
        self.parser = httptools.HttpResponseParser(self)
        self.headers = []
        self.in_body = self.to_close = self.ended = self.extra = self.keep_alive = False
        self.sink, self.done, self.reusable, self.heard = sink, done, False, False
        self.requests += 1
        self.transport.write(request)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Target:
    """Where an endpoint's base URL points: connection key, Host header, path prefix, TLS."""

    __slots__ = ("key", "host", "port", "tls", "host_header", "prefix", "auth")

    def __init__(self, url: str) -> None:
        p = urlsplit(url)
        self.tls = p.scheme == "https"
        self.host = p.hostname or ""
        self.port = p.port or (443 if self.tls else 80)
        self.key = (p.scheme, self.host, self.port)
        self.host_header = p.netloc.rpartition("@")[2]
        self.prefix = p.path.rstrip("/")
        self.auth = None
        if p.username is not None:  # http://user:password@host, as httpx reads it
            pair = f"{unquote(p.username)}:{unquote(p.password or '')}".encode()
            self.auth = "Basic " + base64.b64encode(pair).decode()


class StreamPool:
    """Kept-alive connections per host, and one streamed POST at a time on each (use inside one event loop)."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[tuple, list[Connection]] = {}
        self._all: set[Connection] = set()
        self._targets: dict[str, _Target] = {}
        self._tls = None

    async def post(self, url: str, path: str, headers: dict[str, str], body: bytes, sink: Sink) -> None:
        """POST `body` (JSON) to url + path and hand the response to `sink` as it arrives; returns when it ended.

        Raises a StreamError (ConnectFailed, ServerClosed, BadResponse), or what the sink raised.
        Cancelled (a timeout), the connection is closed, never reused.
        """
        target = self._targets.get(url) or self._targets.setdefault(url, _Target(url))
        head = [("Host", target.host_header), ("User-Agent", USER_AGENT), ("Accept", "text/event-stream"),
                ("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if target.auth is not None:
            head.append(("Authorization", target.auth))
        head += headers.items()
        try:
            request = request_bytes(target.prefix + path, head, body)
        except (ValueError, UnicodeEncodeError):  # never quoted: the header may hold the API key
            raise BadResponse("cannot send the request: a header or the path is not valid HTTP "
                              "(is the API key one line?)") from None
        for attempt in (1, 2):
            conn = await self._acquire(target)
            try:
                done = asyncio.get_running_loop().create_future()
                conn.send(request, sink, done)
                await done
                return
            except _Stale:
                if attempt == 2:
                    raise ServerClosed("before answering") from None
            finally:
                self._release(target, conn)

    async def _acquire(self, target: _Target) -> Connection:
        idle = self._idle.get(target.key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
            self._all.discard(conn)
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if target.tls else None
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(Connection, target.host, target.port, ssl=tls,
                                       server_hostname=target.host if tls else None),
                self.connect_timeout)
        except asyncio.TimeoutError:
            raise ConnectFailed(f"connecting timed out after {self.connect_timeout:g} s") from None
        except OSError as e:  # refused, unresolvable, TLS (ssl.SSLError is an OSError)
            raise ConnectFailed(str(e) or type(e).__name__) from e
        self._all.add(conn)
        return conn

    def _release(self, target: _Target, conn: Connection) -> None:
        if conn.reusable and not conn.closed and conn.sink is None:
            self._idle.setdefault(target.key, []).append(conn)
        else:
            conn.close()
            self._all.discard(conn)

    def _tls_context(self):
        if self._tls is None:
            import httpx

            self._tls = httpx.create_ssl_context()
            self._tls.set_alpn_protocols(["http/1.1"])
        return self._tls

    def close(self) -> None:
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._idle.clear()
