"""What is sent again after a dropped connection: idempotent requests always, waiting
acquires with the time left (the server dropped the first waiter), a try never."""

from __future__ import annotations

import threading
import time
import unittest

import support

import tessera_client

server: support.Server


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.close()


class RetryTest(unittest.TestCase):
    def setUp(self) -> None:
        self.proxy = support.Proxy(server.url)
        self.addCleanup(self.proxy.close)
        self.client = tessera_client.Client(self.proxy.url)
        self.addCleanup(self.client.close)
        self.direct = tessera_client.Client(server.url)
        self.addCleanup(self.direct.close)
        self.name = self.id().rsplit(".", 1)[-1]

    def test_a_renewal_and_a_release_are_sent_again(self) -> None:
        lease = self.client.lock(self.name).acquire(timeout=5)
        self.proxy.cut_next("after", 0.0)
        self.assertGreater(lease.renew(), 20)
        self.proxy.cut_next("before")
        self.assertTrue(lease.release())
        self.assertEqual(self.proxy.cuts, 2)
        self.assertEqual(server.semaphore(self.name)["holders"], [])
        self.assertFalse(lease.lost.is_set())

    def test_a_try_is_not_sent_again(self) -> None:
        self.client.lock(self.name).try_acquire()  # a connection in the pool
        self.client.held()[0].release()
        before = self.proxy.requests
        self.proxy.cut_next("before")
        with self.assertRaises(tessera_client.ConnectionFailed) as caught:
            self.client.lock(self.name).try_acquire()
        self.assertIn("no answer", caught.exception.message)
        self.assertEqual(self.proxy.requests, before + 1)
        self.proxy.cut_next("before")
        with self.assertRaises(tessera_client.ConnectionFailed):
            self.client.rate(self.name, "5/s").try_acquire()
        self.assertEqual(self.proxy.requests, before + 2)
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_a_waiting_acquire_asks_again_and_the_server_drops_the_first_waiter(self) -> None:
        holder = self.direct.lock(self.name).acquire(timeout=5)
        got = []
        self.proxy.cut_next("after", 0.3)
        waiter = threading.Thread(target=lambda: got.append(self.client.lock(self.name).acquire(timeout=10)))
        waiter.start()
        time.sleep(0.8)  # cut at 0.3 s, asked again since
        self.assertEqual(self.proxy.cuts, 1)
        queue = server.semaphore(self.name)["queue"]
        self.assertEqual(len(queue), 1, "the first waiter left the queue with its connection")
        holder.release()
        waiter.join()
        status = server.semaphore(self.name)
        self.assertEqual([h["lease_id"] for h in status["holders"]], [got[0].lease_id])
        self.assertEqual(status["queue"], [])
        got[0].release()

    def test_a_waiting_rate_acquire_asks_again_and_is_charged_once(self) -> None:
        limiter = self.client.rate(self.name, "1/2s")
        first = limiter.acquire(max_wait=0)
        self.proxy.cut_next("after", 0.3)
        second = limiter.acquire(max_wait=5)
        self.assertEqual(self.proxy.cuts, 1)
        # Had the server kept the first request's reservation (the turn 2 s after the first),
        # the second request would have got the turn after it, 4 s after the first.
        assert first.admitted_at_us is not None and second.admitted_at_us is not None
        gap = second.admitted_at_us - first.admitted_at_us
        self.assertTrue(2_000_000 <= gap < 3_000_000, gap)
        limits = server.rate(self.name)["limits"][0]
        self.assertEqual((limits["used"], limits["reserved"]), (1, 0))


if __name__ == "__main__":
    unittest.main()
