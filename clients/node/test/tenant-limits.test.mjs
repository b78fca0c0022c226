// Tenants' ceilings and floors (docs/fair-shares.md#ceilings-and-floors) and window ceilings
// ("A ceiling on a share of the windows"): set and listed through the client, a ceiling seen
// by the client's own acquires and a window ceiling by its own admissions, removed again, bad
// values typed with nothing changed, and a store that keeps none is `Unsupported`.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, InvalidInput, NoPermit, NotAdmitted, Unsupported } from "../src/index.js";
import { startEtcd, startServer, until } from "../testkit/server.mjs";

let server;
let client;
before(async () => {
  server = await startServer({ store: "memory://" }); // the store that keeps tenant limits
  client = new Client(server.url);
});
after(() => server.stop());

/** The limits as the server lists them to a bare GET, beside the client. */
async function listed(name) {
  const res = await fetch(`${server.url}/v1/semaphores/${encodeURIComponent(name)}/tenants`);
  assert.equal(res.status, 200);
  return (await res.json()).tenants;
}

/** The semaphore's status, or an empty one when nobody holds or waits. */
async function status(name) {
  return (await client.lock(name).status()) ?? { used: 0, holders: [], queue: [], tenants: [] };
}

/** Asserts that `promise` rejects with an error of `Class`, `status` and a message matching
 * `re`. */
async function rejectsWith(promise, Class, status, re) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof Class, `${err?.name}: ${err?.message}`);
    assert.equal(err.status, status);
    assert.match(err.message, re);
    return true;
  });
}

