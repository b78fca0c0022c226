#!/usr/bin/env python3
# etcd CPU per transaction of the shapes an etcd join uses, with 0, 2,000 and 10,000 records
# under the queue prefix: a put, the uncontended grant's range compare ("no q/ key at all"),
# a count-only range. Starts a throwaway etcd member (etcd-server on PATH) on free loopback
# ports and reads its process_cpu_seconds_total. Usage: scripts/etcd-txn-cost.py [TXNS_PER_SHAPE]
import base64, json, sys, time, urllib.request, subprocess, socket, os, tempfile, shutil

def b64(s): return base64.b64encode(s.encode()).decode()
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

cp, pp = free_port(), free_port()
d = tempfile.mkdtemp()
etcd = subprocess.Popen(["etcd", "--name", "t1", "--data-dir", d + "/data",
    "--listen-client-urls", f"http://127.0.0.1:{cp}", "--advertise-client-urls", f"http://127.0.0.1:{cp}",
    "--listen-peer-urls", f"http://127.0.0.1:{pp}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
    "--initial-cluster", f"t1=http://127.0.0.1:{pp}", "--log-level", "warn", "--logger", "zap"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
base = f"http://127.0.0.1:{cp}"
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
def cpu():
    for l in urllib.request.urlopen(base + "/metrics").read().decode().splitlines():
        if l.startswith("process_cpu_seconds_total "): return float(l.split()[1])
for _ in range(100):
    try: post("/v3/kv/range", {"key": b64("x")}); break
    except Exception: time.sleep(0.1)
Q = "p/sem/n#q/"; END = "p/sem/n#q0"
val = b64(json.dumps({"w":1,"h":"chaos-runner","ttl":30,"e":1765000000000000,"hl":7587890123456789012,"wt":3}))
def fill(n, start):
    for i in range(start, n):
        post("/v3/kv/put", {"key": b64(f"{Q}{i:032x}"), "value": val})
shapes = {
  "put one key": lambda i: {"success": [{"request_put": {"key": b64(f"o/{i}"), "value": val}}]},
  "compare version over the q/ prefix": lambda i: {"compare": [{"key": b64(Q), "range_end": b64(END), "target": "VERSION", "result": "EQUAL", "version": "0"}],
      "success": [{"request_put": {"key": b64(f"o/{i}"), "value": val}}], "failure": [{"request_put": {"key": b64(f"o/{i}"), "value": val}}]},
  "count-only range over q/": lambda i: {"success": [{"request_range": {"key": b64(Q), "range_end": b64(END), "count_only": True}}, {"request_put": {"key": b64(f"o/{i}"), "value": val}}]},
}
M = int(sys.argv[1]) if len(sys.argv) > 1 else 300
have = 0
for n in [0, 2000, 10000]:
    fill(n, have); have = n
    for name, shape in shapes.items():
        c0, t0 = cpu(), time.time()
        for i in range(M): post("/v3/kv/txn", shape(i))
        c1, t1 = cpu(), time.time()
        print(f"queue {n:>5}: {name:<36} etcd CPU {1000*(c1-c0)/M:6.2f} ms/txn, {1000*(t1-t0)/M:6.2f} ms/txn wall", flush=True)
etcd.kill(); etcd.wait(); shutil.rmtree(d)
