// Bad input, mismatches, tokens and an unreachable server: each a typed error, and nothing
// changed.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  CapacityMismatch,
  Client,
  ConnectionFailed,
  Forbidden,
  InvalidInput,
  RateMismatch,
  TesseraError,
  Unauthorized,
  Unavailable,
} from "../src/index.js";
import { startServer, tempDir } from "../testkit/server.mjs";

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client(server.url);
});
after(() => server.stop());

/** Asserts `promise` rejects with `Class`, from the server (`status`) or the client. */
async function rejectsWith(promise, Class, status) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof Class, `${err?.name}: ${err?.message}`);
    assert.ok(err instanceof TesseraError);
    assert.equal(err.status, status);
    assert.equal(typeof err.kind, "string");
    assert.ok(err.message.length > 0);
    return true;
  });
}

describe("invalid input", () => {
  test("the server's refusals are InvalidInput with status 400, and change nothing", async () => {
    await rejectsWith(client.semaphore("bad", { capacity: 0 }).acquire(), InvalidInput, 400);
    await rejectsWith(client.semaphore("bad", { capacity: 4, weight: 5 }).acquire(), InvalidInput, 400);
    await rejectsWith(client.lock("bad name").acquire(), InvalidInput, 400);
    await rejectsWith(client.lock("bad", { ttl: "50ms" }).acquire(), InvalidInput, 400);
    await rejectsWith(client.lock("bad", { ttl: "soon" }).acquire(), InvalidInput, 400);
    await rejectsWith(client.rate("bad", ["x"]).acquire(), InvalidInput, 400);
    await rejectsWith(client.rate("bad", []).tryAcquire(), InvalidInput, 400);
    await rejectsWith(client.admission("bad", { capacity: 1, limits: [] }).acquire(), InvalidInput, 400);
    await rejectsWith(client.rate("bad", "5/s", { cost: 6 }).acquire(), InvalidInput, 400);
    assert.equal(await client.lock("bad").status(), null);
    assert.equal(await client.rate("bad", "5/s").status(), null);
  });

  test("what the client can check itself is InvalidInput without a status", async () => {
    await rejectsWith(client.lock("ok").acquire({ timeout: -1 }), InvalidInput, undefined);
    assert.throws(() => client.semaphore("ok", {}), InvalidInput);
    assert.throws(() => client.lock(""), InvalidInput);
    assert.throws(() => client.lock("ok", { ttl: -5 }), InvalidInput);
    assert.throws(() => client.rate("ok", [50]), InvalidInput);
    assert.throws(() => new Client("not a url"), InvalidInput);
    assert.throws(() => new Client("ftp://127.0.0.1"), InvalidInput);
    assert.throws(() => new Client(server.url, { maxWaitPerRequest: 0 }), InvalidInput);
  });
});

describe("mismatches", () => {
  test("another capacity is CapacityMismatch (409), and the holder keeps its lease", async () => {
    const held = await client.semaphore("pool", { capacity: 2 }).acquire();
    await rejectsWith(client.semaphore("pool", { capacity: 3 }).acquire(), CapacityMismatch, 409);
    const status = await client.semaphore("pool", { capacity: 2 }).status();
    assert.equal(status.capacity, 2);
    assert.deepEqual(status.holders.map((h) => h.lease_id), [held.leaseId]);
    await held.release();
  });

  test("other limits are RateMismatch (409)", async () => {
    await client.rate("api", "5/s").acquire();
    await rejectsWith(client.rate("api", "6/s").acquire(), RateMismatch, 409);
    await rejectsWith(client.admission("api", { capacity: 1, limits: ["6/s"] }).acquire(), RateMismatch, 409);
    assert.equal((await client.rate("api", "5/s").status()).limits[0].limit, "5/s");
  });
});

describe("reaching the server", () => {
  test("no server is ConnectionFailed, an Unavailable", async () => {
    const gone = await startServer();
    const url = gone.url;
    await gone.stop();
    const lonely = new Client(url);
    await rejectsWith(lonely.lock("x").acquire(), ConnectionFailed, undefined);
    await rejectsWith(lonely.rate("x", "1/s").tryAcquire(), Unavailable, undefined);
  });

  test("tokens: none is Unauthorized (401), another prefix is Forbidden (403)", async () => {
    const tmp = tempDir();
    const tokens = join(tmp.dir, "tokens");
    writeFileSync(tokens, "node-test-token-0123456789 team-a/\n");
    const guarded = await startServer({ args: ["--tokens", tokens] });
    try {
      await rejectsWith(new Client(guarded.url).lock("team-a/x").acquire(), Unauthorized, 401);
      await rejectsWith(new Client(guarded.url, { token: "wrong-token-0123456789" }).lock("team-a/x").acquire(), Unauthorized, 401);
      const ok = new Client(guarded.url, { token: "node-test-token-0123456789" });
      await rejectsWith(ok.lock("team-b/x").acquire(), Forbidden, 403);
      const lease = await ok.lock("team-a/x").acquire({ timeout: 1_000 });
      assert.equal(await lease.release(), true);
    } finally {
      await guarded.stop();
      tmp.dispose();
    }
  });
});
