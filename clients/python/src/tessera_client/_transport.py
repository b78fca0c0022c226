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

Several instances. A client may name several servers on one store (a list of URLs, or one
string of them separated by commas). Calls go to one of them, the current one, until it
fails: a connection error, or an answer 503 ``store_unavailable`` or ``shutting_down`` (the
instance cannot reach the store, or is stopping). Then the current instance becomes the next
one in the list, for this call's next attempt and every later call, and the call is tried
there by the rule above (a 503 counts as a request sent: only ``retry`` requests and the
callers that wait ask again). One attempt on each instance makes a round; the pauses come
between rounds, so a dead instance costs the call one connection attempt, not a pause, and
a call gives up after three rounds or at its deadline. With one instance a 503 is raised as
it came: the server asks to be tried again in a second (``Retry-After``), not at once.

A :class:`Cancel` lets another thread stop a call in flight (the asyncio façade uses it when
a task is cancelled): it shuts the call's socket down, which ends a blocking read at once and
makes the server drop a waiting request.
"""

from __future__ import annotations

import http.client
import json
import math
import select
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

from . import errors

__version__ = "0.1.0"

#: The longest wait the server takes in one request; longer waits loop.
MAX_WAIT = 300.0

#: A pooled connection idle longer than this is closed rather than reused (the server closes
#: connections idle for 10 s).
IDLE_REUSE = 5.0

#: Idle connections kept per client.
POOL_SIZE = 8

#: Pauses before the second and third round of a retried request (a round is one attempt on
#: each instance).
BACKOFF = (0.05, 0.2)

#: The error kinds of a 503 after which a client of several instances moves to the next one.
FAIL_OVER_KINDS = ("store_unavailable", "shutting_down")

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


class _Instance:
    """One server of the client: where it is, and its idle connections."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected a URL like http://127.0.0.1:8080, not {url!r}")
        self.url = url
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.idle: list[tuple[http.client.HTTPConnection, float]] = []


def split_urls(urls: str | Sequence[str]) -> list[str]:
    """The instances' URLs: a list of them, or one string of them separated by commas."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    if not all(isinstance(u, str) for u in items):
        raise TypeError(f"server URLs are strings, not {urls!r}")
    found = [u.strip() for u in items if u.strip()]
    if not found:
        raise ValueError(f"expected a URL like http://127.0.0.1:8080, not {urls!r}")
    return found


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection has something to read: the server closed it (a server that
    stopped or was killed), since it sends nothing unasked. A request written to it would
    fail without telling whether the server saw it."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class Transport:
    """Calls to one server, or to the first of several that answers; safe to share between
    threads."""

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None = None,
        *,
        timeout: float = 15.0,
        ssl_context: ssl.SSLContext | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self._instances = [_Instance(u) for u in split_urls(url)]
        self.urls = tuple(i.url for i in self._instances)
        self.url = ",".join(self.urls)
        self._current = 0
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
        self._closed = False

    def __repr__(self) -> str:  # never the token
        return f"Transport({self.url!r})"

    @property
    def current_url(self) -> str:
        """The instance calls go to now."""
        return self._instances[self._current].url

    def fails_over(self, e: errors.TesseraError) -> bool:
        """Whether ``e`` is a failure that moved this client to its next instance, after which
        a waiting caller asks again: no answer at all, or, with several instances, a 503
        ``store_unavailable`` or ``shutting_down``."""
        if isinstance(e, errors.ConnectionFailed):
            return True
        return len(self._instances) > 1 and e.status == 503 and e.kind in FAIL_OVER_KINDS

    def _move_on(self, index: int) -> None:
        """The instance at ``index`` failed: the next one becomes current, unless another
        call moved on already (two failures of one instance skip no instance)."""
        with self._lock:
            if self._current == index:
                self._current = (index + 1) % len(self._instances)

    def close(self) -> None:
        """Closes the idle connections; calls still work afterwards (they open new ones)."""
        with self._lock:
            idle = []
            for inst in self._instances:
                idle.extend(inst.idle)
                inst.idle = []
        for conn, _ in idle:
            conn.close()

    def _checkout(self, inst: _Instance) -> http.client.HTTPConnection:
        now = self.clock()
        stale = []
        conn = None
        with self._lock:
            while inst.idle:
                c, since = inst.idle.pop()
                if now - since <= IDLE_REUSE and not _closed_by_peer(c):
                    conn = c
                    break
                stale.append(c)
        for c in stale:
            c.close()
        if conn is not None:
            return conn
        if inst.https:
            return http.client.HTTPSConnection(inst.host, inst.port, context=self._ssl)
        return http.client.HTTPConnection(inst.host, inst.port)

    def _checkin(self, inst: _Instance, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(inst.idle) < POOL_SIZE:
                inst.idle.append((conn, self.clock()))
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
        rounds = 1
        tried: set[int] = set()
        while True:
            if cancel is not None:
                cancel.check()
            limit = (timeout if timeout is not None else self.timeout) + wait
            if deadline is not None:
                limit = min(limit, deadline - self.clock())
                if limit <= 0:
                    raise errors.ConnectionFailed(f"{method} {path}: no time left for an answer")
            index = self._current
            inst = self._instances[index]
            tried.add(index)
            conn = self._checkout(inst)
            sent_request = False
            if cancel is not None:
                cancel._attach(conn)
            failure: errors.TesseraError | None = None
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
                conn.request(method, inst.prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                arrived = self.clock()
            except (OSError, http.client.HTTPException, Cancelled) as e:
                conn.close()
                if cancel is not None and cancel.cancelled:
                    raise Cancelled() from None
                what = "no answer from" if sent_request else "cannot connect to"
                failure = errors.ConnectionFailed(
                    f"{method} {path}: {what} {inst.host}:{inst.port} ({type(e).__name__}: {e})"
                )
                failure.__cause__ = e
                may_retry = retry or not sent_request
            except BaseException:  # KeyboardInterrupt: the server drops what the request waited for
                conn.close()
                raise
            finally:
                if cancel is not None:
                    cancel._attach(None)
            if failure is None:
                if resp.will_close:
                    conn.close()
                else:
                    self._checkin(inst, conn)
                if resp.status < 400:
                    break
                failure = errors.from_answer(resp.status, raw, resp.headers.get("Retry-After"))
                if not self.fails_over(failure):
                    raise failure
                may_retry = retry
            self._move_on(index)
            if not may_retry:
                raise failure
            if len(tried) < len(self._instances):
                continue  # the next instance, at once
            pause_s = BACKOFF[rounds - 1] if rounds <= len(BACKOFF) else None
            if pause_s is None or (deadline is not None and self.clock() + pause_s >= deadline):
                raise failure
            pause(pause_s, cancel)
            rounds += 1
            tried.clear()
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            raise errors.TesseraError(
                f"{method} {path}: an answer that is not JSON", kind="bad_answer", status=resp.status
            ) from None
        return Answer(resp.status, parsed, sent, arrived)
