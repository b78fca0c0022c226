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

Each lease is renewed when a third of its span has passed (``valid_until - 2/3 span``). A
failed renewal (no answer, 5xx) is tried again every tenth of the span (50 ms to 1 s).
``lost`` is set:

- at once when a renewal answers ``lease_gone`` (expired, revoked by an admin, semaphore
  deleted): a revocation is noticed at the next renewal, within a third of the TTL;
- when renewals have kept failing until ``valid_until - span/3``, so a holder that stops at
  ``lost`` has a third of the TTL to stop before the lease could expire and be granted to
  another holder. A renewal in flight is cut off at that instant.

After ``lost`` the lease is never renewed again, even if the server would still accept it.

# Implementation details: the keeper

One thread per process, the keeper (:class:`_Keeper`), keeps every lease alive. It holds a
heap of (instant, lease): the lease's next renewal or, while a renewal is in flight, the
instant ``lost`` must fire if that renewal has not succeeded by then. It sleeps until the
earliest entry and takes a *turn* for each one due (:meth:`Lease._turn`): fire ``lost``, or
start the renewal in a short-lived thread of its own, so that one hung renewal delays
neither another lease's renewal nor its ``lost``. A finished renewal pushes its lease back
at its next instant.

A grant costs one heap push (and a wake-up of the keeper only if the new entry comes before
its planned one: rare, as a lease is first due a third of its TTL later). A release pushes
nothing and removes nothing: the keeper drops the entries of ended leases as it meets them,
and rebuilds the heap without them when they are more than half of it, so an
acquire/release loop does not grow it. Each lease keeps the instant of its valid entry; an
entry for another instant is stale and ignored. The keeper thread ends after
:data:`KEEPER_LINGER` with an empty heap and starts again with the next grant; a forked child
starts with an empty keeper (the parent's leases are the parent's).

# Release on every exit path

``release()`` is idempotent. The context manager releases on exit, whatever ended the block.
Leases still held when the interpreter exits normally are released by an ``atexit`` hook
(at most 2 s each); a process killed outright leaves its leases to expire by their TTL.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import os
import threading
from types import TracebackType
from typing import Any, Callable

from . import errors
from ._transport import Transport, ms

GONE = "the server no longer holds the lease (expired, revoked or deleted)"

#: The longest an ``atexit`` release may take per lease.
EXIT_RELEASE_TIMEOUT = 2.0

#: How long the keeper thread waits without leases before it ends.
KEEPER_LINGER = 5.0

# The leases held in this process, for the ``atexit`` hook and ``Client.close()``.
_held_lock = threading.Lock()
_held: dict[int, Lease] = {}


def held_leases(transport: Transport | None = None) -> list[Lease]:
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


