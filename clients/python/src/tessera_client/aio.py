"""The asyncio client: the names of the blocking client, awaited.

::

    from tessera_client import aio

    async def main():
        async with aio.Client("http://127.0.0.1:8080") as client:
            async with client.lock("nightly-report").acquire(timeout=10) as lease:
                await make_report(fence=lease.fence)       # lease.lost is an asyncio.Event

Each call runs the blocking client's request in a thread of its own (not the loop's default
executor, whose few workers, all taken by waiting acquires, would hold back the release they
wait for), so the loop never blocks; keep-alive renewals run in the blocking client's
threads, so a busy loop cannot make a lease expire. Decisions that must be made right before
control returns to the caller (an admission's use-by) are made on the loop.

Cancel safety: cancelling a task that waits in ``acquire`` closes the request's connection,
which gives up the place in the queue (or the rate reservation); a lease granted at that very
moment is released in the background. Nothing is held afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import threading
from collections.abc import Awaitable, Generator, Iterable, Sequence
from types import TracebackType
from typing import (
    Any,
    Callable,
    Generic,
    TypeVar,
)

from . import _lease, errors
from . import client as _sync
from ._transport import Cancel, Duration

T = TypeVar("T")
L = TypeVar("L", bound="Lease")


def _in_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """Runs ``fn`` in a new daemon thread; its result or exception lands in the future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.cancelled():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def run() -> None:
        try:
            result = fn()
        except BaseException as e:  # handed to the awaiting task
            _call_soon(loop, settle, False, e)
        else:
            _call_soon(loop, settle, True, result)

    threading.Thread(target=run, name="tessera-call", daemon=True).start()
    return future


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass  # the loop is closed


async def _cancellable(fn: Callable[[Cancel], T]) -> T:
    """Runs ``fn(cancel)`` in a thread; cancelling the awaiting task cancels the call, and a
    lease it returns anyway is released."""
    cancel = Cancel()
    future = _in_thread(lambda: fn(cancel))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        cancel.cancel()
        future.add_done_callback(_release_late)
        raise


