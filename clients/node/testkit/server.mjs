// Test support: a throwaway `tessera serve` on SQLite in a temp dir, on a free loopback port,
// and node workers running the client in other processes.

import { spawn, spawnSync } from "node:child_process";
import { accessSync, constants, mkdtempSync, readFileSync, rmSync } from "node:fs";
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
 * Starts `tessera serve` on `db` (a SQLite file; default a new one in a new temp dir).
 * @param {{db?: string, args?: string[]}} [opts]
 */
export async function startServer(opts = {}) {
  requireBinary();
  const own = opts.db ? null : tempDir();
  const db = opts.db ?? join(/** @type {{dir: string}} */ (own).dir, "t.db");
  const store = `sqlite://${db}`;
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
