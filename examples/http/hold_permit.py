#!/usr/bin/env python3
"""Hold one of 4 "export" slots for as long as this process runs, through an event stream:
the server keeps the lease alive while the connection is open and releases it the moment
the connection closes — also when this process crashes or is killed, so the slot comes back
at once, not after the lease's TTL. Standard library only.

    TESSERA_URL=http://127.0.0.1:8080 python3 hold_permit.py 5     # work for 5 s

Events: `grant` (the lease: lease_id, fence, seats…) first; `lost` if the lease is lost
(revoked, the store gone, the server stopping): stop using the resource at once. The end of
the stream means the same as `lost`.
"""

import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

URL = urllib.parse.urlsplit(os.environ.get("TESSERA_URL", "http://127.0.0.1:8080"))


def events(resp):
    """Yields (event, data) from a text/event-stream response."""
    name, data = None, []
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if name:
                yield name, json.loads("\n".join(data))
            name, data = None, []
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5
    conn = http.client.HTTPConnection(URL.hostname, URL.port or 80)
    body = json.dumps({"capacity": 4, "ttl": "30s", "wait": "60s", "holder": f"export-{os.getpid()}"})
    conn.request("POST", "/v1/semaphores/exports/acquire", body,
                 {"Content-Type": "application/json", "Accept": "text/event-stream"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"no slot: {resp.status} {resp.read().decode()}")
    stream = events(resp)
    kind, lease = next(stream)
    assert kind == "grant", kind
    print(f"holding seat {lease['seats'][0]} with fence {lease['fence']}", flush=True)

    lost = threading.Event()

    def watch():
        try:
            for kind, data in stream:
                if kind == "lost":
                    print(f"lost the slot: {data['reason']}", flush=True)
                    break
        except (OSError, ValueError, AttributeError):
            pass  # the connection broke, or main() closed it while this thread read
        lost.set()  # a `lost` event, or the stream ended

    threading.Thread(target=watch, daemon=True).start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not lost.is_set():
        time.sleep(0.1)  # a slice of the export's work
    stopped = lost.is_set()
    conn.close()  # releases the slot at once
    print("stopped" if stopped else "done", flush=True)


if __name__ == "__main__":
    main()
