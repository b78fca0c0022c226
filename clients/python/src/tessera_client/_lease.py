"""A held lease: kept alive in the background, watched for loss, released on every exit path.

# When a lease is certainly valid

The client never compares its clock with the server's. Each answer carries ``expires_in_ms``:
how long the lease is certainly valid from when the answer left, already less the request's
round trip and 2% for clock-rate drift. After a renewal, or a grant asked for without a
wait, the lease is taken as valid until ``sent + expires_in_ms``, where ``sent`` is when the
request left this process (the server acted no earlier). A grant that waited is taken as
valid until ``arrived + expires_in_ms``, ``arrived`` being when the answer came: it may have
been granted at any moment of the wait, so the send time says nothing; the answer's travel
time is not counted there, and the third of the TTL below covers it. That instant is
:attr:`Lease.valid_until` (on ``time.monotonic``).

The *span* is ``min(expires_in_ms, ttl)`` of the last grant or renewal.

# Renewals and ``lost``

A keep-alive thread per lease renews it when a third of the span has passed
(``valid_until - 2/3 span``). A failed renewal (no answer, 5xx) is tried again every tenth of
the span (50 ms to 1 s). ``lost`` is set:

- at once when a renewal answers ``lease_gone`` (expired, revoked by an admin, semaphore
  deleted): a revocation is noticed at the next renewal, within a third of the TTL;
- when renewals have kept failing until ``valid_until - span/3``, so a holder that stops at
  ``lost`` has a third of the TTL to stop before the lease could expire and be granted to
  another holder. A renewal in flight is cut off at that instant.

After ``lost`` the keep-alive stops for good: a lost lease is never renewed again, even if the
server would still accept it.

# Release on every exit path

``release()`` is idempotent. The context manager releases on exit, whatever ended the block.
Leases still held when the interpreter exits normally are released by an ``atexit`` hook
(at most 2 s each); a process killed outright leaves its leases to expire by their TTL.
"""

from __future__ import annotations

import atexit
import threading
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Type

from . import errors
from ._transport import Transport, ms

GONE = "the server no longer holds the lease (expired, revoked or deleted)"

#: The longest an ``atexit`` release may take per lease.
EXIT_RELEASE_TIMEOUT = 2.0

# The leases held in this process, for the ``atexit`` hook and ``Client.close()``.
_held_lock = threading.Lock()
_held: Dict[int, "Lease"] = {}


def held_leases(transport: Optional[Transport] = None) -> List["Lease"]:
    with _held_lock:
        leases = list(_held.values())
    return [lease for lease in leases if transport is None or lease._transport is transport]


@atexit.register
def _release_at_exit() -> None:
    for lease in held_leases():
        try:
            lease._release(timeout=EXIT_RELEASE_TIMEOUT)
        except Exception:
            pass  # the lease expires by its TTL


