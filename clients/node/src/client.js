// The entry point: one server, and handles to its semaphores, locks, limiters and admissions.

import { hostname } from "node:os";
import { Admission } from "./admission.js";
import { InvalidInput } from "./errors.js";
import { RateLimiter } from "./rate.js";
import { Semaphore } from "./semaphore.js";
import { checkTenant, tenantLimitsBody } from "./tenant.js";
import { MAX_WAIT_PER_REQUEST_MS, Transport, segment, timeoutMs } from "./transport.js";

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
 * A tenant's limits on a semaphore (docs/fair-shares.md#ceilings-and-floors).
 * @typedef {object} TenantLimits
 * @property {number | null} ceiling the tenant never holds more than this many permits
 *   (`null`: no ceiling)
 * @property {number} floor permits kept for the tenant while it holds fewer (0: none)
 * @property {number} [windowCeiling] the tenant is admitted at most this percentage of each
 *   rate window of the name's admissions (absent: no window ceiling)
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

  /**
   * Sets `tenant`'s ceiling, floor and window ceiling on the semaphore `name` (admin;
   * docs/fair-shares.md#ceilings-and-floors) and resolves with every tenant's limits on it
   * after the change.
   *
   * The tenant never holds more than `ceiling` permits (1..1 000 000; `null` or absent: no
   * ceiling), and `floor` permits (0 up to the ceiling; default 0) are kept for it while it
   * holds fewer: other tenants are not granted the permits it would need to reach its
   * floor. `windowCeiling` (a percentage, 1..100; `null` or absent: none) caps the tenant's
   * share of each rate window of the name's admissions (`client.admission`): on `10/min`
   * with `windowCeiling: 20` the tenant is admitted at most twice in any minute, whatever
   * the other tenants leave unused, while they are still admitted up to the shared limit
   * (each limit `N` becomes `max(1, floor(N × windowCeiling / 100))` for the tenant).
   *
   * The server keeps the limits for the name, also while nobody holds or waits, until they
   * are changed or the semaphore is deleted. Each call sets all of them: one left out is
   * removed, and `setTenantLimits(name, tenant)` (no ceiling, floor 0, no window ceiling)
   * removes them all. They apply from the server's next grant; a tenant above a lowered
   * ceiling keeps what it holds.
   *
   * On success the limits are set. On error nothing changed: `InvalidInput` without a
   * `status` for a bad tenant, ceiling, floor or window ceiling (nothing sent),
   * `InvalidInput` (400) for floors that would add up above the capacity of a semaphore the
   * server holds, `Unsupported` (501) from a store that keeps no limits, or no window
   * ceilings when one is given. Tried again after a lost answer (setting the same values
   * twice is setting them once).
   *
   * @param {string} name the semaphore
   * @param {string} tenant 1 to 64 bytes (UTF-8), no control characters
   * @param {{ceiling?: number | null, floor?: number, windowCeiling?: number | null}} [limits]
   * @returns {Promise<Record<string, TenantLimits>>}
   *
   * @example
   * await client.setTenantLimits("provider", "newsletter", { ceiling: 2 }); // at most 2
   * await client.setTenantLimits("provider", "checkout", { floor: 1 }); // 1 kept for it
   * await client.setTenantLimits("sms", "bulk", { windowCeiling: 20 }); // 20% of each window
   * await client.setTenantLimits("provider", "newsletter"); // removed
   */
  async setTenantLimits(name, tenant, limits = {}) {
    const body = tenantLimitsBody(limits ?? {}, name);
    const path = `/v1/semaphores/${segment(name)}/tenants/${segment(checkTenant(tenant, name))}`;
    const answer = await this.#transport.request("PUT", path, body, { idempotent: true });
    return limitsByTenant(answer.body);
  }

  /**
   * Every tenant's ceiling, floor and window ceiling set on the semaphore `name`, by tenant
   * (`windowCeiling` only where one is set); empty when none
   * is set (and on a store that keeps none). Tried again after a lost answer.
   * @param {string} name
   * @returns {Promise<Record<string, TenantLimits>>}
   */
  async tenantLimits(name) {
    const path = `/v1/semaphores/${segment(name)}/tenants`;
    const answer = await this.#transport.request("GET", path, undefined, { idempotent: true });
    return limitsByTenant(answer.body);
  }
}

/**
 * The `tenants` object of a tenant-limits answer, with `ceiling` `null` where none is set
 * and `windowCeiling` only where one is.
 * @param {any} body
 * @returns {Record<string, TenantLimits>}
 */
function limitsByTenant(body) {
  // fromEntries defines own properties: a tenant named "__proto__" stays a tenant.
  return Object.fromEntries(
    Object.entries(body.tenants).map(([tenant, limits]) => [
      tenant,
      limits.window_ceiling == null
        ? { ceiling: limits.ceiling ?? null, floor: limits.floor ?? 0 }
        : { ceiling: limits.ceiling ?? null, floor: limits.floor ?? 0, windowCeiling: limits.window_ceiling },
    ]),
  );
}
