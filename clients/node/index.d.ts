// Type declarations of tessera-client (the package is plain ESM JavaScript; see src/).

/** A duration for the server: milliseconds, or a string it parses (`"30s"`, `"1500ms"`). */
export type Duration = number | string;

export interface ClientOptions {
  /** Bearer token (`tessera serve --tokens`). */
  token?: string;
  /** Default holder label shown by status and the dashboard (default `node:HOST:PID`). */
  holder?: string;
  /** Milliseconds a request may take beyond its queue wait before it fails with
   * `ConnectionFailed` (default 15 000). */
  requestTimeout?: number;
  /** Milliseconds one request may wait in the server's queue (100..240 000, default
   * 240 000); longer waits are asked again. */
  maxWaitPerRequest?: number;
  /** The `fetch` to use (default the global one). */
  fetch?: typeof fetch;
}

/**
 * A client of one `tessera serve`.
 *
 * @example
 * const client = new Client("http://127.0.0.1:8080", { token: process.env.TESSERA_TOKEN });
 * await client.lock("nightly-report").withLease(async (lease) => {
 *   await makeReport({ fence: lease.fence, signal: lease.lost });
 * }, { timeout: 60_000 });
 */
export class Client {
  /**
   * `url`: the server; or several instances on one store, as an array or one string joined by
   * commas. Requests go to one instance until it fails (no connection, no answer, 503
   * `store_unavailable` or `shutting_down`), then to the next; see the README for what is
   * tried again.
   */
  constructor(url: string | string[], options?: ClientOptions);
  /** The server's base URL; several instances' URLs joined by commas. */
  readonly url: string;
  /** Every instance's base URL, in the order they are tried. */
  readonly urls: string[];
  /** The instance requests go to now (the last one that did not fail). */
  readonly currentUrl: string;
  /** A semaphore of `capacity` permits. */
  semaphore(name: string, options: SemaphoreOptions): Semaphore;
  /** A lock: a semaphore of capacity 1. */
  lock(name: string, options?: LockOptions): Semaphore;
  /** A rate limiter: at most N per PERIOD for every limit, across every client. */
  rate(name: string, limits: string | string[], options?: RateOptions): RateLimiter;
  /** Permits and rate windows in one step (memory, SQLite, Redis, MySQL and PostgreSQL stores). */
  admission(name: string, options: AdmissionOptions): Admission;
  /**
   * Sets a tenant's ceiling, floor and window ceiling on the semaphore `name` (admin;
   * docs/fair-shares.md#ceilings-and-floors); resolves with every tenant's limits after the
   * change. Each call sets all of them; none (`setTenantLimits(name, tenant)`) removes them.
   * Checked first: `InvalidInput` without a `status` for a bad tenant, ceiling, floor or
   * window ceiling (nothing sent); `InvalidInput` (400) for floors above the capacity,
   * `Unsupported` (501) from a store that keeps no limits (or no window ceilings, when one
   * is given); on error nothing changed.
   */
  setTenantLimits(name: string, tenant: string, limits?: TenantLimitsOptions): Promise<Record<string, TenantLimits>>;
  /** Every tenant's ceiling, floor and window ceiling set on the semaphore `name`; `{}` when
   * none is set. */
  tenantLimits(name: string): Promise<Record<string, TenantLimits>>;
}

/** What `setTenantLimits` sets. */
export interface TenantLimitsOptions {
  /** The tenant never holds more than this many permits (1..1 000 000; null or absent: no
   * ceiling). */
  ceiling?: number | null;
  /** Permits kept for the tenant while it holds fewer (0 up to the ceiling; default 0). */
  floor?: number;
  /** The tenant is admitted at most this percentage (1..100) of each rate window of the
   * name's admissions (docs/fair-shares.md, "A ceiling on a share of the windows"); null or
   * absent: none. */
  windowCeiling?: number | null;
}

/** A tenant's limits on a semaphore, as the server keeps them. */
export interface TenantLimits {
  /** `null`: no ceiling. */
  ceiling: number | null;
  /** 0: no floor. */
  floor: number;
  /** Its window ceiling, a percentage of each rate window; absent when none is set. */
  windowCeiling?: number;
}

export interface LockOptions extends TenantOptions {
  /** Lease TTL (default 30 s; 100 ms..24 h). */
  ttl?: Duration;
  /** Holder label. */
  holder?: string;
}

/** Fair shares between tenants (docs/fair-shares.md). Checked when the handle is made:
 * `InvalidInput` for a bad value, nothing sent. A store that cannot order by shares answers
 * `Unsupported` (501) at the first acquire. */
export interface TenantOptions {
  /** The tenant the handle's acquires wait as (1 to 64 bytes, no control characters): under
   * contention grants go to the waiting tenants in proportion to their shares, first come
   * first served within a tenant. */
  tenant?: string;
  /** The tenant's share, a whole number 1..1000 (default 1; only with a tenant). */
  share?: number;
}

