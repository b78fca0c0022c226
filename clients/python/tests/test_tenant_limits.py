"""Tenants' ceilings and floors (docs/fair-shares.md#ceilings-and-floors) and window ceilings
("A ceiling on a share of the windows"): set and listed through the client, a ceiling seen
by the client's own acquires and a window ceiling by its own admissions, removed again, bad
values typed with nothing changed, and a store that keeps none is :class:`Unsupported`."""

from __future__ import annotations

import asyncio
import threading
import unittest
from typing import Any

import support
from test_tenants import Stub

import tessera_client
from tessera_client import TenantLimits, aio

server: support.Server


def setUpModule() -> None:
    global server
    server = support.Server(store="memory://")  # the store that keeps tenant limits


def tearDownModule() -> None:
    server.close()


def queued(name: str) -> int:
    return len(server.semaphore(name)["queue"])


class TenantLimitsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = tessera_client.Client(server.url)
        self.addCleanup(self.client.close)
        self.name = self.id().rsplit(".", 1)[-1]

    def listed(self) -> dict[str, Any]:
        """The limits as the server lists them to a raw GET, beside the client."""
        status, body = server.get(f"/v1/semaphores/{self.name}/tenants")
        self.assertEqual(status, 200, body)
        return body["tenants"]

    def test_limits_set_are_returned_and_listed_by_tenant(self) -> None:
        self.assertEqual(self.client.tenant_limits(self.name), {})
        after = self.client.set_tenant_limits(self.name, "batch", ceiling=2, floor=1)
        self.assertEqual(after, {"batch": TenantLimits(ceiling=2, floor=1)})
        # No ceiling, a floor only; a tenant with "/" and non-ASCII text is one path segment.
        after = self.client.set_tenant_limits(self.name, "web/é", floor=1)
        expected = {"batch": TenantLimits(2, 1), "web/é": TenantLimits(None, 1)}
        self.assertEqual(after, expected)
        self.assertEqual(self.client.tenant_limits(self.name), expected)
        self.assertEqual(
            self.listed(), {"batch": {"ceiling": 2, "floor": 1}, "web/é": {"ceiling": None, "floor": 1}}
        )
        # Setting the same values again changes nothing (the call is retried as idempotent).
        self.assertEqual(self.client.set_tenant_limits(self.name, "batch", ceiling=2, floor=1), expected)
        # Kept for the name while nobody holds or waits; another name has none.
        self.assertEqual(server.semaphore(self.name)["holders"], [])
        self.assertEqual(self.client.tenant_limits(self.name + "-other"), {})

    def test_window_ceilings_set_are_returned_and_listed_and_removed(self) -> None:
        after = self.client.set_tenant_limits(self.name, "bulk", window_ceiling=20)
        self.assertEqual(after, {"bulk": TenantLimits(window_ceiling=20)})
        after = self.client.set_tenant_limits(self.name, "web", ceiling=3, floor=1, window_ceiling=100)
        expected = {"bulk": TenantLimits(None, 0, 20), "web": TenantLimits(3, 1, 100)}
        self.assertEqual(after, expected)
        self.assertEqual(self.client.tenant_limits(self.name), expected)
        self.assertEqual(
            self.listed(),
            {
                "bulk": {"ceiling": None, "floor": 0, "window_ceiling": 20},
                "web": {"ceiling": 3, "floor": 1, "window_ceiling": 100},
            },
        )
        # Each call sets all of a tenant's limits: a window ceiling left out is removed.
        after = self.client.set_tenant_limits(self.name, "web", ceiling=3, floor=1)
        self.assertEqual(after, {"bulk": TenantLimits(None, 0, 20), "web": TenantLimits(3, 1)})
        self.assertEqual(self.listed()["web"], {"ceiling": 3, "floor": 1})
        self.assertEqual(self.client.set_tenant_limits(self.name, "bulk"), {"web": TenantLimits(3, 1)})

    def test_a_tenant_at_its_window_ceiling_is_refused_while_another_is_admitted(self) -> None:
        # 20% of 10 a minute: bulk is admitted twice in any minute, whatever web leaves unused.
        self.client.set_tenant_limits(self.name, "bulk", window_ceiling=20)
        bulk = self.client.admission(self.name, capacity=5, limits=["10/min"], tenant="bulk")
        web = self.client.admission(self.name, capacity=5, limits=["10/min"], tenant="web")
        for _ in range(2):
            lease = bulk.try_acquire()
            self.assertIsNotNone(lease)
            assert lease is not None
            lease.release()
        self.assertIsNone(bulk.try_acquire())
        with self.assertRaises(tessera_client.NotAdmitted):
            bulk.acquire(timeout=0.2)
        # The shared window has 8 slots left: web is admitted, and bulk still is not.
        for _ in range(3):
            lease = web.try_acquire()
            self.assertIsNotNone(lease)
            assert lease is not None
            lease.release()
        self.assertIsNone(bulk.try_acquire())
        self.assertEqual(server.semaphore(self.name)["holders"], [])
        used = server.rate(self.name)["limits"][0]
        self.assertEqual(used["used"] + used["reserved"], 5)
        # Without the window ceiling bulk is admitted again from the shared window.
        self.client.set_tenant_limits(self.name, "bulk")
        lease = bulk.try_acquire()
        self.assertIsNotNone(lease)
        assert lease is not None
        lease.release()

    def test_a_tenant_at_its_ceiling_waits_while_another_tenant_is_granted(self) -> None:
        self.client.set_tenant_limits(self.name, "batch", ceiling=1)
        batch = self.client.semaphore(self.name, capacity=3, tenant="batch")
        web = self.client.semaphore(self.name, capacity=3, tenant="web")
        first = batch.acquire(timeout=5)
        outcome: list[BaseException | tessera_client.Lease] = []

        def second_batch() -> None:
            try:
                outcome.append(batch.acquire(timeout=1.5))
            except BaseException as e:  # checked below
                outcome.append(e)

        t = threading.Thread(target=second_batch)
        t.start()
        self.assertTrue(support.wait_until(lambda: queued(self.name) == 1))
        # Two permits are free, batch's second acquire waits at its ceiling, and web's does
        # not wait behind it.
        with web.acquire(timeout=1) as lease:
            self.assertEqual(lease.weight, 1)
            status = server.semaphore(self.name)
            self.assertEqual((status["used"], status["available"]), (2, 1))
            self.assertEqual([w["tenant"] for w in status["queue"]], ["batch"])
            by_tenant = {t["tenant"]: t for t in status["tenants"]}
            self.assertEqual(by_tenant["batch"]["ceiling"], 1)
        t.join(10)
        (result,) = outcome
        self.assertIsInstance(result, tessera_client.NoPermit, repr(result))
        self.assertEqual(queued(self.name), 0)
        self.assertIsNone(batch.try_acquire())  # a permit is free, but not for batch
        first.release()
        with batch.acquire(timeout=1):
            self.assertEqual(server.semaphore(self.name)["used"], 1)

    def test_clearing_the_limits_lets_the_tenant_past_its_old_ceiling(self) -> None:
        self.client.set_tenant_limits(self.name, "batch", ceiling=1, floor=1)
        batch = self.client.semaphore(self.name, capacity=2, tenant="batch")
        first = batch.acquire(timeout=5)
        self.assertIsNone(batch.try_acquire())
        self.assertEqual(self.client.set_tenant_limits(self.name, "batch", ceiling=None, floor=0), {})
        self.assertEqual(self.client.tenant_limits(self.name), {})
        self.assertEqual(self.listed(), {})
        second = batch.try_acquire()
        self.assertIsNotNone(second)
        assert second is not None
        self.assertEqual(server.semaphore(self.name)["used"], 2)
        second.release()
        first.release()

    def test_values_the_server_refuses_are_invalid_input_and_change_nothing(self) -> None:
        kept = self.client.set_tenant_limits(self.name, "batch", ceiling=2, floor=2)
        holder = self.client.semaphore(self.name, capacity=3, tenant="web").acquire(timeout=5)
        self.addCleanup(holder.release)
        # Only the server knows the capacity: floors 2 + 2 above 3.
        with self.assertRaises(tessera_client.InvalidInput) as caught:
            self.client.set_tenant_limits(self.name, "web", floor=2)
        self.assertEqual(caught.exception.status, 400)
        self.assertIn("above its capacity 3", caught.exception.message)
        # A name longer than the server allows (the client leaves names to the server).
        with self.assertRaises(tessera_client.InvalidInput) as caught:
            self.client.set_tenant_limits("n" * 300, "web", floor=1)
        self.assertEqual(caught.exception.status, 400)
        self.assertIn("invalid name", caught.exception.message)
        # And the ones the client refuses itself, sent to nothing.
        with self.assertRaises(tessera_client.InvalidInput):
            self.client.set_tenant_limits(self.name, "batch", ceiling=0)
        self.assertEqual(self.client.tenant_limits(self.name), kept)
        self.assertEqual(self.client.tenant_limits("n" * 100), {})

    def test_setting_and_listing_are_sent_again_after_a_dropped_connection(self) -> None:
        proxy = support.Proxy(server.url)
        self.addCleanup(proxy.close)
        client = tessera_client.Client(proxy.url)
        self.addCleanup(client.close)
        proxy.cut_next("after", 0.0)  # the server saw the PUT; its answer is cut
        self.assertEqual(
            client.set_tenant_limits(self.name, "batch", ceiling=2), {"batch": TenantLimits(2, 0)}
        )
        proxy.cut_next("after", 0.0)
        self.assertEqual(client.tenant_limits(self.name), {"batch": TenantLimits(2, 0)})
        self.assertEqual(proxy.cuts, 2)


