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
//
// With SMS_PROVIDER_URL set, each message is a POST there (scripts/fake-provider.py counts
// calls as the provider would); otherwise it is only printed.

import { setTimeout as sleep } from "node:timers/promises";
import { Client, Unavailable } from "../../clients/node/src/index.js";

const client = new Client(process.env.TESSERA_URL ?? "http://127.0.0.1:8080", {
  token: process.env.TESSERA_TOKEN, // with `tessera serve --tokens FILE`
});
const sms = client.admission("sms-api", { capacity: 4, limits: ["50/s", "1000/min"] });

const provider = process.env.SMS_PROVIDER_URL;

async function sendMessage(i, ticket) {
  const start = Date.now();
  let refused = "";
  if (provider) {
    // The call to the messaging API; the fence orders stale senders out (and the fake
    // provider measures the delay from the admission).
    const call = { message: i, fence: ticket.fence, admitted_at_us: ticket.admittedAtUs };
    const res = await fetch(provider, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ sender: `node:${process.pid}`, ...call }),
    });
    await res.arrayBuffer();
    if (!res.ok) refused = ` refused ${res.status}`;
  }
  console.log(`${start} pid ${process.pid} message ${i} fence ${ticket.fence}${refused}`);
}

const count = Number(process.argv[2] ?? 10);
let next = 0;

// Four senders: as many as the API allows in flight; the admission keeps them within it
// across every process.
async function sender() {
  while (next < count) {
    const i = next++;
    for (let attempt = 1; ; attempt++) {
      try {
        await sms.withLease((ticket) => sendMessage(i, ticket), { timeout: 120_000 });
        break;
      } catch (err) {
        // The server restarts, or is replaced: ask again. Only the acquire throws these (a
        // failed release is a warning), so a message is never sent twice.
        if (!(err instanceof Unavailable) || attempt === 5) throw err;
        console.error(`message ${i}: ${err.message}; again in 1 s`);
        await sleep(1_000);
      }
    }
  }
}

const summary = () => console.error(`${sms.givenBack} admission(s) arrived late, given back`);
// Stopped by SIGTERM: say what was done, then stop as the signal asks (the client first
// releases what it holds).
process.once("SIGTERM", () => {
  summary();
  process.kill(process.pid, "SIGTERM");
});
await Promise.all([sender(), sender(), sender(), sender()]);
summary();
