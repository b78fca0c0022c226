// The one place that talks HTTP: builds requests, bounds them in time, turns answers into
// values or typed errors, and moves between instances of the server when one fails (with the
// one retry rule that goes with it). Waiting, keep-alive and the lease's own retries live
// above it.

import { ConnectionFailed, InvalidInput, TesseraError, errorFromAnswer } from "./errors.js";

/** How long one request may wait in the server's queue. The server allows 5m; Node's `fetch`
 * gives up on an answer whose headers take 300 s, so the client asks for at most 4m per
 * request and loops for longer waits. */
export const MAX_WAIT_PER_REQUEST_MS = 240_000;

/**
 * @typedef {object} Answer
 * @property {number} status
 * @property {any} body the parsed JSON body
 * @property {number} sentAt `performance.now()` just before the request was sent
 * @property {number} arrivedAt `performance.now()` when the answer's headers arrived
 */

/** Pauses before the second and third round of a request that may be tried again (a round
 * is one attempt on each instance). */
export const BACKOFF_MS = [50, 200];

/** The kinds of a 503 after which a client of several instances moves to the next one: the
 * instance cannot reach its store, or is stopping. */
const FAIL_OVER_KINDS = new Set(["store_unavailable", "shutting_down"]);

/** Error codes of a connection that was never made: the request did not leave. */
const NOT_SENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/**
 * The instances' URLs: an array of them, or one string of them separated by commas.
 * @param {string | string[]} urls
 * @returns {string[]} base URLs without a trailing `/`
 */
