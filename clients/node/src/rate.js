// Rate limiters: a turn within every limit, reserved by the server.

import { InvalidInput, Limited, NotFound } from "./errors.js";
import { DROPS, REASK_PAUSE_MS } from "./queue.js";
import { durationText, segment, sleep, timeoutMs } from "./transport.js";

/**
 * @typedef {object} RateOptions
 * @property {number} [cost] charged to every limit per acquire (default 1)
 * @property {number | string} [margin] between admission and use (ms or `"20ms"`; server
 *   default 20 ms in exact mode)
 * @property {"exact" | "smooth"} [mode] default `"exact"`: at most N in any window of PERIOD
 * @property {number} [burst] smooth mode: units admitted at once after an idle period
 * @property {boolean} [update] replace the stored limits if they differ
 */

/**
 * A rate limiter on the server, shared by every client that names it with the same limits.
 * Get one from `client.rate(name, ["50/s", "1000/min"])`.
 */
export class RateLimiter {
  #transport;
  #path;
  #body;
  #cap;

  /**
   * @param {import("./transport.js").Transport} transport
   * @param {string} name
   * @param {string | string[]} limits
   * @param {RateOptions} options
   * @param {{cap: number}} defaults
   */
  constructor(transport, name, limits, options, defaults) {
    const list = typeof limits === "string" ? [limits] : limits;
    if (!Array.isArray(list) || list.some((l) => typeof l !== "string")) {
      throw new InvalidInput(
        `invalid limits ${JSON.stringify(limits)} for "${name}": strings like "50/s"`,
      );
    }
    this.#transport = transport;
    /** @type {string} */
    this.name = name;
    this.#path = `/v1/rates/${segment(name)}`;
    this.#cap = defaults.cap;
    /** @type {Record<string, unknown>} */
    const body = { limits: list, cost: options.cost ?? 1 };
    if (options.margin !== undefined) body.margin = durationText(options.margin, "margin");
    if (options.mode !== undefined) body.mode = options.mode;
    if (options.burst !== undefined) body.burst = options.burst;
    if (options.update !== undefined) body.update = options.update;
    this.#body = body;
  }

  /**
   * Waits for a turn: the server reserves the earliest instant every limit admits `cost`
   * more and answers at that instant — make the call then. Fair: turns are reserved in
   * arrival order, no polling.
   *
   * If the turn is further than `maxWait`, rejects with `Limited` at once (its
   * `retryAfterMs` is the exact wait if nobody else comes first) and nothing is charged. Waits
   * longer than the per-request cap (4 min) are split: the client sleeps the part of
   * `retry_after_ms` beyond the cap, then asks again. On `signal` abort the connection is
   * closed and the server gives the reservation back if it is still the latest.
   *
   * The answer carries no use-by: a call made late (a stalled process) is still counted at
   * its admission. Use an admission where the limits must hold at the moment of use.
   *
   * @param {{maxWait?: number, cost?: number, signal?: AbortSignal}} [opts] `maxWait` in ms
   *   (default Infinity)
   * @returns {Promise<{admittedAtUs: number}>} the admission instant (store clock, µs)
   * @throws {Limited} no turn within `maxWait`
   *
   * @example
   * const sms = client.rate("sms-api", ["50/s", "1000/min"]);
   * for (const msg of outbox) {
   *   await sms.acquire({ maxWait: 60_000 });
   *   await provider.send(msg);
   * }
   */
  async acquire({ maxWait, cost, signal } = {}) {
    const total = timeoutMs(maxWait, "maxWait", Infinity);
    const start = performance.now();
    const body = cost === undefined ? this.#body : { ...this.#body, cost };
    let drops = 0;
    for (;;) {
      const left = total - (performance.now() - start);
      const waitMs = Math.floor(Math.max(0, Math.min(left, this.#cap)));
      try {
        const answer = await this.#transport.request(
          "POST",
          `${this.#path}/acquire`,
          { ...body, max_wait: `${waitMs}ms` },
          { waitMs, signal },
        );
        return { admittedAtUs: answer.body.admitted_at_us };
      } catch (err) {
        if (!(err instanceof Limited)) {
          // Its instance failed (see `untilGranted`): a waiting request asks the next one.
          const leftNow = total - (performance.now() - start);
          if (waitMs > 0 && this.#transport.failsOver(err) && ++drops <= DROPS && leftNow > REASK_PAUSE_MS) {
            await sleep(REASK_PAUSE_MS, signal);
            continue;
          }
          throw err;
        }
        drops = 0;
        // Not within `waitMs`. If the turn is within the time left (the wait was capped),
        // sleep until it is within the cap and ask again; otherwise waiting cannot help.
        const retryAfter = err.retryAfterMs ?? 1_000;
        const leftNow = total - (performance.now() - start);
        if (retryAfter > leftNow) throw err;
        await sleep(Math.max(0, retryAfter - this.#cap), signal);
      }
    }
  }

  /**
   * Asks for a turn now, without waiting. Being limited is an answer, not an error.
   * @param {{cost?: number}} [opts]
   * @returns {Promise<{admitted: true, admittedAtUs: number} |
   *   {admitted: false, retryAfterMs: number}>} admitted (charged) or not (nothing charged,
   *   with the wait)
   */
  async tryAcquire({ cost } = {}) {
    const body = cost === undefined ? this.#body : { ...this.#body, cost };
    const answer = await this.#transport.request("POST", `${this.#path}/try`, body);
    return answer.body.admitted
      ? { admitted: true, admittedAtUs: answer.body.admitted_at_us }
      : { admitted: false, retryAfterMs: answer.body.retry_after_ms };
  }

  /**
   * The limiter's usage per window, as `GET /v1/rates/{name}` answers it, or `null` when the
   * store holds nothing for it.
   * @returns {Promise<any>}
   */
  async status() {
    try {
      return (await this.#transport.request("GET", this.#path, undefined, { idempotent: true }))
        .body;
    } catch (err) {
      if (err instanceof NotFound) return null;
      throw err;
    }
  }
}