def _release_late(future: asyncio.Future[Any]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    result = future.result()
    if isinstance(result, _lease.Lease):
        threading.Thread(target=_quiet_release, args=(result,), daemon=True).start()


def _quiet_release(lease: _lease.Lease) -> None:
    try:
        lease._release()
    except errors.TesseraError:
        pass  # expires by its TTL


class _Acquiring(Generic[L]):
    """What ``acquire()`` returns: await it for the lease, or use it with ``async with``."""

    def __init__(self, start: Callable[[], Awaitable[L]]) -> None:
        self._start = start
        self._lease: L | None = None

    def __await__(self) -> Generator[Any, None, L]:
        return self._start().__await__()

    async def __aenter__(self) -> L:
        lease = await self._start()
        self._lease = lease
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(exc_type, exc, tb)


class Lease:
    """A held lease (see the blocking :class:`tessera_client.Lease`), with ``lost`` an
    :class:`asyncio.Event` and ``release()``/``renew()`` awaited. ``async with`` releases it::

        lease = await client.semaphore("gpu", capacity=4).acquire(timeout=10)
        try:
            done, _ = await asyncio.wait(
                [asyncio.ensure_future(train(lease.seats)), asyncio.ensure_future(lease.lost.wait())],
                return_when=asyncio.FIRST_COMPLETED)
        finally:
            await lease.release()
    """

    def __init__(self, lease: _lease.Lease) -> None:
        self._lease = lease
        self.lost = asyncio.Event()
        loop = asyncio.get_running_loop()
        lease._add_lost_callback(lambda: _call_soon(loop, self.lost.set))

    def __repr__(self) -> str:
        return repr(self._lease)

    @property
    def name(self) -> str:
        return self._lease.name

    @property
    def lease_id(self) -> str:
        return self._lease.lease_id

    @property
    def fence(self) -> int:
        return self._lease.fence

    @property
    def seats(self) -> list[int]:
        return self._lease.seats

    @property
    def weight(self) -> int:
        return self._lease.weight

    @property
    def holder(self) -> str:
        return self._lease.holder

    @property
    def ttl(self) -> float:
        return self._lease.ttl

    @property
    def expires_at_us(self) -> int:
        return self._lease.expires_at_us

    @property
    def lost_reason(self) -> str | None:
        return self._lease.lost_reason

    @property
    def valid_until(self) -> float:
        return self._lease.valid_until

    @property
    def released(self) -> bool:
        return self._lease.released

    def remaining(self) -> float:
        return self._lease.remaining()

    async def renew(self) -> float:
        """See :meth:`tessera_client.Lease.renew`."""
        return await _in_thread(self._lease.renew)

    async def release(self) -> bool:
        """See :meth:`tessera_client.Lease.release`. Cancelling the awaiting task does not stop
        the release."""
        return await asyncio.shield(_in_thread(self._lease.release))

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except errors.TesseraError:
            if exc_type is None and not self._lease.lost.is_set():
                raise


class AdmittedLease(Lease):
    """An admission's lease (see the blocking :class:`tessera_client.AdmittedLease`)."""

    _lease: _lease.AdmittedLease

    @property
    def admitted_at_us(self) -> int:
        return self._lease.admitted_at_us

    @property
    def reservation(self) -> int:
        return self._lease.reservation

    def use_by_remaining(self) -> float | None:
        return self._lease.use_by_remaining()

    def use_by_passed(self) -> bool:
        return self._lease.use_by_passed()

    @property
    def cost(self) -> int:
        return self._lease.cost

    async def settle(self, actual: int) -> bool:
        """See :meth:`tessera_client.AdmittedLease.settle`; runs to its end even if the
        awaiting task is cancelled."""
        return await asyncio.shield(_in_thread(lambda: self._lease.settle(actual)))


class Client:
    """The asyncio twin of :class:`tessera_client.Client` (same arguments, same retry rule);
    ``await client.close()`` or ``async with`` releases what is still held."""

    def __init__(
        self,
        url: str | Sequence[str] = "http://127.0.0.1:8080",
        token: str | None = None,
        *,
        timeout: float = 15.0,
        holder: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._sync = _sync.Client(url, token, timeout=timeout, holder=holder, ssl_context=ssl_context)

    def __repr__(self) -> str:
        return f"aio.Client({self._sync.url!r})"

    @property
    def url(self) -> str:
        return self._sync.url

    @property
    def urls(self) -> tuple[str, ...]:
        return self._sync.urls

    @property
    def current_url(self) -> str:
        return self._sync.current_url

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
        """See :meth:`tessera_client.Client.semaphore`."""
        return Semaphore(
            self._sync.semaphore(
                name, capacity, weight=weight, ttl=ttl, holder=holder, tenant=tenant, share=share
            )
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
        """A lock: the semaphore of capacity 1 under ``name`` (see
        :meth:`tessera_client.Client.lock`)."""
        return Semaphore(self._sync.lock(name, ttl=ttl, holder=holder, tenant=tenant, share=share))

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
        """See :meth:`tessera_client.Client.rate`."""
        return RateLimiter(
            self._sync.rate(name, *limits, cost=cost, margin=margin, mode=mode, burst=burst, update=update)
        )

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
        """See :meth:`tessera_client.Client.admission`."""
        return Admission(
            self._sync.admission(
                name,
                capacity=capacity,
                limits=limits,
                weight=weight,
                cost=cost,
                ttl=ttl,
                margin=margin,
                holder=holder,
                update=update,
                tenant=tenant,
                share=share,
            )
        )

    async def set_tenant_limits(
        self,
        name: str,
        tenant: str,
        *,
        ceiling: int | None = None,
        floor: int = 0,
        window_ceiling: int | None = None,
    ) -> dict[str, _sync.TenantLimits]:
        """See :meth:`tessera_client.Client.set_tenant_limits`: ``tenant``'s ceiling, floor
        and window ceiling (a percentage of each rate window of the name's admissions)."""
        return await _in_thread(
            lambda: self._sync.set_tenant_limits(
                name, tenant, ceiling=ceiling, floor=floor, window_ceiling=window_ceiling
            )
        )

    async def tenant_limits(self, name: str) -> dict[str, _sync.TenantLimits]:
        """See :meth:`tessera_client.Client.tenant_limits`."""
        return await _in_thread(lambda: self._sync.tenant_limits(name))

    async def close(self) -> None:
        """Releases the leases still held through this client and closes idle connections."""
        await _in_thread(self._sync.close)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class Semaphore:
    """The asyncio twin of :class:`tessera_client.Semaphore`::

    async with client.semaphore("gpu", capacity=4).acquire(timeout=10) as lease:
        ...
    """

    def __init__(self, semaphore: _sync.Semaphore) -> None:
        self._sync = semaphore
        self.name = semaphore.name
        self.capacity = semaphore.capacity
        self.weight = semaphore.weight
        self.tenant = semaphore.tenant
        self.share = semaphore.share

    def __repr__(self) -> str:
        return repr(self._sync)

    def acquire(self, timeout: float | None = None) -> _Acquiring[Lease]:
        """See :meth:`tessera_client.Semaphore.acquire`; also cancel-safe (module docs)."""

        async def start() -> Lease:
            lease = await _cancellable(lambda cancel: self._sync._acquire(timeout, cancel))
            return Lease(lease)

        return _Acquiring(start)

    async def try_acquire(self) -> Lease | None:
        """See :meth:`tessera_client.Semaphore.try_acquire`."""
        try:
            return await self.acquire(0)
        except errors.NoPermit:
            return None

    async def status(self) -> dict[str, Any] | None:
        return await _in_thread(self._sync.status)

    async def revoke(self, lease_id: str) -> bool:
        return await _in_thread(lambda: self._sync.revoke(lease_id))


class RateLimiter:
    """The asyncio twin of :class:`tessera_client.RateLimiter`::

    sms = client.rate("sms-api", "50/s", "1000/min")
    await sms.acquire()          # at the admitted moment
    await send(message)
    """

    def __init__(self, limiter: _sync.RateLimiter) -> None:
        self._sync = limiter
        self.name = limiter.name
        self.limits = limiter.limits

    def __repr__(self) -> str:
        return repr(self._sync)

    async def acquire(self, max_wait: float | None = None) -> _sync.Decision:
        """See :meth:`tessera_client.RateLimiter.acquire`; cancelling gives up the reservation."""
        return await _cancellable(lambda cancel: self._sync._acquire(max_wait, cancel))

    async def try_acquire(self) -> _sync.Decision:
        return await _in_thread(self._sync.try_acquire)

    async def status(self) -> dict[str, Any] | None:
        return await _in_thread(self._sync.status)

    async def reset(self) -> bool:
        return await _in_thread(self._sync.reset)


class Admission:
    """The asyncio twin of :class:`tessera_client.Admission`::

        sms = client.admission("sms-api", capacity=4, limits=["50/s", "1000/min"])
        async with sms.acquire(timeout=30) as ticket:
            await provider.send(message)

    The use-by check runs on the loop, right before ``acquire`` hands the admission over.
    """

    def __init__(self, admission: _sync.Admission) -> None:
        self._sync = admission
        self.name = admission.name
        self.tenant = admission.tenant
        self.share = admission.share

    def __repr__(self) -> str:
        return repr(self._sync)

    @property
    def given_back(self) -> int:
        return self._sync.given_back

    def acquire(self, timeout: float | None = None) -> _Acquiring[AdmittedLease]:
        """See :meth:`tessera_client.Admission.acquire`."""
        return _Acquiring(lambda: self._acquire(timeout))

    async def try_acquire(self) -> AdmittedLease | None:
        try:
            return await self._acquire(0)
        except errors.NotAdmitted:
            return None

    async def _acquire(self, timeout: float | None) -> AdmittedLease:
        clock = self._sync._t.clock
        deadline = _sync._deadline(clock, timeout)
        late: _lease.AdmittedLease | None = None
        while True:
            left = None if deadline is None else max(0.0, deadline - clock())

            def call(
                cancel: Cancel,
                left: float | None = left,
                late: _lease.AdmittedLease | None = late,
            ) -> _lease.AdmittedLease:
                return self._sync._acquire(left, cancel, check_use_by=False, late=late)

            lease = await _cancellable(call)
            if not self._sync.stale(lease):
                return AdmittedLease(lease)
            # Given back by the next request, which keeps this client's place in the queue.
            self._sync.given_back += 1
            if deadline is not None and deadline - clock() < _sync.EPSILON:
                await asyncio.shield(_in_thread(functools.partial(self._sync._give_back_quietly, lease)))
                raise _sync._stale_error(self.name)
            late = lease


__all__ = ["Client", "Semaphore", "RateLimiter", "Admission", "Lease", "AdmittedLease"]