class RefusedBeforeSendingTest(unittest.TestCase):
    """Bad values never leave the client (a stub server records every request)."""

    def test_bad_tenants_ceilings_and_floors_raise_invalid_input_and_send_nothing(self) -> None:
        stub = Stub([])
        self.addCleanup(stub.close)
        client = tessera_client.Client(stub.url)
        self.addCleanup(client.close)
        bad: list[tuple[Any, dict[str, Any], str]] = [
            ("", {}, "tenant"),
            ("x" * 65, {}, "tenant"),
            ("é" * 33, {}, "tenant"),  # 66 bytes
            ("line\nbreak", {}, "tenant"),
            ("\ud800", {}, "tenant"),
            (7, {}, "tenant"),
            (None, {}, "tenant"),
            ("web", {"ceiling": 0}, "ceiling"),
            ("web", {"ceiling": 1_000_001}, "ceiling"),
            ("web", {"ceiling": 2.0}, "ceiling"),
            ("web", {"ceiling": True}, "ceiling"),
            ("web", {"ceiling": "2"}, "ceiling"),
            ("web", {"floor": -1}, "floor"),
            ("web", {"floor": None}, "floor"),
            ("web", {"floor": 1.5}, "floor"),
            ("web", {"floor": False}, "floor"),
            ("web", {"ceiling": 2, "floor": 3}, "floor"),
            ("web", {"floor": 1_000_001}, "floor"),
            ("web", {"window_ceiling": 0}, "window ceiling"),
            ("web", {"window_ceiling": 101}, "window ceiling"),
            ("web", {"window_ceiling": -20}, "window ceiling"),
            ("web", {"window_ceiling": 20.0}, "window ceiling"),
            ("web", {"window_ceiling": True}, "window ceiling"),
            ("web", {"window_ceiling": "20%"}, "window ceiling"),
            ("web", {"ceiling": 2, "floor": 1, "window_ceiling": 0}, "window ceiling"),
        ]
        aclient = aio.Client(stub.url)
        for tenant, kwargs, word in bad:
            with self.assertRaises(tessera_client.InvalidInput, msg=repr((tenant, kwargs))) as caught:
                client.set_tenant_limits("s", tenant, **kwargs)
            self.assertIn(f"invalid {word}", caught.exception.message)
            self.assertIsNone(caught.exception.status)
            with self.assertRaises(tessera_client.InvalidInput):
                asyncio.run(aclient.set_tenant_limits("s", tenant, **kwargs))
        asyncio.run(aclient.close())
        self.assertEqual(stub.requests, [])


