"""``lost``: set when an admin revokes the lease, and before the lease could expire when the
server is gone."""

from __future__ import annotations

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


class LostTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = tessera_client.Client(server.url)
        self.addCleanup(self.client.close)
        self.name = self.id().rsplit(".", 1)[-1]

    def test_lost_fires_when_an_admin_revokes_the_lease_with_the_cli(self) -> None:
        lease = self.client.lock(self.name, ttl="1500ms").acquire(timeout=5)
        self.assertFalse(lease.lost.is_set())
        done = server.cli("revoke", self.name, lease.lease_id)
        self.assertEqual(done.returncode, 0, done.stderr)
        revoked_at = time.monotonic()
        # Noticed at the next renewal, a third of the TTL after the last one.
        self.assertTrue(lease.lost.wait(1.5), "lost did not fire within the TTL of the revoke")
        self.assertLess(time.monotonic() - revoked_at, 1.5)
        self.assertIn("no longer holds", lease.lost_reason or "")
        self.assertTrue(lease.released)
        self.assertFalse(lease.release())
        with self.assertRaises(tessera_client.LeaseGone) as caught:
            lease.renew()
        self.assertEqual(caught.exception.status, 410)
        self.assertEqual(self.client.held(), [])

    def test_lost_fires_when_an_admin_revokes_the_lease_over_http(self) -> None:
        admin = tessera_client.Client(server.url)
        self.addCleanup(admin.close)
        with self.client.semaphore(self.name, capacity=2, ttl="1200ms").acquire(timeout=5) as lease:
            keep = self.client.semaphore(self.name, capacity=2, ttl="10s").acquire(timeout=5)
            self.assertTrue(admin.semaphore(self.name, capacity=2).revoke(lease.lease_id))
            self.assertTrue(lease.lost.wait(1.2))
            self.assertFalse(keep.lost.is_set(), "only the revoked lease is lost")
        # The context exit after the loss raised nothing; the other lease is still held.
        self.assertEqual([h["lease_id"] for h in server.semaphore(self.name)["holders"]], [keep.lease_id])
        self.assertTrue(keep.release())

    def test_lost_fires_before_the_ttl_runs_out_when_the_server_is_killed(self) -> None:
        own = support.Server()
        self.addCleanup(own.close)
        client = tessera_client.Client(own.url)
        self.addCleanup(client.close)
        ttl = 2.0
        lease = client.lock(self.name, ttl=ttl).acquire(timeout=5)
        time.sleep(0.8)  # past the first renewal
        self.assertFalse(lease.lost.is_set())
        killed_at = time.monotonic()
        own.kill()
        # The last renewal left before the kill: the server-side expiry is before
        # killed_at + ttl. lost must fire before that.
        self.assertTrue(lease.lost.wait(ttl), "lost did not fire")
        fired_at = time.monotonic()
        self.assertLess(fired_at, killed_at + ttl)
        self.assertLessEqual(fired_at, lease.valid_until)
        self.assertIn("renewals kept failing", lease.lost_reason or "")
        with self.assertRaises(tessera_client.Unavailable) as caught:
            lease.release()
        self.assertIsInstance(caught.exception, tessera_client.ConnectionFailed)
        self.assertIsNone(caught.exception.status)
        with lease:
            pass  # exiting the block of a lost lease raises nothing

    def test_the_keep_alive_rides_out_a_server_restart_shorter_than_a_third_of_the_ttl(self) -> None:
        own = support.Server()
        self.addCleanup(own.close)
        client = tessera_client.Client(own.url)
        self.addCleanup(client.close)
        lease = client.lock(self.name, ttl=3).acquire(timeout=5)
        own.kill()
        time.sleep(1.4)  # the renewal due a third of the TTL after the grant fails
        self.assertLess(lease.remaining(), 2.0, "no renewal can have succeeded")
        self.assertFalse(lease.lost.is_set())
        own.start(listen=own.url.removeprefix("http://"))  # the same store, on the same port
        self.assertTrue(support.wait_until(lambda: lease.remaining() > 2.0, timeout=2))
        self.assertFalse(lease.lost.is_set(), lease.lost_reason)
        self.assertEqual([h["lease_id"] for h in own.semaphore(self.name)["holders"]], [lease.lease_id])
        self.assertTrue(lease.release())


if __name__ == "__main__":
    unittest.main()
