#!/usr/bin/env python3
"""A fake messaging API that counts calls as a real provider would: 50 per sliding second,
1,000 per sliding minute, over the calls it accepted; a call beyond either is answered 429.

    python3 scripts/fake-provider.py [--port 0] [--report FILE]

Every POST is one call, counted at its arrival (time.monotonic): when its connection was
accepted for the first call on a connection, else when its request line was read (so the
start of a handler thread on a busy host delays no count). The body may be JSON with
"sender", "message", "fence", "admitted_at_us" and "hold_ms"; the call stays in flight for
hold_ms (or an X-Hold-Ms header; default 10) before its answer. With admitted_at_us (the
admission instant on the store's clock, µs since the epoch: this clock when the store runs
on this host) it measures each call's delay from admission to arrival. The first line on
stdout names the address.

GET /report answers the report as JSON, GET /calls every call; SIGTERM (or SIGINT) writes
the report to --report (else stdout) and exits. The report: calls, accepted, refused, the
most calls that arrived in any sliding 1 s and 60 s window (all calls, refused ones too),
the most in flight at once, calls per sender, the delays from admission to arrival
(percentiles, and how many exceeded 20 ms, the default margin) and the busiest second's
calls. Standard library only.
"""

from __future__ import annotations

import argparse
import bisect
import json
import signal
import sys
import threading
import time
from collections import Counter, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LIMITS = ((50, 1.0), (1000, 60.0))  # (calls, seconds), sliding, over accepted calls
DEFAULT_HOLD_MS = 10


class Provider:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.arrivals: list[float] = []  # every call, in arrival order
        self.accepted: list[deque[float]] = [deque() for _ in LIMITS]
        self.refused: list[dict] = []
        self.senders: Counter[str] = Counter()
        self.fences: Counter[int] = Counter()
        self.delays: dict[str, list[float]] = {}  # per sender, ms from admission to arrival
        self.calls: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0

    def arrive(self, t: float) -> bool:
        """Counts a call arriving at t; whether it is accepted."""
        with self.lock:
            self.arrivals.append(t)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            for window, (_, period) in zip(self.accepted, LIMITS):
                while window and window[0] <= t - period:
                    window.popleft()
            ok = all(len(w) < n for w, (n, _) in zip(self.accepted, LIMITS))
            if ok:
                for w in self.accepted:
                    w.append(t)
            return ok

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def note(self, ok: bool, t: float, wall: float, body: dict) -> None:
        call = {"at_s": round(t - self.started, 6), "wall": wall, "ok": ok}
        call.update((k, body[k]) for k in ("sender", "message", "fence", "admitted_at_us") if k in body)
        with self.lock:
            if isinstance(body.get("admitted_at_us"), int):
                call["delay_ms"] = round(wall * 1000 - body["admitted_at_us"] / 1000, 3)
                self.delays.setdefault(str(body.get("sender", "?")), []).append(call["delay_ms"])
            self.calls.append(call)
            self.senders[str(body.get("sender", "?"))] += 1
            if isinstance(body.get("fence"), int):
                self.fences[body["fence"]] += 1
            if not ok:
                self.refused.append(
                    {"at_s": round(t - self.started, 6), "sender": body.get("sender"), "fence": body.get("fence")}
                )

    def report(self) -> dict:
        with self.lock:
            times = sorted(self.arrivals)
            out = {
                "calls": len(times),
                "accepted": len(times) - len(self.refused),
                "refused": len(self.refused),
                "max_1s": 0,
                "max_60s": 0,
                "max_in_flight": self.max_in_flight,
                "in_flight_now": self.in_flight,
                "accepted_last_60s": sum(t > time.monotonic() - 60 for t in self.accepted[1]),
                "duplicate_fences": sum(1 for n in self.fences.values() if n > 1),
                "by_sender": dict(sorted(self.senders.items())),
                "first_refused": self.refused[:20],
            }
            delays = {sender: list(d) for sender, d in self.delays.items()}
            calls = sorted(self.calls, key=lambda c: c["at_s"])
        if delays:
            out["delay_ms"] = summary([d for ds in delays.values() for d in ds])
            out["delay_ms_by_sender"] = {sender: summary(d) for sender, d in sorted(delays.items())}
        for key, period in (("max_1s", 1.0), ("max_60s", 60.0)):
            best, at = 0, 0.0
            for i, t in enumerate(times):  # windows [t, t + period) starting at each call
                n = bisect.bisect_left(times, t + period, i) - i
                if n > best:
                    best, at = n, t
            out[key] = best
            out[key + "_at_s"] = round(at - self.started, 6)
        # The busiest second's calls, to see where a surplus came from.
        start = out["max_1s_at_s"]
        out["max_1s_calls"] = [c for c in calls if start <= c["at_s"] < start + 1.0]
        return out

    def all_calls(self) -> list[dict]:
        with self.lock:
            return sorted(self.calls, key=lambda c: c["at_s"])


def summary(delays: list[float]) -> dict:
    delays = sorted(delays)
    at = lambda q: round(delays[min(len(delays) - 1, int(q * len(delays)))], 1)  # noqa: E731
    return {
        "calls": len(delays),
        "p50": at(0.5),
        "p99": at(0.99),
        "max": round(delays[-1], 1),
        "over_20ms": sum(d > 20 for d in delays),
    }


PROVIDER = Provider()
ACCEPTED: dict[int, tuple[float, float]] = {}  # a new connection's socket: when it was accepted


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def process_request(self, request, client_address) -> None:  # in the accepting thread
        ACCEPTED[id(request)] = (time.monotonic(), time.time())
        super().process_request(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as fetch expects

    def setup(self) -> None:
        self.accepted_at = ACCEPTED.pop(id(self.request), None)
        super().setup()

    def parse_request(self) -> bool:
        # The first request of a connection arrived when it was accepted; a later one when
        # its request line was read (right before this).
        self.arrived, self.accepted_at = self.accepted_at or (time.monotonic(), time.time()), None
        return super().parse_request()

    def do_POST(self) -> None:
        t, wall = self.arrived  # the call counts then, whatever happens next
        ok = PROVIDER.arrive(t)
        try:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else {}
                body = body if isinstance(body, dict) else {}
            except ValueError:
                body = {}
            hold = body.get("hold_ms", self.headers.get("X-Hold-Ms", DEFAULT_HOLD_MS))
            time.sleep(max(0.0, float(hold)) / 1000)
            PROVIDER.note(ok, t, wall, body)
        finally:
            PROVIDER.leave()
        self.answer(200 if ok else 429, {"accepted": ok})

    def do_GET(self) -> None:
        if self.path == "/report":
            self.answer(200, PROVIDER.report())
        elif self.path == "/calls":
            self.answer(200, PROVIDER.all_calls())
        else:
            self.answer(404, {"error": "POST a call, or GET /report or /calls"})

    def answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--report", help="file for the report at SIGTERM (default stdout)")
    args = parser.parse_args()

    server = Server((args.host, args.port), Handler)
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass
    report = json.dumps(PROVIDER.report(), indent=2)
    if args.report:
        with open(args.report, "w") as f:
            f.write(report + "\n")
    else:
        print(report, flush=True)


if __name__ == "__main__":
    main()
