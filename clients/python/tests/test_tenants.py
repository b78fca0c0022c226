"""Tenants and shares (docs/fair-shares.md): a light tenant is not stuck behind another
tenant's backlog, bad values never leave the client, the tenant rides along every re-ask, and
a store without fair shares is :class:`Unsupported`."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import unittest
from typing import Any

import support

import tessera_client
from tessera_client import aio

server: support.Server


def setUpModule() -> None:
    global server
    server = support.Server(store="memory://")  # the store that orders by shares


def tearDownModule() -> None:
    server.close()


def queued(name: str) -> int:
    return len(server.semaphore(name)["queue"])


class TenantOrderTest(unittest.TestCase):
    """The order in which the client's acquires return, as its user sees it."""

    def setUp(self) -> None:
        self.client = tessera_client.Client(server.url)
        self.addCleanup(self.client.close)
        self.name = self.id().rsplit(".", 1)[-1]
        self.order: list[str] = []
        self.threads: list[threading.Thread] = []
        self.failures: list[BaseException] = []

    def wait_in_line(self, handle: Any, label: str) -> None:
        """Starts an acquire of ``handle`` in a thread; returns once the server has queued it.
        The acquire notes ``label`` when it returns, then releases at once."""
        before = queued(self.name)

        def run() -> None:
            try:
                lease = handle.acquire(timeout=20)
                self.order.append(label)
                lease.release()
            except BaseException as e:  # reported by the test
                self.failures.append(e)

        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)
        self.assertTrue(support.wait_until(lambda: queued(self.name) == before + 1), label)

    def finish(self) -> list[str]:
        for t in self.threads:
            t.join(30)
        self.assertEqual(self.failures, [])
        return self.order

    def test_status_shows_each_holders_tenant_and_the_sums_per_tenant(self) -> None:
        sem = self.client.semaphore(self.name, capacity=2, tenant="billing", share=3)
        lease = sem.acquire(timeout=5)
        status = sem.status()
        assert status is not None
        self.assertEqual(status["holders"][0]["tenant"], "billing")
        self.assertEqual(
            status["tenants"],
            [{"tenant": "billing", "holders": 1, "used": 1, "waiters": 0, "waiting": 0}],
        )
        lease.release()

    def test_a_light_tenants_lock_waiter_goes_ahead_of_another_tenants_backlog(self) -> None:
        holder = self.client.lock(self.name).acquire(timeout=5)
        batch = self.client.lock(self.name, tenant="batch")
        for _ in range(4):
            self.wait_in_line(batch, "batch")
        self.wait_in_line(self.client.lock(self.name, tenant="web", share=1), "web")
        holder.release()
        # FIFO would serve web last; with shares it comes after one of batch's.
        self.assertEqual(self.finish(), ["batch", "web", "batch", "batch", "batch"])

    def test_a_light_tenants_admission_goes_ahead_of_another_tenants_backlog(self) -> None:
        def admission(tenant: str) -> tessera_client.Admission:
            return self.client.admission(
                self.name, capacity=1, limits=["1000/s"], tenant=tenant, share=2
            )

        holder = admission("batch").acquire(timeout=5)
        for _ in range(3):
            self.wait_in_line(admission("batch"), "batch")
        self.wait_in_line(admission("web"), "web")
        holder.release()
        # batch has had its turn (the holder): web goes first.
        self.assertEqual(self.finish(), ["web", "batch", "batch", "batch"])

    def test_a_tenant_without_contention_is_granted_at_once(self) -> None:
        sem = self.client.semaphore(self.name, capacity=2, tenant="billing", share=3)
        self.assertEqual((sem.tenant, sem.share), ("billing", 3))
        self.assertIn("tenant='billing'", repr(sem))
        with sem.acquire(timeout=5), sem.try_acquire() as second:
            self.assertIsNotNone(second)
            self.assertEqual(len(server.semaphore(self.name)["holders"]), 2)


class AsyncTenantTest(unittest.IsolatedAsyncioTestCase):
    async def test_asyncio_acquires_wait_as_their_tenant(self) -> None:
        name = self.id().rsplit(".", 1)[-1]
        client = aio.Client(server.url)
        self.addAsyncCleanup(client.close)
        order: list[str] = []

        async def wait(handle: aio.Semaphore, label: str) -> None:
            async with handle.acquire(timeout=20):
                order.append(label)

        holder = await client.lock(name).acquire(timeout=5)
        tasks = []
        for tenant in ["batch", "batch", "batch", "web"]:
            tasks.append(asyncio.ensure_future(wait(client.lock(name, tenant=tenant), tenant)))
            n = len(tasks)
            for _ in range(250):
                if queued(name) == n:
                    break
                await asyncio.sleep(0.02)
            self.assertEqual(queued(name), n)
        await holder.release()
        await asyncio.gather(*tasks)
        self.assertEqual(order, ["batch", "web", "batch", "batch"])


class Stub:
    """An HTTP server that records each request's body and answers each acquire from a plan:
    ``"drop"`` (closes the connection unanswered) or a JSON body for 200. Other requests
    (release, give-back) get 200 ``{"done": true}``."""

    def __init__(self, plan: list[Any]) -> None:
        self.plan = list(plan)
        self.requests: list[tuple[str, str, dict[str, Any] | None]] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size)) if size else None
                stub.requests.append((self.command, self.path, body))
                acquire = self.path.endswith("/acquire") and stub.plan
                step = stub.plan.pop(0) if acquire else {"done": True}
                if step == "drop":
                    self.close_connection = True
                    return
                data = json.dumps(step).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_DELETE = do_GET = handle_one

            def log_message(self, *args: object) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def bodies(self, path_end: str) -> list[dict[str, Any]]:
        return [b for m, p, b in self.requests if m == "POST" and p.endswith(path_end) and b]


