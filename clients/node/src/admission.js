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

import { InvalidInput, NotAdmitted } from "./errors.js";
import { Lease } from "./lease.js";
import { untilGranted, withLease } from "./queue.js";
import { durationText, segment, timeoutMs } from "./transport.js";

/**
 * A granted admission: a `Lease` (renewed, `lost`, `fence`, `seats`) whose windows were
 * charged at `admittedAtUs`. Start the call before its use-by; `release()` when done, or
 * `giveBack()` if the call was not made.
 */
export class Admitted extends Lease {
  #useBy;

  /**
   * @param {import("./transport.js").Transport} transport
   * @param {any} body the admission's answer
   * @param {number} arrivedAt
   */
  constructor(transport, body, arrivedAt) {
    super(transport, body, arrivedAt);
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
    return this._end(async () => {
      const answer = await this._transport.request(
        "POST",
        `/v1/admissions/${segment(this.name)}/leases/${this.leaseId}/give-back`,
        { reservation: this.reservation, admitted_at_us: this.admittedAtUs },
        { idempotent: true },
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
 * @property {number | string} [margin] allowed delay between admission and use (default
 *   20 ms; 0 turns the use-by off)
 * @property {string} [holder] label shown by status
 * @property {boolean} [update] replace the stored limits if they differ
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
    this.#transport = transport;
    /** @type {string} */
    this.name = name;
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
    };
    if (options.margin !== undefined) body.margin = durationText(options.margin, "margin");
    if (options.update !== undefined) body.update = options.update;
    this.#body = body;
  }

  /**
   * Waits in the semaphore's FIFO queue (shared with plain acquires) until, at one instant,
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
        const answer = await this.#transport.request(
          "POST",
          `${this.#path}/acquire`,
          { ...this.#body, wait: `${Math.floor(waitMs)}ms` },
          { waitMs, signal },
        );
        const ticket = new Admitted(this.#transport, answer.body, answer.arrivedAt);
        if (ticket.useByRemainingMs() >= 0) return ticket;
        this.givenBack++;
        await ticket.giveBack();
        return undefined;
      },
    );
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
