// The entry point: one server, and handles to its semaphores, locks, limiters and admissions.

import { hostname } from "node:os";
import { Admission } from "./admission.js";
import { InvalidInput } from "./errors.js";
import { RateLimiter } from "./rate.js";
import { Semaphore } from "./semaphore.js";
import { MAX_WAIT_PER_REQUEST_MS, Transport, timeoutMs } from "./transport.js";

/**
 * @typedef {object} ClientOptions
 * @property {string} [token] bearer token (`tessera serve --tokens`)
 * @property {string} [holder] default holder label (default `node:HOST:PID`)
 * @property {number} [requestTimeout] ms a request may take beyond its queue wait before it
 *   fails with `ConnectionFailed` (default 15 000; the server's own store timeout is 10 s)
 * @property {number} [maxWaitPerRequest] ms one request may wait in the server's queue
 *   (100..240 000, default 240 000); longer waits are asked again
 * @property {typeof fetch} [fetch] the `fetch` to use (default the global one)
 */

/**
 * A client of one `tessera serve`. Handles are cheap: make one per name and use it from any
 * number of tasks.
 *
 * @example
 * import { Client } from "tessera-client";
 * const client = new Client("http://127.0.0.1:8080", { token: process.env.TESSERA_TOKEN });
 * await client.lock("nightly-report").withLease(async (lease) => {
 *   await makeReport({ fence: lease.fence, signal: lease.lost });
 * }, { timeout: 60_000 });
 */
export class Client {
  #transport;
  #defaults;

  /**
   * @param {string | string[]} url the server, e.g. `http://127.0.0.1:8080`; or several
   *   instances on one store, as an array or joined by commas (see the README: calls move
   *   to the next instance when one fails)
   * @param {ClientOptions} [options]
   */
  constructor(url, options = {}) {
    this.#transport = new Transport(url, options);
    const cap = Math.min(
      MAX_WAIT_PER_REQUEST_MS,
      timeoutMs(options.maxWaitPerRequest, "maxWaitPerRequest", MAX_WAIT_PER_REQUEST_MS),
    );
    if (cap < 100) {
      // Shorter waits would turn a long acquire into polling.
      throw new InvalidInput(`invalid maxWaitPerRequest ${cap}: at least 100 ms`);
    }
    this.#defaults = { holder: options.holder ?? `node:${hostname()}:${process.pid}`, cap };
  }

  /** The server's base URL; several instances' URLs joined by commas. */
  get url() {
    return this.#transport.bases.join(",");
  }

  /** Every instance's base URL, in the order they are tried. */
  get urls() {
    return this.#transport.bases;
  }

  /** The instance requests go to now (the last one that did not fail). */
  get currentUrl() {
    return this.#transport.base;
  }

  /**
   * A semaphore of `capacity` permits.
   * @param {string} name `A-Z a-z 0-9 . _ - : / @`, at most 200 bytes
   * @param {import("./semaphore.js").SemaphoreOptions} options
   */
  semaphore(name, options) {
    return new Semaphore(this.#transport, name, options, this.#defaults);
  }

  /**
   * A lock: a semaphore of capacity 1. Every client of a name must use it as a lock (or as a
   * semaphore of capacity 1).
   * @param {string} name
   * @param {{ttl?: number | string, holder?: string, tenant?: string, share?: number}} [options]
   *   `tenant` and `share` as for a semaphore
   */
  lock(name, options = {}) {
    return new Semaphore(
      this.#transport,
      name,
      { ...options, capacity: 1, weight: 1 },
      this.#defaults,
    );
  }

  /**
   * A rate limiter: at most N per PERIOD for every limit, across every client.
   * @param {string} name
   * @param {string | string[]} limits `"50/s"`, `["50/s", "1000/min"]`, `"5/250ms"`
   * @param {import("./rate.js").RateOptions} [options]
   */
  rate(name, limits, options = {}) {
    return new RateLimiter(this.#transport, name, limits, options, this.#defaults);
  }

  /**
   * Permits and rate windows in one step (memory, SQLite, Redis, MySQL and PostgreSQL stores).
   * @param {string} name
   * @param {import("./admission.js").AdmissionOptions} options
   */
  admission(name, options) {
    return new Admission(this.#transport, name, options, this.#defaults);
  }
}
