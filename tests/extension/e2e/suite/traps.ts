// What the workspace traps planted by run.mjs (plantTraps) left behind: sentinel files written when any of
// their code ran, and worker processes started for this run.
import * as fs from "node:fs";
import * as path from "node:path";

export const trapModelingFile: string = "trap_llama/modeling_tiny_llama.py";

function runDir(): string {
    const dir: string | undefined = process.env.MODELTRACE_E2E_RUN_DIR;
    if (dir === undefined) {
        throw new Error("MODELTRACE_E2E_RUN_DIR is not set: start the tests through tests/extension/e2e/run.mjs");
    }
    return dir;
}

/** Names of the sentinel files written so far (`modeling-import-PID`, `interpreter-PID`, ...). */
export function sentinels(): string[] {
    return fs.readdirSync(path.join(runDir(), "sentinels")).sort();
}

/**
 * Processes running `modeltrace.worker` started by this run (the worker inherits MODELTRACE_E2E_RUN_DIR
 * from the extension host), as "PID: command line"; other runs' workers on the machine are not counted.
 */
export function workerProcesses(): string[] {
    const marker: string = `MODELTRACE_E2E_RUN_DIR=${runDir()}`;
    const found: string[] = [];
    for (const entry of fs.readdirSync("/proc")) {
        if (!/^\d+$/.test(entry)) {
            continue;
        }
        try {
            const commandLine: string[] = fs.readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
            if (!commandLine.some((part: string) => part.startsWith("modeltrace.worker"))) {
                continue;
            }
            if (fs.readFileSync(`/proc/${entry}/environ`, "utf8").split("\0").includes(marker)) {
                found.push(`${entry}: ${commandLine.join(" ").trim()}`);
            }
        } catch {
            // gone, or not ours to read
        }
    }
    return found;
}
