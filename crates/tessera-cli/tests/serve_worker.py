#!/usr/bin/env python3
"""A client of `tessera serve` for the multi-process tests (standard library only).

    serve_worker.py sem  BASE_URL NAME CAPACITY RUN_MS LOG WORKER
    serve_worker.py rate BASE_URL NAME LIMIT RUN_MS LOG MARGIN

`sem` takes and releases permits through HTTP as fast as it can and writes a grant log in
the test kit's format (tessera_testkit::grantlog): acquire invoked/returned, release
invoked/returned, stamped with CLOCK_MONOTONIC (time.monotonic_ns, the clock the Rust
checker uses). A grant's certain validity is measured from the moment the acquire was
sent: sent + expires_in_ms (the server's own, already conservative, bound).

`rate` asks for turns within LIMIT and logs each admission in the rate-log format
(tessera_testkit::ratelog::RateEvent): the store's admit time, the call's monotonic
interval, and the wall-clock moment of use.
"""

import http.client
import json
import random
import sys
import time
import urllib.parse


def connect(base):
    u = urllib.parse.urlsplit(base)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)


def call(conn, method, path, body=None):
    data = None if body is None else json.dumps(body)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, json.loads(r.read() or b"{}"), r


def sem(base, name, capacity, run_ms, log_path, worker):
    conn = connect(base)
    log = open(log_path, "a", buffering=1)

    def write(event):
        event["t_ns"] = time.monotonic_ns()
        log.write(json.dumps(event) + "\n")

    write({"event": "capacity", "sem": name, "capacity": capacity})
    end = time.monotonic() + run_ms / 1000
    op = 0
    rng = random.Random(worker)
    while time.monotonic() < end:
        op += 1
        weight = rng.choice([1, 1, 2])
        wait_ms = 2000
        write({"event": "acquire_invoked", "worker": worker, "op": op, "sem": name,
               "weight": weight, "mode": {"timeout": {"timeout_ms": wait_ms}}})
        sent = time.monotonic_ns()
        status, body, _ = call(conn, "POST", f"/v1/semaphores/{name}/acquire",
                               {"capacity": capacity, "weight": weight, "wait": f"{wait_ms}ms",
                                "ttl": "30s", "holder": f"py-{worker}"})
        if status == 200:
            lease = body["lease_id"]
            write({"event": "acquire_returned", "worker": worker, "op": op,
                   "outcome": {"result": "granted", "lease_id": lease, "fence": body["fence"],
                               "seats": body["seats"], "weight": body["weight"],
                               "valid_until_ns": sent + body["expires_in_ms"] * 1_000_000}})
            time.sleep(rng.random() * 0.004)
            write({"event": "release_invoked", "lease_id": lease})
            status, body, _ = call(conn, "DELETE", f"/v1/semaphores/{name}/leases/{lease}")
            if status != 200:
                sys.exit(f"release answered {status}: {body}")
            write({"event": "release_returned", "lease_id": lease, "was_held": body["done"]})
        elif status == 408:
            write({"event": "acquire_returned", "worker": worker, "op": op,
                   "outcome": {"result": "timed_out"}})
        else:
            sys.exit(f"acquire answered {status}: {body}")


def rate(base, name, limit, run_ms, log_path, margin):
    conn = connect(base)
    log = open(log_path, "a", buffering=1)
    end = time.monotonic() + run_ms / 1000
    while time.monotonic() < end:
        invoked = time.monotonic_ns()
        status, body, r = call(conn, "POST", f"/v1/rates/{name}/acquire",
                               {"limits": [limit], "max_wait": "300ms", "margin": margin})
        returned = time.monotonic_ns()
        used_us = time.time_ns() // 1000
        if status == 200:
            log.write(json.dumps({"at_us": body["admitted_at_us"], "cost": 1,
                                  "invoked_ns": invoked, "returned_ns": returned,
                                  "reserved": True, "used_us": used_us}) + "\n")
        elif status == 429:
            if r.getheader("Retry-After") is None:
                sys.exit("429 without Retry-After")
            time.sleep(body["retry_after_ms"] / 1000)
        else:
            sys.exit(f"rate acquire answered {status}: {body}")


if __name__ == "__main__":
    mode, base, name = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "sem":
        sem(base, name, int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7])
    elif mode == "rate":
        rate(base, name, sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7])
    else:
        sys.exit(f"unknown mode {mode}")
