"""Test support: a throwaway `tessera serve` on SQLite in a temporary folder, worker
processes, and the checks the tests share.

The binary is ``$TESSERA_BIN``, else ``target/debug/tessera`` of the repository holding this
file. A missing binary is an error, not a skip: a suite that passes without a server tested
nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLIENT = HERE.parent  # clients/python
REPO = CLIENT.parent.parent
SRC = CLIENT / "src"
WORKER = HERE / "worker.py"

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))


def binary() -> str:
    path = os.environ.get("TESSERA_BIN") or str(REPO / "target" / "debug" / "tessera")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise RuntimeError(
            f"no tessera binary at {path}: build it (cargo build -p tessera-cli) or set TESSERA_BIN"
        )
    return path


class Server:
    """A `tessera serve` of its own: SQLite in a temporary folder, a free loopback port."""

    def __init__(self, *extra: str, store: str | None = None) -> None:
        self.bin = binary()
        self.dir = tempfile.mkdtemp(prefix="tessera-py-")
        self.store = store or f"sqlite://{self.dir}/tessera.db"
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.start()

    def start(self, listen: str = "127.0.0.1:0") -> None:
        out = open(os.path.join(self.dir, "serve.out"), "w")
        err = open(os.path.join(self.dir, "serve.err"), "w")
        self.proc = subprocess.Popen(
            [self.bin, "--store", self.store, "serve", "--listen", listen, *self.extra],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
        out.close()
        err.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with open(os.path.join(self.dir, "serve.out")) as f:
                m = re.search(r"listening on (http://[0-9.:]+)", f.readline())
            if m:
                self.url = m.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        with open(os.path.join(self.dir, "serve.err")) as f:
            raise RuntimeError(f"tessera serve did not start: {f.read()[-2000:]}")

    def stop(self) -> None:
        """SIGTERM, as an operator would; SIGKILL if it has not exited within 15 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """Runs ``tessera --store STORE ARGS…`` (an admin command on the same store)."""
        return subprocess.run(
            [self.bin, "--store", self.store, *args], capture_output=True, text=True, timeout=30
        )

    # -- raw HTTP, beside the client under test --------------------------------------------

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=15) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def semaphore(self, name: str) -> dict[str, Any]:
        """The semaphore's status, or an empty one when the server holds nothing for it."""
        status, body = self.get("/v1/semaphores/" + urllib.parse.quote(name, safe=""))
        if status == 404:
            return {"holders": [], "queue": [], "used": 0}
        assert status == 200, body
        return body

    def rate(self, name: str) -> dict[str, Any]:
        status, body = self.get("/v1/rates/" + urllib.parse.quote(name, safe=""))
        if status == 404:
            return {"limits": []}
        assert status == 200, body
        return body


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free right now (held together while they are picked)."""
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Etcd:
    """An etcd of its own (one member) in a temporary folder, on free loopback ports: a store
    whose queue does not order by tenants' shares (docs/fair-shares.md). A missing ``etcd``
    is an error, not a skip."""

    def __init__(self) -> None:
        if shutil.which("etcd") is None:
            raise RuntimeError("no etcd on PATH: install it (apt-get install etcd-server)")
        self.dir = tempfile.mkdtemp(prefix="tessera-py-etcd-")
        client_port, peer_port = free_ports(2)
        client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        with open(os.path.join(self.dir, "etcd.log"), "w") as log:
            self.proc = subprocess.Popen(
                [
                    "etcd", "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"t={peer}",
                    "--heartbeat-interval", "50", "--election-timeout", "500",
                    "--logger", "zap", "--log-level", "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.url = f"etcd://127.0.0.1:{client_port}"

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(client + "/health", timeout=1) as r:
                    return json.loads(r.read()).get("health") == "true"
            except (OSError, ValueError):
                return False

        if not wait_until(lambda: healthy() or self.proc.poll() is not None, timeout=15) or not healthy():
            self.close()
            raise RuntimeError(f"etcd did not start on {client}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def worker(url: str, *args: Any, wait: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs ``worker.py ARGS…`` against ``url``; returns the finished process (checked)."""
    proc = spawn(url, *args)
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"worker {args} exited {proc.returncode}: {err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def spawn(url: str, *args: Any, **kwargs: Any) -> subprocess.Popen:
    env = dict(os.environ, TESSERA_URL=url, PYTHONPATH=str(SRC))
    return subprocess.Popen(
        [sys.executable, str(WORKER), *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def run_all(url: str, commands: Sequence[Sequence[Any]], timeout: float = 60) -> list[str]:
    """Starts every worker at once, waits for all; returns their stdouts."""
    procs = [spawn(url, *c) for c in commands]
    outs = []
    for p, c in zip(procs, commands):
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise AssertionError(f"worker {c} exited {p.returncode}: {err}")
        outs.append(out)
    return outs


def read_log(path: str) -> list[list[str]]:
    with open(path) as f:
        return [line.split() for line in f if line.strip()]


def most_in_window(times_ns: Sequence[int], window_ns: int) -> int:
    """The most instants in any half-open window ``[t, t + window)``."""
    ts = sorted(times_ns)
    best, j = 0, 0
    for i, t in enumerate(ts):
        while ts[j] <= t - window_ns:
            j += 1
        best = max(best, i - j + 1)
    return best


def most_inside(log: Sequence[Sequence[str]]) -> int:
    """Replays ``enter``/``exit`` lines (written after acquire returned and before release):
    the most holders inside at once."""
    inside, best = 0, 0
    for line in log:
        inside += 1 if line[0] == "enter" else -1
        best = max(best, inside)
    return best


def wait_until(predicate: Any, timeout: float = 5.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def later(delay: float, fn: Any) -> threading.Thread:
    """Calls ``fn`` in a thread after ``delay`` seconds; join the returned thread."""
    t = threading.Thread(target=lambda: (time.sleep(delay), fn()))
    t.start()
    return t


class Proxy:
    """A TCP proxy in front of a server that can cut the next request's connection: before
    forwarding it (the server never sees it) or a while after (the server saw it; its answer
    never arrives). ``requests`` counts the requests that came through or were cut."""

    def __init__(self, upstream_url: str) -> None:
        host, port = upstream_url.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests = 0
        self.cuts = 0
        self._plan: tuple[str, float] | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_next(self, when: str = "before", delay: float = 0.0) -> None:
        assert when in ("before", "after")
        with self._lock:
            self._plan = (when, delay)

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if requests:
                    with self._lock:
                        self.requests += 1
                        plan, self._plan = self._plan, None
                    if plan is not None:
                        with self._lock:
                            self.cuts += 1
                        if plan[0] == "before":
                            break
                        dst.sendall(data)
                        threading.Timer(plan[1], _cut, (src, dst)).start()
                        continue
                dst.sendall(data)
        except OSError:
            pass
        _cut(src, dst)


def _cut(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
