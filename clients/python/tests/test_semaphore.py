"""Semaphores across processes: capacity, weights, seats, and the keep-alive."""

from __future__ import annotations

import os
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


class SemaphoreTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = tessera_client.Client(server.url)
        self.addCleanup(self.client.close)
        self.name = self.id().rsplit(".", 1)[-1]

    def test_five_processes_never_hold_more_than_the_capacity(self) -> None:
        log = os.path.join(server.dir, self.name + ".log")
        support.run_all(server.url, [("sem", log, 4, self.name, 2)] * 5)
        lines = support.read_log(log)
        self.assertEqual(len(lines), 40)
        self.assertEqual(support.most_inside(lines), 2, "at most 2 at once, and 2 did happen")
        seats = {}  # fence -> seat of the holders inside
        for line in lines:
            if line[0] == "enter":
                self.assertNotIn(line[3], seats.values(), "two holders on one seat")
                seats[line[2]] = line[3]
            else:
                del seats[line[2]]
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_a_weight_takes_that_many_seats(self) -> None:
        heavy = self.client.semaphore(self.name, capacity=3, weight=2)
        light = self.client.semaphore(self.name, capacity=3)
        with heavy.acquire(timeout=5) as lease:
            self.assertEqual(lease.weight, 2)
            self.assertEqual(len(set(lease.seats)), 2)
            self.assertIsNone(heavy.try_acquire())
            one = light.try_acquire()
            self.assertIsNotNone(one)
            assert one is not None
            self.assertNotIn(one.seats[0], lease.seats)
            self.assertIsNone(light.try_acquire())
            self.assertEqual(server.semaphore(self.name)["used"], 3)
            one.release()
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_the_keep_alive_holds_a_lease_past_several_ttls(self) -> None:
        sem = self.client.semaphore(self.name, capacity=1, ttl="1s")
        lease = sem.acquire(timeout=5)
        self.assertEqual(lease.ttl, 1.0)
        time.sleep(3.5)
        self.assertFalse(lease.lost.is_set(), lease.lost_reason)
        holders = server.semaphore(self.name)["holders"]
        self.assertEqual([h["lease_id"] for h in holders], [lease.lease_id])
        self.assertGreater(holders[0]["expires_in_ms"], 0)
        self.assertEqual(support.worker(server.url, "try", self.name, 1).stdout.strip(), "held")
        self.assertGreater(lease.renew(), 0.5)
        self.assertGreater(lease.remaining(), 0.5)
        self.assertTrue(lease.release())
        self.assertFalse(lease.lost.is_set())
        self.assertEqual(support.worker(server.url, "try", self.name, 1).stdout.strip(), "free")

    def test_a_name_with_a_slash_is_one_path_segment(self) -> None:
        name = f"jobs/{self.name}/42"
        with self.client.lock(name).acquire(timeout=5) as lease:
            self.assertEqual(lease.name, name)
            status = self.client.lock(name).status()
            assert status is not None
            self.assertEqual(status["name"], name)
            self.assertEqual(server.semaphore(name)["holders"][0]["lease_id"], lease.lease_id)
            self.assertGreater(lease.renew(), 0)
        self.assertIsNone(self.client.lock(name).status())

    def test_waiters_are_served_in_arrival_order_and_a_large_weight_is_not_overtaken(self) -> None:
        first = self.client.semaphore(self.name, capacity=2).acquire(timeout=5)
        big_client, small_client = tessera_client.Client(server.url), tessera_client.Client(server.url)
        self.addCleanup(big_client.close)
        self.addCleanup(small_client.close)
        big = big_client.semaphore(self.name, capacity=2, weight=2)
        small = small_client.semaphore(self.name, capacity=2)
        order = []
        t_big = support.later(0, lambda: order.append(("big", big.acquire(timeout=10))))
        self.assertTrue(support.wait_until(lambda: len(server.semaphore(self.name)["queue"]) == 1))
        t_small = support.later(0, lambda: order.append(("small", small.acquire(timeout=10))))
        self.assertTrue(support.wait_until(lambda: len(server.semaphore(self.name)["queue"]) == 2))
        # One permit is free, but the head of the queue needs 2: the small one must not pass.
        time.sleep(0.3)
        self.assertEqual(order, [])
        first.release()
        t_big.join()
        self.assertEqual([o[0] for o in order], ["big"])
        order[0][1].release()
        t_small.join()
        self.assertEqual([o[0] for o in order], ["big", "small"])
        order[1][1].release()


if __name__ == "__main__":
    unittest.main()
