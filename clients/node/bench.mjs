// The client's cost over the bare HTTP calls: a lock acquire + release through `Client`
// against the same two requests made with `fetch` (POST …/acquire, DELETE …/leases/{id}).
// Not a test. Starts its own `tessera serve` on SQLite ($TESSERA_BIN, else the debug build),
// or uses $TESSERA_URL.
//
//   TESSERA_BIN=/path/to/tessera node clients/node/bench.mjs [OPS] [RUNS]

import { Client } from "./src/index.js";
import { startServer } from "./testkit/server.mjs";

const ops = Number(process.argv[2] ?? 200);
const runs = Number(process.argv[3] ?? 5);
const server = process.env.TESSERA_URL ? null : await startServer();
const url = process.env.TESSERA_URL ?? server.url;
const client = new Client(url);
const lock = client.lock("bench-client");

async function viaClient() {
  const lease = await lock.acquire({ timeout: 5_000 });
  await lease.release();
}

const json = { "content-type": "application/json" };
const body = JSON.stringify({ capacity: 1, weight: 1, ttl: "30000ms", wait: "5000ms" });
async function viaFetch() {
  const res = await fetch(`${url}/v1/semaphores/bench-fetch/acquire`, { method: "POST", headers: json, body });
  const lease = await res.json();
  if (res.status !== 200) throw new Error(JSON.stringify(lease));
  const del = await fetch(`${url}/v1/semaphores/bench-fetch/leases/${lease.lease_id}`, { method: "DELETE" });
  await del.json();
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** Microseconds per acquire + release, one run of `ops`. */
async function run(fn) {
  const start = performance.now();
  for (let i = 0; i < ops; i++) await fn();
  return ((performance.now() - start) * 1000) / ops;
}

for (let i = 0; i < 20; i++) {
  await viaClient(); // warm-up: connections, JIT
  await viaFetch();
}
const client_us = [];
const fetch_us = [];
for (let r = 0; r < runs; r++) {
  // Alternate, so a noisy neighbour hits both alike.
  client_us.push(await run(viaClient));
  fetch_us.push(await run(viaFetch));
}
const c = median(client_us);
const f = median(fetch_us);
console.log(`lock acquire + release, ${runs} runs of ${ops}, median µs per pair:`);
console.log(`  client ${c.toFixed(0)}  (runs: ${client_us.map((x) => x.toFixed(0)).join(" ")})`);
console.log(`  fetch  ${f.toFixed(0)}  (runs: ${fetch_us.map((x) => x.toFixed(0)).join(" ")})`);
console.log(`  ratio  ${(c / f).toFixed(2)}`);
await server?.stop();
