"""The timed stream of `specgen bench --endpoint`: HTTP/1.1 read by an asyncio Protocol.

Reading a streamed response through httpx wakes a task for every chunk
(httpx, httpcore, anyio, h11: ≈ 14 ms of CPU for 64 one-token chunks). Here
the bytes are handled in the protocol's `data_received` callback as they
arrive: h11 frames the HTTP/1.1 response (chunked, sized, or to the close),
`SseLines` cuts it into `data:` lines, and a sink (the bench's reader, in
specgen.bench.http) parses each line there and then. The request's task
wakes once, when the response has ended or failed.

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


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: h11 on the bytes, one request at a time, the response handed to a sink."""

    def __init__(self) -> None:
        self.h11 = h11.Connection(h11.CLIENT)
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
        if self.sink is None:  # nothing asked: a server talking out of turn (a 408 before closing, …)
            self.close()
            return
        now = time.perf_counter()
        self.heard = True
        try:
            self.h11.receive_data(data)
            self._pump(now)
        except h11.RemoteProtocolError as e:
            self._settle(BadResponse(f"not an HTTP/1.1 response: {e}"))
        except Exception as e:  # the sink's own failures
            self._settle(e)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost says what it meant

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.sink is None:
            return
        if not self.heard:
            self._settle(_Stale() if self.requests > 1 else ServerClosed("before answering"))
            return
        try:
            self.h11.receive_data(b"")  # a body that runs to the close ends here
            self._pump(time.perf_counter())
        except h11.RemoteProtocolError as e:
            self._settle(ServerClosed(str(exc or e)))
            return
        except Exception as e:
            self._settle(e)
            return
        if self.sink is not None:
            self._settle(ServerClosed(str(exc) if exc else "the connection closed"))

    # -- the response

    def _pump(self, now: float) -> None:
        sink = self.sink
        while True:
            event = self.h11.next_event()
            kind = type(event)
            if kind is h11.Data:
                sink.data(event.data, now)
            elif event is h11.NEED_DATA:
                return
            elif kind is h11.Response:
                sink.response(event.status_code, list(event.headers))
            elif kind is h11.EndOfMessage:
                reusable = self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE
                try:
                    sink.end()
                except Exception as e:
                    self._settle(e, reusable)
                    return
                self._settle(None, reusable)
                return
            elif kind is h11.ConnectionClosed or event is h11.PAUSED:
                raise h11.RemoteProtocolError("the response ended without a body's end")
            # h11.InformationalResponse (1xx): wait for the real one

    def _settle(self, exc: BaseException | None, reusable: bool = False) -> None:
        self.sink = None
        if reusable and not self.closed:
            self.h11.start_next_cycle()
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
                data = conn.h11.send(request) + conn.h11.send(h11.Data(data=body)) + conn.h11.send(h11.EndOfMessage())
                done = asyncio.get_running_loop().create_future()
                conn.send(data, sink, done)
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
                loop.create_connection(_Connection, target.host, target.port, ssl=tls,
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
