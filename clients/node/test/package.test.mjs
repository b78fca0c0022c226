// The package as published: `npm pack` makes a tarball that installs offline and exports the
// client, with its type declarations and nothing of the tests.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { tempDir } from "../testkit/server.mjs";

const PACKAGE = dirname(dirname(fileURLToPath(import.meta.url)));
const npm = (args, cwd) => execFileSync("npm", [...args, "--offline", "--no-audit", "--no-fund"], { cwd, encoding: "utf8" });

test("npm pack makes a tarball that installs and imports offline", () => {
  const tmp = tempDir();
  try {
    const [packed] = JSON.parse(npm(["pack", "--json", "--pack-destination", tmp.dir], PACKAGE));
    const files = packed.files.map((f) => f.path).sort();
    assert.ok(files.includes("src/index.js") && files.includes("index.d.ts") && files.includes("README.md"), `${files}`);
    assert.ok(!files.some((f) => f.startsWith("test") || f === "bench.mjs"), `${files}`);
    const app = join(tmp.dir, "app");
    execFileSync("mkdir", [app]);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
    npm(["install", join(tmp.dir, packed.filename)], app);
    const out = execFileSync(
      process.execPath,
      ["--input-type=module", "-e", 'const m = await import("tessera-client"); console.log(Object.keys(m).sort().join(" "))'],
      { cwd: app, encoding: "utf8" },
    );
    for (const name of ["Client", "Lease", "NoPermit", "LeaseLost", "TesseraError", "Limited"]) {
      assert.ok(out.split(" ").map((s) => s.trim()).includes(name), `${name} not exported: ${out}`);
    }
  } finally {
    tmp.dispose();
  }
});
