// Interpreter resolution order (setting, Python extension, python3) and the interpreter check's messages.
import { fileUri, vscodeFake } from "./vscode_fake";
import * as assert from "node:assert/strict";
import {
    checkInterpreter,
    expandSettingPath,
    findInterpreter,
    type InterpreterProbe,
    type ProcessResult,
    probeScript,
    pythonExtensionId,
    runProcess,
    serverExecutable,
} from "../../../extension/src/python";

function pythonExtension(executable: string | undefined, isActive: boolean = true) {
    const calls: string[] = [];
    const api = {
        environments: {
            getActiveEnvironmentPath: () => {
                calls.push("getActiveEnvironmentPath");
                return { id: "env", path: "/envs/env" };
            },
            resolveEnvironment: async (environment: unknown) => {
                calls.push(`resolveEnvironment ${JSON.stringify(environment)}`);
                return executable === undefined ? undefined : { executable: { uri: fileUri(executable) } };
            },
        },
    };
    const extension = {
        isActive,
        exports: isActive ? api : undefined,
        activate: async () => {
            calls.push("activate");
            return api;
        },
    };
    return { extension, calls };
}

function probeOutput(probe: Partial<InterpreterProbe>): ProcessResult {
    const full: InterpreterProbe = { version: [3, 11, 7], executable: "/venv/bin/python", modeltrace: "0.1.0", error: null, ...probe };
    return { stdout: `${JSON.stringify(full)}\n`, stderr: "" };
}

describe("findInterpreter", () => {
    beforeEach(() => vscodeFake.reset());

    it("uses the modelTrace.python setting first, even when the Python extension has one", async () => {
        vscodeFake.installedExtensions.set(pythonExtensionId, pythonExtension("/envs/env/bin/python").extension);
        assert.deepEqual(await findInterpreter("/opt/py/bin/python3"), { path: "/opt/py/bin/python3", source: "setting" });
    });

    it("expands ${workspaceFolder} and resolves relative setting paths against the workspace folder", async () => {
        vscodeFake.folders = [{ uri: fileUri("/home/me/project"), name: "project", index: 0 }];
        assert.deepEqual(await findInterpreter("${workspaceFolder}/.venv/bin/python"), {
            path: "/home/me/project/.venv/bin/python",
            source: "setting",
        });
        assert.deepEqual(await findInterpreter(".venv/bin/python"), { path: "/home/me/project/.venv/bin/python", source: "setting" });
        assert.equal(expandSettingPath("python3.12", "/home/me/project"), "python3.12", "a bare command stays a PATH lookup");
    });

    it("asks the Python extension's environment API when the setting is empty", async () => {
        const { extension, calls } = pythonExtension("/envs/env/bin/python");
        vscodeFake.installedExtensions.set(pythonExtensionId, extension);
        assert.deepEqual(await findInterpreter(""), { path: "/envs/env/bin/python", source: "python-extension" });
        assert.deepEqual(calls, ["getActiveEnvironmentPath", 'resolveEnvironment {"id":"env","path":"/envs/env"}']);
    });

    it("activates the Python extension when it is installed but not active yet", async () => {
        const { extension, calls } = pythonExtension("/envs/env/bin/python", false);
        vscodeFake.installedExtensions.set(pythonExtensionId, extension);
        assert.equal((await findInterpreter("")).path, "/envs/env/bin/python");
        assert.equal(calls[0], "activate");
    });

    it("falls back to python3 without the Python extension", async () => {
        assert.deepEqual(await findInterpreter(""), { path: "python3", source: "default" });
    });

    it("falls back to python3 when the Python extension cannot resolve its environment, and logs why when it throws", async () => {
        vscodeFake.installedExtensions.set(pythonExtensionId, pythonExtension(undefined).extension);
        assert.deepEqual(await findInterpreter(""), { path: "python3", source: "default" });

        const broken = { isActive: false, exports: undefined, activate: async () => Promise.reject(new Error("activation failed")) };
        vscodeFake.installedExtensions.set(pythonExtensionId, broken);
        const logged: string[] = [];
        assert.deepEqual(await findInterpreter("", (message: string) => logged.push(message)), { path: "python3", source: "default" });
        assert.match(logged[0] ?? "", /activation failed/);
    });
});

