"""A worker process for the multi-process tests; the server is ``$TESSERA_URL``.

    worker.py lock  LOG ROUNDS NAME            enter/exit lines around each hold of a lock
    worker.py sem   LOG ROUNDS NAME CAPACITY   the same on a semaphore, with the seats
    worker.py rate  LOG ROUNDS NAME LIMIT MARGIN       one line per admitted call
    worker.py admit LOG ROUNDS NAME CAPACITY LIMIT MARGIN   enter (with the start) and exit
    worker.py hold-and-exit NAME               acquire, print the lease id, exit without release
    worker.py try NAME CAPACITY                print "held" or "free" (a try_acquire)

Each line is written with one ``write`` to a file opened with O_APPEND, right after the
acquire returned (``enter``, stamped ``time.time_ns()``) and right before the release
(``exit``), so the file's order is an order the holds really had.
"""

from __future__ import annotations

import os
import sys
import time

import tessera_client

URL = os.environ["TESSERA_URL"]


def logger(path: str):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(*fields: object) -> None:
        os.write(fd, (" ".join(map(str, fields)) + "\n").encode())

    return log


def main(cmd: str, *args: str) -> None:
    client = tessera_client.Client(URL)
    pid = os.getpid()
    if cmd in ("lock", "sem"):
        log, rounds, name = logger(args[0]), int(args[1]), args[2]
        sem = client.lock(name) if cmd == "lock" else client.semaphore(name, capacity=int(args[3]))
        for _ in range(rounds):
            with sem.acquire(timeout=30) as lease:
                log("enter", pid, lease.fence, ",".join(map(str, lease.seats)), time.time_ns())
                time.sleep(0.03)
                log("exit", pid, lease.fence)
    elif cmd == "rate":
        log, rounds, name, limit, margin = logger(args[0]), int(args[1]), args[2], args[3], args[4]
        limiter = client.rate(name, limit, margin=margin)
        for _ in range(rounds):
            decision = limiter.acquire(max_wait=30)
            log("call", pid, time.time_ns(), decision.admitted_at_us)
    elif cmd == "admit":
        log, rounds, name = logger(args[0]), int(args[1]), args[2]
        admission = client.admission(name, capacity=int(args[3]), limits=[args[4]], margin=args[5])
        for _ in range(rounds):
            with admission.acquire(timeout=30) as ticket:
                log("enter", pid, time.time_ns(), ticket.admitted_at_us)
                time.sleep(0.1)
                log("exit", pid)
    elif cmd == "hold-and-exit":
        lease = client.lock(args[0]).acquire(timeout=10)
        print(lease.lease_id, flush=True)
        # No release: the atexit hook releases it as the interpreter exits.
    elif cmd == "try":
        lease = client.semaphore(args[0], capacity=int(args[1])).try_acquire()
        print("free" if lease else "held", flush=True)
        if lease:
            lease.release()
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(*sys.argv[1:])
