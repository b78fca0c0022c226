// Admissions: permits and rate windows in one step, checked against their use-by before the
// caller gets them (docs/admission.md).
//
// Implementation details
//
// The server answers `use_by_ms`: how long from when the answer left a call still counts
// inside the windows. The client cannot see when the answer left, only when it arrived, so it
// takes `arrivedAt + use_by_ms` as the use-by instant on its own monotonic clock. That is late
// by the answer's transit (loopback: well under a millisecond; a stalled client: its stall
// before the answer was read). Right before `acquire` returns, a ticket past that instant is
// given back — the lease released and the charge returned while it is the limiter's latest,
// in one request — and the client asks again. So `acquire` never returns a ticket it knows to
// be stale; the caller should start its call at once, or check `useByRemainingMs()`.

import { InvalidInput, NotAdmitted, QueueFull } from "./errors.js";
import { Lease } from "./lease.js";
import { untilGranted, withLease } from "./queue.js";
import { tenantFields } from "./tenant.js";
import { durationText, segment, timeoutMs } from "./transport.js";

/**
 * A granted admission: a `Lease` (renewed, `lost`, `fence`, `seats`) whose windows were
 * charged at `admittedAtUs`. Start the call before its use-by; `release()` when done,
 * `giveBack()` if the call was not made, or `settle(actual)` when its cost is known only
 * afterwards.
 */
export class Admitted extends Lease {
  #useBy;

  /**
   * @param {import("./transport.js").Transport} transport
   * @param {any} body the admission's answer
   * @param {number} arrivedAt
   * @param {number} [cost] the cost charged to every window
   */
  constructor(transport, body, arrivedAt, cost = 1) {
    super(transport, body, arrivedAt);
    /** The cost charged to every window. @type {number} */
    this.cost = cost;
    /** The instant permits were granted and windows charged (store clock, µs since the
     * epoch). @type {number} */
    this.admittedAtUs = body.admitted_at_us;
    /** Names the charge for a give-back. @type {number} */
    this.reservation = body.reservation;
    /** The server's `use_by_ms` (null with a margin of 0: no use-by). @type {number | null} */
    this.useByMs = body.use_by_ms ?? null;
    this.#useBy = this.useByMs === null ? Infinity : arrivedAt + this.useByMs;
  }

  /** Milliseconds left to start the call so the windows count it (Infinity without a use-by;
   * negative once past). */
  useByRemainingMs() {
    return this.#useBy - performance.now();
  }

  /**
   * Gives the admission back unused: releases the lease and, while this admission is the
   * limiter's latest charge, returns the charge to every window. Ends the lease like
   * `release()` (either one, once).
   * @returns {Promise<boolean>} whether the lease was still held
   */
  giveBack() {
    return this._end(() => this._sendGiveBack());
  }

  /** The give-back request alone. @protected */
  async _sendGiveBack() {
    const body = { reservation: this.reservation, admitted_at_us: this.admittedAtUs };
    // Past its use-by: counted by the store (the limiter's `expired_unused`).
    if (this.useByRemainingMs() < 0) body.expired = true;
    const answer = await this._transport.request(
      "POST",
      `/v1/admissions/${segment(this.name)}/leases/${this.leaseId}/give-back`,
      body,
      { idempotent: true },
    );
    return answer.body?.done === true;
  }

  /**
   * Ends the lease here for a give-back that the next acquire carries (`given_back`): the
   * keep-alive stops, the server releases it with that request. @protected
   */
  _handBack() {
    this._end(async () => true);
    return { lease_id: this.leaseId, reservation: this.reservation, admitted_at_us: this.admittedAtUs };
  }

  /**
   * Releases the lease and makes the admission's charge `actual` instead of `cost`, in one
   * request: for a cost known after the call (tokens of a reply, bytes sent). A smaller cost
   * is given back to every window once, and only while the lease is still held; a larger one
   * is charged at once (later admissions wait for it). Ends the lease like `release()`.
   * @param {number} actual what the call cost (a whole number, 0 to 1,000,000)
   * @returns {Promise<boolean>} whether the lease was still held
   * @throws {InvalidInput} `actual` out of range (the lease still held and renewed)
   */
  settle(actual) {
    if (!Number.isSafeInteger(actual) || actual < 0 || actual > 1_000_000) {
      return Promise.reject(
        new InvalidInput(`invalid settled cost ${actual}: must be a whole number between 0 and 1000000`),
      );
    }
    return this._end(async () => {
      const answer = await this._transport.request(
        "POST",
        `/v1/admissions/${segment(this.name)}/leases/${this.leaseId}/settle`,
        {
          reservation: this.reservation,
          admitted_at_us: this.admittedAtUs,
          cost: this.cost,
          actual,
        },
      );
      return answer.body?.done === true;
    });
  }
}

/**
 * @typedef {object} AdmissionOptions
 * @property {number} capacity the semaphore's capacity, as every client declares it
 * @property {string | string[]} limits `"50/s"`, `["50/s", "1000/min"]`
 * @property {number} [weight] permits per admission (default 1)
 * @property {number} [cost] charged to every limit per admission (default 1)
 * @property {number | string} [ttl] lease TTL (default 30 s)
 * @property {number | string} [margin] allowed delay between admission and use (server
 *   default 100 ms; 0 turns the use-by off)
 * @property {string} [holder] label shown by status
 * @property {boolean} [update] replace the stored limits if they differ
 * @property {string} [tenant] the tenant this handle's admissions wait as: permits and window
 *   slots go to the waiting tenants in proportion to their shares (docs/fair-shares.md)
 * @property {number} [share] the tenant's share, 1..1000 (default 1; only with a tenant)
 */

