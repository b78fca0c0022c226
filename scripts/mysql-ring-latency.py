#!/usr/bin/env python3
"""How long a MySQL/MariaDB doorbell ring takes, for the two ways a doorbell can park.

N connections park as tessera's doorbells do; N ringers each ring them in turn ROUNDS times,
as tessera rings (the PROCESSLIST check, then KILL QUERY), 5 ms apart. Prints the latency of
each ring (check + KILL) as p50 / p99 / max.

    pip3 install pymysql
    python3 scripts/mysql-ring-latency.py PORT sleep     # parked in SELECT SLEEP(60)
    python3 scripts/mysql-ring-latency.py PORT getlock   # parked in GET_LOCK on a held lock

Connects as root without a password to 127.0.0.1:PORT (a throwaway server).
"""
import os
import sys
import threading
import time

import pymysql

PORT, MODE = int(sys.argv[1]), sys.argv[2]
N, ROUNDS = 8, 100


def conn():
    return pymysql.connect(host="127.0.0.1", port=PORT, user="root", autocommit=True)


def park_query(i):
    if MODE == "sleep":
        return f"SELECT SLEEP(60) /* tessera doorbell tok{i} */"
    return f"SELECT GET_LOCK('tessera-bell-tok{i}', 60) /* tessera doorbell tok{i} */"


def bell(i, c):
    cur = c.cursor()
    while True:
        try:
            cur.execute(park_query(i))
            cur.fetchall()
        except pymysql.MySQLError:
            pass


ids, latches, lat = [], [], []
for i in range(N):
    if MODE == "getlock":
        latch = conn()
        latch.cursor().execute(f"SELECT GET_LOCK('tessera-bell-tok{i}', 0)")
        latches.append(latch)
    c = conn()
    cur = c.cursor()
    cur.execute("SELECT CONNECTION_ID()")
    ids.append(cur.fetchone()[0])
    threading.Thread(target=bell, args=(i, c), daemon=True).start()
time.sleep(0.5)


def ringer(j):
    cur = conn().cursor()
    for r in range(ROUNDS):
        i = (j + r) % N
        t = time.time()
        cur.execute(
            "SELECT INFO LIKE %s FROM information_schema.PROCESSLIST WHERE ID = %s",
            (f"%tessera doorbell tok{i}%", ids[i]),
        )
        cur.fetchall()
        cur.execute(f"KILL QUERY {ids[i]}")
        lat.append(time.time() - t)
        time.sleep(0.005)


t0 = time.time()
ringers = [threading.Thread(target=ringer, args=(j,)) for j in range(N)]
for t in ringers:
    t.start()
for t in ringers:
    t.join()
lat.sort()
ms = lambda x: f"{x * 1000:.1f} ms"
print(
    f"{MODE}: {len(lat)} rings in {time.time() - t0:.1f} s; "
    f"p50 {ms(lat[len(lat) // 2])}, p99 {ms(lat[int(len(lat) * 0.99)])}, max {ms(lat[-1])}"
)
os._exit(0)
