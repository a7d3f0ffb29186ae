"""The timed stream of `specgen bench --endpoint`: HTTP/1.1 read by an asyncio Protocol.

Reading a streamed response through httpx wakes a task for every chunk
(httpx, httpcore, anyio, h11: ≈ 14 ms of CPU for 64 one-token chunks). Here
the bytes are handled in the protocol's `data_received` callback as they
arrive: h11 writes the request and reads the response's head (status,
headers, 1xx, their validation); the body is cut by its framing here
(ChunkedBody, SizedBody, BodyToClose: h11's events cost more per chunk
than the rest of the reading, see ChunkedBody), and what it holds goes to a sink (the
bench's reader, in specgen.bench.http) with the time its bytes arrived.
The request's task wakes once, when the response has ended or failed.

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

import h11

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
    """The bytes are not an HTTP/1.1 response, or the request cannot be written as one (h11 says why)."""


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


_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")  # h11's rule: extensions dropped, trailing OWS allowed
MAX_LINE = 65536  # a chunk-size or trailer line longer than this is not HTTP


class FramingError(Exception):
    """The body's framing is broken (the message says how)."""


class ChunkedBody:
    """A chunked body (RFC 9112 §7.1) cut as its bytes arrive: the chunks' data out, the framing dropped.

    h11 frames the response's head; the body is cut here because h11's
    events cost more CPU per one-token chunk than all the rest of the
    reading (a 64-chunk request replayed warm: 1.2 ms of reading with h11
    on the body, 0.6 ms with this; in benchmarks/http_client.py's run the
    client's CPU above the wake-up floor fell from 4.7 to 2.9 ms). The rules
    are h11's: hex size (up to 20 digits) with extensions dropped, CRLF after
    every line and every chunk's data, trailer lines until an empty one.
    """

    __slots__ = ("_left", "_line", "_state", "ended", "extra")

    def __init__(self) -> None:
        self._left = 0  # bytes of the current chunk's data still to come
        self._line = b""  # the start of a line that has not ended yet
        self._state = "size"  # the next line: "size", "crlf" (after a chunk's data) or "trailer"
        self.ended = False
        self.extra = b""  # bytes after the body's end: not ours (the connection is not reused)

    def feed(self, data: bytes) -> bytes:
        """The body's bytes in `data` (b"" when it held only framing)."""
        out = []
        pos, n = 0, len(data)
        while pos < n:
            if self._left:
                end = min(n, pos + self._left)
                out.append(data[pos:end])
                self._left -= end - pos
                pos = end
                continue
            i = data.find(b"\n", pos)
            if i < 0:
                self._line += data[pos:]
                if len(self._line) > MAX_LINE:
                    raise FramingError(f"a chunked body's line is over {MAX_LINE} bytes")
                break
            line = self._line + data[pos:i + 1] if self._line else data[pos:i + 1]
            self._line, pos = b"", i + 1
            self._end_line(line)
            if self.ended:
                self.extra = data[pos:]
                break
        return out[0] if len(out) == 1 else b"".join(out)

    def _end_line(self, line: bytes) -> None:
        if line[-2:] != b"\r\n":
            raise FramingError(f"a chunked body's line does not end with CRLF: {line[:40]!r}")
        line = line[:-2]
        if self._state == "size":
            m = _CHUNK_SIZE.fullmatch(line)
            if m is None:
                raise FramingError(f"illegal chunk header: {line[:40]!r}")
            self._left = int(m[1], 16)
            self._state = "crlf" if self._left else "trailer"
        elif self._state == "crlf":
            if line:
                raise FramingError(f"a chunk is longer than its size says: {line[:40]!r}")
            self._state = "size"
        elif not line:  # the empty line after the trailers (if any)
            self.ended = True

    @property
    def missing(self) -> str:
        return "an incomplete chunked body"


class SizedBody:
    """A body of Content-Length bytes."""

    __slots__ = ("_left", "ended", "extra")

    def __init__(self, length: int) -> None:
        self._left, self.ended, self.extra = length, length == 0, b""

    def feed(self, data: bytes) -> bytes:
        if len(data) < self._left:
            self._left -= len(data)
            return data
        data, self.extra = data[:self._left], data[self._left:]
        self._left, self.ended = 0, True
        return data

    @property
    def missing(self) -> str:
        return f"{self._left} bytes of the body missing"


class BodyToClose:
    """A body without a length: it runs to the connection's close (the connection is not reused)."""

    __slots__ = ("ended", "extra")

    def __init__(self) -> None:
        self.ended, self.extra = False, b""

    def feed(self, data: bytes) -> bytes:
        return data


def body_reader(response: h11.Response) -> ChunkedBody | SizedBody | BodyToClose:
    """How the body of `response` (to a POST) is framed: RFC 9112 §6.3, on headers h11 has validated."""
    if response.status_code in (204, 304):
        return SizedBody(0)
    length = None
    for name, value in response.headers:
        if name == b"transfer-encoding":  # h11 allows nothing but chunked
            return ChunkedBody()
        if name == b"content-length":  # h11 checked that all of them agree
            length = int(value)
    return BodyToClose() if length is None else SizedBody(length)


