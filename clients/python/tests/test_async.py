"""The asyncio client: the same behaviour, awaited; cancellation leaves nothing behind."""

from __future__ import annotations

import asyncio
import time
import unittest
from unittest import mock

import support

import tessera_client
from tessera_client import aio

server: support.Server


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.close()


class AsyncTest(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.client = aio.Client(server.url)
        self.name = self.id().rsplit(".", 1)[-1]

    async def asyncTearDown(self) -> None:
        await self.client.close()

    async def test_tasks_of_three_clients_never_hold_the_lock_at_once(self) -> None:
        clients = [aio.Client(server.url) for _ in range(3)]
        log = []

        async def work(client: aio.Client, i: int) -> None:
            for _ in range(3):
                async with client.lock(self.name).acquire(timeout=30) as lease:
                    log.append(("enter", i, lease.fence))
                    await asyncio.sleep(0.02)
                    log.append(("exit", i, lease.fence))

        await asyncio.gather(*(work(c, i) for i, c in enumerate(clients)))
        for c in clients:
            await c.close()
        self.assertEqual(len(log), 18)
        self.assertLessEqual(support.most_inside(log), 1)
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    async def test_many_waiting_tasks_do_not_hold_back_the_release_they_wait_for(self) -> None:
        # More waiters than the loop's default executor has threads.
        done = []

        async def work(i: int) -> None:
            async with self.client.lock(self.name).acquire(timeout=30):
                await asyncio.sleep(0.01)
            done.append(i)

        await asyncio.wait_for(asyncio.gather(*(work(i) for i in range(12))), 60)
        self.assertEqual(sorted(done), list(range(12)))

    async def test_acquire_is_awaitable_and_lost_is_an_asyncio_event(self) -> None:
        sem = self.client.semaphore(self.name, capacity=2, ttl="1200ms")
        lease = await sem.acquire(timeout=5)
        self.assertIsInstance(lease.lost, asyncio.Event)
        self.assertEqual(len(lease.seats), 1)
        await asyncio.sleep(1.5)  # past a TTL: kept alive
        self.assertFalse(lease.lost.is_set())
        self.assertTrue(await sem.revoke(lease.lease_id))
        await asyncio.wait_for(lease.lost.wait(), 1.2)
        self.assertIn("no longer holds", lease.lost_reason or "")
        self.assertFalse(await lease.release())

    async def test_cancelling_a_waiting_acquire_gives_up_the_place_in_the_queue(self) -> None:
        holder = await self.client.lock(self.name).acquire(timeout=5)
        waiter = asyncio.ensure_future(self.client.lock(self.name).acquire(timeout=30))
        await _until(lambda: len(server.semaphore(self.name)["queue"]) == 1)
        waiter.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await waiter
        await _until(lambda: server.semaphore(self.name)["queue"] == [])
        await holder.release()
        await asyncio.sleep(0.2)
        self.assertEqual(server.semaphore(self.name)["holders"], [])
        self.assertEqual(self.client._sync.held(), [])

    async def test_timeouts_raise_the_same_errors(self) -> None:
        async with self.client.lock(self.name).acquire(timeout=5):
            start = time.monotonic()
            with self.assertRaises(tessera_client.NoPermit):
                await self.client.lock(self.name).acquire(timeout=0.4)
            self.assertGreaterEqual(time.monotonic() - start, 0.35)
            self.assertIsNone(await self.client.lock(self.name).try_acquire())
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    async def test_rates_wait_and_refuse_like_the_blocking_ones(self) -> None:
        limiter = self.client.rate(self.name, "2/1s")
        first = await limiter.acquire(max_wait=0)
        self.assertTrue(await limiter.try_acquire())
        refused = await limiter.try_acquire()
        self.assertFalse(refused)
        with self.assertRaises(tessera_client.Limited):
            await limiter.acquire(max_wait=0.1)
        third = await limiter.acquire(max_wait=3)
        assert first.admitted_at_us is not None and third.admitted_at_us is not None
        self.assertGreaterEqual(third.admitted_at_us - first.admitted_at_us, 1_000_000)

    async def test_cancelling_a_waiting_rate_acquire_gives_up_its_reservation(self) -> None:
        limiter = self.client.rate(self.name, "1/3s")
        await limiter.acquire(max_wait=0)
        waiter = asyncio.ensure_future(limiter.acquire(max_wait=10))
        await _until(lambda: server.rate(self.name)["limits"][0]["reserved"] == 1)
        waiter.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await waiter
        await _until(lambda: server.rate(self.name)["limits"][0]["reserved"] == 0)
        self.assertEqual(server.rate(self.name)["limits"][0]["used"], 1)

    async def test_an_admission_checks_its_use_by_on_the_loop(self) -> None:
        admission = self.client.admission(self.name, capacity=2, limits=["10/s"], margin="500ms")
        answers = iter([True, False])
        with mock.patch.object(admission._sync, "stale", side_effect=lambda lease: next(answers)):
            async with admission.acquire(timeout=5) as ticket:
                self.assertGreater(ticket.admitted_at_us, 0)
                self.assertEqual(admission.given_back, 1)
                holders = server.semaphore(self.name)["holders"]
                self.assertEqual([h["lease_id"] for h in holders], [ticket.lease_id])
                self.assertEqual(server.rate(self.name)["limits"][0]["used"], 1)
        self.assertEqual(server.semaphore(self.name)["holders"], [])


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


if __name__ == "__main__":
    unittest.main()
