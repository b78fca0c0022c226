// A client process for the cross-process tests. argv[2] is a JSON task; log lines go to
// `task.log` (appended, one write per line) as `KIND PID NS ...`, NS from process.hrtime on
// the host's monotonic clock.

import { appendFileSync } from "node:fs";
import { Client } from "../src/index.js";

const task = JSON.parse(process.argv[2]);
const client = new Client(task.url);
const now = () => process.hrtime.bigint();
const log = (kind, ...rest) => appendFileSync(task.log, `${kind} ${process.pid} ${now()} ${rest.join(" ")}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

switch (task.mode) {
  case "semaphore": {
    // Hold a permit `rounds` times for `holdMs`, logging when the holding starts and ends.
    const sem = client.semaphore(task.name, { capacity: task.capacity, ttl: task.ttl ?? "10s" });
    for (let i = 0; i < task.rounds; i++) {
      const lease = await sem.acquire({ timeout: 60_000 });
      log("enter", lease.fence, lease.seats.join(","));
      await sleep(task.holdMs);
      log("exit");
      await lease.release();
    }
    break;
  }
  case "rate": {
    // Log the moment each turn is given: that is when the call would be made.
    const rate = client.rate(task.name, task.limits, { margin: task.margin });
    for (let i = 0; i < task.count; i++) {
      await rate.acquire({ maxWait: 60_000 });
      log("call");
    }
    break;
  }
  case "admission": {
    // Start a "call" right after each admission, hold the permit for `holdMs`.
    const adm = client.admission(task.name, {
      capacity: task.capacity,
      limits: task.limits,
      margin: task.margin,
    });
    for (let i = 0; i < task.count; i++) {
      const ticket = await adm.acquire({ timeout: 60_000 });
      log("enter", ticket.fence);
      await sleep(task.holdMs);
      log("exit");
      await ticket.release();
    }
    console.log(`given back ${adm.givenBack}`);
    break;
  }
  case "hold": {
    // Take a lock, say so, and keep the process alive until a signal ends it.
    const lease = await client.lock(task.name, { ttl: "30s" }).acquire({ timeout: 10_000 });
    console.log(`held ${lease.leaseId}`);
    setInterval(() => {}, 1_000);
    break;
  }
  case "forget": {
    // Take a lock and end the program without releasing it: the `beforeExit` hook does.
    const lease = await client.lock(task.name, { ttl: "30s" }).acquire({ timeout: 10_000 });
    console.log(`held ${lease.leaseId}`);
    break;
  }
  default:
    throw new Error(`unknown mode ${task.mode}`);
}
