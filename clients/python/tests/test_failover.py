"""Several instances of `tessera serve` on one store: a client that names them all keeps
working through the others when one is killed or stops, its leases are renewed and released
through whichever instance answers, and with every instance down it fails with its typed
error in bounded time."""

from __future__ import annotations

import json
import threading
import time
import unittest
import urllib.request

import support

import tessera_client


def post(url: str, method: str = "POST", body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=15) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class FailoverTest(unittest.TestCase):
    def setUp(self) -> None:
        # Two instances on one SQLite file, as two hosts would share a Redis.
        self.a = support.Server()
        self.addCleanup(self.a.close)
        self.b = support.Server(store=self.a.store)
        self.addCleanup(self.b.close)
        self.name = self.id().rsplit(".", 1)[-1]

    def client(self, *urls: str) -> tessera_client.Client:
        c = tessera_client.Client(list(urls), timeout=5)
        self.addCleanup(c.close)
        return c

    def test_urls_are_a_list_or_a_comma_separated_string(self) -> None:
        joined = tessera_client.Client(f"{self.a.url}, {self.b.url}")
        self.addCleanup(joined.close)
        self.assertEqual(joined.urls, (self.a.url, self.b.url))
        self.assertEqual(joined.current_url, self.a.url)
        self.assertEqual(self.client(self.a.url, self.b.url).urls, (self.a.url, self.b.url))
        with self.assertRaises(ValueError):
            tessera_client.Client(" , ")

    def test_a_lease_taken_through_one_instance_is_renewed_and_released_through_another(self) -> None:
        lease = self.client(self.a.url).lock(self.name, ttl=5).acquire(timeout=5)
        path = f"/v1/semaphores/{self.name}/leases/{lease.lease_id}"
        status, body = post(self.b.url + path + "/renew", body={"ttl": "5s"})
        self.assertEqual(status, 200, body)
        self.assertGreater(body["expires_in_ms"], 4000)
        status, body = post(self.b.url + path, method="DELETE")
        self.assertEqual((status, body), (200, {"done": True}))
        self.assertEqual(self.a.semaphore(self.name)["holders"], [])

    def test_a_killed_instance_costs_a_holder_nothing(self) -> None:
        client = self.client(self.a.url, self.b.url)
        # A TTL of 1.5 s: renewed every 0.5 s, lost if no renewal succeeds for about 1 s.
        lease = client.lock(self.name, ttl=1.5).acquire(timeout=5)
        self.assertEqual(client.current_url, self.a.url)
        self.a.kill()  # SIGKILL: no answer, no goodbye, connections reset
        killed = time.monotonic()
        time.sleep(4.5)  # three TTLs: every renewal since the kill went through B
        self.assertFalse(lease.lost.is_set(), lease.lost_reason)
        self.assertEqual(client.current_url, self.b.url)
        self.assertGreater(lease.remaining(), 0.5)
        # The store agrees: the same lease, still held, and nobody else gets in.
        holders = self.b.semaphore(self.name)["holders"]
        self.assertEqual([h["lease_id"] for h in holders], [lease.lease_id])
        other = self.client(self.b.url)
        self.assertIsNone(other.lock(self.name, ttl=1.5).try_acquire())
        # New calls work through B; the lease is released through it.
        self.assertIsNotNone(client.lock(self.name + "-2").try_acquire())
        self.assertTrue(lease.release())
        self.assertEqual(
            [h["lease_id"] for h in self.b.semaphore(self.name)["holders"]], []
        )
        self.assertLess(time.monotonic() - killed, 15)

    def test_a_waiting_acquire_moves_to_the_next_instance_when_one_stops(self) -> None:
        holder = self.client(self.b.url).lock(self.name, ttl=10).acquire(timeout=5)
        client = self.client(self.a.url, self.b.url)
        got: list = []
        waiting = threading.Thread(
            target=lambda: got.append(client.lock(self.name, ttl=10).acquire(timeout=20))
        )
        waiting.start()
        self.assertTrue(support.wait_until(lambda: len(self.a.semaphore(self.name)["queue"]) == 1))
        # SIGTERM: A answers its waiting acquire 503 shutting_down and gives up the place.
        stopping = threading.Thread(target=self.a.stop)
        stopping.start()
        self.assertTrue(support.wait_until(lambda: client.current_url == self.b.url, timeout=10))
        holder.release()
        waiting.join(20)
        stopping.join(20)
        self.assertEqual(len(got), 1)
        lease = got[0]
        self.assertEqual(
            [h["lease_id"] for h in self.b.semaphore(self.name)["holders"]], [lease.lease_id]
        )
        self.assertTrue(lease.release())

    def test_every_instance_down_is_a_typed_error_in_bounded_time(self) -> None:
        client = self.client(self.a.url, self.b.url)
        lease = client.lock(self.name, ttl=1.5).acquire(timeout=5)
        self.a.kill()
        self.b.kill()
        started = time.monotonic()
        with self.assertRaises(tessera_client.ConnectionFailed):
            client.lock(self.name + "-2").acquire(timeout=30)
        # Three rounds over both instances per request, four requests: well under the timeout.
        self.assertLess(time.monotonic() - started, 5)
        started = time.monotonic()
        with self.assertRaises(tessera_client.ConnectionFailed):
            client.lock(self.name + "-2").try_acquire()
        self.assertLess(time.monotonic() - started, 2)
        # The holder is told before its lease could expire.
        self.assertTrue(lease.lost.wait(3))
        self.assertIsInstance(lease.lost_reason, str)


if __name__ == "__main__":
    unittest.main()