export function splitUrls(urls) {
  const items = typeof urls === "string" ? urls.split(",") : Array.isArray(urls) ? urls : null;
  if (items === null || !items.every((u) => typeof u === "string")) {
    throw new InvalidInput(`invalid server URL ${JSON.stringify(urls)}: a string or an array of strings`);
  }
  const found = items.map((u) => u.trim()).filter((u) => u !== "");
  if (found.length === 0) throw new InvalidInput(`invalid server URL ${JSON.stringify(urls)}`);
  return found.map((u) => {
    let url;
    try {
      url = new URL(u);
    } catch {
      throw new InvalidInput(`invalid server URL ${JSON.stringify(u)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new InvalidInput(`invalid server URL ${JSON.stringify(u)}: http or https only`);
    }
    return url.href.replace(/\/+$/, "");
  });
}

/**
 * Requests to one server, or to one of several instances on the same store.
 *
 * Calls go to the current instance until it fails: no connection, no answer, or an answer
 * 503 `store_unavailable` or `shutting_down`. Then the next instance in the list becomes
 * current, for the failed request's next attempt and for every later request. A request is
 * tried again (on the next instance, at once; after a round over all of them, 50 ms, then
 * 200 ms later; three rounds at most, all within the request's own time limit) when doing
 * so is safe: always if its connection was never made (it did not leave), otherwise only if
 * it is `idempotent` (renew, release, give-back, status). With one instance a 503 is thrown
 * as it came: the server asks to be tried again in a second, not at once.
 */
export class Transport {
  /** @type {string[]} */
  #bases;
  #current = 0;

  /**
   * @param {string | string[]} urls one base URL, several (an array, or joined by commas)
   * @param {{token?: string, requestTimeout?: number, fetch?: typeof fetch}} options
   */
  constructor(urls, options) {
    this.#bases = splitUrls(urls);
    this.requestTimeout = options.requestTimeout ?? 15_000;
    this.fetch = options.fetch ?? globalThis.fetch;
    /** @type {Record<string, string>} */
    this.headers = { accept: "application/json" };
    if (options.token) this.headers.authorization = `Bearer ${options.token}`;
  }

  /** Every instance's base URL, in the order they are tried. */
  get bases() {
    return [...this.#bases];
  }

  /** The instance requests go to now. */
  get base() {
    return this.#bases[this.#current];
  }

  /**
   * Whether `err` moved this client to its next instance, after which a waiting acquire asks
   * again: no answer at all, or, with several instances, a 503 `store_unavailable` or
   * `shutting_down`.
   * @param {unknown} err
   */
  failsOver(err) {
    if (err instanceof ConnectionFailed) return true;
    return (
      this.#bases.length > 1 &&
      err instanceof TesseraError &&
      err.status === 503 &&
      FAIL_OVER_KINDS.has(err.kind)
    );
  }

  /** The instance at `index` failed: the next one becomes current, unless a concurrent
   * request moved on already (two failures of one instance skip no instance). */
  #moveOn(index) {
    if (this.#current === index) this.#current = (index + 1) % this.#bases.length;
  }

  /**
   * Sends one request. `waitMs` is how long the server may hold it (a queue wait); the
   * request, with every attempt of it, is abandoned after `waitMs` plus the request timeout
   * (or `timeout`), or when `signal` aborts (then the signal's reason is thrown).
   *
   * @param {string} method
   * @param {string} path from `/v1`, names already encoded
   * @param {object | undefined} body
   * @param {{waitMs?: number, signal?: AbortSignal, timeout?: number, idempotent?: boolean}} [opts]
   *   `idempotent`: sending it twice is the same as once, so it is tried again after it
   *   left and got no usable answer
   * @returns {Promise<Answer>} for status < 400
   * @throws {import("./errors.js").TesseraError} for status ≥ 400 and for no answer
   */
  async request(method, path, body, opts = {}) {
    const limit = opts.timeout ?? (opts.waitMs ?? 0) + this.requestTimeout;
    const timer = AbortSignal.timeout(Math.max(1, Math.ceil(limit)));
    const signal = opts.signal ? AbortSignal.any([opts.signal, timer]) : timer;
    const headers = { ...this.headers };
    if (body !== undefined) headers["content-type"] = "application/json";
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const tried = new Set();
    let round = 0;
    for (;;) {
      const index = this.#current;
      tried.add(index);
      const { answer, error, sent } = await this.#attempt(
        this.#bases[index],
        method,
        path,
        { headers, payload, signal, limit, timer, callerSignal: opts.signal },
      );
      if (answer) return answer;
      const failsOver = this.failsOver(error);
      if (!failsOver) throw error;
      this.#moveOn(index);
      // Out of time (the instance did not answer within it), or not safe to send again.
      if (timer.aborted || (sent && !opts.idempotent)) throw error;
      if (tried.size < this.#bases.length) continue;
      if (round >= BACKOFF_MS.length) throw error;
      try {
        await sleep(BACKOFF_MS[round], signal);
      } catch {
        if (opts.signal?.aborted) throw opts.signal.reason;
        throw error;
      }
      round++;
      tried.clear();
    }
  }

  /**
   * One attempt on the instance at `base`: its answer, or the error it ends with and
   * whether the request may have reached the server.
   * @returns {Promise<{answer?: Answer, error?: any, sent: boolean}>}
   */
  async #attempt(base, method, path, { headers, payload, signal, limit, timer, callerSignal }) {
    const sentAt = performance.now();
    let res;
    let arrivedAt;
    let text;
    try {
      res = await this.fetch(base + path, { method, headers, body: payload, signal });
      arrivedAt = performance.now();
      text = await res.text();
    } catch (err) {
      if (callerSignal?.aborted) throw callerSignal.reason;
      if (timer.aborted) {
        const error = new ConnectionFailed(
          `${method} ${path}: no answer from ${base} within ${Math.ceil(limit)} ms`,
          { cause: err },
        );
        return { error, sent: true };
      }
      const code = err?.cause?.code ?? err?.code;
      const error = new ConnectionFailed(
        `${method} ${path}: ${base}: ${code ?? err?.cause?.message ?? err?.message ?? String(err)}`,
        { cause: err },
      );
      return { error, sent: !NOT_SENT.has(code) };
    }
    let parsed;
    try {
      parsed = text === "" ? undefined : JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    if (res.status >= 400) {
      return { error: errorFromAnswer(res.status, parsed, res.headers.get("retry-after")), sent: true };
    }
    return { answer: { status: res.status, body: parsed, sentAt, arrivedAt }, sent: true };
  }
}

/**
 * A duration for the API: a number of milliseconds, or a string the server parses
 * (`"30s"`, `"1500ms"`, `"5m"`).
 * @param {number | string} value
 * @param {string} what
 * @returns {string}
 */
export function durationText(value, what) {
  if (typeof value === "string" && value.trim() !== "") return value;
  if (typeof value === "number" && Number.isFinite(value) && value >= 0) {
    return `${Math.ceil(value)}ms`;
  }
  throw new InvalidInput(
    `invalid ${what} ${JSON.stringify(value)}: a number of milliseconds or a string like "30s"`,
  );
}

/**
 * A timeout in milliseconds: a number ≥ 0, or Infinity; undefined means `fallback`.
 * @param {number | undefined} value
 * @param {string} what
 * @param {number} fallback
 */
export function timeoutMs(value, what, fallback) {
  if (value === undefined) return fallback;
  if (typeof value === "number" && value >= 0 && !Number.isNaN(value)) return value;
  throw new InvalidInput(
    `invalid ${what} ${JSON.stringify(value)}: a number of milliseconds ≥ 0, or Infinity`,
  );
}

/** The path segment for a name: `/` and every other reserved character percent-encoded, so
 * `jobs/42` names the semaphore `jobs/42`, as in the library.
 * @param {string} name */
export function segment(name) {
  if (typeof name !== "string" || name === "") {
    throw new InvalidInput(`invalid name ${JSON.stringify(name)}: a non-empty string`);
  }
  return encodeURIComponent(name);
}

/** Resolves after `ms` (at once for ≤ 0), or rejects with the signal's reason.
 * @param {number} ms
 * @param {AbortSignal} [signal] */
export function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    if (ms <= 0) return resolve(undefined);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(undefined);
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
