"""Admissions: permits and windows both hold at the moment of use, a refusal holds and
charges nothing, a stale admission is given back and asked for again."""

from __future__ import annotations

import http.server
import json
import os
import threading
import unittest
from unittest import mock

import support

import tessera_client

server: support.Server

SECOND_NS = 1_000_000_000


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.close()


class AdmissionTest(unittest.TestCase):
    def setUp(self) -> None:
        self.client = tessera_client.Client(server.url)
        self.addCleanup(self.client.close)
        self.name = self.id().rsplit(".", 1)[-1]

    def used(self) -> int:
        """The cost counted in the limiter's first window, admitted or reserved."""
        return sum(limit["used"] + limit["reserved"] for limit in server.rate(self.name)["limits"][:1])

    def test_four_processes_keep_the_capacity_and_the_window_at_the_moment_of_use(self) -> None:
        log = os.path.join(server.dir, self.name + ".log")
        support.run_all(server.url, [("admit", log, 3, self.name, 2, "4/s", "200ms")] * 4)
        lines = support.read_log(log)
        self.assertEqual(len(lines), 24)
        self.assertLessEqual(support.most_inside(lines), 2)
        starts = [int(line[2]) for line in lines if line[0] == "enter"]
        self.assertLessEqual(support.most_in_window(starts, SECOND_NS), 4)
        self.assertGreaterEqual(max(starts) - min(starts), 2 * SECOND_NS)
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_an_admission_refused_for_permits_holds_and_charges_nothing(self) -> None:
        admission = self.client.admission(self.name, capacity=1, limits=["5/s"])
        with admission.acquire(timeout=5) as ticket:
            self.assertGreater(ticket.admitted_at_us, 0)
            self.assertIsNone(admission.try_acquire())
            with self.assertRaises(tessera_client.NotAdmitted) as caught:
                admission.acquire(timeout=0.3)
            self.assertEqual(caught.exception.status, 408)
            status = server.semaphore(self.name)
            self.assertEqual([h["lease_id"] for h in status["holders"]], [ticket.lease_id])
            self.assertEqual(status["queue"], [])
            self.assertEqual(self.used(), 1)

    def test_an_admission_refused_for_the_window_holds_and_charges_nothing(self) -> None:
        admission = self.client.admission(self.name, capacity=5, limits=["2/5s"])
        for _ in range(2):
            admission.acquire(timeout=0).release()
        self.assertIsNone(admission.try_acquire())
        self.assertEqual(self.used(), 2)
        self.assertEqual(server.semaphore(self.name)["holders"], [])

    def test_an_admission_past_its_use_by_is_given_back_and_asked_for_again(self) -> None:
        admission = self.client.admission(self.name, capacity=2, limits=["10/s"], margin="500ms")
        seen = []

        def stale(lease: tessera_client.AdmittedLease) -> bool:
            seen.append(lease)
            return len(seen) == 1  # the first answer came too late

        with mock.patch.object(admission, "stale", side_effect=stale):
            ticket = admission.acquire(timeout=5)
        self.assertEqual(len(seen), 2)
        self.assertIs(seen[1], ticket)
        self.assertNotEqual(seen[0].lease_id, ticket.lease_id)
        self.assertTrue(seen[0].released)
        self.assertEqual(admission.given_back, 1)
        # The first lease is released and its charge returned (it was the limiter's latest).
        self.assertEqual([h["lease_id"] for h in server.semaphore(self.name)["holders"]], [ticket.lease_id])
        self.assertEqual(self.used(), 1)
        left = ticket.use_by_remaining()
        assert left is not None
        self.assertLessEqual(left, 0.5)
        ticket.release()

    def test_an_admission_that_is_always_stale_is_never_returned(self) -> None:
        admission = self.client.admission(self.name, capacity=1, limits=["100/s"], margin="500ms")
        with mock.patch.object(admission, "stale", return_value=True):
            with self.assertRaises(tessera_client.NotAdmitted):
                admission.acquire(timeout=0.3)
        self.assertGreaterEqual(admission.given_back, 1)
        self.assertEqual(server.semaphore(self.name)["holders"], [])
        self.assertEqual(self.used(), 0)

    def test_an_admission_is_a_semaphore_lease(self) -> None:
        admission = self.client.admission(
            self.name, capacity=3, weight=2, limits=["5/s", "100/min"], ttl="1s"
        )
        with admission.acquire(timeout=5) as ticket:
            self.assertEqual(len(ticket.seats), 2)
            self.assertIsNone(self.client.semaphore(self.name, capacity=3, weight=2).try_acquire())
            self.assertTrue(self.client.semaphore(self.name, capacity=3).revoke(ticket.lease_id))
            self.assertTrue(ticket.lost.wait(1))
        self.assertEqual(self.used(), 1)

    def test_a_settle_gives_back_what_the_call_did_not_cost_once(self) -> None:
        admission = self.client.admission(self.name, capacity=2, limits=["20/min"], cost=4)
        ticket = admission.acquire(timeout=5)
        self.assertEqual(ticket.cost, 4)
        self.assertEqual(self.used(), 4)
        self.assertTrue(ticket.settle(1))
        self.assertEqual(self.used(), 1)
        self.assertFalse(ticket.settle(0), "settled already: nothing held, nothing given back")
        self.assertEqual(self.used(), 1)
        self.assertEqual(server.semaphore(self.name)["holders"], [])
        more = admission.acquire(timeout=5)
        self.assertTrue(more.settle(6))
        self.assertEqual(self.used(), 7, "the excess of 2 is charged")
        last = admission.acquire(timeout=5)
        for bad in (1_000_001, -1, 2.5):
            with self.assertRaises(tessera_client.InvalidInput):
                last.settle(bad)  # type: ignore[arg-type]
        self.assertEqual(self.used(), 11, "the refused settles changed nothing")
        self.assertEqual([h["lease_id"] for h in server.semaphore(self.name)["holders"]], [last.lease_id])
        self.assertTrue(last.release())

    def test_a_capacity_or_limits_differing_from_the_stored_ones_is_a_mismatch(self) -> None:
        # A semaphore nobody holds or waits for is forgotten, capacity included: hold one.
        with self.client.admission(self.name, capacity=2, limits=["5/s"]).acquire(timeout=5):
            with self.assertRaises(tessera_client.RateMismatch):
                self.client.admission(self.name, capacity=2, limits=["6/s"]).acquire(timeout=5)
            with self.assertRaises(tessera_client.CapacityMismatch):
                self.client.admission(self.name, capacity=3, limits=["5/s"]).acquire(timeout=5)
            self.assertEqual(self.used(), 1)


class UnsupportedTest(unittest.TestCase):
    """A server whose store has no admissions answers 501 ``unsupported``."""

    def test_a_501_unsupported_answer_raises_unsupported(self) -> None:
        body = json.dumps({"kind": "unsupported", "message": "admission is not built on this store"}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(501)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=stub.serve_forever, daemon=True).start()
        self.addCleanup(stub.server_close)
        self.addCleanup(stub.shutdown)
        client = tessera_client.Client(f"http://127.0.0.1:{stub.server_address[1]}")
        self.addCleanup(client.close)
        with self.assertRaises(tessera_client.Unsupported) as caught:
            client.admission("sms-api", capacity=4, limits=["50/s"]).acquire(timeout=1)
        e = caught.exception
        self.assertEqual((e.kind, e.status), ("unsupported", 501))
        self.assertEqual(e.message, "admission is not built on this store")


if __name__ == "__main__":
    unittest.main()
