// Rate limits, counted at the moment each turn is given.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Client, Limited } from "../src/index.js";
import { maxInWindow } from "../testkit/check.mjs";
import { readLog, runWorkers, startServer, tempDir } from "../testkit/server.mjs";

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

describe("a rate limiter", () => {
  test("admits at most N per period across processes, at the moment each acquire returns", async () => {
    const log = join(tmp.dir, "rate.log");
    // The margin covers the delay from the store's admission instant to the worker's stamp
    // (the answer's trip and the worker's scheduling): the server counts windows of
    // PERIOD + margin, so stamps late by less than the margin stay within PERIOD windows.
    const task = { mode: "rate", url: server.url, name: "sms", limits: ["5/s", "8/2s"], margin: "250ms", count: 4, log };
    await runWorkers([task, task, task]);
    const stamps = readLog(log).map((e) => e.ns);
    assert.equal(stamps.length, 12);
    const in1s = maxInWindow(stamps, 1_000);
    const in2s = maxInWindow(stamps, 2_000);
    assert.ok(in1s <= 5, `${in1s} calls in one sliding second (limit 5/s)`);
    assert.ok(in2s <= 8, `${in2s} calls in two sliding seconds (limit 8/2s)`);
  });

  test("tryAcquire answers admitted or the wait, and a refusal charges nothing", async () => {
    const rate = client.rate("try", "2/s");
    assert.equal((await rate.tryAcquire()).admitted, true);
    const second = await rate.tryAcquire();
    assert.equal(second.admitted, true);
    assert.equal(typeof second.admittedAtUs, "number");
    const third = await rate.tryAcquire();
    assert.equal(third.admitted, false);
    assert.ok(third.retryAfterMs > 0 && third.retryAfterMs <= 1_020, `${third.retryAfterMs}`);
    const status = await rate.status();
    assert.equal(status.limits[0].used, 2, "the refused try was not charged");
  });

  test("acquire rejects with Limited and the exact wait when the turn is beyond maxWait", async () => {
    const rate = client.rate("limited", "1/s");
    await rate.acquire({ maxWait: 0 });
    await assert.rejects(rate.acquire({ maxWait: 100 }), (err) => {
      assert.ok(err instanceof Limited);
      assert.equal(err.kind, "limited");
      assert.equal(err.status, 429);
      assert.ok(err.retryAfterMs > 100 && err.retryAfterMs <= 1_020, `${err.retryAfterMs}`);
      return true;
    });
    assert.equal((await rate.status()).limits[0].used, 1, "nothing charged");
  });

  test("a turn beyond one request's cap is waited for in several requests", async () => {
    let requests = 0;
    const counting = (...args) => (requests++, fetch(...args));
    const short = new Client(server.url, { maxWaitPerRequest: 200, fetch: counting });
    const rate = short.rate("capped", "1/s");
    const first = await rate.acquire();
    const second = await rate.acquire({ maxWait: 5_000 });
    assert.ok(
      second.admittedAtUs - first.admittedAtUs >= 1_000_000,
      `admitted ${(second.admittedAtUs - first.admittedAtUs) / 1000} ms apart under 1/s`,
    );
    assert.ok(requests >= 3, `${requests} requests: the second turn was not asked again`);
  });
});