export interface SemaphoreOptions extends LockOptions {
  /** The semaphore's capacity, as every client declares it (1..1 000 000). */
  capacity: number;
  /** Permits per lease (default 1). */
  weight?: number;
}

export interface AcquireOptions {
  /** Milliseconds to wait (default Infinity; 0 only takes a permit free now). */
  timeout?: number;
  /** Aborting it gives up the place in the queue; the promise rejects with its reason. */
  signal?: AbortSignal;
}

/** A semaphore on the server; `client.semaphore(...)` or `client.lock(...)`. */
export class Semaphore {
  private constructor();
  readonly name: string;
  /** The tenant the handle's acquires wait as, if any. */
  readonly tenant: string | undefined;
  /** The tenant's share (undefined without a tenant). */
  readonly share: number | undefined;
  /** Waits in FIFO order for the permits. Rejects with `NoPermit` at the timeout (nothing
   * held or queued). */
  acquire(options?: AcquireOptions): Promise<Lease>;
  /** The permits if free now and nobody waits, else `null`. */
  tryAcquire(options?: { signal?: AbortSignal }): Promise<Lease | null>;
  /** Runs `fn` holding the permits; releases them however `fn` ends. */
  withLease<R>(fn: (lease: Lease) => R | Promise<R>, options?: AcquireOptions): Promise<R>;
  /** Holders and queue (`GET /v1/semaphores/{name}`), or `null` if nobody holds or waits. */
  status(): Promise<SemaphoreStatus | null>;
}

/** A held lease, renewed in the background until released or lost. */
export class Lease {
  protected constructor();
  readonly name: string;
  readonly leaseId: string;
  /** Strictly increasing per semaphore, never reused: pass it to the protected resource. */
  readonly fence: number;
  /** `weight` distinct numbers in `0..capacity`. */
  readonly seats: number[];
  readonly weight: number;
  readonly holder: string;
  readonly ttlMs: number;
  /** Aborted before the lease could expire when it is lost; `reason` is `LeaseGone`
   * (revoked, expired, released elsewhere), `LeaseLost` (no renewal in time) or the error
   * that refused a renewal for good. Never aborted by `release()`. */
  readonly lost: AbortSignal;
  /** True once ended: by `release()`, a give-back, or the client after a loss. */
  readonly released: boolean;
  /** Milliseconds the lease is certainly valid from now (0 once lost or released). */
  remainingMs(): number;
  /** Throws `lost.reason` if the lease was lost. */
  throwIfLost(): void;
  /** Idempotent: `true` if the lease was still held, `false` if it had gone. */
  release(): Promise<boolean>;
  [Symbol.asyncDispose](): Promise<void>;
}

export interface RateOptions {
  /** Charged to every limit per acquire (default 1). */
  cost?: number;
  /** Between admission and use (server default 20 ms in exact mode). */
  margin?: Duration;
  /** `"exact"` (default) or `"smooth"`. */
  mode?: "exact" | "smooth";
  /** Smooth mode: units admitted at once after an idle period. */
  burst?: number;
  /** Replace the stored limits if they differ. */
  update?: boolean;
}

export type RateDecision =
  | { admitted: true; admittedAtUs: number }
  | { admitted: false; retryAfterMs: number };

/** A rate limiter on the server; `client.rate(name, limits)`. */
export class RateLimiter {
  private constructor();
  readonly name: string;
  /** Waits for a turn (reserved by the server, in arrival order). Rejects with `Limited`
   * (nothing charged) if the turn is beyond `maxWait` ms (default Infinity). */
  acquire(options?: {
    maxWait?: number;
    cost?: number;
    signal?: AbortSignal;
  }): Promise<{ admittedAtUs: number }>;
  /** A turn now, or the wait (nothing charged). */
  tryAcquire(options?: { cost?: number }): Promise<RateDecision>;
  /** Usage per window (`GET /v1/rates/{name}`), or `null` if the store holds nothing. */
  status(): Promise<RateStatus | null>;
}

export interface AdmissionOptions extends TenantOptions {
  capacity: number;
  limits: string | string[];
  weight?: number;
  cost?: number;
  ttl?: Duration;
  /** Allowed delay between admission and use (server default 100 ms; 0 turns the use-by off). */
  margin?: Duration;
  holder?: string;
  update?: boolean;
}

/** Permits and rate windows granted together; `client.admission(name, options)`. */
export class Admission {
  private constructor();
  readonly name: string;
  /** The tenant the handle's admissions wait as, if any. */
  readonly tenant: string | undefined;
  /** The tenant's share (undefined without a tenant). */
  readonly share: number | undefined;
  /** Admissions that arrived past their use-by and were given back. */
  givenBack: number;
  /** Waits for a fresh admission. Rejects with `NotAdmitted` at the timeout (nothing held
   * or charged). */
  acquire(options?: AcquireOptions): Promise<Admitted>;
  /** An admission if permits and windows allow it now, else `null` (nothing charged). */
  tryAcquire(options?: { signal?: AbortSignal }): Promise<Admitted | null>;
  /** Runs `fn` holding a fresh admission; releases it however `fn` ends. */
  withLease<R>(fn: (ticket: Admitted) => R | Promise<R>, options?: AcquireOptions): Promise<R>;
}