describe("ceilings and floors on memory://", () => {
  test("limits set are returned and listed by tenant", async () => {
    const name = "limits/listed";
    assert.deepEqual(await client.tenantLimits(name), {});
    assert.deepEqual(await client.setTenantLimits(name, "batch", { ceiling: 2, floor: 1 }), {
      batch: { ceiling: 2, floor: 1 },
    });
    // No ceiling, a floor only; a tenant with "/" and non-ASCII text is one path segment;
    // "__proto__" is a tenant like any other.
    await client.setTenantLimits(name, "__proto__", { ceiling: 5 });
    const after = await client.setTenantLimits(name, "web/é", { floor: 1 });
    const expected = Object.fromEntries([
      ["__proto__", { ceiling: 5, floor: 0 }],
      ["batch", { ceiling: 2, floor: 1 }],
      ["web/é", { ceiling: null, floor: 1 }],
    ]);
    assert.deepEqual(after, expected);
    assert.deepEqual(Object.keys(after).sort(), ["__proto__", "batch", "web/é"]);
    assert.equal(Object.getPrototypeOf(after), Object.prototype);
    assert.deepEqual(await client.tenantLimits(name), expected);
    const raw = await listed(name);
    assert.deepEqual(raw.batch, { ceiling: 2, floor: 1 });
    assert.deepEqual(raw["web/é"], { ceiling: null, floor: 1 });
    // The same values again change nothing (the request is idempotent).
    assert.deepEqual(await client.setTenantLimits(name, "batch", { ceiling: 2, floor: 1 }), expected);
    // Kept for the name while nobody holds or waits; another name has none.
    assert.equal(await client.lock(name).status(), null);
    assert.deepEqual(await client.tenantLimits(`${name}-other`), {});
  });

  test("window ceilings set are returned, listed and removed", async () => {
    const name = "limits/window-listed";
    assert.deepEqual(await client.setTenantLimits(name, "bulk", { windowCeiling: 20 }), {
      bulk: { ceiling: null, floor: 0, windowCeiling: 20 },
    });
    const expected = {
      bulk: { ceiling: null, floor: 0, windowCeiling: 20 },
      web: { ceiling: 3, floor: 1, windowCeiling: 100 },
    };
    assert.deepEqual(await client.setTenantLimits(name, "web", { ceiling: 3, floor: 1, windowCeiling: 100 }), expected);
    assert.deepEqual(await client.tenantLimits(name), expected);
    assert.deepEqual(await listed(name), {
      bulk: { ceiling: null, floor: 0, window_ceiling: 20 },
      web: { ceiling: 3, floor: 1, window_ceiling: 100 },
    });
    // Each call sets all of a tenant's limits: a window ceiling left out (or null) is removed.
    assert.deepEqual(await client.setTenantLimits(name, "web", { ceiling: 3, floor: 1, windowCeiling: null }), {
      bulk: { ceiling: null, floor: 0, windowCeiling: 20 },
      web: { ceiling: 3, floor: 1 },
    });
    assert.deepEqual((await listed(name)).web, { ceiling: 3, floor: 1 });
    assert.deepEqual(await client.setTenantLimits(name, "bulk"), { web: { ceiling: 3, floor: 1 } });
  });

  test("a tenant at its window ceiling is refused while another tenant is admitted", async () => {
    const name = "limits/window-admitted";
    // 20% of 10 a minute: bulk is admitted twice in any minute, whatever web leaves unused.
    await client.setTenantLimits(name, "bulk", { windowCeiling: 20 });
    const bulk = client.admission(name, { capacity: 5, limits: ["10/min"], tenant: "bulk" });
    const web = client.admission(name, { capacity: 5, limits: ["10/min"], tenant: "web" });
    for (let i = 0; i < 2; i++) {
      const ticket = await bulk.tryAcquire();
      assert.ok(ticket, `bulk's admission ${i + 1}`);
      await ticket.release();
    }
    assert.equal(await bulk.tryAcquire(), null);
    await assert.rejects(bulk.acquire({ timeout: 200 }), NotAdmitted);
    // The shared window has 8 slots left: web is admitted, and bulk still is not.
    for (let i = 0; i < 3; i++) {
      const ticket = await web.tryAcquire();
      assert.ok(ticket, `web's admission ${i + 1}`);
      await ticket.release();
    }
    assert.equal(await bulk.tryAcquire(), null);
    assert.deepEqual((await status(name)).holders, []);
    // Without the window ceiling bulk is admitted again from the shared window.
    await client.setTenantLimits(name, "bulk");
    const ticket = await bulk.tryAcquire();
    assert.ok(ticket);
    await ticket.release();
  });

  test("a tenant at its ceiling waits while another tenant is granted", async () => {
    const name = "limits/ceiling";
    await client.setTenantLimits(name, "batch", { ceiling: 1 });
    const batch = client.semaphore(name, { capacity: 3, tenant: "batch" });
    const web = client.semaphore(name, { capacity: 3, tenant: "web" });
    const first = await batch.acquire({ timeout: 5_000 });
    const second = batch.acquire({ timeout: 1_500 }).then(
      (lease) => lease,
      (err) => err,
    );
    await until(async () => (await status(name)).queue.length === 1, "batch's second queued", 5_000);
    // Two permits are free, batch's second acquire waits at its ceiling, and web's does not
    // wait behind it.
    const lease = await web.acquire({ timeout: 1_000 });
    const s = await status(name);
    assert.deepEqual([s.used, s.available], [2, 1]);
    assert.deepEqual(s.queue.map((w) => w.tenant), ["batch"]);
    assert.equal(s.tenants.find((t) => t.tenant === "batch").ceiling, 1);
    await lease.release();
    const outcome = await second;
    assert.ok(outcome instanceof NoPermit, `${outcome?.name}: ${outcome?.message}`);
    assert.equal((await status(name)).queue.length, 0);
    assert.equal(await batch.tryAcquire(), null); // a permit is free, but not for batch
    await first.release();
    const again = await batch.acquire({ timeout: 1_000 });
    assert.equal((await status(name)).used, 1);
    await again.release();
  });

  test("clearing the limits lets the tenant past its old ceiling", async () => {
    const name = "limits/clear";
    await client.setTenantLimits(name, "batch", { ceiling: 1, floor: 1 });
    const batch = client.semaphore(name, { capacity: 2, tenant: "batch" });
    const first = await batch.acquire({ timeout: 5_000 });
    assert.equal(await batch.tryAcquire(), null);
    assert.deepEqual(await client.setTenantLimits(name, "batch", { ceiling: null, floor: 0 }), {});
    assert.deepEqual(await client.tenantLimits(name), {});
    assert.deepEqual(await listed(name), {});
    const second = await batch.tryAcquire();
    assert.ok(second);
    assert.equal((await status(name)).used, 2);
    await second.release();
    await first.release();
  });

  test("values the server refuses are InvalidInput (400) and change nothing", async () => {
    const name = "limits/refused";
    const kept = await client.setTenantLimits(name, "batch", { ceiling: 2, floor: 2 });
    const holder = await client.semaphore(name, { capacity: 3, tenant: "web" }).acquire({ timeout: 5_000 });
    try {
      // Only the server knows the capacity: floors 2 + 2 above 3.
      await rejectsWith(client.setTenantLimits(name, "web", { floor: 2 }), InvalidInput, 400, /above its capacity 3/);
      // A name longer than the server allows (the client leaves names to the server).
      await rejectsWith(client.setTenantLimits("n".repeat(300), "web", { floor: 1 }), InvalidInput, 400, /invalid name/);
      // And one the client refuses itself.
      await rejectsWith(client.setTenantLimits(name, "batch", { ceiling: 0 }), InvalidInput, undefined, /invalid ceiling/);
      assert.deepEqual(await client.tenantLimits(name), kept);
    } finally {
      await holder.release();
    }
  });
});

