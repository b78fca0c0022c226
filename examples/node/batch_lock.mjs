// Process a batch while holding its lock, so two workers never process the same batch at
// once: the lock is named after the batch (`batch/ID`), renewed in the background, and
// released however the work ends. If the lock is lost (revoked, the server out of reach),
// the work stops before the lease could expire; the fence lets the store of results refuse
// a stale writer.
//
//   TESSERA_URL=http://127.0.0.1:8080 node examples/node/batch_lock.mjs 42 [ITEMS]

import { Client, NoPermit } from "../../clients/node/src/index.js";

const client = new Client(process.env.TESSERA_URL ?? "http://127.0.0.1:8080", {
  token: process.env.TESSERA_TOKEN,
});
const [batch = "1", items = "5"] = process.argv.slice(2);

async function processItem(i, fence) {
  await new Promise((resolve) => setTimeout(resolve, 20)); // the real work goes here
  console.log(`batch ${batch} item ${i} fence ${fence}`);
}

try {
  await client.lock(`batch/${batch}`, { ttl: "15s" }).withLease(
    async (lease) => {
      for (let i = 0; i < Number(items); i++) {
        lease.throwIfLost(); // stop at once if the lock is gone
        await processItem(i, lease.fence);
      }
      console.log(`batch ${batch} done fence ${lease.fence}`);
    },
    { timeout: 60_000 },
  );
} catch (err) {
  if (!(err instanceof NoPermit)) throw err;
  console.error(`batch ${batch} is still being processed elsewhere; try later`);
  process.exitCode = 75; // EX_TEMPFAIL
}
