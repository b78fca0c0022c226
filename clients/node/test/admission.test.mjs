// Admissions: capacity and windows at the moment of use, nothing charged by a refusal, and
// the use-by check.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Client, InvalidInput, NotAdmitted } from "../src/index.js";
import { intervals, maxInWindow, maxOverlap } from "../testkit/check.mjs";
import { readLog, runWorkers, sleep, startServer, tempDir } from "../testkit/server.mjs";

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

/** A `fetch` whose answers to admission acquires are read `delayMs` late (the first `count`
 * of them), as if the process had stalled right after the answer arrived. */
function slowAdmissions(delayMs, count = Infinity) {
  let slowed = 0;
  return async (url, init) => {
    const res = await fetch(url, init);
    if (!/\/v1\/admissions\/[^/]+\/acquire$/.test(url) || res.status !== 200 || slowed >= count) return res;
    slowed++;
    const text = await res.text();
    return {
      status: res.status,
      headers: res.headers,
      text: async () => {
        await sleep(delayMs);
        return text;
      },
    };
  };
}

describe("an admission", () => {
  test("holds capacity and every window at the moment of use, across processes", async () => {
    const log = join(tmp.dir, "adm.log");
    const task = {
      mode: "admission",
      url: server.url,
      name: "provider",
      capacity: 2,
      limits: ["4/s"],
      margin: "200ms",
      count: 4,
      holdMs: 100,
      log,
    };
    await runWorkers([task, task, task]);
    const ivs = intervals(readLog(log));
    assert.equal(ivs.length, 12);
    const { max } = maxOverlap(ivs);
    assert.ok(max <= 2, `${max} calls in flight with capacity 2`);
    const starts = ivs.map((i) => i.start);
    const in1s = maxInWindow(starts, 1_000);
    assert.ok(in1s <= 4, `${in1s} calls started in one sliding second (limit 4/s)`);
  });

  test("a try refused for want of a permit holds and charges nothing", async () => {
    const adm = client.admission("full", { capacity: 1, limits: ["10/s"] });
    const held = await adm.acquire({ timeout: 1_000 });
    assert.equal(await adm.tryAcquire(), null);
    const rate = await client.rate("full", "10/s").status();
    assert.equal(rate.limits[0].used, 1, "only the held admission is charged");
    const sem = await client.semaphore("full", { capacity: 1 }).status();
    assert.deepEqual(sem.holders.map((h) => h.lease_id), [held.leaseId]);
    assert.deepEqual(sem.queue, []);
    await held.release();
  });

  test("a settle gives back what the call did not cost, once, and charges an excess", async () => {
    const adm = client.admission("settle", { capacity: 2, limits: ["20/min"], cost: 4 });
    const used = async () => (await client.rate("settle", "20/min").status()).limits[0].used;
    const a = await adm.acquire({ timeout: 1_000 });
    assert.equal(a.cost, 4);
    assert.equal(await used(), 4);
    assert.equal(await a.settle(1), true);
    assert.equal(await used(), 1);
    assert.equal(await a.settle(0), true, "ended already: the first settle's answer, nothing more");
    assert.equal(await used(), 1);
    const b = await adm.acquire({ timeout: 1_000 });
    assert.equal(await b.settle(6), true);
    assert.equal(await used(), 7, "the excess of 2 is charged");
    const c = await adm.acquire({ timeout: 1_000 });
    for (const bad of [-1, 1.5, 1_000_001]) await assert.rejects(c.settle(bad), InvalidInput);
    assert.equal(await used(), 11);
    const sem = await client.semaphore("settle", { capacity: 2 }).status();
    assert.deepEqual(sem.holders.map((h) => h.lease_id), [c.leaseId]);
    assert.equal(await c.release(), true);
  });

  test("a try refused by the windows holds and charges nothing", async () => {
    const adm = client.admission("windows", { capacity: 4, limits: ["2/s"] });
    const a = await adm.acquire({ timeout: 1_000 });
    const b = await adm.acquire({ timeout: 1_000 });
    assert.equal(await adm.tryAcquire(), null);
    await assert.rejects(adm.acquire({ timeout: 200 }), NotAdmitted);
    assert.equal((await client.rate("windows", "2/s").status()).limits[0].used, 2);
    const sem = await client.semaphore("windows", { capacity: 4 }).status();
    assert.deepEqual(sem.holders.map((h) => h.lease_id).sort(), [a.leaseId, b.leaseId].sort());
    await a.release();
    await b.release();
  });

  test("an answer read past its use-by is given back and asked again", async () => {
    const slow = new Client(server.url, { fetch: slowAdmissions(150, 1) });
    const adm = slow.admission("late-once", { capacity: 2, limits: ["10/s"], margin: "50ms" });
    const ticket = await adm.acquire({ timeout: 5_000 });
    assert.ok(adm.givenBack >= 1, "the late answer was given back");
    assert.equal(ticket.lost.aborted, false);
    const status = await client.semaphore("late-once", { capacity: 2 }).status();
    assert.deepEqual(status.holders.map((h) => h.lease_id), [ticket.leaseId], "the late lease was released");
    const rate = await client.rate("late-once", "10/s").status();
    assert.equal(rate.limits[0].used, 1, "the late admission's charge was returned");
    await ticket.release();
  });

  test("never returns a stale admission: all late means NotAdmitted, nothing held or charged", async () => {
    const slow = new Client(server.url, { fetch: slowAdmissions(150) });
    const adm = slow.admission("late-always", { capacity: 2, limits: ["100/s"], margin: "50ms" });
    await assert.rejects(adm.acquire({ timeout: 500 }), NotAdmitted);
    assert.ok(adm.givenBack >= 1);
    assert.equal(await client.semaphore("late-always", { capacity: 2 }).status(), null);
    const rate = await client.rate("late-always", "100/s").status();
    assert.ok(rate === null || rate.limits[0].used === 0, `charged: ${JSON.stringify(rate)}`);
  });

  test("withLease releases the admission", async () => {
    const adm = client.admission("scoped", { capacity: 1, limits: ["10/s"] });
    const fence = await adm.withLease(async (ticket) => ticket.fence, { timeout: 1_000 });
    assert.equal(typeof fence, "number");
    assert.equal(await client.semaphore("scoped", { capacity: 1 }).status(), null);
  });
});
