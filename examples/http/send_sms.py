#!/usr/bin/env python3
"""Send messages through a messaging API that allows 50 calls per second and 1,000 per
minute, from as many processes and hosts as you like: each call first asks `tessera serve`
for a turn. Standard library only.

    TESSERA_URL=http://127.0.0.1:8080 python3 send_sms.py 200      # send 200 messages

Start several of these at once: together they never exceed the limits. Each turn is a
reservation made by the server (fair, in arrival order, no polling): the answer comes when
the turn does, and the call is made at once. If the turn is further away than max_wait, the
server answers 429 with the exact wait, and nothing is charged.
"""

import http.client
import json
import os
import sys
import time
import urllib.parse

URL = urllib.parse.urlsplit(os.environ.get("TESSERA_URL", "http://127.0.0.1:8080"))
TOKEN = os.environ.get("TESSERA_TOKEN")  # with `tessera serve --tokens FILE`
LIMITS = {"limits": ["50/s", "1000/min"], "max_wait": "5s"}


def turn(conn):
    """Blocks until the rate limits admit one more call."""
    headers = {"Content-Type": "application/json"}
    if TOKEN:
        headers["Authorization"] = f"Bearer {TOKEN}"
    while True:
        conn.request("POST", "/v1/rates/sms-api/acquire", json.dumps(LIMITS), headers)
        r = conn.getresponse()
        body = json.loads(r.read())
        if r.status == 200:
            return
        if r.status == 429:  # not within max_wait: nothing charged; wait as told
            # The server closes connections idle for 10 s: reconnect after a long wait.
            conn.close()
            time.sleep(body["retry_after_ms"] / 1000)
            continue
        raise RuntimeError(f"tessera answered {r.status}: {body['kind']}: {body['message']}")


def send_message(i):
    # The real call to the messaging API goes here.
    print(f"{time.time():.3f} pid {os.getpid()} message {i}", flush=True)


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    conn = http.client.HTTPConnection(URL.hostname, URL.port or 80, timeout=30)
    for i in range(count):
        turn(conn)
        send_message(i)


if __name__ == "__main__":
    main()
