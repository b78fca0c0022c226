// Semaphores and locks: the acquire that waits (looping past the per-request cap), the one
// that does not, and the scoped form.

import { InvalidInput, NoPermit, NotFound } from "./errors.js";
import { Lease } from "./lease.js";
import { untilGranted, withLease } from "./queue.js";
import { tenantFields } from "./tenant.js";
import { durationText, segment, timeoutMs } from "./transport.js";

/**
 * @typedef {object} SemaphoreOptions
 * @property {number} capacity the semaphore's capacity, as every client declares it
 * @property {number} [weight] permits per lease (default 1)
 * @property {number | string} [ttl] lease TTL: ms, or `"30s"` (default 30 s; 100 ms..24 h)
 * @property {string} [holder] label shown by status (default the client's)
 * @property {string} [tenant] the tenant this handle's acquires wait as (1 to 64 bytes, no
 *   control characters): under contention permits go to the waiting tenants in proportion
 *   to their shares, FIFO within a tenant (docs/fair-shares.md)
 * @property {number} [share] the tenant's share, 1..1000 (default 1; only with a tenant)
 */

/**
 * A semaphore on the server: `capacity` permits shared by every client that names it.
 * Get one from `client.semaphore(name, options)` or `client.lock(name)`.
 */
export class Semaphore {
  #transport;
  #path;
  #body;
  #cap;

  /**
   * @param {import("./transport.js").Transport} transport
   * @param {string} name
   * @param {SemaphoreOptions} options
   * @param {{holder: string, cap: number}} defaults
   */
  constructor(transport, name, options, defaults) {
    if (!Number.isInteger(options?.capacity)) {
      throw new InvalidInput(
        `invalid capacity ${JSON.stringify(options?.capacity)} for "${name}": an integer`,
      );
    }
    const tenant = tenantFields(options, name);
    this.#transport = transport;
    /** @type {string} */
    this.name = name;
    /** The tenant this handle's acquires wait as (undefined: none). @type {string | undefined} */
    this.tenant = tenant.tenant;
    /** The tenant's share (undefined without a tenant). @type {number | undefined} */
    this.share = tenant.share;
    this.#path = `/v1/semaphores/${segment(name)}`;
    this.#cap = defaults.cap;
    this.#body = {
      capacity: options.capacity,
      weight: options.weight ?? 1,
      ttl: durationText(options.ttl ?? 30_000, "ttl"),
      holder: options.holder ?? defaults.holder,
      ...tenant,
    };
  }

  /**
   * Waits for `weight` permits in the semaphore's FIFO queue and returns the lease, renewed in
   * the background until you release it.
   *
   * Fairness: first come, first served (with a `tenant`: in proportion to the waiting
   * tenants' shares, first come first served within each); a large weight is never
   * overtaken. Waits longer than
   * the per-request cap (4 min) are asked again and join the back of the queue.
   *
   * On success the permits are held. On timeout it rejects with `NoPermit` and nothing is
   * held or queued. On `signal` abort it rejects with the signal's reason and the server
   * drops the place in the queue; if the grant happened at that very moment, that lease is
   * not returned to anyone and expires by its TTL.
   *
   * @param {{timeout?: number, signal?: AbortSignal}} [opts] `timeout` in ms (default
   *   Infinity; 0 only takes a permit free now)
   * @returns {Promise<Lease>}
   * @throws {NoPermit} none within `timeout`
   *
   * @example
   * const gpus = client.semaphore("gpus", { capacity: 4, ttl: "10s" });
   * const lease = await gpus.acquire({ timeout: 10_000 });
   * console.log(`GPU ${lease.seats[0]}, fence ${lease.fence}`);
   * await lease.release();
   */
  async acquire({ timeout, signal } = {}) {
    const total = timeoutMs(timeout, "timeout", Infinity);
    return await untilGranted(
      {
        timeout: total,
        cap: this.#cap,
        signal,
        Refusal: NoPermit,
        what: this.name,
        transport: this.#transport,
      },
      async (waitMs) => {
        const answer = await this.#transport.request(
          "POST",
          `${this.#path}/acquire`,
          { ...this.#body, wait: `${Math.floor(waitMs)}ms` },
          { waitMs, signal },
        );
        return new Lease(this.#transport, answer.body, answer.arrivedAt);
      },
    );
  }

  /**
   * Takes the permits only if they are free now and nobody waits.
   * @returns {Promise<Lease | null>} the lease, or `null` (nothing held)
   */
  async tryAcquire({ signal } = /** @type {{signal?: AbortSignal}} */ ({})) {
    try {
      return await this.acquire({ timeout: 0, signal });
    } catch (err) {
      if (err instanceof NoPermit) return null;
      throw err;
    }
  }

  /**
   * Runs `fn(lease)` holding the permits and releases them however `fn` ends.
   *
   * @template R
   * @param {(lease: Lease) => R | Promise<R>} fn
   * @param {{timeout?: number, signal?: AbortSignal}} [opts] as for `acquire`
   * @returns {Promise<R>} what `fn` returned
   *
   * @example
   * await client.lock(`batch/${id}`).withLease(async (lease) => {
   *   await processBatch(id, { fence: lease.fence, signal: lease.lost });
   * }, { timeout: 60_000 });
   */
  withLease(fn, opts) {
    return withLease(() => this.acquire(opts), fn);
  }

  /**
   * The semaphore's holders and queue, as `GET /v1/semaphores/{name}` answers it, or `null`
   * when nobody holds or waits.
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
