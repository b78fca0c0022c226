// The one place that talks HTTP: builds requests, bounds them in time, and turns answers into
// values or typed errors. Retries, waiting and keep-alive live above it.

import { ConnectionFailed, InvalidInput, errorFromAnswer } from "./errors.js";

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

export class Transport {
  /**
   * @param {string} baseUrl
   * @param {{token?: string, requestTimeout?: number, fetch?: typeof fetch}} options
   */
  constructor(baseUrl, options) {
    let url;
    try {
      url = new URL(baseUrl);
    } catch {
      throw new InvalidInput(`invalid server URL ${JSON.stringify(baseUrl)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new InvalidInput(`invalid server URL ${JSON.stringify(baseUrl)}: http or https only`);
    }
    this.base = url.href.replace(/\/+$/, "");
    this.requestTimeout = options.requestTimeout ?? 15_000;
    this.fetch = options.fetch ?? globalThis.fetch;
    /** @type {Record<string, string>} */
    this.headers = { accept: "application/json" };
    if (options.token) this.headers.authorization = `Bearer ${options.token}`;
  }

  /**
   * Sends one request. `waitMs` is how long the server may hold it (a queue wait); the
   * request is abandoned after `waitMs` plus the request timeout, or when `signal` aborts
   * (then the signal's reason is thrown).
   *
   * @param {string} method
   * @param {string} path from `/v1`, names already encoded
   * @param {object | undefined} body
   * @param {{waitMs?: number, signal?: AbortSignal, timeout?: number}} [opts]
   * @returns {Promise<Answer>} for status < 400
   * @throws {import("./errors.js").TesseraError} for status ≥ 400 and for no answer
   */
  async request(method, path, body, opts = {}) {
    const limit = opts.timeout ?? (opts.waitMs ?? 0) + this.requestTimeout;
    const timer = AbortSignal.timeout(Math.max(1, Math.ceil(limit)));
    const signal = opts.signal ? AbortSignal.any([opts.signal, timer]) : timer;
    const headers = { ...this.headers };
    if (body !== undefined) headers["content-type"] = "application/json";
    const sentAt = performance.now();
    let res;
    let arrivedAt;
    let text;
    try {
      res = await this.fetch(this.base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      });
      arrivedAt = performance.now();
      text = await res.text();
    } catch (err) {
      if (opts.signal?.aborted) throw opts.signal.reason;
      if (timer.aborted) {
        throw new ConnectionFailed(`${method} ${path}: no answer within ${Math.ceil(limit)} ms`, {
          cause: err,
        });
      }
      const code = err?.cause?.code ?? err?.code;
      throw new ConnectionFailed(
        `${method} ${path}: ${code ?? err?.cause?.message ?? err?.message ?? String(err)}`,
        { cause: err },
      );
    }
    let parsed;
    try {
      parsed = text === "" ? undefined : JSON.parse(text);
    } catch {
      parsed = undefined;
    }
    if (res.status >= 400) {
      throw errorFromAnswer(res.status, parsed, res.headers.get("retry-after"));
    }
    return { status: res.status, body: parsed, sentAt, arrivedAt };
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
