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
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

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

    def __init__(self, *extra: str, store: Optional[str] = None) -> None:
        self.bin = binary()
        self.dir = tempfile.mkdtemp(prefix="tessera-py-")
        self.store = store or f"sqlite://{self.dir}/tessera.db"
        self.extra = extra
        self.proc: Optional[subprocess.Popen] = None
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

    def get(self, path: str) -> Tuple[int, Dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=15) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def semaphore(self, name: str) -> Dict[str, Any]:
        """The semaphore's status, or an empty one when the server holds nothing for it."""
        status, body = self.get("/v1/semaphores/" + urllib.parse.quote(name, safe=""))
        if status == 404:
            return {"holders": [], "queue": [], "used": 0}
        assert status == 200, body
        return body

    def rate(self, name: str) -> Dict[str, Any]:
        status, body = self.get("/v1/rates/" + urllib.parse.quote(name, safe=""))
        if status == 404:
            return {"limits": []}
        assert status == 200, body
        return body


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


def run_all(url: str, commands: Sequence[Sequence[Any]], timeout: float = 60) -> List[str]:
    """Starts every worker at once, waits for all; returns their stdouts."""
    procs = [spawn(url, *c) for c in commands]
    outs = []
    for p, c in zip(procs, commands):
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise AssertionError(f"worker {c} exited {p.returncode}: {err}")
        outs.append(out)
    return outs


def read_log(path: str) -> List[List[str]]:
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
