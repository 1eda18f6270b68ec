// Test runner loaded by the extension host (the `extensionTestsPath` contract: export run()).
// MODELTRACE_E2E_MODE picks the suite: trusted.test.js (then reference, recorders and recipe) or untrusted.test.js.
import * as path from "node:path";
import Mocha from "mocha";
import { hostLog } from "./handshake";

export function run(): Promise<void> {
    const mode: string = process.env.MODELTRACE_E2E_MODE ?? "trusted";
    const mocha: Mocha = new Mocha({ ui: "bdd", timeout: 240_000, color: false, reporter: "dot" });
    mocha.addFile(path.join(__dirname, `${mode}.test.js`));
    if (mode === "trusted") {
        mocha.addFile(path.join(__dirname, "reference.test.js"));
        mocha.addFile(path.join(__dirname, "recorders.test.js"));
        mocha.addFile(path.join(__dirname, "recipe.test.js"));
        mocha.addFile(path.join(__dirname, "editor.test.js"));
    }
    return new Promise((resolve, reject) => {
        const runner: Mocha.Runner = mocha.run((failures: number) => {
            hostLog(`mocha finished: ${failures} failed`);
            if (failures > 0) {
                reject(new Error(`${failures} extension-host test(s) failed`));
            } else {
                resolve();
            }
        });
        runner.on("pass", (test: Mocha.Test) => hostLog(`PASS ${test.fullTitle()}`));
        runner.on("fail", (test: Mocha.Test, error: Error) => hostLog(`FAIL ${test.fullTitle()}\n${error.stack ?? error.message}`));
    });
}
