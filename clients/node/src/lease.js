// A held lease and its keep-alive.
//
// Implementation details
//
// The client knows a lease is valid until its *deadline*, on this process's monotonic clock
// (`performance.now()`): the instant a renewal was sent plus the `expires_in_ms` it answered
// (the server already took off its store round trip and 2% for clock-rate drift), or, for the
// acquire, the instant its answer arrived plus `expires_in_ms` (the acquire may have waited in
// the queue, so its send time says nothing; the answer's transit is within the 2%).
//
// The keeper renews a third of the way to the deadline, so two renewals can fail before the
// lease is in danger. A failed renewal (no answer, 5xx) is retried, more often as the deadline
// nears. `lost` is aborted at `deadline − guard` (guard: 15% of the TTL, between 10 ms and
// 3 s) if no renewal has moved the deadline by then — before the lease could expire — or at
// once when the server says `lease_gone` (expired, revoked, released elsewhere) or refuses
// the renewal for good (401, 403, 400). After `lost`, the keeper stops and the client tries
// one release: if the lease still exists, the permit comes back without waiting for the TTL.
//
// Races: a renewal in flight when the lost timer fires may still succeed; `lost` stays aborted
// (the holder was told to stop) and the release that follows gives the permit back. A renewal
// answered after `release()` began is ignored, whatever it says.

import { ConnectionFailed, LeaseGone, LeaseLost, TesseraError, Unavailable } from "./errors.js";
import { hold, unhold } from "./exit.js";
import { segment, sleep } from "./transport.js";

/**
 * A held lease: `weight` permits of a semaphore, renewed in the background until
 * `release()` or until it is lost.
 *
 * Pass `fence` to the resource you protect so it can refuse a stale holder; stop using the
 * resource when `lost` aborts.
 *
 * @example
 * const lease = await client.lock("reports").acquire({ timeout: 10_000 });
 * try {
 *   await writeReport({ fence: lease.fence, signal: lease.lost });
 * } finally {
 *   await lease.release();
 * }
 */
export class Lease {
  #transport;
  #path;
  #controller = new AbortController();
  #deadline;
  #timer = null;
  #lostTimer = null;
  #ending = null;
  #lastError = undefined;

  /**
   * @param {import("./transport.js").Transport} transport
   * @param {any} body the acquire's answer
   * @param {number} arrivedAt when the answer arrived (`performance.now()`)
   */
  constructor(transport, body, arrivedAt) {
    this.#transport = transport;
    /** The semaphore's name. @type {string} */
    this.name = body.name;
    /** The lease id (32 hex digits); renew and release name it. @type {string} */
    this.leaseId = body.lease_id;
    /** Fence token: strictly increasing per semaphore, never reused. @type {number} */
    this.fence = body.fence;
    /** The seats held: `weight` distinct numbers in `0..capacity`. @type {number[]} */
    this.seats = body.seats;
    /** Permits held. @type {number} */
    this.weight = body.weight;
    /** Holder label, as status shows it. @type {string} */
    this.holder = body.holder;
    /** The TTL each renewal asks for, in milliseconds. @type {number} */
    this.ttlMs = body.ttl_ms;
    this.#path = `/v1/semaphores/${segment(this.name)}/leases/${this.leaseId}`;
    this.#deadline = arrivedAt + body.expires_in_ms;
    hold(this);
    this.#schedule(arrivedAt, body.expires_in_ms);
  }

  /**
   * Aborted, with the reason, when the lease is lost before `release()`: `LeaseGone` when
   * the server says it is gone (revoked by an admin, expired, released by another client),
   * `LeaseLost` when no renewal succeeded in time — then it aborts before the lease could
   * expire. Never aborted by `release()`.
   * @type {AbortSignal}
   */
  get lost() {
    return this.#controller.signal;
  }

  /** True once the lease was ended: by `release()`, a give-back, or the client after it was
   * lost. */
  get released() {
    return this.#ending !== null;
  }

