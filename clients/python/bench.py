#!/usr/bin/env python3
"""The cost of a lock acquire+release through tessera_client, against the same two HTTP
calls made by hand on one kept-alive connection (http.client, no keep-alive thread).

    python3 clients/python/bench.py                  # its own server: $TESSERA_BIN, else
                                                     # target/debug/tessera, on SQLite in /tmp
    python3 clients/python/bench.py --url http://127.0.0.1:8080 --pairs 300 --runs 7

Prints the median time per pair of each over ``--runs`` runs of ``--pairs`` pairs, and their
ratio. Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "src"))

import tessera_client  # noqa: E402


def start_server(folder: str) -> tuple[subprocess.Popen, str]:
    binary = os.environ.get("TESSERA_BIN") or str(HERE.parent.parent / "target" / "debug" / "tessera")
    out = os.path.join(folder, "serve.out")
    proc = subprocess.Popen(
        [binary, "--store", f"sqlite://{folder}/bench.db", "serve", "--listen", "127.0.0.1:0"],
        stdout=open(out, "w"),
        stderr=subprocess.DEVNULL,
    )
    for _ in range(500):
        m = re.search(r"listening on (http://[0-9.:]+)", open(out).read())
        if m:
            return proc, m.group(1)
        time.sleep(0.02)
    proc.kill()
    sys.exit("tessera serve did not start")


def raw_pairs(url: str, name: str, pairs: int) -> float:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port)
    headers = {"Content-Type": "application/json"}
    body = json.dumps({"capacity": 1, "ttl": "30s", "wait": "10s"})
    start = time.perf_counter()
    for _ in range(pairs):
        conn.request("POST", f"/v1/semaphores/{name}/acquire", body, headers)
        r = conn.getresponse()
        lease = json.loads(r.read())
        assert r.status == 200, lease
        conn.request("DELETE", f"/v1/semaphores/{name}/leases/{lease['lease_id']}")
        r = conn.getresponse()
        r.read()
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / pairs


def client_pairs(client: tessera_client.Client, name: str, pairs: int) -> float:
    lock = client.lock(name)
    start = time.perf_counter()
    for _ in range(pairs):
        with lock.acquire(timeout=10):
            pass
    return (time.perf_counter() - start) / pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url")
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="tessera-bench-")
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(folder)
    try:
        client = tessera_client.Client(url)
        raw, lib = [], []
        for run in range(args.runs):  # interleaved, so drift in load hits both alike
            raw.append(raw_pairs(url, f"bench-raw-{run}", args.pairs))
            lib.append(client_pairs(client, f"bench-client-{run}", args.pairs))
        client.close()
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
    r, c = statistics.median(raw), statistics.median(lib)
    print(f"{args.runs} runs of {args.pairs} lock acquire+release pairs, median per pair:")
    print(f"  raw HTTP (http.client)  {r * 1e6:8.0f} µs")
    print(f"  tessera_client          {c * 1e6:8.0f} µs")
    print(f"  ratio client/raw        {c / r:8.2f}")


if __name__ == "__main__":
    main()
