#!/usr/bin/env python3
"""Send notifications through a messaging API that allows 50 calls per second, 1,000 per
minute and 4 calls in flight, from as many processes and hosts as you like, with the Python
client of `tessera serve` (clients/python).

    TESSERA_URL=http://127.0.0.1:8080 python3 examples/python/send_sms.py 200

Each call first takes an admission: one of 4 permits and room in both windows, granted in
one step by the server, in FIFO order. The call starts at once: the client never returns an
admission past its use-by, so the limits hold at the moment of each call, not only at the
moment it asked. Start several of these at once: together they stay within all three limits.

With SMS_PROVIDER_URL set, each message is a POST there (scripts/fake-provider.py counts
calls as the provider would); otherwise it is only printed.
"""

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    import tessera_client
except ImportError:  # not installed: the copy in this repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "src"))
    import tessera_client

URL = os.environ.get("TESSERA_URL", "http://127.0.0.1:8080")
TOKEN = os.environ.get("TESSERA_TOKEN")  # with `tessera serve --tokens FILE`
PROVIDER = os.environ.get("SMS_PROVIDER_URL")


def send_message(i: int, ticket: tessera_client.AdmittedLease) -> None:
    start, refused, fence = time.time(), "", ticket.fence
    if PROVIDER:  # the call to the messaging API (the fake one measures the admission's delay)
        call = {"message": i, "fence": fence, "admitted_at_us": ticket.admitted_at_us}
        body = json.dumps({"sender": f"py:{os.getpid()}", **call}).encode()
        request = urllib.request.Request(PROVIDER, body, {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except urllib.error.HTTPError as e:  # 429: the provider counted more than it allows
            refused = f" refused {e.code}"
    else:
        time.sleep(0.01)
    sys.stdout.write(f"{start:.6f} pid {os.getpid()} message {i} fence {fence}{refused}\n")  # one write
    sys.stdout.flush()


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    with tessera_client.Client(URL, token=TOKEN) as client:
        sms = client.admission("sms-api", capacity=4, limits=["50/s", "1000/min"])

        def send_one(i: int) -> None:
            for attempt in range(1, 6):
                try:
                    ticket = sms.acquire()  # waits for a permit and a turn in both windows
                    break
                except tessera_client.Unavailable as e:  # the server restarts, or is replaced
                    if attempt == 5:
                        raise
                    print(f"message {i}: {e}; again in 1 s", file=sys.stderr, flush=True)
                    time.sleep(1)
            try:
                send_message(i, ticket)
            finally:
                try:
                    ticket.release()
                except tessera_client.Unavailable:  # sent already: the lease expires by its TTL
                    print(f"message {i}: release failed", file=sys.stderr, flush=True)

        def summary(*stopped_by: object) -> None:
            print(f"{sms.given_back} admission(s) arrived late, given back", file=sys.stderr, flush=True)
            if stopped_by:  # SIGTERM: say what was done, then stop as the signal asks
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, summary)
        with ThreadPoolExecutor(8) as pool:  # more senders than permits: the 5th waits
            list(pool.map(send_one, range(count)))
        summary()


if __name__ == "__main__":
    main()