  /** How long the lease is certainly valid from now, in ms (0 once lost or released). */
  remainingMs() {
    if (this.lost.aborted || this.released) return 0;
    return Math.max(0, this.#deadline - performance.now());
  }

  /** Throws `lost.reason` if the lease was lost. */
  throwIfLost() {
    this.lost.throwIfAborted();
  }

  /**
   * Releases the lease: stops the keep-alive and deletes the lease on the server. Idempotent:
   * every call returns the first call's promise. Resolves to `true` if the lease was still
   * held, `false` if it had already gone (expired, revoked, or lost and released by the
   * client). A request without an answer (or a 503) is tried 3 times; if all fail, the promise
   * rejects and the lease expires by its TTL.
   * @returns {Promise<boolean>}
   */
  release() {
    return this._end(() => this.#delete(3));
  }

  /**
   * Ends the lease once, with `finish` (a release, or an admission's give-back); every later
   * call returns the first call's promise. @protected
   * @param {() => Promise<boolean>} finish
   */
  _end(finish) {
    if (this.#ending === null) {
      this.#stop();
      this.#ending = finish().finally(() => unhold(this));
    }
    return this.#ending;
  }

  /** @param {number} attempts */
  async #delete(attempts) {
    let last;
    for (let attempt = 0; attempt < attempts; attempt++) {
      if (attempt > 0) await sleep(100 * 3 ** (attempt - 1));
      try {
        const answer = await this.#transport.request("DELETE", this.#path, undefined, {
          timeout: Math.min(this.#transport.requestTimeout, 5_000),
          idempotent: true,
        });
        return answer.body?.done === true;
      } catch (err) {
        if (!(err instanceof Unavailable)) throw err;
        last = err;
      }
    }
    throw last;
  }

  /** The transport, for subclasses. @protected */
  get _transport() {
    return this.#transport;
  }

  /** `await using lease = await sem.acquire()` releases at the end of the block (Node
   * defines `Symbol.asyncDispose` from 20.4; the syntax needs a compiler or a newer Node). */
  async [Symbol.asyncDispose]() {
    await this.release();
  }

  // --- keep-alive ---

  /** Plans the next renewal and the lost timer from a deadline just learnt. */
  #schedule(anchor, expiresInMs) {
    clearTimeout(this.#lostTimer);
    this.#lostTimer = setTimeout(() => {
      const message = `lease ${this.leaseId} of "${this.name}" was not renewed in time: it may expire`;
      this.#lose(new LeaseLost(message, { cause: this.#lastError }));
    }, Math.max(0, this.#deadline - this.#guard - performance.now()));
    this.#lostTimer.unref();
    this.#renewIn(anchor + expiresInMs / 3 - performance.now());
  }

  /** How long before the deadline `lost` aborts if no renewal succeeded. */
  get #guard() {
    return Math.min(3_000, Math.max(10, this.ttlMs * 0.15));
  }

  #renewIn(ms) {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#renew(), Math.max(0, ms));
    this.#timer.unref();
  }

  async #renew() {
    if (this.#done()) return;
    const sentAt = performance.now();
    const untilLost = this.#deadline - this.#guard - sentAt;
    try {
      const answer = await this.#transport.request(
        "POST",
        `${this.#path}/renew`,
        { ttl: `${this.ttlMs}ms` },
        {
          timeout: Math.max(1, Math.min(this.#transport.requestTimeout, untilLost)),
          idempotent: true,
        },
      );
      if (this.#done()) return;
      this.#lastError = undefined;
      this.#deadline = Math.max(this.#deadline, sentAt + answer.body.expires_in_ms);
      this.#schedule(sentAt, answer.body.expires_in_ms);
    } catch (err) {
      if (this.#done()) return;
      if (err instanceof LeaseGone) return this.#lose(err);
      if (err instanceof Unavailable || (err instanceof TesseraError && err.status >= 500)) {
        // No answer, or the store is out of reach: try again while there is time.
        this.#lastError = err;
        const left = this.#deadline - this.#guard - performance.now();
        this.#renewIn(Math.min(1_000, Math.max(10, left / 4)));
        return;
      }
      // Refused for good (a token no longer valid, an impossible request): no renewal will
      // succeed, so the lease is as good as lost now.
      this.#lose(err instanceof TesseraError ? err : new ConnectionFailed(String(err), { cause: err }));
    }
  }

  #done() {
    return this.released || this.lost.aborted;
  }

  #stop() {
    clearTimeout(this.#timer);
    clearTimeout(this.#lostTimer);
  }

  /** @param {TesseraError} reason */
  #lose(reason) {
    if (this.#done()) return;
    this.#stop();
    this.#controller.abort(reason);
    // Give the permit back if the lease still exists (a renewal may have failed only on the
    // way back); `lease_gone` needs nothing.
    this._end(async () => {
      if (reason instanceof LeaseGone) return false;
      try {
        await this.#delete(1);
      } catch {
        // The server is out of reach: the lease expires by its TTL.
      }
      return false;
    });
  }
}
