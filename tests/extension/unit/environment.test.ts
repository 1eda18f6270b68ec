// What the interpreter lacks: the interpreter check's verdicts, the bundle's environment, and the install offer
// (a warning naming each package and its feature, "Install" running the one pip command as a task).
import { vscodeFake } from "./vscode_fake";
import * as assert from "node:assert/strict";
import { mkdirSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { copyChoice, installChoice, missingMessage, offerInstall } from "../../../extension/src/environment";
import {
    checkInterpreter,
    commandLine,
    type InterpreterProbe,
    type MissingRequirement,
    type ProcessResult,
    pythonEnvironment,
    serverBundle,
    serverExecutable,
} from "../../../extension/src/python";

const numpy: MissingRequirement = { module: "numpy", package: "numpy", needed_for: "statistics and the diff", server: true };
const libcst: MissingRequirement = { module: "libcst", package: "libcst>=1.4", needed_for: "the quick fixes", server: false };
const install: string[] = ["/envs/torch/bin/python", "-m", "pip", "install", "libcst>=1.4"];

function probeOutput(probe: Partial<InterpreterProbe>): ProcessResult {
    const full: InterpreterProbe = { version: [3, 11, 7], executable: "/envs/torch/bin/python", modeltrace: "0.1.0", error: null, ...probe };
    return { stdout: `${JSON.stringify(full)}\n`, stderr: "" };
}

describe("the bundled server", () => {
    it("is used when its folder holds modeltrace and the strategy is useBundled", () => {
        const folder: string = mkdtempSync(join(tmpdir(), "bundle-"));
        assert.equal(serverBundle("useBundled", folder), undefined, "an empty folder is no bundle");
        mkdirSync(join(folder, "tool", "modeltrace"), { recursive: true });
        assert.equal(serverBundle("useBundled", folder), folder);
        assert.equal(serverBundle("fromEnvironment", folder), undefined);
    });

    it("puts the bundle's tool/ first on PYTHONPATH and names the bundle for modeltrace.bundled", () => {
        const environment = pythonEnvironment({ PYTHONPATH: "/mine", HOME: "/home/me" }, "/ext/out/bundled");
        assert.equal(environment.PYTHONPATH, "/ext/out/bundled/tool:/mine");
        assert.equal(environment.MODELTRACE_BUNDLE, "/ext/out/bundled");
        assert.equal(environment.PYTHONSAFEPATH, "1");
        const plain = pythonEnvironment({ HOME: "/home/me" });
        assert.equal(plain.PYTHONPATH, undefined);
        assert.equal(plain.MODELTRACE_BUNDLE, undefined);
        const executable = serverExecutable({ path: "/envs/torch/bin/python", source: "python-extension" }, "/ws", "/ext/out/bundled");
        assert.deepEqual(executable.args, ["-m", "modeltrace", "serve"]);
        assert.equal(executable.options?.env?.MODELTRACE_BUNDLE, "/ext/out/bundled");
    });

    it("probes the interpreter in the server's environment, bundle included", async () => {
        let seen: NodeJS.ProcessEnv | undefined;
        await checkInterpreter({ path: "/envs/torch/bin/python", source: "setting" }, async (_command, _args, env) => {
            seen = env;
            return probeOutput({});
        }, "/ext/out/bundled");
        assert.equal(seen?.MODELTRACE_BUNDLE, "/ext/out/bundled");
        assert.match(seen?.PYTHONPATH ?? "", /^\/ext\/out\/bundled\/tool/);
    });
});

describe("missing packages", () => {
    beforeEach(() => vscodeFake.reset());

    it("refuses to start without what the server needs, with the command that installs it", async () => {
        const command = ["/envs/torch/bin/python", "-m", "pip", "install", "numpy"];
        const check = await checkInterpreter({ path: "/envs/torch/bin/python", source: "setting" }, async () =>
            probeOutput({ missing: [numpy, libcst], install: command }),
        );
        assert.equal(check.ok, false);
        assert.equal(
            !check.ok && check.problem,
            "ModelTrace: /envs/torch/bin/python (from the modelTrace.python setting) lacks numpy (statistics and the diff); " +
                "the server cannot start without it. Install it with `/envs/torch/bin/python -m pip install numpy`, " +
                "or set modelTrace.python to an interpreter that has it.",
        );
        assert.deepEqual(!check.ok && check.install, command);
    });

    it("starts without what only disables a feature, and leaves it for the offer", async () => {
        const check = await checkInterpreter({ path: "/envs/torch/bin/python", source: "setting" }, async () =>
            probeOutput({ missing: [libcst], install }),
        );
        assert.equal(check.ok, true);
        assert.deepEqual(check.ok && check.probe.missing, [libcst]);
    });

    it("writes the command as a person types it", () => {
        assert.equal(commandLine(install), "/envs/torch/bin/python -m pip install 'libcst>=1.4'");
        assert.equal(commandLine(["/my envs/python", "it's"]), "'/my envs/python' 'it'\\''s'");
        assert.equal(
            missingMessage("/envs/torch/bin/python", [libcst], install),
            "ModelTrace: /envs/torch/bin/python lacks libcst (the quick fixes). " +
                "Install it into that environment with `/envs/torch/bin/python -m pip install 'libcst>=1.4'`.",
        );
    });

    it("runs the command as a task on Install, and restarts the server when pip succeeded", async () => {
        vscodeFake.messageReplies = [installChoice];
        vscodeFake.taskExitCodes = [0];
        let restarted = 0;
        await offerInstall("lacks libcst", install, () => (restarted += 1), () => undefined);
        assert.deepEqual(vscodeFake.warningItems, [[installChoice, copyChoice]]);
        assert.deepEqual(vscodeFake.executedTasks.map((task) => [task.command, ...task.args]), [install]);
        assert.equal(restarted, 1);
    });

    it("says so when pip fails, and does not restart", async () => {
        vscodeFake.messageReplies = [installChoice];
        vscodeFake.taskExitCodes = [1];
        let restarted = 0;
        await offerInstall("lacks libcst", install, () => (restarted += 1), () => undefined);
        assert.equal(restarted, 0);
        assert.match(vscodeFake.errors[0] ?? "", /pip install 'libcst>=1\.4'` failed \(exit code 1\)/);
    });

    it("offers only to copy the command in an untrusted workspace (no tasks run there)", async () => {
        vscodeFake.trusted = false;
        vscodeFake.messageReplies = [undefined];
        await offerInstall("lacks libcst", install, () => assert.fail("no restart"), () => undefined);
        assert.deepEqual(vscodeFake.warningItems, [[copyChoice]]);
    });

    it("copies the command, or does nothing when dismissed", async () => {
        vscodeFake.messageReplies = [copyChoice, undefined];
        await offerInstall("lacks libcst", install, () => assert.fail("no restart"), () => undefined);
        assert.equal(vscodeFake.clipboard, "/envs/torch/bin/python -m pip install 'libcst>=1.4'");
        await offerInstall("lacks libcst", install, () => assert.fail("no restart"), () => undefined);
        assert.deepEqual(vscodeFake.executedTasks, []);
    });
});