/**
 * Permits of a semaphore and a turn within rate limits of the same name, granted together at
 * one instant. Get one from `client.admission(name, options)`.
 */
export class Admission {
  #transport;
  #path;
  #body;
  #cap;
  /** How many admissions arrived past their use-by and were given back. */
  givenBack = 0;

  /**
   * @param {import("./transport.js").Transport} transport
   * @param {string} name
   * @param {AdmissionOptions} options
   * @param {{holder: string, cap: number}} defaults
   */
  constructor(transport, name, options, defaults) {
    if (!Number.isInteger(options?.capacity)) {
      throw new InvalidInput(
        `invalid capacity ${JSON.stringify(options?.capacity)} for "${name}": an integer`,
      );
    }
    const limits = typeof options.limits === "string" ? [options.limits] : options.limits;
    if (!Array.isArray(limits) || limits.some((l) => typeof l !== "string")) {
      throw new InvalidInput(
        `invalid limits ${JSON.stringify(options.limits)} for "${name}": strings like "50/s"`,
      );
    }
    const tenant = tenantFields(options, name);
    this.#transport = transport;
    /** @type {string} */
    this.name = name;
    /** The tenant this handle's admissions wait as (undefined: none). @type {string | undefined} */
    this.tenant = tenant.tenant;
    /** The tenant's share (undefined without a tenant). @type {number | undefined} */
    this.share = tenant.share;
    this.#path = `/v1/admissions/${segment(name)}`;
    this.#cap = defaults.cap;
    /** @type {Record<string, unknown>} */
    const body = {
      capacity: options.capacity,
      limits,
      weight: options.weight ?? 1,
      cost: options.cost ?? 1,
      ttl: durationText(options.ttl ?? 30_000, "ttl"),
      holder: options.holder ?? defaults.holder,
      ...tenant,
    };
    if (options.margin !== undefined) body.margin = durationText(options.margin, "margin");
    if (options.update !== undefined) body.update = options.update;
    this.#body = body;
  }

  /**
   * Waits in the semaphore's FIFO queue (shared with plain acquires; ordered by shares
   * between tenants) until, at one instant,
   * the permits are free and every window has room; then the lease is written and every
   * window charged together. Nothing is held while the windows are full, nothing charged
   * while no permit is free.
   *
   * Right before returning, the client checks the use-by: an admission that arrived too late
   * to be used inside the windows is given back and asked for again (counted in
   * `givenBack`), so the ticket returned is fresh: start the call at once.
   *
   * On timeout it rejects with `NotAdmitted`, with nothing held or charged. Cancel safety as
   * for `Semaphore.acquire`: an abort drops the place in the queue; a grant at that very
   * moment is lost to everyone until its TTL, and its charge stays.
   *
   * @param {{timeout?: number, signal?: AbortSignal}} [opts] `timeout` in ms (default
   *   Infinity)
   * @returns {Promise<Admitted>}
   * @throws {NotAdmitted} no fresh admission within `timeout`
   *
   * @example
   * const sms = client.admission("sms-api", { capacity: 4, limits: ["50/s", "1000/min"] });
   * const ticket = await sms.acquire({ timeout: 30_000 });
   * try {
   *   await provider.send(message);            // at once: the ticket is fresh
   * } finally {
   *   await ticket.release();
   * }
   */
  async acquire({ timeout, signal } = {}) {
    const total = timeoutMs(timeout, "timeout", Infinity);
    // A ticket found past its use-by is given back by the next request (`given_back`), which
    // the server then queues first, where the late one stood.
    /** @type {Admitted | null} */
    let late = null;
    try {
      return await untilGranted(
        {
          timeout: total,
          cap: this.#cap,
          signal,
          Refusal: NotAdmitted,
          what: this.name,
          transport: this.#transport,
        },
        async (waitMs) => {
          const body = { ...this.#body, wait: `${Math.floor(waitMs)}ms` };
          if (late) body.given_back = late._handBack();
          let answer;
          try {
            answer = await this.#transport.request("POST", `${this.#path}/acquire`, body, {
              waitMs,
              signal,
            });
          } catch (err) {
            // Refused or queue full: the server gave it back before it answered.
            if (err instanceof NotAdmitted || err instanceof QueueFull) late = null;
            throw err;
          }
          late = null;
          const ticket = new Admitted(this.#transport, answer.body, answer.arrivedAt, this.#body.cost);
          if (ticket.useByRemainingMs() >= 0) return ticket;
          this.givenBack++;
          late = ticket;
          return undefined;
        },
      );
    } finally {
      // Not carried by a request that reached the server: sent alone (idempotent), else it
      // expires by its TTL.
      if (late) {
        const pending = late;
        late = null;
        pending._handBack();
        await pending._sendGiveBack().catch(() => {});
      }
    }
  }

  /**
   * Takes an admission only if permits and windows allow it now and nobody waits.
   * A refusal holds and charges nothing.
   * @returns {Promise<Admitted | null>}
   */
  async tryAcquire({ signal } = /** @type {{signal?: AbortSignal}} */ ({})) {
    try {
      return await this.acquire({ timeout: 0, signal });
    } catch (err) {
      if (err instanceof NotAdmitted) return null;
      throw err;
    }
  }

  /**
   * Runs `fn(ticket)` holding a fresh admission and releases it however `fn` ends.
   * @template R
   * @param {(ticket: Admitted) => R | Promise<R>} fn
   * @param {{timeout?: number, signal?: AbortSignal}} [opts]
   * @returns {Promise<R>}
   */
  withLease(fn, opts) {
    return withLease(() => this.acquire(opts), fn);
  }
}