def grant(lease_id: str, use_by_ms: int | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "lease_id": lease_id,
        "fence": 1,
        "seats": [0],
        "weight": 1,
        "holder": "stub",
        "ttl_ms": 30_000,
        "expires_at_us": 0,
        "expires_in_ms": 29_000,
    }
    if use_by_ms is not None:
        answer.update(admitted_at_us=1, reservation=7, use_by_ms=use_by_ms)
    return answer


class TenantRequestTest(unittest.TestCase):
    """What the client sends, seen by a stub server."""

    def stub(self, plan: list[Any]) -> tuple[Stub, tessera_client.Client]:
        stub = Stub(plan)
        self.addCleanup(stub.close)
        client = tessera_client.Client(stub.url)
        self.addCleanup(client.close)
        return stub, client

    def test_bad_tenants_and_shares_are_refused_before_any_request(self) -> None:
        stub, client = self.stub([])
        bad: list[dict[str, Any]] = [
            {"tenant": ""},
            {"tenant": "x" * 65},
            {"tenant": "é" * 33},  # 66 bytes
            {"tenant": "line\nbreak"},
            {"tenant": "nul\x00"},
            {"tenant": "\ud800"},
            {"tenant": 7},
            {"tenant": "web", "share": 0},
            {"tenant": "web", "share": 1001},
            {"tenant": "web", "share": 1.5},
            {"tenant": "web", "share": True},
            {"tenant": "web", "share": "2"},
            {"share": 2},  # a share without a tenant
        ]
        aclient = aio.Client(stub.url)
        for kwargs in bad:
            for make in (
                lambda: client.semaphore("s", capacity=2, **kwargs),
                lambda: client.lock("s", **kwargs),
                lambda: client.admission("s", capacity=1, limits=["5/s"], **kwargs),
                lambda: aclient.semaphore("s", capacity=2, **kwargs),
                lambda: aclient.lock("s", **kwargs),
                lambda: aclient.admission("s", capacity=1, limits=["5/s"], **kwargs),
            ):
                with self.assertRaises(tessera_client.InvalidInput, msg=repr(kwargs)) as caught:
                    make()
                word = "tenant" if "tenant" in kwargs and "share" not in kwargs else "share"
                self.assertIn(f"invalid {word}", caught.exception.message)
                self.assertIsNone(caught.exception.status)
        self.assertEqual(stub.requests, [])
        # The limits themselves pass: 64 bytes, share 1000.
        self.assertEqual(client.lock("s", tenant="x" * 64, share=1000).share, 1000)
        self.assertEqual(client.lock("s", tenant="ü" * 32).share, 1)

    def test_the_tenant_rides_along_a_reask_after_a_drop_and_a_given_back_reask(self) -> None:
        stub, client = self.stub(
            [
                "drop",  # the semaphore's waiting acquire loses its connection: asked again
                grant("s1"),
                "drop",  # the same for the admission
                grant("a1", use_by_ms=-1),  # past its use-by on arrival: given back, asked again
                grant("a2", use_by_ms=60_000),
            ]
        )
        client.semaphore("s", capacity=2, tenant="web", share=3).acquire(timeout=5).release()
        admission = client.admission("a", capacity=2, limits=["5/s"], tenant="web", share=3)
        lease = admission.acquire(timeout=5)
        self.assertEqual(lease.lease_id, "a2")
        self.assertEqual(admission.given_back, 1)
        lease.release()
        sem_bodies = stub.bodies("/v1/semaphores/s/acquire")
        adm_bodies = stub.bodies("/v1/admissions/a/acquire")
        self.assertEqual(len(sem_bodies), 2)
        self.assertEqual(len(adm_bodies), 3)
        self.assertEqual(adm_bodies[2]["given_back"]["lease_id"], "a1")
        for body in sem_bodies + adm_bodies:
            self.assertEqual((body["tenant"], body["share"]), ("web", 3), body)

    def test_without_a_tenant_the_body_names_none(self) -> None:
        stub, client = self.stub([grant("s1")])
        client.lock("s").acquire(timeout=5).release()
        (body,) = stub.bodies("/acquire")
        self.assertNotIn("tenant", body)
        self.assertNotIn("share", body)


class UnsupportedTest(unittest.TestCase):
    def test_a_store_without_fair_shares_refuses_a_tenant_as_unsupported(self) -> None:
        # etcd's queue follows its keys' create revisions: no order by shares there.
        etcd = support.Etcd()
        self.addCleanup(etcd.close)
        on_etcd = support.Server(store=etcd.url)
        self.addCleanup(on_etcd.close)
        client = tessera_client.Client(on_etcd.url)
        self.addCleanup(client.close)
        with self.assertRaises(tessera_client.Unsupported) as caught:
            client.lock("jobs", tenant="web", share=2).acquire(timeout=1)
        e = caught.exception
        self.assertEqual((e.kind, e.status), ("unsupported", 501))
        self.assertIn("fair shares", e.message)
        self.assertEqual(on_etcd.semaphore("jobs")["holders"], [])

        async def in_asyncio() -> None:
            aclient = aio.Client(on_etcd.url)
            try:
                await aclient.lock("jobs", tenant="web").acquire(timeout=1)
            finally:
                await aclient.close()

        with self.assertRaises(tessera_client.Unsupported):
            asyncio.run(in_asyncio())
        # The refusal is the tenant's: the same lock without one is granted.
        with client.lock("jobs").acquire(timeout=5) as lease:
            self.assertEqual(lease.seats, [0])


if __name__ == "__main__":
    unittest.main()