describe("what the client sends", () => {
  test("bad tenants, ceilings and floors are InvalidInput before any request", async () => {
    const requests = [];
    const fetch = async (url, init) => {
      requests.push({ method: init.method, url, body: init.body && JSON.parse(init.body) });
      return new Response(JSON.stringify({ tenants: {} }), { status: 200, headers: { "content-type": "application/json" } });
    };
    const stub = new Client("http://127.0.0.1:9", { fetch });
    const bad = [
      ["", {}, "tenant"],
      ["x".repeat(65), {}, "tenant"],
      ["é".repeat(33), {}, "tenant"], // 66 bytes
      ["line\nbreak", {}, "tenant"],
      ["\ud800", {}, "tenant"],
      [7, {}, "tenant"],
      [undefined, {}, "tenant"],
      ["web", { ceiling: 0 }, "ceiling"],
      ["web", { ceiling: 1_000_001 }, "ceiling"],
      ["web", { ceiling: 2.5 }, "ceiling"],
      ["web", { ceiling: "2" }, "ceiling"],
      ["web", { ceiling: true }, "ceiling"],
      ["web", { floor: -1 }, "floor"],
      ["web", { floor: null }, "floor"],
      ["web", { floor: 1.5 }, "floor"],
      ["web", { floor: "0" }, "floor"],
      ["web", { ceiling: 2, floor: 3 }, "floor"],
      ["web", { floor: 1_000_001 }, "floor"],
      ["web", { windowCeiling: 0 }, "window ceiling"],
      ["web", { windowCeiling: 101 }, "window ceiling"],
      ["web", { windowCeiling: -20 }, "window ceiling"],
      ["web", { windowCeiling: 20.5 }, "window ceiling"],
      ["web", { windowCeiling: "20%" }, "window ceiling"],
      ["web", { windowCeiling: true }, "window ceiling"],
      ["web", { ceiling: 2, floor: 1, windowCeiling: 0 }, "window ceiling"],
    ];
    for (const [tenant, limits, word] of bad) {
      await rejectsWith(stub.setTenantLimits("s", tenant, limits), InvalidInput, undefined, new RegExp(`^invalid ${word} `));
    }
    await rejectsWith(stub.tenantLimits(""), InvalidInput, undefined, /^invalid name /);
    assert.deepEqual(requests, []);
    // The bounds themselves pass, and the body is what the server expects.
    await stub.setTenantLimits("jobs/42", "ü".repeat(32), { ceiling: 1_000_000, floor: 1_000_000 });
    await stub.setTenantLimits("s", "web");
    await stub.setTenantLimits("s", "bulk", { windowCeiling: 1 });
    await stub.setTenantLimits("s", "bulk", { ceiling: 4, windowCeiling: 100 });
    assert.deepEqual(
      requests.map((r) => [r.method, new URL(r.url).pathname, r.body]),
      [
        [
          "PUT",
          `/v1/semaphores/jobs%2F42/tenants/${encodeURIComponent("ü".repeat(32))}`,
          { ceiling: 1_000_000, floor: 1_000_000 },
        ],
        ["PUT", "/v1/semaphores/s/tenants/web", { ceiling: null, floor: 0 }],
        ["PUT", "/v1/semaphores/s/tenants/bulk", { ceiling: null, floor: 0, window_ceiling: 1 }],
        ["PUT", "/v1/semaphores/s/tenants/bulk", { ceiling: 4, floor: 0, window_ceiling: 100 }],
      ],
    );
  });
});

describe("what is sent again", () => {
  test("setting and listing are sent again after an answer was lost", async () => {
    // The first attempt of each reaches the server, whose answer is lost (a reset).
    let drops = 0;
    let sent = 0;
    const fetch = async (url, init) => {
      sent++;
      const res = await globalThis.fetch(url, init);
      if (sent % 2 === 1) {
        drops++;
        await res.text();
        throw new TypeError("fetch failed", { cause: { code: "ECONNRESET" } });
      }
      return res;
    };
    const flaky = new Client(server.url, { fetch });
    const name = "limits/resent";
    assert.deepEqual(await flaky.setTenantLimits(name, "batch", { ceiling: 2 }), {
      batch: { ceiling: 2, floor: 0 },
    });
    assert.deepEqual(await flaky.tenantLimits(name), { batch: { ceiling: 2, floor: 0 } });
    assert.deepEqual([drops, sent], [2, 4]);
  });
});

describe("a store that keeps no limits", () => {
  test("refuses them as Unsupported (501), with nothing kept", async () => {
    const etcd = await startEtcd();
    const onEtcd = await startServer({ store: etcd.url });
    try {
      const etcdClient = new Client(onEtcd.url);
      await rejectsWith(
        etcdClient.setTenantLimits("jobs", "batch", { ceiling: 1 }),
        Unsupported,
        501,
        /keeps no tenant ceilings or floors/,
      );
      assert.deepEqual(await etcdClient.tenantLimits("jobs"), {});
    } finally {
      await onEtcd.stop();
      await etcd.stop();
    }
  });

  test("SQLite (the server's default store) keeps a window ceiling too", async () => {
    const onSqlite = await startServer();
    try {
      const sqliteClient = new Client(onSqlite.url);
      assert.deepEqual(
        await sqliteClient.setTenantLimits("jobs", "bulk", { ceiling: 2, windowCeiling: 20 }),
        { bulk: { ceiling: 2, floor: 0, windowCeiling: 20 } },
      );
      assert.deepEqual(await sqliteClient.tenantLimits("jobs"), {
        bulk: { ceiling: 2, floor: 0, windowCeiling: 20 },
      });
      // Set again without one: the window ceiling is gone, the rest kept.
      assert.deepEqual(await sqliteClient.setTenantLimits("jobs", "bulk", { ceiling: 2 }), {
        bulk: { ceiling: 2, floor: 0 },
      });
    } finally {
      await onSqlite.stop();
    }
  });
});
