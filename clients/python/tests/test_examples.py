"""The examples in examples/python, run as their users would, against a test server."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

import support

server: support.Server

EXAMPLES = support.REPO / "examples" / "python"


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.close()


def run(*args: str) -> subprocess.Popen:
    # Without PYTHONPATH: the examples find the package in the repository themselves.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TESSERA_URL"] = server.url
    return subprocess.Popen(
        [sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(test: unittest.TestCase, procs: list) -> list:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        test.assertEqual(p.returncode, 0, err)
        outs.append(out)
    return outs


class ExamplesTest(unittest.TestCase):
    def test_send_sms_keeps_fifty_per_second_across_two_processes(self) -> None:
        outs = finish(self, [run(str(EXAMPLES / "send_sms.py"), "35") for _ in range(2)])
        lines = [line.split() for out in outs for line in out.splitlines()]
        self.assertEqual(len(lines), 70)
        starts = [int(float(line[0]) * 1e9) for line in lines]
        self.assertLessEqual(support.most_in_window(starts, 1_000_000_000), 50)
        fences = [int(line[6]) for line in lines]
        self.assertEqual(len(set(fences)), 70, "every call had an admission of its own")
        self.assertEqual(server.semaphore("sms-api")["holders"], [])

    def test_batch_lock_processes_each_batch_once_across_three_workers(self) -> None:
        out_dir = os.path.join(server.dir, "batches")
        os.mkdir(out_dir)
        batches = [str(i) for i in range(8)]
        outs = finish(self, [run(str(EXAMPLES / "batch_lock.py"), out_dir, *batches) for _ in range(3)])
        processed = [line for out in outs for line in out.splitlines() if line.endswith("processed")]
        self.assertEqual(sorted(line.split()[1].rstrip(":") for line in processed), batches)
        self.assertEqual(sorted(os.listdir(out_dir)), sorted(f"batch-{b}.done" for b in batches))
        for b in batches:
            self.assertEqual(server.semaphore(f"batch/{b}")["holders"], [])


if __name__ == "__main__":
    unittest.main()
