"""The blocking client: semaphores, locks, rate limiters and admissions of `tessera serve`.

Waiting is done by the server (a request waits in the semaphore's FIFO queue, or until its
reserved turn), up to 5 minutes per request; longer waits are several requests in a row. What
is retried after a dropped connection is listed in :class:`Client`'s docs.
"""

from __future__ import annotations

import os
import socket
import ssl
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import errors
from ._lease import AdmittedLease, Lease, held_leases
from ._transport import (
    MAX_WAIT,
    Answer,
    Cancel,
    Cancelled,
    Clock,
    Duration,
    Transport,
    ms,
    pause,
    quote,
)

#: How many times in a row a waiting request is asked again after its connection dropped.
DROPS = 3

#: A remaining wait shorter than this is no wait: the timeout has run out.
EPSILON = 0.005

#: The pause before a waiting request whose connection dropped is sent again: the server
#: drops the first request's queue place or rate reservation when it notices the closed
#: connection; a new request that came before would wait behind it (for a rate limiter, a
#: reserved turn later than needed).
REASK_PAUSE = 0.2


def _default_holder() -> str:
    return f"py:{socket.gethostname()}:{os.getpid()}"


#: The longest tenant name, in UTF-8 bytes (the server's limit).
MAX_TENANT_LEN = 64

#: The largest share of a tenant.
MAX_SHARE = 1000


#: The highest ceiling (and floor) of a tenant: the largest capacity.
MAX_CEILING = 1_000_000

#: The highest window ceiling of a tenant, a percentage of each rate window.
MAX_WINDOW_CEILING = 100


def _check_tenant(tenant: object) -> str:
    """``tenant``, checked as the server checks it: :class:`InvalidInput` unless it is 1 to
    64 bytes of UTF-8 without control characters."""
    try:
        size = len(tenant.encode("utf-8")) if isinstance(tenant, str) else 0
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 string
        size = 0
    if not isinstance(tenant, str) or not 1 <= size <= MAX_TENANT_LEN or any(
        unicodedata.category(c) == "Cc" for c in tenant
    ):
        raise errors.InvalidInput(
            f"invalid tenant {tenant!r}: 1 to {MAX_TENANT_LEN} bytes (UTF-8), no control characters"
        )
    return tenant


def _tenant_fields(tenant: str | None, share: int | None) -> dict[str, Any]:
    """The ``tenant`` and ``share`` fields of an acquire body, checked as the server checks
    them, so that a bad value raises :class:`InvalidInput` before anything is sent."""
    if tenant is None:
        if share is not None:
            raise errors.InvalidInput(f"invalid share {share!r}: a share needs a tenant")
        return {}
    _check_tenant(tenant)
    if share is None:
        share = 1
    if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= MAX_SHARE:
        raise errors.InvalidInput(f"invalid share {share!r}: a whole number between 1 and {MAX_SHARE}")
    return {"tenant": tenant, "share": share}


def _deadline(clock: Clock, timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"a timeout is seconds >= 0 or None, not {timeout!r}")
    return clock() + timeout


def _left(clock: Clock, deadline: float | None) -> float:
    """The next request's wait: what is left of the timeout, at most the server's 5 minutes."""
    if deadline is None:
        return MAX_WAIT
    return min(MAX_WAIT, max(0.0, deadline - clock()))


