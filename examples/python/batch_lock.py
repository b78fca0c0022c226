#!/usr/bin/env python3
"""Process batches so that no batch is ever worked on by two workers at once, however many
workers run on however many hosts: each batch has a lock of its own, `batch/ID`, held
through the Python client of `tessera serve` (clients/python).

    TESSERA_URL=http://127.0.0.1:8080 python3 examples/python/batch_lock.py OUT_DIR 1 2 3 4

A worker walks the batches: one whose lock another worker holds is skipped (that worker is
on it), one already done is skipped. The lock's lease is renewed in the background; if it is
lost (revoked, or the server unreachable for a third of its TTL) the worker stops before
another could take the batch. The done-marker records the lease's fence: a store that keeps
the highest fence per batch can refuse a write from a worker that lost its lock.
"""

import os
import sys
import time
from pathlib import Path

try:
    import tessera_client
except ImportError:  # not installed: the copy in this repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "src"))
    import tessera_client

URL = os.environ.get("TESSERA_URL", "http://127.0.0.1:8080")


def process(batch: str, lease: tessera_client.Lease, out: Path) -> bool:
    marker = out / f"batch-{batch}.done"
    if marker.exists():
        return False
    for _ in range(5):
        if lease.lost.is_set():
            sys.exit(f"lost the lock of batch {batch}: {lease.lost_reason}")
        time.sleep(0.02)  # a slice of the batch's work
    with open(marker, "x") as f:  # "x": a second worker on this batch would fail here
        f.write(f"pid {os.getpid()} fence {lease.fence}\n")
    return True


def main() -> None:
    out, batches = Path(sys.argv[1]), sys.argv[2:]
    with tessera_client.Client(URL, token=os.environ.get("TESSERA_TOKEN")) as client:
        for batch in batches:
            lease = client.lock(f"batch/{batch}", ttl=10).try_acquire()
            if lease is None:
                print(f"batch {batch}: skipped, another worker has it", flush=True)
                continue
            with lease:
                done = process(batch, lease, out)
            print(f"batch {batch}: {'processed' if done else 'already done'}", flush=True)


if __name__ == "__main__":
    main()
