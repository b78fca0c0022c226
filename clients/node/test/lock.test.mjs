// Locks and semaphores: exclusion and capacity across processes, release, timeouts.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Client, NoPermit } from "../src/index.js";
import { intervals, maxOverlap } from "../testkit/check.mjs";
import { readLog, runWorkers, startServer, tempDir, until } from "../testkit/server.mjs";

let server;
let client;
let tmp;
before(async () => {
  server = await startServer();
  client = new Client(server.url);
  tmp = tempDir();
});
after(async () => {
  await server.stop();
  tmp.dispose();
});

describe("a lock", () => {
  test("is held by one process at a time", async () => {
    const log = join(tmp.dir, "lock.log");
    const task = { mode: "semaphore", url: server.url, name: "jobs/lock", capacity: 1, rounds: 5, holdMs: 20, log };
    await runWorkers([task, task, task, task]);
    const ivs = intervals(readLog(log));
    assert.equal(ivs.length, 20);
    const { max } = maxOverlap(ivs);
    assert.equal(max, 1, "two holders of a lock at once");
    // Fences increase in the order the lock was taken.
    const fences = ivs.sort((a, b) => (a.start < b.start ? -1 : 1)).map((i) => Number(i.rest[0]));
    assert.deepEqual(fences, [...fences].sort((a, b) => a - b));
    assert.equal(new Set(fences).size, 20);
  });

  test("names holding / are one lock, sent percent-encoded", async () => {
    const lease = await client.lock("jobs/42").acquire({ timeout: 1_000 });
    assert.equal(lease.name, "jobs/42");
    assert.match(lease.leaseId, /^[0-9a-f]{32}$/);
    assert.deepEqual(lease.seats, [0]);
    assert.equal(await client.lock("jobs/42").tryAcquire(), null);
    const status = await client.lock("jobs/42").status();
    assert.deepEqual(status.holders.map((h) => h.lease_id), [lease.leaseId]);
    assert.equal(await lease.release(), true);
  });

  test("release is idempotent", async () => {
    const lock = client.lock("release-twice");
    const lease = await lock.acquire({ timeout: 1_000 });
    const first = lease.release();
    const second = lease.release();
    assert.equal(first, second, "every call returns the first call's promise");
    assert.equal(await first, true);
    assert.equal(await lease.release(), true);
    assert.equal(lease.released, true);
    assert.equal(lease.lost.aborted, false, "a release is not a loss");
    assert.equal(await lock.status(), null, "nothing held after release");
    // The server agrees: a second delete finds nothing.
    const res = await fetch(`${server.url}/v1/semaphores/release-twice/leases/${lease.leaseId}`, { method: "DELETE" });
    assert.deepEqual(await res.json(), { done: false });
  });

  test("a timeout rejects with NoPermit and leaves nothing held or queued", async () => {
    const lock = client.lock("timeout");
    const held = await lock.acquire();
    await assert.rejects(lock.acquire({ timeout: 300 }), (err) => {
      assert.ok(err instanceof NoPermit);
      assert.equal(err.kind, "no_permit");
      assert.equal(err.status, 408);
      return true;
    });
    assert.equal(await lock.tryAcquire(), null);
    const status = await lock.status();
    assert.deepEqual(status.holders.map((h) => h.lease_id), [held.leaseId]);
    assert.deepEqual(status.queue, []);
    await held.release();
    assert.equal(await lock.status(), null);
  });

  test("a wait longer than one request's cap is asked again until granted", async () => {
    let requests = 0;
    const counting = (...args) => (requests++, fetch(...args));
    const short = new Client(server.url, { maxWaitPerRequest: 100, fetch: counting });
    const held = await client.lock("long-wait").acquire();
    setTimeout(() => held.release(), 450);
    const lease = await short.lock("long-wait").acquire({ timeout: 10_000 });
    assert.equal(held.released, true);
    assert.ok(requests >= 3, `${requests} requests for a wait of 4+ caps`);
    assert.equal(await lease.release(), true);
    // And gives up at the timeout, with nothing queued.
    const again = await client.lock("long-wait").acquire();
    await assert.rejects(short.lock("long-wait").acquire({ timeout: 350 }), NoPermit);
    assert.deepEqual((await client.lock("long-wait").status()).queue, []);
    await again.release();
  });

  test("an aborted acquire leaves the queue", async () => {
    const held = await client.lock("abort").acquire();
    const ac = new AbortController();
    const waiting = client.lock("abort").acquire({ signal: ac.signal });
    await until(async () => (await client.lock("abort").status()).queue.length === 1, "queued");
    ac.abort(new Error("stop waiting"));
    await assert.rejects(waiting, /stop waiting/);
    await until(async () => (await client.lock("abort").status()).queue.length === 0, "the queue place given up");
    assert.deepEqual((await client.lock("abort").status()).holders.map((h) => h.lease_id), [held.leaseId]);
    await held.release();
  });

  test("withLease releases when the function returns and when it throws", async () => {
    const lock = client.lock("scoped");
    const value = await lock.withLease(async (lease) => {
      assert.equal((await lock.status()).holders[0].lease_id, lease.leaseId);
      return 42;
    });
    assert.equal(value, 42);
    assert.equal(await lock.status(), null);
    await assert.rejects(
      lock.withLease(async () => {
        throw new Error("boom");
      }),
      /boom/,
    );
    assert.equal(await lock.status(), null);
  });
});

describe("a semaphore", () => {
  test("never has more holders than its capacity, across processes", async () => {
    const log = join(tmp.dir, "sem.log");
    const task = { mode: "semaphore", url: server.url, name: "gpus", capacity: 3, rounds: 4, holdMs: 40, log };
    await runWorkers(Array(6).fill(task));
    const ivs = intervals(readLog(log));
    assert.equal(ivs.length, 24);
    const { max, groups } = maxOverlap(ivs);
    assert.ok(max <= 3, `${max} holders of a semaphore of capacity 3`);
    for (const open of groups) {
      const seats = open.map((i) => i.rest[1]);
      assert.equal(new Set(seats).size, seats.length, `one seat held twice: ${seats}`);
      assert.ok(seats.every((s) => ["0", "1", "2"].includes(s)));
    }
  });

  test("grants capacity permits and refuses the next", async () => {
    const sem = client.semaphore("slots", { capacity: 3 });
    const leases = [await sem.acquire(), await sem.acquire(), await sem.acquire()];
    assert.deepEqual(leases.flatMap((l) => l.seats).sort(), [0, 1, 2]);
    assert.equal(await sem.tryAcquire(), null);
    await leases[1].release();
    const next = await sem.tryAcquire();
    assert.deepEqual(next?.seats, leases[1].seats);
    await Promise.all([...leases, next].map((l) => l.release()));
    const heavy = await client.semaphore("slots", { capacity: 3, weight: 3 }).acquire({ timeout: 1_000 });
    assert.equal(heavy.weight, 3);
    assert.equal(await sem.tryAcquire(), null);
    await heavy.release();
  });
});