class Client:
    """A client of one `tessera serve`; thread-safe, cheap to keep for the whole program.

    ::

        import tessera_client

        client = tessera_client.Client("http://127.0.0.1:8080")      # token="..." with --tokens
        with client.lock("nightly-report").acquire(timeout=10) as lease:
            make_report(fence=lease.fence)

    ``timeout`` bounds each request's answer (seconds), on top of the time the request asks the
    server to wait. ``holder`` labels leases in status and the dashboard (default
    ``py:HOST:PID``).

    What is retried after a dropped connection (reset, closed or timed out; a request that
    could not connect at all is always tried again, as it never reached the server):

    - renew, release, status and give-back: always (each is idempotent), 3 attempts;
    - a semaphore or admission acquire, and a rate acquire, only while they wait
      (``timeout``/``max_wait`` above 0), 3 times in a row: the server drops a waiter, or its
      reservation, when its connection closes, so the client asks again with the time left,
      200 ms later (so as not to queue behind its own dropped request). If the grant was made
      just as the connection broke, that lease is held until its TTL runs out;
    - ``try_acquire`` (no wait): never, since a lost answer may have granted or charged; it
      raises :class:`ConnectionFailed`.

    Several instances of the server on one store: pass their URLs as a list, or as one string
    separated by commas (``"http://10.0.0.1:8080,http://10.0.0.2:8080"``). Calls go to one
    instance until it fails (no connection, no answer, or 503 ``store_unavailable`` or
    ``shutting_down``); then to the next one, and the failed call is tried there by the rules
    above, within its own timeout: idempotent calls and waiting acquires move on, a try
    moves on only if its request never left. A lease taken through one instance is renewed
    and released through any other, as they share the store. When every instance fails, the
    call raises the last error (:class:`ConnectionFailed`, :class:`StoreUnavailable`) after
    three rounds over them.
    """

    def __init__(
        self,
        url: str | Sequence[str] = "http://127.0.0.1:8080",
        token: str | None = None,
        *,
        timeout: float = 15.0,
        holder: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._transport = Transport(url, token, timeout=timeout, ssl_context=ssl_context)
        self.holder = holder or _default_holder()

    def __repr__(self) -> str:
        return f"Client({self._transport.url!r})"

    @property
    def url(self) -> str:
        """The server's URL; several instances' URLs joined by commas."""
        return self._transport.url

    @property
    def urls(self) -> tuple[str, ...]:
        """Every instance's URL, in the order they are tried."""
        return self._transport.urls

    @property
    def current_url(self) -> str:
        """The instance calls go to now (the last one that did not fail)."""
        return self._transport.current_url

    def semaphore(
        self,
        name: str,
        capacity: int,
        *,
        weight: int = 1,
        ttl: Duration = 30.0,
        holder: str | None = None,
        tenant: str | None = None,
        share: int | None = None,
    ) -> Semaphore:
        """A semaphore of ``capacity`` permits under ``name``; each lease takes ``weight``.

        Every client declares the same capacity (else :class:`CapacityMismatch`). ``ttl``
        (seconds or ``"30s"``) is how long a lease outlives a client that stops renewing it.

        ``tenant`` (1 to 64 bytes, no control characters) and ``share`` (1 to 1000, default
        1): this handle's acquires wait as that tenant, so under contention permits go to the
        waiting tenants in proportion to their shares, FIFO within a tenant
        (docs/fair-shares.md). A bad value raises :class:`InvalidInput` here; a store that
        cannot order by shares answers :class:`Unsupported` at the first acquire.
        """
        return Semaphore(
            self, name, capacity, weight=weight, ttl=ttl, holder=holder, tenant=tenant, share=share
        )

    def lock(
        self,
        name: str,
        *,
        ttl: Duration = 30.0,
        holder: str | None = None,
        tenant: str | None = None,
        share: int | None = None,
    ) -> Semaphore:
        """A lock: the semaphore of capacity 1 under ``name`` (``tenant`` and ``share`` as
        for :meth:`semaphore`)."""
        return Semaphore(self, name, 1, weight=1, ttl=ttl, holder=holder, tenant=tenant, share=share)

    def rate(
        self,
        name: str,
        *limits: str | Sequence[str],
        cost: int = 1,
        margin: Duration | None = None,
        mode: str | None = None,
        burst: int | None = None,
        update: bool = False,
    ) -> RateLimiter:
        """A rate limiter under ``name`` with every limit charged at once:
        ``client.rate("sms-api", "50/s", "1000/min")``.

        ``cost`` is charged to every limit per acquire. ``margin`` (default 20 ms in exact
        mode) is the delay between admission and use for which the limits still hold; every
        client of a limiter declares the same limits, margin and mode (else
        :class:`RateMismatch`, unless ``update=True`` replaces them).
        """
        flat: list[str] = []
        for limit in limits:
            flat.extend([limit] if isinstance(limit, str) else list(limit))
        return RateLimiter(self, name, flat, cost=cost, margin=margin, mode=mode, burst=burst, update=update)

    def admission(
        self,
        name: str,
        *,
        capacity: int,
        limits: Iterable[str],
        weight: int = 1,
        cost: int = 1,
        ttl: Duration = 30.0,
        margin: Duration | None = None,
        holder: str | None = None,
        update: bool = False,
        tenant: str | None = None,
        share: int | None = None,
    ) -> Admission:
        """Permits of the semaphore ``name`` and room in the windows of its rate limiter, taken
        in one step: ``client.admission("sms-api", capacity=4, limits=["50/s", "1000/min"])``.

        The semaphore and the limiter are the ones of the same name under
        :meth:`semaphore` and :meth:`rate`. ``tenant`` and ``share`` as for
        :meth:`semaphore`: permits and window slots go to the waiting tenants in proportion
        to their shares.
        """
        return Admission(
            self,
            name,
            capacity=capacity,
            limits=list(limits),
            weight=weight,
            cost=cost,
            ttl=ttl,
            margin=margin,
            holder=holder,
            update=update,
            tenant=tenant,
            share=share,
        )

    def set_tenant_limits(
        self,
        name: str,
        tenant: str,
        *,
        ceiling: int | None = None,
        floor: int = 0,
        window_ceiling: int | None = None,
    ) -> dict[str, TenantLimits]:
        """Sets ``tenant``'s ceiling, floor and window ceiling on the semaphore ``name``
        (admin; docs/fair-shares.md) and returns every tenant's limits on it after the change.

        The tenant never holds more than ``ceiling`` permits (1 to 1,000,000; None: no
        ceiling), and ``floor`` permits (0 to the ceiling) are kept for it while it holds
        fewer: other tenants are not granted the permits it would need to reach its floor.
        ``window_ceiling`` (a percentage, 1 to 100; None: none) caps the tenant's share of
        each rate window of the name's admissions (:meth:`admission`): on ``10/min`` with
        ``window_ceiling=20`` the tenant is admitted at most twice in any minute, whatever
        the other tenants leave unused, while they are still admitted up to the shared limit
        (each limit ``N`` becomes ``max(1, N * window_ceiling // 100)`` for the tenant).

        The server keeps the limits for the name, also while nobody holds or waits, until
        they are changed or the semaphore is deleted. Each call sets all of them: one left
        out is removed, and ``set_tenant_limits(name, tenant)`` (no ceiling, floor 0, no
        window ceiling) removes them all. They apply from the server's next grant; a tenant
        above a lowered ceiling keeps what it holds.

        On success the limits are set. A bad tenant, ceiling, floor or window ceiling raises
        :class:`InvalidInput` (``status`` None) before anything is sent; floors that would
        add up above the capacity of a semaphore the server holds raise
        :class:`InvalidInput` (400), and a store that keeps no limits, or no window ceilings
        when one is given, :class:`Unsupported` (501): on either error nothing changed.
        Retried after a dropped connection (setting the same values twice is setting them
        once).
        """
        body = _limits_body(ceiling, floor, window_ceiling)
        path = f"/v1/semaphores/{quote(name)}/tenants/{quote(_check_tenant(tenant))}"
        return _tenant_limits(self._transport.call("PUT", path, body, retry=True).body)

    def tenant_limits(self, name: str) -> dict[str, TenantLimits]:
        """Every tenant's ceiling, floor and window ceiling set on the semaphore ``name``, by tenant; empty
        when none is set (and on a store that keeps none). Retried after a dropped
        connection."""
        path = f"/v1/semaphores/{quote(name)}/tenants"
        return _tenant_limits(self._transport.call("GET", path, retry=True).body)

    def held(self) -> list[Lease]:
        """The leases acquired through this client and not yet released or found gone."""
        return held_leases(self._transport)

    def close(self) -> None:
        """Releases the leases still held through this client, and closes idle connections.
        A release that fails leaves its lease to expire by its TTL."""
        for lease in self.held():
            try:
                lease.release()
            except errors.TesseraError:
                pass
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Semaphore:
    """Leases on the permits of one semaphore; make it with :meth:`Client.semaphore` or
    :meth:`Client.lock`.

    ::

        gpus = client.semaphore("gpus", capacity=8, weight=2, ttl=10)
        with gpus.acquire(timeout=60) as lease:      # 2 of 8 GPUs, for as long as the block runs
            train(devices=lease.seats)
    """

    def __init__(
        self,
        client: Client,
        name: str,
        capacity: int,
        *,
        weight: int = 1,
        ttl: Duration = 30.0,
        holder: str | None = None,
        tenant: str | None = None,
        share: int | None = None,
    ) -> None:
        self._tenant = _tenant_fields(tenant, share)
        self._client = client
        self._t = client._transport
        self.name = name
        self.capacity = capacity
        self.weight = weight
        self.ttl = ttl
        self.holder = holder or client.holder
        #: The tenant this handle's acquires wait as, and its share (None: no tenant).
        self.tenant: str | None = self._tenant.get("tenant")
        self.share: int | None = self._tenant.get("share")
        self._path = f"/v1/semaphores/{quote(name)}"

    def __repr__(self) -> str:
        tenant = "" if self.tenant is None else f" tenant={self.tenant!r} share={self.share}"
        return f"<Semaphore {self.name!r} capacity={self.capacity} weight={self.weight}{tenant}>"

    def acquire(self, timeout: float | None = None) -> Lease:
        """Waits for ``weight`` permits and returns the lease, kept alive until released.

        ``timeout``: seconds to wait at most (None: for ever; 0: only if free now). Waiters
        are served in the order the server received them (with a ``tenant``: in proportion to
        the waiting tenants' shares, in order within each), and a large ``weight`` is not
        overtaken by smaller ones. Raises :class:`NoPermit` when the timeout runs out; then
        nothing is held and this client's place in the queue is given up. A ``queue_full``
        answer is waited out within the timeout. Interrupted (``KeyboardInterrupt``), the
        request's connection is closed and the server gives up the place in the queue.
        """
        return self._acquire(timeout)

    def try_acquire(self) -> Lease | None:
        """The lease if ``weight`` permits are free now and nobody waits, else None. Never
        retried after its request was sent (see :class:`Client`)."""
        try:
            return self._acquire(0)
        except errors.NoPermit:
            return None

    def _acquire(self, timeout: float | None, cancel: Cancel | None = None) -> Lease:
        clock = self._t.clock
        deadline = _deadline(clock, timeout)
        drops = 0
        while True:
            wait = _left(clock, deadline)
            body = {
                "capacity": self.capacity,
                "weight": self.weight,
                "ttl": ms(self.ttl, up=True),
                "wait": ms(wait, up=False),
                "holder": self.holder,
                **self._tenant,
            }
            try:
                answer = self._t.call("POST", self._path + "/acquire", body, wait=wait, cancel=cancel)
            except errors.NoPermit:
                if deadline is not None and deadline - clock() < EPSILON:
                    raise
                drops = 0
                continue  # a wait longer than one request allows
            except errors.QueueFull as e:
                _wait_out(e, clock, deadline, cancel)
                drops = 0
                continue
            except errors.Unavailable as e:
                drops += 1
                if wait <= 0 or drops > DROPS or not self._t.fails_over(e):
                    raise
                _after_drop(clock, deadline, cancel)
                continue
            lease = Lease(
                self._t,
                self.name,
                f"{self._path}/leases/{answer.body['lease_id']}",
                answer.body,
                _start(answer, wait),
            )
            return _hand_over(lease, cancel)

    def status(self) -> dict[str, Any] | None:
        """The holders and queue (the server's status JSON), or None when the server holds
        nothing for this name. Retried after a dropped connection."""
        try:
            return self._t.call("GET", self._path, retry=True).body
        except errors.NotFound:
            return None

    def revoke(self, lease_id: str) -> bool:
        """Revokes another holder's lease (admin); its holder's ``lost`` fires at its next
        renewal. True if the lease was there. Retried after a dropped connection."""
        return bool(
            self._t.call("POST", f"{self._path}/leases/{quote(lease_id)}/revoke", retry=True).body.get("done")
        )


def _start(answer: Answer, wait: float) -> float:
    """Since when the grant's ``expires_in_ms`` counts on this clock: the send time of a
    request that did not wait (the server granted it no earlier), else the arrival time (a
    grant may come at any moment of a wait; the answer's travel time is not counted)."""
    return answer.sent if wait <= 0 else answer.arrived


def _hand_over(lease: Lease, cancel: Cancel | None) -> Lease:
    """Starts the keep-alive, unless the call was cancelled meanwhile: then the lease is
    released at once."""
    if cancel is not None and cancel.cancelled:
        try:
            lease._release()
        except errors.TesseraError:
            pass
        cancel.check()
    lease._start()
    return lease


def _after_drop(clock: Clock, deadline: float | None, cancel: Cancel | None) -> None:
    """Pauses :data:`REASK_PAUSE` (at most until the deadline) before a waiting request is
    sent again after its connection dropped."""
    left = REASK_PAUSE if deadline is None else min(REASK_PAUSE, deadline - clock())
    pause(max(0.0, left), cancel)


def _wait_out(e: errors.TesseraError, clock: Clock, deadline: float | None, cancel: Cancel | None) -> None:
    """Sleeps the ``retry_after`` of ``e``, or raises ``e`` if that passes the deadline."""
    delay = max(0.001, e.retry_after if e.retry_after is not None else 1.0)
    if deadline is not None and clock() + delay > deadline:
        raise e
    pause(delay, cancel)


@dataclass(frozen=True)
class TenantLimits:
    """A tenant's limits on a semaphore (docs/fair-shares.md), as
    :meth:`Client.tenant_limits` lists them: the tenant never holds more than ``ceiling``
    permits (None: no ceiling), ``floor`` permits are kept for it while it holds fewer
    (0: none), and it is admitted at most ``window_ceiling`` percent of each rate window of
    the name's admissions (None: no window ceiling)."""

    ceiling: int | None = None
    floor: int = 0
    window_ceiling: int | None = None


def _limits_body(ceiling: int | None, floor: int, window_ceiling: int | None = None) -> dict[str, Any]:
    """The body of a tenant-limits PUT, checked as the server checks it, so that a bad value
    raises :class:`InvalidInput` before anything is sent."""
    if ceiling is not None and (
        isinstance(ceiling, bool) or not isinstance(ceiling, int) or not 1 <= ceiling <= MAX_CEILING
    ):
        raise errors.InvalidInput(
            f"invalid ceiling {ceiling!r}: None or a whole number between 1 and {MAX_CEILING}"
        )
    top = MAX_CEILING if ceiling is None else ceiling
    if isinstance(floor, bool) or not isinstance(floor, int) or not 0 <= floor <= top:
        raise errors.InvalidInput(
            f"invalid floor {floor!r}: a whole number between 0 and "
            + (f"{MAX_CEILING}" if ceiling is None else f"the ceiling ({ceiling})")
        )
    if window_ceiling is not None and (
        isinstance(window_ceiling, bool)
        or not isinstance(window_ceiling, int)
        or not 1 <= window_ceiling <= MAX_WINDOW_CEILING
    ):
        raise errors.InvalidInput(
            f"invalid window ceiling {window_ceiling!r}: None or a whole number (a percentage)"
            f" between 1 and {MAX_WINDOW_CEILING}"
        )
    body: dict[str, Any] = {"ceiling": ceiling, "floor": floor}
    if window_ceiling is not None:
        body["window_ceiling"] = window_ceiling
    return body


def _tenant_limits(body: dict[str, Any]) -> dict[str, TenantLimits]:
    return {
        tenant: TenantLimits(limits.get("ceiling"), limits.get("floor", 0), limits.get("window_ceiling"))
        for tenant, limits in body["tenants"].items()
    }


@dataclass(frozen=True)
class Decision:
    """A rate limiter's answer: ``admitted`` (truthy) with ``admitted_at_us`` (the server's
    clock, µs since the Unix epoch), or not, with ``retry_after``: the exact wait in seconds
    before it would be admitted if nobody else came first. Nothing is charged when not
    admitted."""

    admitted: bool
    admitted_at_us: int | None = None
    retry_after: float | None = None

    def __bool__(self) -> bool:
        return self.admitted


class RateLimiter:
    """Turns within rate limits shared by every client of the name; make it with
    :meth:`Client.rate`.

    ::

        sms = client.rate("sms-api", "50/s", "1000/min")
        for message in outbox:
            sms.acquire()            # returns at the admitted moment: send now
            send(message)

        if sms.try_acquire():        # a Decision: truthy when admitted (and charged)
            send(message)
    """

    def __init__(
        self,
        client: Client,
        name: str,
        limits: list[str],
        *,
        cost: int = 1,
        margin: Duration | None = None,
        mode: str | None = None,
        burst: int | None = None,
        update: bool = False,
    ) -> None:
        self._t = client._transport
        self.name = name
        self.limits = limits
        self.cost = cost
        self._path = f"/v1/rates/{quote(name)}"
        self._body: dict[str, Any] = {"limits": limits, "cost": cost}
        if margin is not None:
            self._body["margin"] = ms(margin, up=False)
        if mode is not None:
            self._body["mode"] = mode
        if burst is not None:
            self._body["burst"] = burst
        if update:
            self._body["update"] = True

    def __repr__(self) -> str:
        return f"<RateLimiter {self.name!r} {' '.join(self.limits)} cost={self.cost}>"

    def acquire(self, max_wait: float | None = None) -> Decision:
        """Waits for a turn and returns at its moment (the admitted ``Decision``): make the
        call at once.

        The server reserves the earliest admissible moment within the wait and answers then
        (FIFO among the waiting). ``max_wait``: seconds (None: for ever). If the turn is
        further than that, raises :class:`Limited` at once with ``retry_after``, and nothing
        is charged. A wait longer than 5 minutes is several requests, sleeping the exact
        ``retry_after`` in between (others may take that turn meanwhile).
        """
        return self._acquire(max_wait)

    def _acquire(self, max_wait: float | None, cancel: Cancel | None = None) -> Decision:
        clock = self._t.clock
        deadline = _deadline(clock, max_wait)
        drops = 0
        while True:
            wait = _left(clock, deadline)
            body = dict(self._body, max_wait=ms(wait, up=False))
            try:
                answer = self._t.call("POST", self._path + "/acquire", body, wait=wait, cancel=cancel)
            except errors.Limited as e:
                _wait_out(e, clock, deadline, cancel)
                drops = 0
                continue
            except errors.Unavailable as e:
                drops += 1
                if wait <= 0 or drops > DROPS or not self._t.fails_over(e):
                    raise
                _after_drop(clock, deadline, cancel)
                continue
            if cancel is not None:
                cancel.check()
            return Decision(True, answer.body.get("admitted_at_us"))

    def try_acquire(self) -> Decision:
        """Admitted (and charged) now, or not with the wait; never waits. Never retried after
        its request was sent: a lost answer may have charged."""
        body = self._t.call("POST", self._path + "/try", self._body).body
        return Decision(
            bool(body.get("admitted")), body.get("admitted_at_us"), _seconds(body.get("retry_after_ms"))
        )

    def status(self) -> dict[str, Any] | None:
        """Usage per window and next free time (the server's JSON), or None when the server
        holds nothing for this name. Retried after a dropped connection."""
        try:
            return self._t.call("GET", self._path, retry=True).body
        except errors.NotFound:
            return None

    def reset(self) -> bool:
        """Deletes the limiter's history and reservations (admin)."""
        return bool(self._t.call("DELETE", self._path, retry=True).body.get("done"))


def _seconds(value: int | None) -> float | None:
    return None if value is None else value / 1000.0


class Admission:
    """Permits and rate windows taken in one step; make it with :meth:`Client.admission`.

    ::

        sms = client.admission("sms-api", capacity=4, limits=["50/s", "1000/min"])
        with sms.acquire(timeout=30) as ticket:      # one of 4 in flight, within both limits
            provider.send(message)                   # start the call at once

    At one instant of the server, ``weight`` permits were free and every window admitted
    ``cost`` more; the lease was written and every window charged then. The windows hold for
    calls started within the margin (the server's default for an admission: 100 ms) after
    that instant, the admission's use-by; ``acquire`` checks it right before returning. For a
    cost known only after the call, ``ticket.settle(actual)`` releases and settles it.
    """

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        capacity: int,
        limits: list[str],
        weight: int = 1,
        cost: int = 1,
        ttl: Duration = 30.0,
        margin: Duration | None = None,
        holder: str | None = None,
        update: bool = False,
        tenant: str | None = None,
        share: int | None = None,
    ) -> None:
        tenant_fields = _tenant_fields(tenant, share)
        self._t = client._transport
        self.name = name
        self.capacity = capacity
        self.limits = limits
        self._path = f"/v1/admissions/{quote(name)}"
        self._lease_path = f"/v1/semaphores/{quote(name)}/leases"
        self._body: dict[str, Any] = {
            "capacity": capacity,
            "limits": limits,
            "weight": weight,
            "cost": cost,
            "ttl": ms(ttl, up=True),
            "holder": holder or client.holder,
            **tenant_fields,
        }
        #: The tenant this handle's admissions wait as, and its share (None: no tenant).
        self.tenant: str | None = tenant_fields.get("tenant")
        self.share: int | None = tenant_fields.get("share")
        if margin is not None:
            self._body["margin"] = ms(margin, up=False)
        if update:
            self._body["update"] = True
        #: How many admissions this object gave back because their use-by had passed.
        self.given_back = 0

    def __repr__(self) -> str:
        return f"<Admission {self.name!r} capacity={self.capacity} {' '.join(self.limits)}>"

    def acquire(self, timeout: float | None = None) -> AdmittedLease:
        """Waits for an admission and returns its lease (a context manager, released on exit).

        ``timeout``: seconds (None: for ever; 0: only if admissible now). Admission waiters
        share the semaphore's FIFO queue with plain waiters (ordered by shares between
        tenants, see :meth:`Client.semaphore`); the head waits for both its permits and its
        windows. Raises :class:`NotAdmitted` when the timeout runs out, with
        nothing held or charged; :class:`Unsupported` if the server's store has no admissions.

        Use-by: right before returning, if the use-by instant (``use_by_ms`` after the answer
        arrived) has passed, the admission is given back (lease released, the charge
        returned while it is the limiter's latest) and asked for again with the time left, so
        a stale admission is never returned. With a margin smaller than the round trip to the
        server every admission is stale: the call then runs until the timeout.
        """
        return self._acquire(timeout, check_use_by=True)

    def try_acquire(self) -> AdmittedLease | None:
        """The admission if it can be granted now, else None (nothing held or charged)."""
        try:
            return self._acquire(0, check_use_by=True)
        except errors.NotAdmitted:
            return None

    def _acquire(
        self,
        timeout: float | None,
        cancel: Cancel | None = None,
        *,
        check_use_by: bool,
        late: AdmittedLease | None = None,
    ) -> AdmittedLease:
        """``late``: an admission found past its use-by; the first request gives it back
        (``given_back``), and the server then queues this one first, where the late one was."""
        clock = self._t.clock
        deadline = _deadline(clock, timeout)
        drops = 0
        given_back = None if late is None else late._handed_back()
        while True:
            wait = _left(clock, deadline)
            body = dict(self._body, wait=ms(wait, up=False))
            if given_back is not None:
                body["given_back"] = given_back
            try:
                try:
                    answer = self._t.call(
                        "POST", self._path + "/acquire", body, wait=wait, cancel=cancel
                    )
                except (errors.NotAdmitted, errors.QueueFull):
                    given_back = None  # the server gave it back before it answered
                    raise
                except (errors.TesseraError, Cancelled):
                    # It may not have reached the server: send it alone (idempotent).
                    if late is not None and given_back is not None:
                        given_back = None
                        self._give_back_quietly(late)
                    raise
                given_back = None
            except errors.NotAdmitted:
                if deadline is not None and deadline - clock() < EPSILON:
                    raise
                drops = 0
                continue
            except errors.QueueFull as e:
                _wait_out(e, clock, deadline, cancel)
                drops = 0
                continue
            except errors.Unavailable as e:
                drops += 1
                if wait <= 0 or drops > DROPS or not self._t.fails_over(e):
                    raise
                _after_drop(clock, deadline, cancel)
                continue
            lease = AdmittedLease(
                self._t,
                self.name,
                f"{self._lease_path}/{answer.body['lease_id']}",
                answer.body,
                _start(answer, wait),
                self._path,
                self._body["cost"],
            )
            _hand_over(lease, cancel)
            if not check_use_by or not self.stale(lease):
                return lease
            # Past its use-by: a call started now could fall outside the windows it was
            # counted in. Give it back and ask again (its charge is returned only while it is
            # the limiter's latest; otherwise the windows keep counting it, which is safe):
            # in one request, which keeps this client's place first in the queue.
            self.given_back += 1
            if deadline is not None and deadline - clock() < EPSILON:
                lease._give_back(self._path)
                raise _stale_error(self.name)
            late = lease
            given_back = lease._handed_back()

    def stale(self, lease: AdmittedLease) -> bool:
        """Whether ``lease``'s use-by instant has passed (the check ``acquire`` makes)."""
        return lease.use_by_passed()

    def _give_back_quietly(self, lease: AdmittedLease) -> None:
        try:
            lease._give_back(self._path)
        except errors.TesseraError:
            pass  # not reachable: the lease expires by its TTL

    def give_back(self, lease: AdmittedLease) -> bool:
        """Gives back an admission not used: releases its lease and returns its window charge
        while it is the limiter's latest. True if the server found it. Retried after a
        dropped connection (idempotent)."""
        self.given_back += 1
        return lease._give_back(self._path)


def _stale_error(name: str) -> errors.NotAdmitted:
    return errors.NotAdmitted(
        f"the admission of {name!r} came past its use-by and was given back; no time left to ask again",
        status=None,
    )
