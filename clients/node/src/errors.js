// Errors: one base class, `TesseraError`, and one subclass per `kind` the server answers
// (`{"kind", "message"}`), plus the few the client itself raises (`connection_failed`,
// `lease_lost`). Callers match with `instanceof` or on `kind`, never on messages.

/**
 * Every error this package throws or puts in `lease.lost.reason`.
 *
 * `kind` is the server's machine-readable class (`"no_permit"`, `"lease_gone"`, …) or one of
 * the client's own (`"connection_failed"`, `"lease_lost"`); `status` is the HTTP status when
 * the server answered (else `undefined`); `retryAfterMs` is set for `queue_full` and
 * `limited` (the exact wait the server named).
 *
 * @example
 * try {
 *   await client.lock("nightly-report").acquire({ timeout: 5_000 });
 * } catch (err) {
 *   if (err instanceof NoPermit) console.log("someone else runs the report");
 *   else throw err;
 * }
 */
export class TesseraError extends Error {
  /**
   * @param {string} message
   * @param {{kind?: string, status?: number, retryAfterMs?: number, cause?: unknown}} [details]
   */
  constructor(message, details = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    /** @type {string} */
    this.kind = details.kind ?? new.target.kind ?? "unknown";
    /** @type {number | undefined} */
    this.status = details.status;
    /** @type {number | undefined} */
    this.retryAfterMs = details.retryAfterMs;
  }

  get name() {
    return this.constructor.name;
  }
}

/** `invalid_input` (400): the request was refused as it stands; nothing changed. Also raised
 * by the client, without a `status`, for arguments it can check itself. */
export class InvalidInput extends TesseraError {
  static kind = "invalid_input";
}
/** `unauthorized` (401): no bearer token, or an unknown one. */
export class Unauthorized extends TesseraError {
  static kind = "unauthorized";
}
/** `forbidden` (403): the token does not cover this name. */
export class Forbidden extends TesseraError {
  static kind = "forbidden";
}
/** `not_found` (404): no such semaphore, limiter or route. */
export class NotFound extends TesseraError {
  static kind = "not_found";
}
/** `method_not_allowed` (405). */
export class MethodNotAllowed extends TesseraError {
  static kind = "method_not_allowed";
}
/** `no_permit` (408): no permit within the timeout; nothing is held or queued. */
export class NoPermit extends TesseraError {
  static kind = "no_permit";
}
/** `not_admitted` (408): no admission within the timeout; nothing is held, queued or
 * charged. */
export class NotAdmitted extends TesseraError {
  static kind = "not_admitted";
}
/** `capacity_mismatch` (409): the store holds this semaphore with another capacity. */
export class CapacityMismatch extends TesseraError {
  static kind = "capacity_mismatch";
}
/** `rate_mismatch` (409): the store holds this limiter with other limits (or margin). */
export class RateMismatch extends TesseraError {
  static kind = "rate_mismatch";
}
/** `lease_gone` (410): the lease expired, was revoked or released; it cannot come back. */
export class LeaseGone extends TesseraError {
  static kind = "lease_gone";
}
/** `payload_too_large` (413). */
export class PayloadTooLarge extends TesseraError {
  static kind = "payload_too_large";
}
/** `unsupported_media_type` (415). */
export class UnsupportedMediaType extends TesseraError {
  static kind = "unsupported_media_type";
}
/** `queue_full` (429): the semaphore's queue is full; `retryAfterMs` says when to retry. */
export class QueueFull extends TesseraError {
  static kind = "queue_full";
}
/** `limited` (429): the limits do not admit the request within the wait; nothing was
 * charged; `retryAfterMs` is the exact wait if nobody else comes first. */
export class Limited extends TesseraError {
  static kind = "limited";
}
/** `internal` or `corrupt` (500): a fault in the server or the stored data. */
export class Internal extends TesseraError {
  static kind = "internal";
}
/** `unsupported` (501): the server's store lacks this operation (admissions on etcd). */
export class Unsupported extends TesseraError {
  static kind = "unsupported";
}
/** `store_unavailable` (503): the server could not reach its store in time. Also the base of
 * `ShuttingDown` and `ConnectionFailed`: catch `Unavailable` for "not reachable now". */
export class Unavailable extends TesseraError {
  static kind = "store_unavailable";
}
/** `shutting_down` (503): the server is stopping. */
export class ShuttingDown extends Unavailable {
  static kind = "shutting_down";
}
/** `connection_failed` (client side, no `status`): no answer from the server — refused,
 * reset, or none within the request timeout. For an acquire, the server may still have
 * granted a lease whose answer was lost; such a lease expires by its TTL. */
export class ConnectionFailed extends Unavailable {
  static kind = "connection_failed";
}
/** `lease_lost` (client side, the reason of `lease.lost`): no renewal succeeded in time, so
 * the lease may expire; `cause` is the last renewal's error. */
export class LeaseLost extends TesseraError {
  static kind = "lease_lost";
}

const BY_KIND = new Map(
  [
    InvalidInput,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    NoPermit,
    NotAdmitted,
    CapacityMismatch,
    RateMismatch,
    LeaseGone,
    PayloadTooLarge,
    UnsupportedMediaType,
    QueueFull,
    Limited,
    Internal,
    Unsupported,
    Unavailable,
    ShuttingDown,
  ].map((cls) => [cls.kind, cls]),
);
BY_KIND.set("corrupt", Internal);

/**
 * The error for an answer with status ≥ 400.
 * @param {number} status
 * @param {any} body the parsed JSON body, or undefined if it was not JSON
 * @param {string | null} retryAfterHeader
 * @returns {TesseraError}
 */
export function errorFromAnswer(status, body, retryAfterHeader) {
  const kind = typeof body?.kind === "string" ? body.kind : `http_${status}`;
  const message =
    typeof body?.message === "string" ? body.message : `tessera serve answered ${status}`;
  let retryAfterMs = typeof body?.retry_after_ms === "number" ? body.retry_after_ms : undefined;
  if (retryAfterMs === undefined && retryAfterHeader && /^\d+$/.test(retryAfterHeader)) {
    retryAfterMs = Number(retryAfterHeader) * 1000;
  }
  const Class = BY_KIND.get(kind) ?? TesseraError;
  return new Class(message, { kind, status, retryAfterMs });
}
