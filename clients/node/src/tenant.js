// Tenants and shares (docs/fair-shares.md): the `tenant` and `share` fields of an acquire,
// checked here as the server checks them, so that a bad value is refused before anything is
// sent.

import { InvalidInput } from "./errors.js";

/** The longest tenant name, in UTF-8 bytes (the server's limit). */
export const MAX_TENANT_LEN = 64;
/** The largest share of a tenant. */
export const MAX_SHARE = 1000;

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
  const s = share ?? 1;
  if (!Number.isInteger(s) || s < 1 || s > MAX_SHARE) {
    throw new InvalidInput(
      `invalid share ${JSON.stringify(share)} for "${name}": a whole number between 1 and ${MAX_SHARE}`,
    );
  }
  return { tenant, share: s };
}
