// Bundles the extension (and, with --unit / --e2e, the tests) with esbuild.
//   node extension/esbuild.mjs          extension/out/extension.js (vscode-languageclient bundled in)
//   node extension/esbuild.mjs --unit   extension/out/unit/*.js    (mocha on plain Node, fake `vscode`)
//   node extension/esbuild.mjs --e2e    extension/out/e2e/*.js     (mocha inside a real extension host)
import * as esbuild from "esbuild";
import { readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const repo = dirname(dirname(fileURLToPath(import.meta.url)));
const common = {
    bundle: true,
    platform: "node",
    format: "cjs",
    target: "node18",
    external: ["vscode", "mocha"],
    logLevel: "warning",
    absWorkingDir: repo,
};

function testEntries(folder, pattern) {
    return readdirSync(join(repo, folder))
        .filter((name) => pattern.test(name))
        .map((name) => join(folder, name));
}

const target = process.argv[2] ?? "--extension";
if (target === "--extension") {
    await esbuild.build({
        ...common,
        entryPoints: ["extension/src/extension.ts"],
        outfile: "extension/out/extension.js",
        sourcemap: false,
    });
} else if (target === "--unit") {
    await esbuild.build({
        ...common,
        entryPoints: testEntries("tests/extension/unit", /\.ts$/),
        outdir: "extension/out/unit",
        sourcemap: "inline",
    });
} else if (target === "--e2e") {
    await esbuild.build({
        ...common,
        entryPoints: testEntries("tests/extension/e2e/suite", /^(index|.*\.test)\.ts$/),
        outdir: "extension/out/e2e",
        sourcemap: "inline",
    });
} else {
    console.error(`unknown target ${target}; use --unit or --e2e or nothing`);
    process.exit(2);
}
