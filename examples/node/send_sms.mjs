// Send messages through a messaging API that allows 50 calls per second and 1,000 per minute
// and at most 4 calls in flight, from as many processes and hosts as you like: each call
// first takes an admission from `tessera serve` — a permit and a turn in every window, at one
// instant.
//
//   TESSERA_URL=http://127.0.0.1:8080 node examples/node/send_sms.mjs 200
//
// Start several at once: together they never exceed the limits. The client checks each
// admission's use-by before it returns it, so a call started at once counts where the
// windows counted it; a late one was given back and asked for again.

import { Client } from "../../clients/node/src/index.js";

const client = new Client(process.env.TESSERA_URL ?? "http://127.0.0.1:8080", {
  token: process.env.TESSERA_TOKEN, // with `tessera serve --tokens FILE`
});
const sms = client.admission("sms-api", { capacity: 4, limits: ["50/s", "1000/min"] });

async function sendMessage(i, ticket) {
  // The real call to the messaging API goes here; the fence orders stale senders out.
  console.log(`${Date.now()} pid ${process.pid} message ${i} fence ${ticket.fence}`);
}

const count = Number(process.argv[2] ?? 10);
let next = 0;

// Four senders: as many as the API allows in flight; the admission keeps them within it
// across every process.
async function sender() {
  while (next < count) {
    const i = next++;
    await sms.withLease((ticket) => sendMessage(i, ticket), { timeout: 120_000 });
  }
}

await Promise.all([sender(), sender(), sender(), sender()]);
if (sms.givenBack > 0) console.error(`${sms.givenBack} admission(s) arrived late, given back`);