/** A granted admission: a lease whose windows were charged at `admittedAtUs`. */
export class Admitted extends Lease {
  /** Store clock, µs since the epoch. */
  readonly admittedAtUs: number;
  readonly reservation: number;
  /** The server's `use_by_ms`; `null` with a margin of 0. */
  readonly useByMs: number | null;
  /** Milliseconds left to start the call (Infinity without a use-by; negative once past). */
  useByRemainingMs(): number;
  /** The cost charged to every window. */
  readonly cost: number;
  /** Releases the lease and returns the charge while it is the limiter's latest. */
  giveBack(): Promise<boolean>;
  /** Releases the lease and makes the charge `actual` (0 to 1,000,000): a smaller cost given
   * back once while the lease is held, a larger one charged at once. */
  settle(actual: number): Promise<boolean>;
}

export interface HolderStatus {
  lease_id: string;
  weight: number;
  seats: number[];
  fence: number;
  holder: string;
  acquired_at_us: number;
  expires_at_us: number;
  expires_in_ms: number;
  /** The tenant it was granted to; absent when the request named none. */
  tenant?: string;
}

/** One tenant's part of a semaphore: `tenant` is `""` for requests that named none. */
export interface TenantStatus {
  tenant: string;
  holders: number;
  used: number;
  waiters: number;
  waiting: number;
  /** Its ceiling, when one is set (`setTenantLimits`). */
  ceiling?: number;
  /** Its floor, when above 0. */
  floor?: number;
  /** Its window ceiling (a percentage of each rate window), when one is set. */
  window_ceiling?: number;
}

export interface SemaphoreStatus {
  name: string;
  capacity: number;
  used: number;
  available: number;
  now_us: number;
  holders: HolderStatus[];
  queue: { lease_id: string; weight: number; holder: string; enqueued_at_us: number; tenant?: string }[];
  /** Holders, waiters and permits per tenant. */
  tenants: TenantStatus[];
}

export interface RateStatus {
  name: string;
  mode: string;
  margin_ms: number;
  limits: {
    limit: string;
    used: number;
    reserved: number;
    next_free_us: number;
    next_free_in_ms: number;
  }[];
  next_free_us: number;
  next_free_in_ms: number;
  now_us: number;
}

/** Every error of this package. */
export class TesseraError extends Error {
  constructor(
    message: string,
    details?: { kind?: string; status?: number; retryAfterMs?: number; cause?: unknown },
  );
  /** The server's `kind`, or the client's own (`connection_failed`, `lease_lost`). */
  readonly kind: string;
  /** The HTTP status when the server answered. */
  readonly status: number | undefined;
  /** For `queue_full` and `limited`: the wait the server named, in ms. */
  readonly retryAfterMs: number | undefined;
}
/** `invalid_input` (400), or an argument the client refused itself (no `status`). */
export class InvalidInput extends TesseraError {}
/** `unauthorized` (401). */
export class Unauthorized extends TesseraError {}
/** `forbidden` (403): the token does not cover the name. */
export class Forbidden extends TesseraError {}
/** `not_found` (404). */
export class NotFound extends TesseraError {}
/** `method_not_allowed` (405). */
export class MethodNotAllowed extends TesseraError {}
/** `no_permit` (408): none within the timeout; nothing held or queued. */
export class NoPermit extends TesseraError {}
/** `not_admitted` (408): none within the timeout; nothing held, queued or charged. */
export class NotAdmitted extends TesseraError {}
/** `capacity_mismatch` (409). */
export class CapacityMismatch extends TesseraError {}
/** `rate_mismatch` (409). */
export class RateMismatch extends TesseraError {}
/** `lease_gone` (410): expired, revoked or released; it cannot come back. */
export class LeaseGone extends TesseraError {}
/** `payload_too_large` (413). */
export class PayloadTooLarge extends TesseraError {}
/** `unsupported_media_type` (415). */
export class UnsupportedMediaType extends TesseraError {}
/** `queue_full` (429), with `retryAfterMs`. */
export class QueueFull extends TesseraError {}
/** `limited` (429): not within the wait, nothing charged; `retryAfterMs` is exact. */
export class Limited extends TesseraError {}
/** `internal` or `corrupt` (500). */
export class Internal extends TesseraError {}
/** `unsupported` (501): the store lacks the operation. */
export class Unsupported extends TesseraError {}
/** `store_unavailable` (503); base of `ShuttingDown` and `ConnectionFailed`. */
export class Unavailable extends TesseraError {}
/** `shutting_down` (503). */
export class ShuttingDown extends Unavailable {}
/** `connection_failed`: no answer (refused, reset, or none within the request timeout). */
export class ConnectionFailed extends Unavailable {}
/** `lease_lost`: no renewal succeeded in time; `cause` is the last renewal's error. */
export class LeaseLost extends TesseraError {}
