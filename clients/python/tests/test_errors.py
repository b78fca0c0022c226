"""Errors: the class of the server's ``kind``, with its status and message; tokens."""

from __future__ import annotations

import os
import socket
import unittest

import support

import tessera_client

server: support.Server
guarded: support.Server

TOKEN = "billing-token-0123456789"
ADMIN = "admin-token-0123456789ab"


def setUpModule() -> None:
    global server, guarded
    server = support.Server()
    tokens = os.path.join(server.dir, "tokens")
    with open(tokens, "w") as f:
        f.write(f"{TOKEN} billing/\n{ADMIN} *\n")
    guarded = support.Server("--tokens", tokens)


def tearDownModule() -> None:
    guarded.close()
    server.close()


class ErrorTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = tessera_client.Client(server.url)
        self.addCleanup(self.client.close)
        self.name = self.id().rsplit(".", 1)[-1]

    def assertRaisesKind(self, cls: type, status: int, *words: str):  # noqa: N802
        test = self

        class Check:
            def __enter__(self) -> None:
                return None

            def __exit__(self, exc_type, exc, tb) -> bool:
                test.assertIsNotNone(exc, f"{cls.__name__} not raised")
                test.assertIs(type(exc), cls, repr(exc))
                test.assertIsInstance(exc, tessera_client.TesseraError)
                test.assertEqual(exc.kind, cls.KIND)
                test.assertEqual(exc.status, status)
                for word in words:
                    test.assertIn(word, exc.message)
                test.assertIn(exc.kind, str(exc))
                return True

        return Check()

    def test_invalid_input_names_the_value(self) -> None:
        with self.assertRaisesKind(tessera_client.InvalidInput, 400, "invalid capacity 0"):
            self.client.semaphore(self.name, capacity=0).acquire(timeout=1)
        with self.assertRaisesKind(tessera_client.InvalidInput, 400, "invalid weight 3"):
            self.client.semaphore(self.name, capacity=2, weight=3).acquire(timeout=1)
        with self.assertRaisesKind(tessera_client.InvalidInput, 400, "invalid ttl", "soon"):
            self.client.lock(self.name, ttl="soon").acquire(timeout=1)
        with self.assertRaisesKind(tessera_client.InvalidInput, 400, "invalid name"):
            self.client.lock("two words").acquire(timeout=1)
        with self.assertRaisesKind(tessera_client.InvalidInput, 400, "invalid rate limit", "3/x"):
            self.client.rate(self.name, "3/x").try_acquire()
        with self.assertRaisesKind(tessera_client.InvalidInput, 400, "margin 2s"):
            self.client.admission(self.name, capacity=1, limits=["5/s"], margin="2s").acquire(timeout=1)
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_values_the_client_can_check_are_refused_before_any_request(self) -> None:
        with self.assertRaises(ValueError):
            self.client.lock(self.name).acquire(timeout=-1)
        with self.assertRaises(ValueError):
            self.client.lock(self.name, ttl=-5).acquire()
        with self.assertRaises(TypeError):
            self.client.lock(self.name, ttl=[1]).acquire()  # type: ignore[arg-type]
        with self.assertRaises(ValueError):
            tessera_client.Client("127.0.0.1:8080")

    def test_mismatches_are_conflicts(self) -> None:
        with self.client.semaphore(self.name, capacity=2).acquire(timeout=5):
            with self.assertRaisesKind(tessera_client.CapacityMismatch, 409, "capacity 2"):
                self.client.semaphore(self.name, capacity=3).acquire(timeout=1)
        self.client.rate(self.name, "5/s").try_acquire()
        with self.assertRaisesKind(tessera_client.RateMismatch, 409, "5/s"):
            self.client.rate(self.name, "6/s").acquire(max_wait=1)

    def test_renewing_a_revoked_lease_is_lease_gone(self) -> None:
        lease = self.client.lock(self.name).acquire(timeout=5)
        self.assertTrue(self.client.lock(self.name).revoke(lease.lease_id))
        try:
            lease.renew()
        except tessera_client.LeaseGone as e:
            self.assertTrue(e.is_lost())
        with self.assertRaisesKind(tessera_client.LeaseGone, 410, lease.lease_id):
            lease.renew()
        self.assertTrue(lease.lost.is_set())

    def test_limited_carries_the_exact_retry_after(self) -> None:
        limiter = self.client.rate(self.name, "1/10s")
        limiter.acquire(max_wait=0)
        with self.assertRaisesKind(tessera_client.Limited, 429, "at its limit"):
            limiter.acquire(max_wait=0)
        try:
            limiter.acquire(max_wait=0.1)
        except tessera_client.Limited as e:
            assert e.retry_after is not None
            self.assertTrue(9.0 < e.retry_after <= 10.1, e.retry_after)

    def test_no_server_is_connection_failed(self) -> None:
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        client = tessera_client.Client(f"http://127.0.0.1:{port}")
        with self.assertRaises(tessera_client.ConnectionFailed) as caught:
            client.lock(self.name).acquire(timeout=1)
        e = caught.exception
        self.assertIsInstance(e, tessera_client.Unavailable)
        self.assertTrue(e.is_unavailable())
        self.assertIsNone(e.status)
        self.assertEqual(e.kind, "connection_failed")
        self.assertIn("cannot connect", e.message)

    def test_a_token_covers_its_prefix(self) -> None:
        anonymous = tessera_client.Client(guarded.url)
        self.addCleanup(anonymous.close)
        with self.assertRaisesKind(tessera_client.Unauthorized, 401):
            anonymous.lock("billing/run").acquire(timeout=1)
        billing = tessera_client.Client(guarded.url, token=TOKEN)
        self.addCleanup(billing.close)
        self.assertNotIn(TOKEN, repr(billing))
        with billing.lock("billing/run").acquire(timeout=1) as lease:
            self.assertGreater(lease.renew(), 0)
            with self.assertRaisesKind(tessera_client.Forbidden, 403):
                billing.lock("reports/run").acquire(timeout=1)
            admin = tessera_client.Client(guarded.url, token=ADMIN)
            self.addCleanup(admin.close)
            self.assertTrue(admin.lock("billing/run").revoke(lease.lease_id))


if __name__ == "__main__":
    unittest.main()