describe("checkInterpreter", () => {
    const fromSetting = { path: "/venv/bin/python", source: "setting" } as const;

    it("accepts Python >= 3.10 that imports modeltrace, and runs the probe script with -c", async () => {
        const seen: { command: string; args: string[] }[] = [];
        const check = await checkInterpreter(fromSetting, async (command: string, args: string[]) => {
            seen.push({ command, args });
            return probeOutput({});
        });
        assert.deepEqual(seen, [{ command: "/venv/bin/python", args: ["-c", probeScript] }]);
        assert.equal(check.ok, true);
        assert.equal(check.ok && check.probe.modeltrace, "0.1.0");
    });

    it("says the interpreter is missing when it cannot be started", async () => {
        const check = await checkInterpreter({ path: "python3", source: "default" }, async () => ({
            stdout: "",
            stderr: "",
            error: { code: "ENOENT", message: "spawn python3 ENOENT" },
        }));
        assert.equal(check.ok, false);
        assert.match(!check.ok ? check.problem : "", /^ModelTrace: cannot find the Python interpreter python3 \(the default; set modelTrace\.python/);
    });

    it("names the version when Python is too old", async () => {
        const check = await checkInterpreter(fromSetting, async () => probeOutput({ version: [3, 9, 18], modeltrace: null }));
        assert.equal(
            !check.ok && check.problem,
            "ModelTrace: /venv/bin/python (from the modelTrace.python setting) is Python 3.9.18; " +
                "ModelTrace needs Python 3.10 or newer. Set modelTrace.python to a newer interpreter.",
        );
    });

    it("says how to install modeltrace when the import fails", async () => {
        const check = await checkInterpreter(fromSetting, async () =>
            probeOutput({ modeltrace: null, error: "ModuleNotFoundError: No module named 'modeltrace'" }),
        );
        assert.equal(
            !check.ok && check.problem,
            "ModelTrace: /venv/bin/python (from the modelTrace.python setting) cannot import modeltrace " +
                "(ModuleNotFoundError: No module named 'modeltrace'). Install it into that environment with " +
                "`/venv/bin/python -m pip install -e <ModelTrace checkout>`, set modelTrace.importStrategy to useBundled " +
                "(the server this extension carries), or set modelTrace.python to an interpreter that has it.",
        );
    });

    it("reports a crash with the end of stderr", async () => {
        const check = await checkInterpreter(fromSetting, async () => ({
            stdout: "",
            stderr: "Fatal Python error: init_fs_encoding\nModuleNotFoundError: No module named 'encodings'\n",
            error: { code: 1, message: "Command failed" },
        }));
        assert.match(!check.ok ? check.problem : "", /could not run the Python interpreter .*No module named 'encodings'/);
    });

    it("runs the real probe script on this machine's python3", async () => {
        const result: ProcessResult = await runProcess("python3", ["-c", probeScript]);
        const probe: InterpreterProbe = JSON.parse(result.stdout) as InterpreterProbe;
        assert.equal(probe.version[0], 3);
        assert.ok(probe.modeltrace !== null || (probe.error ?? "").includes("modeltrace"), result.stdout);
    });
});

describe("serverExecutable", () => {
    it("launches `<python> -m modeltrace serve` with nothing appended (no --stdio) in the workspace folder", () => {
        const executable = serverExecutable({ path: "/venv/bin/python", source: "setting" }, "/ws");
        assert.equal(executable.command, "/venv/bin/python");
        assert.deepEqual(executable.args, ["-m", "modeltrace", "serve"]);
        assert.equal(executable.transport, undefined);
        assert.equal(executable.options?.cwd, "/ws");
        assert.equal(executable.options?.env?.PYTHONUNBUFFERED, "1");
        // The workspace folder never lands on the server's sys.path (a workspace `modeltrace.py` is not imported).
        assert.equal(executable.options?.env?.PYTHONSAFEPATH, "1");
    });
});
