"""Locks across processes: mutual exclusion, release on every exit path, timeouts."""

from __future__ import annotations

import os
import time
import unittest
from unittest import mock

import support

import tessera_client
from tessera_client import client as client_module

server: support.Server


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.close()


class LockTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = tessera_client.Client(server.url)
        self.name = self.id().rsplit(".", 1)[-1]

    def tearDown(self) -> None:
        self.client.close()

    def test_workers_in_four_processes_never_hold_the_lock_at_once(self) -> None:
        log = os.path.join(server.dir, self.name + ".log")
        support.run_all(server.url, [("lock", log, 5, self.name)] * 4)
        lines = support.read_log(log)
        self.assertEqual(len(lines), 40)
        for enter, exit_ in zip(lines[::2], lines[1::2]):
            self.assertEqual(enter[0], "enter", lines)
            self.assertEqual(exit_[0], "exit", lines)
            self.assertEqual(enter[1:3], exit_[1:3], "an exit must follow its own enter")
        fences = [int(line[2]) for line in lines[::2]]
        self.assertEqual(fences, sorted(set(fences)), "fences grow with every grant")
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_release_is_idempotent(self) -> None:
        lock = self.client.lock(self.name)
        lease = lock.acquire(timeout=5)
        self.assertTrue(lease.release())
        self.assertFalse(lease.release())
        self.assertTrue(lease.released)
        with lease:
            pass  # a context exit after a release changes nothing
        self.assertEqual(server.semaphore(self.name)["holders"], [])
        with lock.acquire(timeout=5) as again:
            self.assertGreater(again.fence, lease.fence)
            self.assertTrue(again.release())
        self.assertFalse(again.release())
        self.assertFalse(lease.lost.is_set())

    def test_the_context_manager_releases_when_the_block_raises(self) -> None:
        with self.assertRaises(KeyError):
            with self.client.lock(self.name).acquire(timeout=5) as lease:
                self.assertEqual(len(server.semaphore(self.name)["holders"]), 1)
                raise KeyError("the block failed")
        self.assertTrue(lease.released)
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_a_lock_is_the_semaphore_of_capacity_one(self) -> None:
        with self.client.lock(self.name).acquire(timeout=5) as lease:
            self.assertEqual(lease.seats, [0])
            self.assertIsNone(self.client.semaphore(self.name, capacity=1).try_acquire())
            with self.assertRaises(tessera_client.CapacityMismatch):
                self.client.semaphore(self.name, capacity=2).try_acquire()
            self.assertEqual(server.semaphore(self.name)["capacity"], 1)

    def test_acquire_with_a_timeout_raises_no_permit_after_it_and_leaves_nothing_behind(self) -> None:
        holder = self.client.lock(self.name).acquire(timeout=5)
        other = tessera_client.Client(server.url)
        self.addCleanup(other.close)
        start = time.monotonic()
        with self.assertRaises(tessera_client.NoPermit) as caught:
            other.lock(self.name).acquire(timeout=0.6)
        elapsed = time.monotonic() - start
        self.assertGreaterEqual(elapsed, 0.55)
        self.assertLess(elapsed, 10)
        self.assertEqual(caught.exception.status, 408)
        self.assertTrue(caught.exception.is_timeout())
        status = server.semaphore(self.name)
        self.assertEqual([h["lease_id"] for h in status["holders"]], [holder.lease_id])
        self.assertEqual(status["queue"], [])
        self.assertEqual(other.held(), [])
        self.assertIsNone(other.lock(self.name).try_acquire())
        holder.release()
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_a_timeout_longer_than_one_request_allows_is_several_requests(self) -> None:
        # The server waits at most 5 minutes per request; shrink that to 0.2 s to see the loop.
        holder = self.client.lock(self.name).acquire(timeout=5)
        other = tessera_client.Client(server.url)
        self.addCleanup(other.close)
        with mock.patch.object(client_module, "MAX_WAIT", 0.2):
            start = time.monotonic()
            with self.assertRaises(tessera_client.NoPermit):
                other.lock(self.name).acquire(timeout=1.0)
            self.assertGreaterEqual(time.monotonic() - start, 0.95)
            proc = support.spawn(server.url, "try", self.name, 1)
            self.assertEqual(proc.communicate(timeout=30)[0].strip(), "held")
            releaser = support.later(0.7, holder.release)
            start = time.monotonic()
            with other.lock(self.name).acquire(timeout=5) as lease:
                self.assertGreaterEqual(time.monotonic() - start, 0.6)
                self.assertGreater(lease.fence, holder.fence)
            releaser.join()
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_a_process_that_exits_without_releasing_releases_at_exit(self) -> None:
        out = support.worker(server.url, "hold-and-exit", self.name).stdout.split()
        self.assertEqual(len(out), 1)
        # The lease had a 30 s TTL: it is gone now only because the atexit hook released it.
        self.assertEqual(server.semaphore(self.name)["holders"], [])
        lease = self.client.lock(self.name).try_acquire()
        self.assertIsNotNone(lease)
        assert lease is not None
        self.assertNotEqual(lease.lease_id, out[0])
        lease.release()

    def test_close_releases_what_the_client_still_holds(self) -> None:
        client = tessera_client.Client(server.url)
        a = client.lock(self.name + "-a").acquire(timeout=5)
        b = client.semaphore(self.name + "-b", capacity=3, weight=2).acquire(timeout=5)
        self.assertEqual({lease.lease_id for lease in client.held()}, {a.lease_id, b.lease_id})
        client.close()
        self.assertTrue(a.released and b.released)
        self.assertEqual(server.semaphore(self.name + "-a")["holders"], [])
        self.assertEqual(server.semaphore(self.name + "-b")["holders"], [])


if __name__ == "__main__":
    unittest.main()