class AsyncTenantLimitsTest(unittest.IsolatedAsyncioTestCase):
    async def test_asyncio_sets_lists_and_clears(self) -> None:
        name = self.id().rsplit(".", 1)[-1]
        client = aio.Client(server.url)
        self.addAsyncCleanup(client.close)
        self.assertEqual(
            await client.set_tenant_limits(name, "batch", ceiling=3, floor=1),
            {"batch": TenantLimits(3, 1)},
        )
        self.assertEqual(await client.tenant_limits(name), {"batch": TenantLimits(3, 1)})
        self.assertEqual(
            await client.set_tenant_limits(name, "batch", ceiling=3, floor=1, window_ceiling=25),
            {"batch": TenantLimits(3, 1, 25)},
        )
        self.assertEqual(await client.tenant_limits(name), {"batch": TenantLimits(3, 1, 25)})
        self.assertEqual(await client.set_tenant_limits(name, "batch"), {})


class UnsupportedTest(unittest.TestCase):
    def test_a_store_that_keeps_no_limits_refuses_them_as_unsupported(self) -> None:
        etcd = support.Etcd()
        self.addCleanup(etcd.close)
        on_etcd = support.Server(store=etcd.url)
        self.addCleanup(on_etcd.close)
        client = tessera_client.Client(on_etcd.url)
        self.addCleanup(client.close)
        with self.assertRaises(tessera_client.Unsupported) as caught:
            client.set_tenant_limits("jobs", "batch", ceiling=1)
        e = caught.exception
        self.assertEqual((e.kind, e.status), ("unsupported", 501))
        self.assertIn("keeps no tenant ceilings or floors", e.message)
        # Nothing kept; listing there is simply empty.
        self.assertEqual(client.tenant_limits("jobs"), {})

        async def in_asyncio() -> None:
            aclient = aio.Client(on_etcd.url)
            try:
                await aclient.set_tenant_limits("jobs", "batch", floor=0)
            finally:
                await aclient.close()

        with self.assertRaises(tessera_client.Unsupported):
            asyncio.run(in_asyncio())

    def test_a_window_ceiling_is_kept_on_sqlite_too(self) -> None:
        on_sqlite = support.Server()  # the server's default store: SQLite
        self.addCleanup(on_sqlite.close)
        client = tessera_client.Client(on_sqlite.url)
        self.addCleanup(client.close)
        self.assertEqual(
            client.set_tenant_limits("jobs", "bulk", ceiling=2, window_ceiling=20),
            {"bulk": TenantLimits(2, 0, 20)},
        )
        self.assertEqual(client.tenant_limits("jobs"), {"bulk": TenantLimits(2, 0, 20)})
        # Set again without one: the window ceiling is gone, the rest kept.
        self.assertEqual(client.set_tenant_limits("jobs", "bulk", ceiling=2), {"bulk": TenantLimits(2, 0)})


if __name__ == "__main__":
    unittest.main()
