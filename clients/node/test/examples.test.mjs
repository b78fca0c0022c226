// The examples in examples/node, run with small counts.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Client } from "../src/index.js";
import { REPO_ROOT, startServer } from "../testkit/server.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server.stop());

function run(script, ...args) {
  const proc = spawn(process.execPath, [join(REPO_ROOT, "examples/node", script), ...args], {
    env: { ...process.env, TESSERA_URL: server.url },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (d) => (stdout += d));
  proc.stderr.on("data", (d) => (stderr += d));
  return new Promise((res) => proc.once("close", (code) => res({ code, stdout, stderr })));
}

test("send_sms.mjs sends every message within the admission", async () => {
  const [a, b] = await Promise.all([run("send_sms.mjs", "6"), run("send_sms.mjs", "6")]);
  for (const r of [a, b]) {
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trim().split("\n");
    assert.equal(lines.length, 6);
    assert.deepEqual(lines.map((l) => Number(/message (\d+)/.exec(l)[1])).sort(), [0, 1, 2, 3, 4, 5]);
  }
  // Every message was charged. A late admission (given back by the client, or by the server
  // before it answered) keeps its charge unless it was the limiter's latest, so the windows
  // may count more than was sent, never less.
  const rate = await new Client(server.url).rate("sms-api", ["50/s", "1000/min"]).status();
  assert.ok(rate.limits[1].used >= 12, `${rate.limits[1].used} charged for 12 messages`);
  assert.equal(await new Client(server.url).semaphore("sms-api", { capacity: 4 }).status(), null);
});

test("batch_lock.mjs processes one batch in one process at a time", async () => {
  const [a, b] = await Promise.all([run("batch_lock.mjs", "7", "4"), run("batch_lock.mjs", "7", "4")]);
  for (const r of [a, b]) {
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /batch 7 item 3 fence \d+\nbatch 7 done fence \d+/);
  }
  const fence = (r) => /done fence (\d+)/.exec(r.stdout)[1];
  assert.notEqual(fence(a), fence(b), "each run held the lock under its own fence");
  assert.equal(await new Client(server.url).lock("batch/7").status(), null);
});