def keeps_alive(response: h11.Response) -> bool:
    """HTTP/1.1 and no `Connection: close` (h11's rule)."""
    if response.http_version < b"1.1":
        return False
    return not any(name == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]
                   for name, value in response.headers)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time: h11 writes the request and reads the response's head, the
    body is cut by its framing (ChunkedBody, SizedBody, BodyToClose), and what it holds goes to a sink."""

    def __init__(self) -> None:
        self.head: h11.Connection | None = None  # the current request's, until its response's head is read
        self.body: ChunkedBody | SizedBody | BodyToClose | None = None  # then the body's reader
        self.keep_alive = False  # what the response's head said
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.done: asyncio.Future | None = None
        self.closed = False
        self.reusable = False  # set when a response ended with the connection fit for the next request
        self.requests = 0
        self.heard = False  # any byte of the current answer

    # -- asyncio's callbacks

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.body is None:
            if self.sink is None:  # nothing asked: a server talking out of turn (a 408 before closing, …)
                self.close()
                return
            self.heard = True
            try:
                self.head.receive_data(data)
                data = self._read_head()
            except h11.RemoteProtocolError as e:
                self._settle(BadResponse(f"not an HTTP/1.1 response: {e}"))
                return
            except Exception as e:  # the sink's own failures
                self._settle(e)
                return
            if data is None:
                return
        self._read_body(data, now)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost says what it meant

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.sink is None:
            return
        if not self.heard:
            self._settle(_Stale() if self.requests > 1 else ServerClosed("before answering"))
        elif isinstance(self.body, BodyToClose):  # a body that runs to the close ends here
            self._end()
        elif self.body is None:
            self._settle(ServerClosed(str(exc) if exc else "in the response's head"))
        else:
            self._settle(ServerClosed(str(exc) if exc else f"the connection closed with {self.body.missing}"))

    # -- the response

    def _read_head(self) -> bytes | None:
        """h11's events until the response's head: then the body's reader is set, and the bytes after the head
        come back (None while the head is incomplete)."""
        while True:
            event = self.head.next_event()
            if event is h11.NEED_DATA:
                return None
            if type(event) is h11.Response:
                break
            if type(event) is not h11.InformationalResponse:  # 1xx: wait for the real one
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} before the response")
        self.sink.response(event.status_code, list(event.headers))
        self.keep_alive = keeps_alive(event)
        self.body = body_reader(event)
        rest = self.head.trailing_data[0]
        self.head = None
        return rest

    def _read_body(self, data: bytes, now: float) -> None:
        body = self.body
        try:
            piece = body.feed(data)
            if piece:
                self.sink.data(piece, now)
        except FramingError as e:
            self._settle(BadResponse(f"not an HTTP/1.1 response: {e}"))
            return
        except Exception as e:
            self._settle(e)
            return
        if body.ended:
            self._end()

    def _end(self) -> None:
        reusable = self.keep_alive and not self.body.extra and not isinstance(self.body, BodyToClose)
        try:
            self.sink.end()
        except Exception as e:
            self._settle(e, reusable)
            return
        self._settle(None, reusable)

    def _settle(self, exc: BaseException | None, reusable: bool = False) -> None:
        self.sink, self.head, self.body = None, None, None
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

    def send(self, request: h11.Request, body: bytes, sink: Sink, done: asyncio.Future) -> None:
        self.head = h11.Connection(h11.CLIENT)
        data = self.head.send(request) + self.head.send(h11.Data(data=body)) + self.head.send(h11.EndOfMessage())
        self.sink, self.done, self.reusable, self.heard = sink, done, False, False
        self.requests += 1
        self.transport.write(data)

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

    connection = _Connection  # the protocol each connection runs (benchmarks/http_client.py swaps in the former one)

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.connect_timeout = connect_timeout
        self._idle: dict[tuple, list[_Connection]] = {}
        self._all: set[_Connection] = set()
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
            request = h11.Request(method="POST", target=target.prefix + path, headers=head)
        except h11.LocalProtocolError:  # h11's message would quote the header: the API key never goes into a record
            raise BadResponse("cannot send the request: a header is not valid HTTP (is the API key one line?)") from None
        for attempt in (1, 2):
            conn = await self._acquire(target)
            try:
                done = asyncio.get_running_loop().create_future()
                conn.send(request, body, sink, done)
                await done
                return
            except _Stale:
                if attempt == 2:
                    raise ServerClosed("before answering") from None
            finally:
                self._release(target, conn)

    async def _acquire(self, target: _Target) -> _Connection:
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
                loop.create_connection(self.connection, target.host, target.port, ssl=tls,
                                       server_hostname=target.host if tls else None),
                self.connect_timeout)
        except asyncio.TimeoutError:
            raise ConnectFailed(f"connecting timed out after {self.connect_timeout:g} s") from None
        except OSError as e:  # refused, unresolvable, TLS (ssl.SSLError is an OSError)
            raise ConnectFailed(str(e) or type(e).__name__) from e
        self._all.add(conn)
        return conn

    def _release(self, target: _Target, conn: _Connection) -> None:
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
