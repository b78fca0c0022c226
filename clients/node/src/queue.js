// The waiting loop shared by semaphore and admission acquires: one place decides when to ask
// again, so both have the same timeout and retry rules.

import { QueueFull } from "./errors.js";
import { sleep } from "./transport.js";

/** How many times in a row a waiting request is asked again after its instance failed. */
export const DROPS = 3;

/** The pause before a waiting request is asked again after its instance failed: an instance
 * still running drops the first request's place when it notices the closed connection, and a
 * new request that came before would queue behind it. */
export const REASK_PAUSE_MS = 200;

/**
 * Calls `ask(waitMs)` until it returns a value, within `timeout` ms:
 *
 * - after a refusal (`Refusal`) of a wait that was capped below the time left: the server's
 *   "not within the wait" then only means "not yet";
 * - after `queue_full`, once its `retry_after_ms` has passed, if that is within the timeout;
 * - after `ask` returned `undefined` (an admission that arrived past its use-by and was given
 *   back), while time is left;
 * - after a failure that moved the transport to its next instance (`failsOver`: no answer,
 *   or a 503 `store_unavailable` or `shutting_down` with several instances), if the request
 *   waits (`timeout` above 0), up to {@link DROPS} times in a row, {@link REASK_PAUSE_MS}
 *   later, within the timeout. A grant made just as the failure happened is held by nobody
 *   until its TTL runs out. A request that does not wait (a try) is never asked again once
 *   it left: the lost answer may have granted.
 *
 * Any other error, and the refusal of the last wait, is thrown.
 *
 * @template T
 * @param {{timeout: number, cap: number, signal?: AbortSignal,
 *          Refusal: typeof import("./errors.js").TesseraError, what: string,
 *          transport: import("./transport.js").Transport}} opts
 * @param {(waitMs: number) => Promise<T | undefined>} ask
 * @returns {Promise<T>}
 */
export async function untilGranted({ timeout, cap, signal, Refusal, what, transport }, ask) {
  const start = performance.now();
  const left = () => timeout - (performance.now() - start);
  let stale = 0;
  let drops = 0;
  for (;;) {
    const waitMs = Math.max(0, Math.min(left(), cap));
    const capped = left() > cap;
    let result;
    try {
      result = await ask(waitMs);
    } catch (err) {
      if (err instanceof Refusal && capped) continue;
      if (err instanceof QueueFull && (err.retryAfterMs ?? 1_000) < left()) {
        await sleep(err.retryAfterMs ?? 1_000, signal);
        drops = 0;
        continue;
      }
      if (waitMs > 0 && transport.failsOver(err) && ++drops <= DROPS && left() > REASK_PAUSE_MS) {
        await sleep(REASK_PAUSE_MS, signal);
        continue;
      }
      throw err;
    }
    drops = 0;
    if (result !== undefined) return result;
    stale++;
    if (left() <= 0) {
      throw new Refusal(
        `${what}: ${stale} admission(s) arrived past their use-by and were given back; ` +
          "no fresh one within the timeout",
      );
    }
  }
}

/**
 * Runs `fn(lease)` while holding a lease from `acquire`, and releases it on every exit path
 * (return, throw). A release that fails is reported with `process.emitWarning` and not
 * thrown: the keep-alive has stopped, so the lease expires by its TTL.
 *
 * @template L, R
 * @param {() => Promise<L & {release(): Promise<boolean>}>} acquire
 * @param {(lease: L) => R | Promise<R>} fn
 * @returns {Promise<R>}
 */
export async function withLease(acquire, fn) {
  const lease = await acquire();
  try {
    return await fn(lease);
  } finally {
    try {
      await lease.release();
    } catch (err) {
      process.emitWarning(`tessera: release failed, the lease expires by its TTL: ${err}`);
    }
  }
}
