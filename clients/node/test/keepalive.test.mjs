// The keep-alive, `lost`, and leases still held at exit.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, LeaseGone, LeaseLost } from "../src/index.js";
import { aborted, cli, sleep, startServer, tempDir, waitForLine, worker } from "../testkit/server.mjs";

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client(server.url);
});
after(() => server.stop());

describe("the keep-alive", () => {
  test("holds a lease of TTL 1s for 3.5s", async () => {
    const lock = client.lock("kept", { ttl: "1s" });
    const lease = await lock.acquire({ timeout: 1_000 });
    assert.equal(lease.ttlMs, 1_000);
    await sleep(3_500);
    assert.equal(lease.lost.aborted, false, `lost: ${lease.lost.reason}`);
    assert.ok(lease.remainingMs() > 0);
    const status = await lock.status();
    assert.deepEqual(status.holders.map((h) => h.lease_id), [lease.leaseId]);
    assert.equal(await client.lock("kept").tryAcquire(), null);
    assert.equal(await lease.release(), true, "the lease was still held");
  });
});

describe("lost", () => {
  test("aborts with LeaseGone when an admin revokes the lease", async () => {
    const lease = await client.lock("revoked", { ttl: "1s" }).acquire();
    const r = cli(server.store, "revoke", "revoked", lease.leaseId);
    assert.equal(r.code, 0, r.stderr);
    const reason = await aborted(lease.lost, 5_000);
    assert.ok(reason instanceof LeaseGone, `reason: ${reason}`);
    assert.equal(reason.status, 410);
    assert.equal(lease.remainingMs(), 0);
    assert.throws(() => lease.throwIfLost(), LeaseGone);
    assert.equal(await lease.release(), false, "nothing left to release");
    // The permit is free again for others.
    const next = await client.lock("revoked").tryAcquire();
    assert.ok(next);
    await next.release();
  });

  test("aborts with LeaseLost before the lease could expire when the server is killed", async () => {
    // Two servers on one SQLite file: the client talks to `a`; `b` shows the stored lease.
    const tmp = tempDir();
    const db = `${tmp.dir}/two.db`;
    const a = await startServer({ db });
    const b = await startServer({ db });
    try {
      const lease = await new Client(a.url).lock("killed", { ttl: "1s" }).acquire();
      let lostAtUs;
      lease.lost.addEventListener("abort", () => (lostAtUs = Date.now() * 1000));
      await sleep(500); // a renewal or two
      await a.kill();
      // Nothing renews the lease any more: its stored expiry is final.
      const status = await new Client(b.url).lock("killed").status();
      const [holder] = status.holders;
      assert.equal(holder.lease_id, lease.leaseId);
      const reason = await aborted(lease.lost, 5_000);
      assert.ok(reason instanceof LeaseLost, `reason: ${reason}`);
      assert.ok(reason.cause, "the last renewal's error is the cause");
      // The SQLite store keeps time on the host's clock, as Date.now() does.
      assert.ok(
        lostAtUs < holder.expires_at_us,
        `lost fired ${(lostAtUs - holder.expires_at_us) / 1000} ms after the lease expired`,
      );
      assert.equal(await lease.release(), false);
    } finally {
      await a.stop();
      await b.stop();
      tmp.dispose();
    }
  });
});

describe("at exit", () => {
  for (const sig of ["SIGTERM", "SIGINT"]) {
    test(`${sig} releases the leases still held, then ends the process by the signal`, async () => {
      const name = `exit-${sig}`;
      const w = worker({ mode: "hold", url: server.url, name });
      const [, leaseId] = await waitForLine(w, /held (\w+)/);
      assert.equal((await client.lock(name).status()).holders[0].lease_id, leaseId);
      w.proc.kill(sig);
      const r = await w.done;
      assert.equal(r.signal, sig, `exit: ${r.code} ${r.stderr}`);
      assert.equal(await client.lock(name).status(), null, "released before the TTL");
    });
  }

  test("a program that ends without releasing releases on beforeExit", async () => {
    const w = worker({ mode: "forget", url: server.url, name: "forgotten" });
    const r = await w.done;
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /held \w+/);
    assert.equal(await client.lock("forgotten").status(), null, "released before the TTL");
  });
});
