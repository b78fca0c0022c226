// Test support: a throwaway `tessera serve` on SQLite in a temp dir, on a free loopback port,
// and node workers running the client in other processes.

import { spawn, spawnSync } from "node:child_process";
import { accessSync, constants, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository root: clients/node/testkit → three levels up. */
export const REPO_ROOT = resolve(HERE, "../../..");
export const BIN = process.env.TESSERA_BIN ?? join(REPO_ROOT, "target/debug/tessera");
export const WORKER = join(HERE, "worker.mjs");

/** Throws (never skips) when the server binary is missing. */
export function requireBinary() {
  try {
    accessSync(BIN, constants.X_OK);
  } catch {
    throw new Error(
      `tessera binary not found or not executable at ${BIN}: ` +
        "build it (cargo build -p tessera-cli) or set TESSERA_BIN",
    );
  }
}

/** A fresh temp dir, removed by `dispose`. */
export function tempDir() {
  const dir = mkdtempSync(join(tmpdir(), "tessera-node-"));
  return { dir, dispose: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * Starts `tessera serve` on `db` (a SQLite file; default a new one in a new temp dir), or on
 * `store` (a store URL, such as `memory://`).
 * @param {{db?: string, store?: string, args?: string[]}} [opts]
 */
export async function startServer(opts = {}) {
  requireBinary();
  const own = opts.db || opts.store ? null : tempDir();
  const db = opts.db ?? (own ? join(own.dir, "t.db") : undefined);
  const store = opts.store ?? `sqlite://${db}`;
  const proc = spawn(BIN, ["--store", store, "serve", "--listen", "127.0.0.1:0", ...(opts.args ?? [])], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  proc.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((res) => proc.once("exit", (code, signal) => res({ code, signal })));
  const url = await new Promise((res, rej) => {
    let out = "";
    const timer = setTimeout(() => rej(new Error(`tessera serve did not start in 20 s: ${stderr}`)), 20_000);
    proc.stdout.on("data", (d) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        res(m[1].replace(/[,.]$/, ""));
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      rej(new Error(`tessera serve exited with ${code} before listening: ${stderr}`));
    });
  });
  proc.stdout.resume();
  return {
    url,
    db,
    store,
    proc,
    exited,
    /** SIGTERM, and wait for the exit. */
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
      const r = await exited;
      own?.dispose();
      return r;
    },
    /** SIGKILL, and wait until the process is gone. */
    async kill() {
      proc.kill("SIGKILL");
      return exited;
    },
  };
}

/** `n` distinct loopback ports free right now (held together while they are picked). */
async function freePorts(n) {
  const servers = await Promise.all(
    Array.from({ length: n }, () => new Promise((res) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => res(s));
    })),
  );
  const ports = servers.map((s) => s.address().port);
  await Promise.all(servers.map((s) => new Promise((res) => s.close(res))));
  return ports;
}

/**
 * Starts an etcd of its own (one member) in a temp dir on free loopback ports: a store whose
 * queue does not order by tenants' shares (docs/fair-shares.md). A missing `etcd` is an
 * error, not a skip.
 * @returns {Promise<{url: string, stop: () => Promise<void>}>} `url` is the `etcd://` store URL
 */
export async function startEtcd() {
  const tmp = tempDir();
  const [clientPort, peerPort] = await freePorts(2);
  const client = `http://127.0.0.1:${clientPort}`;
  const peer = `http://127.0.0.1:${peerPort}`;
  const proc = spawn(
    "etcd",
    [
      "--name", "t", "--data-dir", join(tmp.dir, "data"),
      "--listen-client-urls", client, "--advertise-client-urls", client,
      "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
      "--initial-cluster", `t=${peer}`,
      "--heartbeat-interval", "50", "--election-timeout", "500",
      "--logger", "zap", "--log-level", "warn",
    ],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let log = "";
  proc.stderr.on("data", (d) => (log += d));
  const exited = new Promise((res) => proc.once("close", res));
  const failed = new Promise((res) => proc.once("error", res));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null && proc.pid !== undefined) {
      proc.kill("SIGTERM");
      await exited;
    }
    tmp.dispose();
  };
  const end = performance.now() + 15_000;
  for (;;) {
    const healthy = await fetch(`${client}/health`)
      .then(async (r) => (await r.json()).health === "true")
      .catch(() => false);
    if (healthy) return { url: `etcd://127.0.0.1:${clientPort}`, stop };
    const error = await Promise.race([failed, sleep(50).then(() => null)]);
    if (error || proc.exitCode !== null || performance.now() > end) {
      await stop();
      throw new Error(`etcd did not start (install it: apt-get install etcd-server): ${error ?? log}`);
    }
  }
}

/** Runs the `tessera` CLI on a store. */
export function cli(store, ...args) {
  const r = spawnSync(BIN, ["--store", store, ...args], { encoding: "utf8" });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/**
 * Runs `worker.mjs` with a task; resolves with its exit status and output.
 * @param {object} task
 */
export function worker(task) {
  const proc = spawn(process.execPath, [WORKER, JSON.stringify(task)], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (d) => (stdout += d));
  proc.stderr.on("data", (d) => (stderr += d));
  const done = new Promise((res) =>
    proc.once("close", (code, signal) => res({ code, signal, stdout, stderr })),
  );
  return { proc, done, output: () => stdout };
}

/** Runs workers and fails with their stderr if any did not exit 0. */
export async function runWorkers(tasks) {
  const results = await Promise.all(tasks.map((t) => worker(t).done));
  for (const r of results) {
    if (r.code !== 0) throw new Error(`worker exited ${r.code ?? r.signal}: ${r.stderr}`);
  }
  return results;
}

/** Resolves when `proc` has printed a line matching `re`, with the match. */
export function waitForLine(w, re, ms = 20_000) {
  return new Promise((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`no line matching ${re} in ${ms} ms: ${w.output()}`)), ms);
    const check = () => {
      const m = re.exec(w.output());
      if (m) {
        clearTimeout(timer);
        w.proc.stdout.off("data", check);
        res(m);
      }
    };
    w.proc.stdout.on("data", check);
    check();
  });
}

/** The log lines a worker wrote: `[kind, pid, ns (bigint), ...rest]`. */
export function readLog(path) {
  return readFileSync(path, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((line) => {
      const [kind, pid, ns, ...rest] = line.split(" ");
      return { kind, pid, ns: BigInt(ns), rest };
    });
}

/** Resolves after `ms`. */
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Resolves with the abort reason once `signal` aborts, or rejects after `ms`. */
export function aborted(signal, ms) {
  return new Promise((res, rej) => {
    if (signal.aborted) return res(signal.reason);
    const timer = setTimeout(() => rej(new Error(`not aborted within ${ms} ms`)), ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      res(signal.reason);
    });
  });
}

/** Polls `check` (async, truthy when done) every 20 ms; rejects with `what` after `ms`. */
export async function until(check, what, ms = 10_000) {
  const end = performance.now() + ms;
  for (;;) {
    if (await check()) return;
    if (performance.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await sleep(20);
  }
}
