// Tenants and shares (docs/fair-shares.md): a light tenant is not stuck behind another
// tenant's backlog, bad values never leave the client, the tenant rides along every re-ask,
// and a store without fair shares is `Unsupported`.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, InvalidInput, Unsupported } from "../src/index.js";
import { startEtcd, startServer, until } from "../testkit/server.mjs";

let server;
let client;
before(async () => {
  server = await startServer({ store: "memory://" }); // the store that orders by shares
  client = new Client(server.url);
});
after(() => server.stop());

/** How many wait in the queue of `name`. */
async function queued(name) {
  return (await client.lock(name).status())?.queue.length ?? 0;
}

/**
 * Starts `handle.acquire()` and resolves once the server has queued it; the acquire pushes
 * `label` to `order` when it returns, then releases at once.
 */
async function waitInLine(name, handle, label, order, pending) {
  const before = await queued(name);
  pending.push(
    handle.acquire({ timeout: 20_000 }).then(async (lease) => {
      order.push(label);
      await lease.release();
    }),
  );
  await until(async () => (await queued(name)) === before + 1, `${label} queued`, 5_000);
}

describe("the order of grants between tenants", () => {
  test("a light tenant's lock waiter goes ahead of another tenant's backlog", async () => {
    const name = "tenants/lock";
    const holder = await client.lock(name).acquire({ timeout: 5_000 });
    const order = [];
    const pending = [];
    const batch = client.lock(name, { tenant: "batch" });
    for (let i = 0; i < 4; i++) await waitInLine(name, batch, "batch", order, pending);
    await waitInLine(name, client.lock(name, { tenant: "web", share: 1 }), "web", order, pending);
    await holder.release();
    await Promise.all(pending);
    // FIFO would serve web last; with shares it comes after one of batch's.
    assert.deepEqual(order, ["batch", "web", "batch", "batch", "batch"]);
  });

  test("a light tenant's admission goes ahead of another tenant's backlog", async () => {
    const name = "tenants/admission";
    const admission = (tenant) =>
      client.admission(name, { capacity: 1, limits: ["1000/s"], tenant, share: 2 });
    const holder = await admission("batch").acquire({ timeout: 5_000 });
    const order = [];
    const pending = [];
    for (let i = 0; i < 3; i++) await waitInLine(name, admission("batch"), "batch", order, pending);
    await waitInLine(name, admission("web"), "web", order, pending);
    await holder.release();
    await Promise.all(pending);
    // batch has had its turn (the holder): web goes first.
    assert.deepEqual(order, ["web", "batch", "batch", "batch"]);
  });

  test("a tenant without contention is granted at once", async () => {
    const sem = client.semaphore("tenants/free", { capacity: 2, tenant: "billing", share: 3 });
    assert.equal(sem.tenant, "billing");
    assert.equal(sem.share, 3);
    const a = await sem.acquire({ timeout: 5_000 });
    const b = await sem.tryAcquire();
    assert.ok(b);
    const status = await sem.status();
    assert.equal(status.holders.length, 2);
    // Each holder shows its tenant, and the status sums them per tenant.
    assert.deepEqual(status.holders.map((h) => h.tenant), ["billing", "billing"]);
    assert.deepEqual(status.tenants, [{ tenant: "billing", holders: 2, used: 2, waiters: 0, waiting: 0 }]);
    await a.release();
    await b.release();
  });
});

/** A `fetch` that records each request and answers each acquire from `plan`: `"drop"` (the
 * connection fails without an answer) or a JSON body for 200. Other requests (release,
 * give-back) get `{done: true}`. */
function recordingFetch(plan) {
  const requests = [];
  const fetch = async (url, init) => {
    requests.push({ method: init.method, path: new URL(url).pathname, body: init.body ? JSON.parse(init.body) : undefined });
    const step = url.endsWith("/acquire") && plan.length ? plan.shift() : { done: true };
    if (step === "drop") throw new TypeError("fetch failed", { cause: { code: "ECONNRESET" } });
    return new Response(JSON.stringify(step), { status: 200, headers: { "content-type": "application/json" } });
  };
  return { fetch, requests };
}

function grant(name, leaseId, useByMs) {
  const answer = {
    name,
    lease_id: leaseId,
    fence: 1,
    seats: [0],
    weight: 1,
    holder: "stub",
    ttl_ms: 30_000,
    expires_at_us: 0,
    expires_in_ms: 29_000,
  };
  if (useByMs !== undefined) Object.assign(answer, { admitted_at_us: 1, reservation: 7, use_by_ms: useByMs });
  return answer;
}