class _Keeper:
    """The one thread per process that renews every lease (see the module docs)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Lease]] = []
        self._seq = itertools.count()
        self._running = False
        self._ended = 0  # entries in the heap whose lease has ended

    def push(self, lease: Lease, due: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), lease))
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="tessera-keeper", daemon=True).start()
            elif self._heap[0][2] is lease:
                self._cond.notify()  # due before the keeper's planned wake-up

    def note_ended(self) -> None:
        """A lease ended: its entries are garbage; rebuild when they are half the heap."""
        with self._cond:
            self._ended += 1
            if self._ended > 32 and 2 * self._ended > len(self._heap):
                self._heap = [e for e in self._heap if not e[2]._stop.is_set()]
                heapq.heapify(self._heap)
                self._ended = 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._heap:
                        self._ended = 0
                        self._cond.wait(KEEPER_LINGER)
                        if not self._heap:
                            self._running = False
                            return
                        continue
                    due, _, lease = self._heap[0]
                    now = lease._transport.clock()
                    if due <= now:
                        heapq.heappop(self._heap)
                        if lease._stop.is_set():
                            self._ended = max(0, self._ended - 1)
                        break
                    self._cond.wait(due - now)
            try:
                lease._turn(due)
            except Exception:  # a bug in a turn must not end the keeper of every lease
                pass

    def reset_after_fork(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap = []
        self._running = False
        self._ended = 0


_keeper = _Keeper()


def _after_fork_in_child() -> None:
    _keeper.reset_after_fork()
    global _held_lock
    _held_lock = threading.Lock()
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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

    def __init__(
        self, transport: Transport, name: str, path: str, body: dict[str, Any], start: float
    ) -> None:
        self._transport = transport
        self._path = path  # /v1/semaphores/{quoted name}/leases/{lease_id}
        self.name: str = body.get("name", name)
        self.lease_id: str = body["lease_id"]
        self.fence: int = body["fence"]
        self.seats: list[int] = list(body["seats"])
        self.weight: int = body["weight"]
        self.holder: str = body["holder"]
        self.ttl: float = body["ttl_ms"] / 1000.0
        self.expires_at_us: int = body["expires_at_us"]
        self.lost: threading.Event = threading.Event()
        self.lost_reason: str | None = None
        expires_in = body["expires_in_ms"] / 1000.0
        self._lock = threading.Lock()
        self._valid_until: float = start + expires_in
        self._span: float = min(expires_in, self.ttl)
        self._releasing = False  # release() or a give-back was called: a 410 is no loss
        self._done = False  # released, given back or gone: nothing left on the server
        self._stop = threading.Event()  # set when the keeper has nothing more to do
        self._on_lost: list[Callable[[], None]] = []
        self._due = 0.0  # the instant of the lease's valid keeper entry
        self._renewing = False  # a renewal is in flight
        self._failing: errors.TesseraError | None = None  # the last renewal's error

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
        with self._lock:
            self._due = self._valid_until - 2 * self._span / 3
            due = self._due
        _keeper.push(self, due)

    def _halt(self) -> None:
        """Ends the keep-alive: the lease is never renewed again."""
        if not self._stop.is_set():
            self._stop.set()
            _keeper.note_ended()

    def _stop_keeping(self) -> None:
        """Ends the keep-alive and forgets the lease for the ``atexit`` hook."""
        self._halt()
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
        if gone:
            self._stop_keeping()
        else:
            self._halt()  # still released at exit, in case the server holds it yet
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

    def _turn(self, due: float) -> None:
        """The keeper's turn for the entry at ``due``: fire ``lost`` if renewals have failed
        for too long, else start a renewal (in a thread of its own)."""
        clock = self._transport.clock
        with self._lock:
            if self._stop.is_set():
                return
            lose_at = self._valid_until - self._span / 3
            late = clock() >= lose_at
            if not late and (self._renewing or due != self._due):
                return  # a stale entry, or the renewal in flight will push the next one
            if not late:
                self._renewing = True
                self._due = lose_at  # the entry that fires lost if this renewal hangs
            failing = self._failing
        if late:
            why = (
                f"renewals kept failing ({failing})"
                if failing
                else "the process did not run in time to renew"
            )
            self._mark_lost(f"{why}; the lease may expire", gone=False)
            return
        _keeper.push(self, lose_at)
        threading.Thread(target=self._renewal, args=(lose_at,), name="tessera-renew", daemon=True).start()

    def _renewal(self, lose_at: float) -> None:
        failing: errors.TesseraError | None = None
        try:
            self._renew(deadline=lose_at)
        except errors.LeaseGone:
            with self._lock:
                self._renewing = False
            self._mark_lost(GONE, gone=True)
            return
        except errors.TesseraError as e:
            failing = e
        except Exception as e:  # an answer without the expected fields: a failed renewal
            failing = errors.TesseraError(f"renewal: {type(e).__name__}: {e}", kind="bad_answer")
        clock = self._transport.clock
        with self._lock:
            self._renewing = False
            self._failing = failing
            if self._stop.is_set():
                return
            if failing is None:
                due = self._valid_until - 2 * self._span / 3
            else:
                due = clock() + min(1.0, max(0.05, self._span / 10))
            self._due = min(due, self._valid_until - self._span / 3)
            due = self._due
        _keeper.push(self, due)

    def _renew(self, deadline: float | None = None) -> float:
        answer = self._transport.call(
            "POST", self._path + "/renew", {"ttl": ms(self.ttl, up=True)}, retry=True, deadline=deadline
        )
        expires_in: float = answer.body["expires_in_ms"] / 1000.0
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
        raises :class:`Unavailable`, and the lease expires by its TTL unless a later
        ``release()``, ``Client.close()`` or the ``atexit`` hook gets through.
        """
        return self._release()

    def _release(self, timeout: float | None = None) -> bool:
        with self._lock:
            self._releasing = True
            done = self._done
        self._halt()
        if done:
            self._stop_keeping()
            return False
        answer = self._transport.call("DELETE", self._path, retry=True, timeout=timeout)
        with self._lock:
            first = not self._done
            self._done = True
        self._stop_keeping()
        return first and bool(answer.body.get("done"))

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
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

    def __init__(
        self,
        transport: Transport,
        name: str,
        path: str,
        body: dict[str, Any],
        start: float,
        admission_path: str = "",
        cost: int = 1,
    ) -> None:
        super().__init__(transport, name, path, body, start)
        self._admission_path = admission_path
        #: The cost charged to every window (the admission's ``cost``).
        self.cost: int = cost
        self.admitted_at_us: int = body["admitted_at_us"]
        self.reservation: int = body["reservation"]
        use_by_ms = body.get("use_by_ms")
        # Counted from the same instant as the lease's validity: the send time of a request
        # that did not wait, else the arrival time. None with a margin of 0: no use-by.
        self.use_by: float | None = None if use_by_ms is None else start + use_by_ms / 1000.0

    def use_by_remaining(self) -> float | None:
        """Seconds left before the use-by instant (negative once past), or None without a
        use-by (a margin of 0)."""
        if self.use_by is None:
            return None
        return self.use_by - self._transport.clock()

    def use_by_passed(self) -> bool:
        """Whether a call started now would be past the admission's use-by instant."""
        left = self.use_by_remaining()
        return left is not None and left < 0

    def settle(self, actual: int) -> bool:
        """Releases the lease and makes the admission's charge ``actual`` instead of
        ``cost``, in one step: for a cost known after the call (tokens of a reply, bytes
        sent). A smaller cost is given back to every window once, and only while the lease is
        still held; a larger one is charged at once (later admissions wait for it). True if
        the lease was still held. Retried after a dropped connection: a repeated settle gives
        nothing back again, though it may charge an excess twice (the windows count more,
        never less). Raises :class:`InvalidInput` for ``actual`` outside 0..1,000,000, with
        the lease still held and kept alive."""
        if isinstance(actual, bool) or not isinstance(actual, int) or not 0 <= actual <= 1_000_000:
            raise errors.InvalidInput(
                f"invalid settled cost {actual!r}: must be a whole number between 0 and 1000000"
            )
        with self._lock:
            self._releasing = True
            done = self._done
        self._halt()
        if done:
            self._stop_keeping()
            return False
        answer = self._transport.call(
            "POST",
            f"{self._admission_path}/leases/{self.lease_id}/settle",
            {
                "reservation": self.reservation,
                "admitted_at_us": self.admitted_at_us,
                "cost": self.cost,
                "actual": actual,
            },
            retry=True,
        )
        with self._lock:
            self._done = True
        self._stop_keeping()
        return bool(answer.body.get("done"))

    def _handed_back(self) -> dict[str, Any]:
        """Ends the lease here for a give-back the next acquire carries (``given_back``):
        the keep-alive stops; the server releases it with that request."""
        with self._lock:
            self._releasing = True
            self._done = True
        self._stop_keeping()
        return {
            "lease_id": self.lease_id,
            "reservation": self.reservation,
            "admitted_at_us": self.admitted_at_us,
        }

    def _give_back(self, admission_path: str) -> bool:
        """Releases the lease and returns the window charge while it is the limiter's latest.
        Retried after a dropped connection (idempotent: a second give-back finds nothing)."""
        with self._lock:
            self._releasing = True
        self._stop_keeping()
        body: dict = {"reservation": self.reservation, "admitted_at_us": self.admitted_at_us}
        if self.use_by_passed():
            body["expired"] = True  # counted by the store (the limiter's ``expired_unused``)
        answer = self._transport.call(
            "POST",
            f"{admission_path}/leases/{self.lease_id}/give-back",
            body,
            retry=True,
        )
        with self._lock:
            self._done = True
        return bool(answer.body.get("done"))
