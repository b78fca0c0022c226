"""Rate limiters: the limits hold at the moment of each call, across processes; a refusal
charges nothing; waits honour ``max_wait``."""

from __future__ import annotations

import os
import time
import unittest
from unittest import mock

import support

import tessera_client
from tessera_client import client as client_module

server: support.Server

SECOND_NS = 1_000_000_000


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.close()


class RateTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = tessera_client.Client(server.url)
        self.addCleanup(self.client.close)
        self.name = self.id().rsplit(".", 1)[-1]

    def used(self) -> int:
        """The cost counted in the limiter's (only) window, admitted or reserved."""
        limits = server.rate(self.name)["limits"]
        return sum(limit["used"] + limit["reserved"] for limit in limits[:1])

    def test_three_processes_never_call_more_than_the_limit_in_any_second(self) -> None:
        # 5/s with a 200 ms margin: the server admits at most 5 in any 1.2 s, so the calls,
        # stamped right after acquire returns (within the margin), hold 5 in any second.
        log = os.path.join(server.dir, self.name + ".log")
        support.run_all(server.url, [("rate", log, 5, self.name, "5/s", "200ms")] * 3)
        calls = [int(line[2]) for line in support.read_log(log)]
        self.assertEqual(len(calls), 15)
        self.assertLessEqual(support.most_in_window(calls, SECOND_NS), 5)
        # 15 calls at 5 per second cannot fit in less than 2 s.
        self.assertGreaterEqual(max(calls) - min(calls), 2 * SECOND_NS)

    def test_a_refused_try_charges_nothing(self) -> None:
        limiter = self.client.rate(self.name, "3/2s")
        decisions = [limiter.try_acquire() for _ in range(3)]
        self.assertTrue(all(decisions), decisions)
        self.assertTrue(all(d.admitted_at_us for d in decisions))
        refused = limiter.try_acquire()
        self.assertFalse(refused)
        self.assertFalse(refused.admitted)
        assert refused.retry_after is not None
        self.assertGreater(refused.retry_after, 0)
        self.assertLessEqual(refused.retry_after, 2.1)
        self.assertEqual(self.used(), 3)

    def test_a_turn_beyond_max_wait_raises_limited_at_once_and_charges_nothing(self) -> None:
        limiter = self.client.rate(self.name, "2/3s")
        limiter.acquire(max_wait=0)
        limiter.acquire(max_wait=0)
        start = time.monotonic()
        with self.assertRaises(tessera_client.Limited) as caught:
            limiter.acquire(max_wait=0.5)
        e = caught.exception
        assert e.retry_after is not None
        self.assertGreater(e.retry_after, 0.5)
        self.assertLess(time.monotonic() - start, e.retry_after, "it did not wait for a turn it cannot get")
        self.assertEqual((e.status, e.kind), (429, "limited"))
        self.assertEqual(self.used(), 2)

    def test_acquire_returns_at_the_admitted_moment(self) -> None:
        limiter = self.client.rate(self.name, "2/1s")
        first = limiter.acquire(max_wait=0)
        limiter.acquire(max_wait=0)
        third = limiter.acquire(max_wait=3)
        assert first.admitted_at_us is not None and third.admitted_at_us is not None
        self.assertGreaterEqual(third.admitted_at_us - first.admitted_at_us, 1_000_000)

    def test_a_wait_longer_than_one_request_allows_sleeps_the_retry_after_and_asks_again(self) -> None:
        # The server takes at most 5 minutes of max_wait per request; shrink that to 0.2 s:
        # the first answer is 429 with retry_after about 1 s, within the 3 s asked for.
        limiter = self.client.rate(self.name, "1/1s")
        first = limiter.acquire(max_wait=0)
        with mock.patch.object(client_module, "MAX_WAIT", 0.2):
            second = limiter.acquire(max_wait=3)
        assert first.admitted_at_us is not None and second.admitted_at_us is not None
        self.assertGreaterEqual(second.admitted_at_us - first.admitted_at_us, 1_000_000)

    def test_limits_differing_from_the_stored_ones_are_a_rate_mismatch(self) -> None:
        self.client.rate(self.name, "10/s", "100/min").try_acquire()
        with self.assertRaises(tessera_client.RateMismatch) as caught:
            self.client.rate(self.name, "20/s").try_acquire()
        self.assertEqual(caught.exception.status, 409)
        self.assertIn("10/s", caught.exception.message)
        self.assertTrue(self.client.rate(self.name, ["20/s"], update=True).try_acquire())


if __name__ == "__main__":
    unittest.main()