describe("what the client sends", () => {
  test("bad tenants and shares are InvalidInput before any request", () => {
    const { fetch, requests } = recordingFetch([]);
    const stub = new Client("http://127.0.0.1:9", { fetch });
    const bad = [
      [{ tenant: "" }, "tenant"],
      [{ tenant: "x".repeat(65) }, "tenant"],
      [{ tenant: "é".repeat(33) }, "tenant"], // 66 bytes
      [{ tenant: "line\nbreak" }, "tenant"],
      [{ tenant: "nul\u0000" }, "tenant"],
      [{ tenant: "\ud800" }, "tenant"],
      [{ tenant: 7 }, "tenant"],
      [{ tenant: "web", share: 0 }, "share"],
      [{ tenant: "web", share: 1001 }, "share"],
      [{ tenant: "web", share: 1.5 }, "share"],
      [{ tenant: "web", share: "2" }, "share"],
      [{ share: 2 }, "share"], // a share without a tenant
    ];
    for (const [options, word] of bad) {
      for (const make of [
        () => stub.semaphore("s", { capacity: 2, ...options }),
        () => stub.lock("s", options),
        () => stub.admission("s", { capacity: 1, limits: ["5/s"], ...options }),
      ]) {
        assert.throws(make, (err) => {
          assert.ok(err instanceof InvalidInput, `${JSON.stringify(options)}: ${err}`);
          assert.equal(err.status, undefined);
          assert.match(err.message, new RegExp(`^invalid ${word} `));
          return true;
        });
      }
    }
    assert.deepEqual(requests, []);
    // The limits themselves pass: 64 bytes, share 1000.
    assert.equal(stub.lock("s", { tenant: "x".repeat(64), share: 1000 }).share, 1000);
    assert.equal(stub.lock("s", { tenant: "ü".repeat(32) }).share, 1);
  });

  test("the tenant rides along a re-ask after a drop and a given-back re-ask", async () => {
    const { fetch, requests } = recordingFetch([
      "drop", // the semaphore's waiting acquire loses its connection: asked again
      grant("s", "s1"),
      "drop", // the same for the admission
      grant("a", "a1", -1), // past its use-by on arrival: given back, asked again
      grant("a", "a2", 60_000),
    ]);
    const stub = new Client("http://127.0.0.1:9", { fetch });
    await (await stub.semaphore("s", { capacity: 2, tenant: "web", share: 3 }).acquire({ timeout: 5_000 })).release();
    const admission = stub.admission("a", { capacity: 2, limits: ["5/s"], tenant: "web", share: 3 });
    const ticket = await admission.acquire({ timeout: 5_000 });
    assert.equal(ticket.leaseId, "a2");
    assert.equal(admission.givenBack, 1);
    await ticket.release();
    const sem = requests.filter((r) => r.path === "/v1/semaphores/s/acquire").map((r) => r.body);
    const adm = requests.filter((r) => r.path === "/v1/admissions/a/acquire").map((r) => r.body);
    assert.equal(sem.length, 2);
    assert.equal(adm.length, 3);
    assert.equal(adm[2].given_back.lease_id, "a1");
    for (const body of [...sem, ...adm]) assert.deepEqual([body.tenant, body.share], ["web", 3]);
  });

  test("without a tenant the body names none", async () => {
    const { fetch, requests } = recordingFetch([grant("s", "s1")]);
    const stub = new Client("http://127.0.0.1:9", { fetch });
    await (await stub.lock("s").acquire({ timeout: 5_000 })).release();
    const [acquire] = requests;
    assert.equal("tenant" in acquire.body, false);
    assert.equal("share" in acquire.body, false);
  });
});

describe("a store without fair shares", () => {
  test("refuses a tenant as Unsupported (501), with nothing held", async () => {
    // etcd's queue follows its keys' create revisions: no order by shares there.
    const etcd = await startEtcd();
    const onEtcd = await startServer({ store: etcd.url });
    try {
      const etcdClient = new Client(onEtcd.url);
      await assert.rejects(etcdClient.lock("jobs", { tenant: "web", share: 2 }).acquire({ timeout: 1_000 }), (err) => {
        assert.ok(err instanceof Unsupported, `${err?.name}: ${err?.message}`);
        assert.equal(err.kind, "unsupported");
        assert.equal(err.status, 501);
        assert.match(err.message, /fair shares/);
        return true;
      });
      assert.equal(await etcdClient.lock("jobs").status(), null);
      // The refusal is the tenant's: the same lock without one is granted.
      const lease = await etcdClient.lock("jobs").acquire({ timeout: 5_000 });
      assert.deepEqual(lease.seats, [0]);
      await lease.release();
    } finally {
      await onEtcd.stop();
      await etcd.stop();
    }
  });
});
