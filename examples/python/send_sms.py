#!/usr/bin/env python3
"""Send notifications through a messaging API that allows 50 calls per second, 1,000 per
minute and 4 calls in flight, from as many processes and hosts as you like, with the Python
client of `tessera serve` (clients/python).

    TESSERA_URL=http://127.0.0.1:8080 python3 examples/python/send_sms.py 200

Each call first takes an admission: one of 4 permits and room in both windows, granted in
one step by the server, in FIFO order. The call starts at once: the client never returns an
admission past its use-by, so the limits hold at the moment of each call, not only at the
moment it asked. Start several of these at once: together they stay within all three limits.
"""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    import tessera_client
except ImportError:  # not installed: the copy in this repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "src"))
    import tessera_client

URL = os.environ.get("TESSERA_URL", "http://127.0.0.1:8080")
TOKEN = os.environ.get("TESSERA_TOKEN")  # with `tessera serve --tokens FILE`


def send_message(i: int, fence: int) -> None:
    # The real call to the messaging API goes here.
    sys.stdout.write(f"{time.time():.6f} pid {os.getpid()} message {i} fence {fence}\n")  # one write
    sys.stdout.flush()
    time.sleep(0.01)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    with tessera_client.Client(URL, token=TOKEN) as client:
        sms = client.admission("sms-api", capacity=4, limits=["50/s", "1000/min"])

        def send_one(i: int) -> None:
            with sms.acquire() as ticket:  # waits for a permit and a turn in both windows
                send_message(i, ticket.fence)

        with ThreadPoolExecutor(8) as pool:  # more senders than permits: the 5th waits
            list(pool.map(send_one, range(count)))


if __name__ == "__main__":
    main()
