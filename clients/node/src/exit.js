// Leases still held when the process ends. Node gives a chance to run asynchronous code on
// `beforeExit` (the event loop ran dry: the keep-alive timers are unref'd, so a program that
// forgot a lease gets here) and on SIGINT/SIGTERM (a listener replaces the default exit).
// Nothing runs on `process.exit()`, an uncaught exception or SIGKILL: those leases expire by
// their TTL, which is what the TTL is for.
//
// The listeners are installed while at least one lease is held and removed when none is, so
// a process that holds nothing keeps Node's default signal behaviour.

const held = new Set();
const SIGNALS = /** @type {const} */ (["SIGINT", "SIGTERM"]);
let installed = false;
let releasing = null;

/** How long the exit hooks wait for the releases. */
const EXIT_RELEASE_MS = 2_000;

/** @param {{release(): Promise<boolean>, name: string}} lease */
export function hold(lease) {
  held.add(lease);
  if (!installed) {
    installed = true;
    process.on("beforeExit", onBeforeExit);
    for (const sig of SIGNALS) process.on(sig, onSignal);
  }
}

/** @param {object} lease */
export function unhold(lease) {
  held.delete(lease);
  if (held.size === 0 && installed && !releasing) uninstall();
}

function uninstall() {
  installed = false;
  process.off("beforeExit", onBeforeExit);
  for (const sig of SIGNALS) process.off(sig, onSignal);
}

function releaseAll() {
  releasing ??= Promise.race([
    Promise.allSettled([...held].map((lease) => lease.release())).then((results) => {
      for (const r of results) {
        if (r.status === "rejected") {
          process.emitWarning(`tessera: a lease held at exit was not released: ${r.reason}`);
        }
      }
    }),
    new Promise((resolve) => setTimeout(resolve, EXIT_RELEASE_MS).unref()),
  ]).finally(() => {
    releasing = null;
    if (held.size === 0 && installed) uninstall();
  });
  return releasing;
}

function onBeforeExit() {
  // The releases keep the event loop busy; when they are done `beforeExit` comes again with
  // nothing held, and the listener is gone by then.
  if (held.size > 0) releaseAll();
}

/** @param {NodeJS.Signals} sig */
async function onSignal(sig) {
  // Our listener is one of this signal's listeners; if it is the only one, Node would have
  // ended the process: do that after the releases, by the same signal, so the exit status
  // tells what happened. Otherwise the program's own listener decides.
  const alone = process.listenerCount(sig) === 1;
  await releaseAll();
  if (alone) {
    uninstall();
    process.kill(process.pid, sig);
  }
}
