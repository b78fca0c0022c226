// Tenants and shares (docs/fair-shares.md): the `tenant` and `share` fields of an acquire,
// checked here as the server checks them, so that a bad value is refused before anything is
// sent.

import { InvalidInput } from "./errors.js";

/** The longest tenant name, in UTF-8 bytes (the server's limit). */
export const MAX_TENANT_LEN = 64;
/** The largest share of a tenant. */
export const MAX_SHARE = 1000;
/** The highest ceiling (and floor) of a tenant: the largest capacity. */
export const MAX_CEILING = 1_000_000;
/** The highest window ceiling of a tenant, a percentage of each rate window. */
export const MAX_WINDOW_CEILING = 100;

/**
 * The acquire body's tenant fields for `options.tenant` and `options.share`: none without a
 * tenant; else the tenant and its share (default 1).
 * @param {{tenant?: unknown, share?: unknown}} options
 * @param {string} name the semaphore's name, for the message
 * @returns {{tenant?: string, share?: number}}
 * @throws {InvalidInput} a tenant that is not 1 to 64 bytes of text without control
 *   characters, a share that is not a whole number 1 to 1000, or a share without a tenant
 */
export function tenantFields({ tenant, share }, name) {
  if (tenant === undefined || tenant === null) {
    if (share !== undefined && share !== null) {
      throw new InvalidInput(`invalid share ${JSON.stringify(share)} for "${name}": a share needs a tenant`);
    }
    return {};
  }
  checkTenant(tenant, name);
  const s = share ?? 1;
  if (!Number.isInteger(s) || s < 1 || s > MAX_SHARE) {
    throw new InvalidInput(
      `invalid share ${JSON.stringify(share)} for "${name}": a whole number between 1 and ${MAX_SHARE}`,
    );
  }
  return { tenant, share: s };
}

/**
 * `tenant`, checked as the server checks it.
 * @param {unknown} tenant
 * @param {string} name the semaphore's name, for the message
 * @returns {string}
 * @throws {InvalidInput} unless it is 1 to 64 bytes of text without control characters
 */
export function checkTenant(tenant, name) {
  if (
    typeof tenant !== "string" ||
    // A lone surrogate is no UTF-8 text.
    /\p{Surrogate}/u.test(tenant) ||
    /\p{Cc}/u.test(tenant) ||
    Buffer.byteLength(tenant, "utf8") < 1 ||
    Buffer.byteLength(tenant, "utf8") > MAX_TENANT_LEN
  ) {
    throw new InvalidInput(
      `invalid tenant ${JSON.stringify(tenant)} for "${name}": 1 to ${MAX_TENANT_LEN} bytes (UTF-8), no control characters`,
    );
  }
  return tenant;
}

/**
 * The body of a tenant-limits PUT (docs/fair-shares.md#ceilings-and-floors), checked as the
 * server checks it, so that a bad value is refused before anything is sent.
 * @param {{ceiling?: unknown, floor?: unknown, windowCeiling?: unknown}} limits `ceiling`:
 *   1..1 000 000, or `null`/undefined for none; `floor`: 0 up to the ceiling (default 0);
 *   `windowCeiling`: a percentage 1..100 of each rate window, or `null`/undefined for none
 * @param {string} name the semaphore's name, for the message
 * @returns {{ceiling: number | null, floor: number, window_ceiling?: number}}
 * @throws {InvalidInput} a ceiling, floor or window ceiling out of range or not a whole
 *   number
 */
export function tenantLimitsBody({ ceiling, floor, windowCeiling }, name) {
  const c = ceiling ?? null;
  if (c !== null && (!Number.isInteger(c) || c < 1 || c > MAX_CEILING)) {
    throw new InvalidInput(
      `invalid ceiling ${JSON.stringify(ceiling)} for "${name}": null or a whole number between 1 and ${MAX_CEILING}`,
    );
  }
  const f = floor === undefined ? 0 : floor;
  const top = c ?? MAX_CEILING;
  if (!Number.isInteger(f) || f < 0 || f > top) {
    throw new InvalidInput(
      `invalid floor ${JSON.stringify(floor)} for "${name}": a whole number between 0 and ${c === null ? MAX_CEILING : `the ceiling (${c})`}`,
    );
  }
  const w = windowCeiling ?? null;
  if (w !== null && (!Number.isInteger(w) || w < 1 || w > MAX_WINDOW_CEILING)) {
    throw new InvalidInput(
      `invalid window ceiling ${JSON.stringify(windowCeiling)} for "${name}": null or a whole number (a percentage) between 1 and ${MAX_WINDOW_CEILING}`,
    );
  }
  // Sent only when set (absent: none), so that a request without one reads as before.
  return w === null ? { ceiling: c, floor: f } : { ceiling: c, floor: f, window_ceiling: w };
}
