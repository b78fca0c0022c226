// Several instances of `tessera serve` on one store: a client that names them all keeps
// working through the others when one is killed or stops, its leases are renewed and
// released through whichever instance answers, and with every instance down it fails with
// its typed error in bounded time.

import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, test } from "node:test";
import { Client, ConnectionFailed, InvalidInput, LeaseLost } from "../src/index.js";
import { aborted, sleep, startServer } from "../testkit/server.mjs";

let a;
let b;
beforeEach(async () => {
  // Two instances on one SQLite file, as two hosts would share a Redis.
  a = await startServer();
  b = await startServer({ db: a.db });
});
afterEach(async () => {
  await b.stop();
  await a.stop();
});

/** The holders' lease ids of `name`, as instance `s` reads them from the store. */
async function holders(s, name) {
  const res = await fetch(`${s.url}/v1/semaphores/${name}`);
  if (res.status === 404) return [];
  return (await res.json()).holders.map((h) => h.lease_id);
}

describe("several instances", () => {
  test("are a list or a comma-separated string", () => {
    const joined = new Client(`${a.url}, ${b.url}`);
    assert.deepEqual(joined.urls, [a.url, b.url]);
    assert.equal(joined.currentUrl, a.url);
    assert.equal(joined.url, `${a.url},${b.url}`);
    assert.deepEqual(new Client([a.url, b.url]).urls, [a.url, b.url]);
    assert.throws(() => new Client(" , "), InvalidInput);
    assert.throws(() => new Client([a.url, "ftp://x"]), InvalidInput);
  });

  test("an instance that does not answer in time moves the client on by one, not round", async () => {
    // A fetch that never answers: every request ends at its time limit.
    const hang = (_url, { signal }) =>
      new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)));
    const client = new Client(["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"], {
      fetch: hang,
      requestTimeout: 100,
    });
    const started = performance.now();
    await assert.rejects(client.lock("slow").status(), ConnectionFailed);
    assert.ok(performance.now() - started < 1_000);
    assert.equal(client.currentUrl, "http://127.0.0.1:2");
  });

  test("a lease taken through one instance is renewed and released through another", async () => {
    const lease = await new Client(a.url).lock("shared", { ttl: "5s" }).acquire({ timeout: 5_000 });
    const path = `/v1/semaphores/shared/leases/${lease.leaseId}`;
    const renew = await fetch(`${b.url}${path}/renew`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ttl: "5s" }),
    });
    assert.equal(renew.status, 200);
    assert.ok((await renew.json()).expires_in_ms > 4_000);
    const release = await fetch(`${b.url}${path}`, { method: "DELETE" });
    assert.deepEqual(await release.json(), { done: true });
    assert.deepEqual(await holders(a, "shared"), []);
    assert.equal(await lease.release(), false, "already released through b");
  });

  test("a killed instance costs a holder nothing", async () => {
    const client = new Client([a.url, b.url], { requestTimeout: 5_000 });
    // A TTL of 1.5 s: renewed every 0.5 s, lost if no renewal succeeds for about 1 s.
    const lease = await client.lock("kept", { ttl: 1_500 }).acquire({ timeout: 5_000 });
    assert.equal(client.currentUrl, a.url);
    await a.kill(); // SIGKILL: no answer, no goodbye
    await sleep(4_500); // three TTLs: every renewal since the kill went through b
    assert.equal(lease.lost.aborted, false, `lost: ${lease.lost.reason}`);
    assert.equal(client.currentUrl, b.url);
    assert.ok(lease.remainingMs() > 500, `${lease.remainingMs()}`);
    // The store agrees: the same lease, still held, and nobody else gets in.
    assert.deepEqual(await holders(b, "kept"), [lease.leaseId]);
    assert.equal(await new Client(b.url).lock("kept").tryAcquire(), null);
    // New calls work through b; the lease is released through it.
    const other = await client.lock("kept-2").tryAcquire();
    assert.ok(other);
    await other.release();
    assert.equal(await lease.release(), true);
    assert.deepEqual(await holders(b, "kept"), []);
  });

  test("a waiting acquire moves to the next instance when one stops", async () => {
    const holder = await new Client(b.url).lock("queue", { ttl: "10s" }).acquire({ timeout: 5_000 });
    const client = new Client([a.url, b.url]);
    const waiting = client.lock("queue", { ttl: "10s" }).acquire({ timeout: 20_000 });
    for (let i = 0; i < 250; i++) {
      const res = await fetch(`${a.url}/v1/semaphores/queue`);
      if ((await res.json()).queue.length === 1) break;
      await sleep(20);
    }
    // SIGTERM: a answers its waiting acquire 503 shutting_down and gives up the place. (Not
    // `a.stop()`: that also removes a's folder, which holds the file b still uses.)
    a.proc.kill("SIGTERM");
    const stopping = a.exited;
    for (let i = 0; i < 500 && client.currentUrl !== b.url; i++) await sleep(20);
    assert.equal(client.currentUrl, b.url);
    await holder.release();
    const lease = await waiting;
    await stopping;
    assert.deepEqual(await holders(b, "queue"), [lease.leaseId]);
    assert.equal(await lease.release(), true);
  });

  test("every instance down is a typed error in bounded time", async () => {
    const client = new Client([a.url, b.url]);
    const lease = await client.lock("gone", { ttl: 1_500 }).acquire({ timeout: 5_000 });
    await a.kill();
    await b.kill();
    let started = performance.now();
    await assert.rejects(client.lock("gone-2").acquire({ timeout: 30_000 }), ConnectionFailed);
    // Three rounds over both instances per request, four requests: well under the timeout.
    assert.ok(performance.now() - started < 5_000, `${performance.now() - started} ms`);
    started = performance.now();
    await assert.rejects(client.lock("gone-2").tryAcquire(), ConnectionFailed);
    assert.ok(performance.now() - started < 2_000, `${performance.now() - started} ms`);
    // The holder is told before its lease could expire.
    const reason = await aborted(lease.lost, 3_000);
    assert.ok(reason instanceof LeaseLost, `reason: ${reason}`);
  });
});