class Lease:
    """A lease on ``weight`` permits of a semaphore, renewed in the background until
    released or lost.

    Use it as a context manager, which releases it on exit::

        with client.semaphore("gpu", capacity=4).acquire(timeout=10) as lease:
            train(gpus=lease.seats, fence=lease.fence)

    Attributes: ``name``, ``lease_id``, ``fence`` (strictly increasing per semaphore: pass it
    to the protected resource so it can refuse a stale holder), ``seats`` (``weight``
    distinct numbers in ``range(capacity)``), ``weight``, ``holder``, ``ttl`` (seconds),
    ``expires_at_us`` (the server's clock, for display), and ``lost``, a
    :class:`threading.Event` set before the lease could expire once renewals fail or the
    lease is gone (``lost_reason`` says which). Stop using the resource when it is set::

        with client.lock("ledger").acquire() as lease:
            for entry in entries:
                if lease.lost.is_set():
                    raise RuntimeError(lease.lost_reason)
                write(entry, fence=lease.fence)
    """

    def __init__(self, transport: Transport, name: str, path: str, body: Dict[str, Any], start: float) -> None:
        self._transport = transport
        self._path = path  # /v1/semaphores/{quoted name}/leases/{lease_id}
        self.name: str = body.get("name", name)
        self.lease_id: str = body["lease_id"]
        self.fence: int = body["fence"]
        self.seats: List[int] = list(body["seats"])
        self.weight: int = body["weight"]
        self.holder: str = body["holder"]
        self.ttl: float = body["ttl_ms"] / 1000.0
        self.expires_at_us: int = body["expires_at_us"]
        self.lost: threading.Event = threading.Event()
        self.lost_reason: Optional[str] = None
        expires_in = body["expires_in_ms"] / 1000.0
        self._lock = threading.Lock()
        self._valid_until = start + expires_in
        self._span = min(expires_in, self.ttl)
        self._releasing = False  # release() or a give-back was called: a 410 is no loss
        self._done = False  # released, given back or gone: nothing left on the server
        self._stop = threading.Event()
        self._on_lost: List[Callable[[], None]] = []
        self._thread: Optional[threading.Thread] = None

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "released" if self._done else "held"
        return f"<Lease {self.name!r} {self.lease_id} fence={self.fence} seats={self.seats} {state}>"

    # -- state ---------------------------------------------------------------------------

    @property
    def valid_until(self) -> float:
        """Until when, on ``time.monotonic()``, the lease is certainly valid."""
        with self._lock:
            return self._valid_until

    def remaining(self) -> float:
        """Seconds the lease is certainly valid from now (0 once that has passed)."""
        return max(0.0, self.valid_until - self._transport.clock())

    @property
    def released(self) -> bool:
        """Whether the server holds nothing more for this lease as far as this client knows:
        released, given back, or found gone."""
        with self._lock:
            return self._done

    # -- the keep-alive --------------------------------------------------------------------

    def _start(self) -> None:
        with _held_lock:
            _held[id(self)] = self
        self._thread = threading.Thread(
            target=self._keep_alive, name=f"tessera-keepalive-{self.lease_id[:8]}", daemon=True
        )
        self._thread.start()

    def _stop_keeping(self) -> None:
        """Stops the keep-alive and forgets the lease for the ``atexit`` hook."""
        self._stop.set()
        with _held_lock:
            _held.pop(id(self), None)

    def _mark_lost(self, reason: str, *, gone: bool) -> None:
        with self._lock:
            if gone:
                self._done = True
            if self._releasing or self.lost.is_set():
                return  # released meanwhile: nothing was lost
            self.lost_reason = reason
            self.lost.set()
            callbacks = list(self._on_lost)
        self._stop.set()
        if gone:
            self._stop_keeping()
        for callback in callbacks:
            try:
                callback()
            except Exception:
                pass

    def _add_lost_callback(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self.lost.is_set():
                self._on_lost.append(callback)
                return
        callback()

    def _keep_alive(self) -> None:
        clock = self._transport.clock
        failing: Optional[errors.TesseraError] = None
        while True:
            with self._lock:
                valid_until, span = self._valid_until, self._span
            lose_at = valid_until - span / 3
            if failing is None:
                due = valid_until - 2 * span / 3
            else:
                due = clock() + min(1.0, max(0.05, span / 10))
            if self._stop.wait(max(0.0, min(due, lose_at) - clock())):
                return
            if clock() >= lose_at:
                why = f"renewals kept failing ({failing})" if failing else "the process did not run in time to renew"
                self._mark_lost(f"{why}; the lease may expire", gone=False)
                return
            try:
                self._renew(deadline=lose_at)
                failing = None
            except errors.LeaseGone:
                self._mark_lost(GONE, gone=True)
                return
            except errors.TesseraError as e:
                failing = e

    def _renew(self, deadline: Optional[float] = None) -> float:
        answer = self._transport.call(
            "POST", self._path + "/renew", {"ttl": ms(self.ttl, up=True)}, retry=True, deadline=deadline
        )
        expires_in = answer.body["expires_in_ms"] / 1000.0
        with self._lock:
            self._valid_until = max(self._valid_until, answer.sent + expires_in)
            self._span = min(expires_in, self.ttl)
            self.expires_at_us = answer.body.get("expires_at_us", self.expires_at_us)
            return self._valid_until - self._transport.clock()

    def renew(self) -> float:
        """Renews the lease now (the keep-alive does so on its own) and returns the seconds
        it is certainly valid. Retried after a dropped connection (a renewal is idempotent).

        Raises :class:`LeaseGone` (and sets ``lost``) if the lease no longer exists.
        """
        try:
            return self._renew()
        except errors.LeaseGone:
            self._mark_lost(GONE, gone=True)
            raise

    # -- release ---------------------------------------------------------------------------

    def release(self) -> bool:
        """Releases the lease; idempotent.

        Returns True if this call released it; False if it was not held any more (released
        before, revoked, expired). Retried after a dropped connection (a release is
        idempotent). The keep-alive stops first: if the release cannot reach the server it
        raises :class:`Unavailable` and the lease expires by its TTL, unless a later
        ``release()`` gets through.
        """
        return self._release()

    def _release(self, timeout: Optional[float] = None) -> bool:
        with self._lock:
            self._releasing = True
            done = self._done
        self._stop.set()
        if done:
            self._stop_keeping()
            return False
        answer = self._transport.call("DELETE", self._path, retry=True, timeout=timeout)
        with self._lock:
            first = not self._done
            self._done = True
        self._stop_keeping()
        return first and bool(answer.body.get("done"))

    def __enter__(self) -> "Lease":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except errors.TesseraError:
            # The block's own exception wins, and a lost lease is not relied on anyway:
            # either way the lease expires by its TTL (its keep-alive has stopped).
            if exc_type is None and not self.lost.is_set():
                raise


class AdmittedLease(Lease):
    """A lease granted by an admission: the permits, and the charge of every rate window
    made at the same instant.

    Besides a :class:`Lease`'s attributes: ``admitted_at_us`` (the admission instant on the
    server's clock), ``reservation`` (names the charge for a give-back) and
    :meth:`use_by_remaining`. The call the admission is for must start before its use-by
    instant: then the windows hold at the moment of use. ``Admission.acquire`` checks it right
    before returning and never returns an admission past it.
    """

    def __init__(self, transport: Transport, name: str, path: str, body: Dict[str, Any], start: float) -> None:
        super().__init__(transport, name, path, body, start)
        self.admitted_at_us: int = body["admitted_at_us"]
        self.reservation: int = body["reservation"]
        use_by_ms = body.get("use_by_ms")
        # Counted from the same instant as the lease's validity: the send time of a request
        # that did not wait, else the arrival time. None with a margin of 0: no use-by.
        self.use_by: Optional[float] = None if use_by_ms is None else start + use_by_ms / 1000.0

    def use_by_remaining(self) -> Optional[float]:
        """Seconds left before the use-by instant (negative once past), or None without a
        use-by (a margin of 0)."""
        if self.use_by is None:
            return None
        return self.use_by - self._transport.clock()

    def use_by_passed(self) -> bool:
        """Whether a call started now would be past the admission's use-by instant."""
        left = self.use_by_remaining()
        return left is not None and left < 0

    def _give_back(self, admission_path: str) -> bool:
        """Releases the lease and returns the window charge while it is the limiter's latest.
        Retried after a dropped connection (idempotent: a second give-back finds nothing)."""
        with self._lock:
            self._releasing = True
        self._stop_keeping()
        answer = self._transport.call(
            "POST",
            f"{admission_path}/leases/{self.lease_id}/give-back",
            {"reservation": self.reservation, "admitted_at_us": self.admitted_at_us},
            retry=True,
        )
        with self._lock:
            self._done = True
        return bool(answer.body.get("done"))


