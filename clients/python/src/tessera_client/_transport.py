"""HTTP/1.1 calls to `tessera serve`: a small pool of kept-alive connections, JSON in and
out, errors mapped to their classes, and the retry rule.

# Implementation details

A call takes an idle connection from the pool (or opens one), sends one request, reads the
whole answer and puts the connection back. A connection idle for longer than
:data:`IDLE_REUSE` is closed instead of reused: the server closes connections idle for 10 s,
and a request written to a connection the server is closing at that moment fails without
telling whether the server saw it.

The retry rule. A request whose connection could not be opened never reached the server, so
it is sent again (after 50 ms, then 200 ms) whatever it is. A request that was sent and then
lost its connection (reset, closed, timed out) is sent again only when ``retry`` says that
doing it twice is the same as doing it once: renew, release, status, give-back. Callers that
wait (an acquire with a ``wait``, a rate acquire with a ``max_wait``) handle such a failure
themselves: the server gives up the waiter's place or reservation when its connection closes,
so they ask again with the time they have left.

A :class:`Cancel` lets another thread stop a call in flight (the asyncio façade uses it when
a task is cancelled): it shuts the call's socket down, which ends a blocking read at once and
makes the server drop a waiting request.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Union

from . import errors

__version__ = "0.1.0"

#: The longest wait the server takes in one request; longer waits loop.
MAX_WAIT = 300.0

#: A pooled connection idle longer than this is closed rather than reused (the server closes
#: connections idle for 10 s).
IDLE_REUSE = 5.0

#: Idle connections kept per client.
POOL_SIZE = 8

#: Pauses before the second and third attempt of a retried request.
BACKOFF = (0.05, 0.2)

Duration = Union[int, float, str]
Clock = Callable[[], float]


class Cancelled(Exception):
    """Raised inside a call stopped through its :class:`Cancel` (never seen by users: the
    asyncio façade turns it into the task's ``CancelledError``)."""


class Cancel:
    """Stops a call running in another thread: its socket is shut down, its pauses end."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        self._event.set()
        with self._lock:
            conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def sleep(self, seconds: float) -> None:
        """Sleeps, or raises :class:`Cancelled` as soon as the call is cancelled."""
        if self._event.wait(max(0.0, seconds)):
            raise Cancelled()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled()

    def _attach(self, conn: http.client.HTTPConnection | None) -> None:
        with self._lock:
            self._conn = conn


def pause(seconds: float, cancel: Cancel | None) -> None:
    if cancel is not None:
        cancel.sleep(seconds)
    elif seconds > 0:
        time.sleep(seconds)


def ms(value: Duration, *, up: bool) -> str:
    """A duration for the server: a string as given (``"30s"``), seconds as whole
    milliseconds, rounded up (a TTL never shorter than asked) or down (a wait never longer)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise TypeError(f"a duration is seconds (int or float) or a string like '30s', not {value!r}")
    if value < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    n = math.ceil(value * 1000 - 1e-6) if up else math.floor(value * 1000 + 1e-6)
    return f"{max(0, n)}ms"


def quote(name: str) -> str:
    """A name as one path segment: ``jobs/42`` is sent as ``jobs%2F42``."""
    if not isinstance(name, str):
        raise TypeError(f"a name is a string, not {name!r}")
    return urllib.parse.quote(name, safe="")


@dataclass
class Answer:
    """A 2xx answer: its JSON body and when, on the client's clock, the request left and the
    answer arrived."""

    status: int
    body: dict[str, Any]
    sent: float
    arrived: float


class Transport:
    """Calls to one server; safe to share between threads."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 15.0,
        ssl_context: ssl.SSLContext | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected a URL like http://127.0.0.1:8080, not {url!r}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._ssl = ssl_context
        self.timeout = timeout
        self.clock = clock
        self._headers = {
            "Accept": "application/json",
            "User-Agent": f"tessera-client-python/{__version__}",
        }
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._lock = threading.Lock()
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._closed = False

    def __repr__(self) -> str:  # never the token
        return f"Transport({self.url!r})"

    def close(self) -> None:
        """Closes the idle connections; calls still work afterwards (they open new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def _checkout(self) -> http.client.HTTPConnection:
        now = self.clock()
        stale = []
        conn = None
        with self._lock:
            while self._idle:
                c, since = self._idle.pop()
                if now - since <= IDLE_REUSE:
                    conn = c
                    break
                stale.append(c)
        for c in stale:
            c.close()
        if conn is not None:
            return conn
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port)

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < POOL_SIZE:
                self._idle.append((conn, self.clock()))
                return
        conn.close()

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        wait: float = 0.0,
        retry: bool = False,
        deadline: float | None = None,
        timeout: float | None = None,
        cancel: Cancel | None = None,
    ) -> Answer:
        """Sends one request and returns its 2xx answer, or raises the error of its kind.

        ``wait``: how long the server may hold the request before answering (added to the
        timeout). ``retry``: the request may be sent again after it was sent and lost its
        connection (see the module docs). ``deadline``: on the client's clock, no attempt
        outlasts it. Raises :class:`errors.ConnectionFailed` when no answer came.
        """
        data = None
        headers = self._headers
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers = dict(headers, **{"Content-Type": "application/json"})
        target = self._prefix + path
        attempt = 0
        while True:
            if cancel is not None:
                cancel.check()
            limit = (timeout if timeout is not None else self.timeout) + wait
            if deadline is not None:
                limit = min(limit, deadline - self.clock())
                if limit <= 0:
                    raise errors.ConnectionFailed(f"{method} {path}: no time left for an answer")
            conn = self._checkout()
            sent_request = False
            if cancel is not None:
                cancel._attach(conn)
            try:
                conn.timeout = limit
                if conn.sock is None:
                    conn.connect()
                else:
                    conn.sock.settimeout(limit)
                if cancel is not None:
                    cancel.check()
                sent = self.clock()
                sent_request = True
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                arrived = self.clock()
            except (OSError, http.client.HTTPException, Cancelled) as e:
                conn.close()
                if cancel is not None and cancel.cancelled:
                    raise Cancelled() from None
                attempt += 1
                may_retry = retry or not sent_request
                pause_s = BACKOFF[attempt - 1] if attempt <= len(BACKOFF) else None
                if (
                    not may_retry
                    or pause_s is None
                    or (deadline is not None and self.clock() + pause_s >= deadline)
                ):
                    what = "no answer from" if sent_request else "cannot connect to"
                    raise errors.ConnectionFailed(
                        f"{method} {path}: {what} {self._host}:{self._port} ({type(e).__name__}: {e})"
                    ) from e
                pause(pause_s, cancel)
                continue
            except BaseException:  # KeyboardInterrupt: the server drops what the request waited for
                conn.close()
                raise
            finally:
                if cancel is not None:
                    cancel._attach(None)
            if resp.will_close:
                conn.close()
            else:
                self._checkin(conn)
            if resp.status >= 400:
                raise errors.from_answer(resp.status, raw, resp.headers.get("Retry-After"))
            try:
                parsed = json.loads(raw) if raw else {}
            except ValueError:
                raise errors.TesseraError(
                    f"{method} {path}: an answer that is not JSON", kind="bad_answer", status=resp.status
                ) from None
            return Answer(resp.status, parsed, sent, arrived)
