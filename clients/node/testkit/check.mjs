// Checkers over logs written by workers on the host's monotonic clock (process.hrtime, shared
// by every process on the host).

/**
 * Pairs `enter`/`exit` lines per pid into intervals, in order.
 * @param {{kind: string, pid: string, ns: bigint, rest: string[]}[]} log
 */
export function intervals(log) {
  const open = new Map();
  const out = [];
  for (const e of log) {
    if (e.kind === "enter") open.set(e.pid, e);
    else if (e.kind === "exit") {
      const start = open.get(e.pid);
      if (!start) throw new Error(`exit without enter for pid ${e.pid}`);
      open.delete(e.pid);
      out.push({ pid: e.pid, start: start.ns, end: e.ns, rest: start.rest });
    }
  }
  if (open.size) throw new Error(`enter without exit for ${[...open.keys()]}`);
  return out;
}

/** The most intervals open at once, and the sets of intervals open at each start. */
export function maxOverlap(ivs) {
  let max = 0;
  const groups = [];
  for (const a of ivs) {
    const open = ivs.filter((b) => b.start <= a.start && a.start < b.end);
    groups.push(open);
    max = Math.max(max, open.length);
  }
  return { max, groups };
}

/** The most stamps (ns, bigint) inside any window [t, t + windowMs) starting at a stamp —
 * the windows that start at a stamp are the ones that can hold the most. */
export function maxInWindow(stamps, windowMs) {
  const sorted = [...stamps].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const w = BigInt(Math.round(windowMs * 1e6));
  let max = 0;
  let j = 0;
  for (let i = 0; i < sorted.length; i++) {
    while (j < sorted.length && sorted[j] < sorted[i] + w) j++;
    max = Math.max(max, j - i);
  }
  return max;
}
