// Finds the Python interpreter that runs the ModelTrace server, and checks it can.
// Order: the `modelTrace.python` setting, the Python extension's selected environment, `python3`.
// The server itself is the copy bundled in the extension (extension/out/bundled, `modelTrace.importStrategy`
// useBundled) with its pure-Python dependencies; what is compiled (torch, numpy, ...) comes from the interpreter.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type * as vscode from "vscode";
import type { Executable } from "vscode-languageclient/node";
import * as vscodeapi from "./vscodeapi";

export const pythonExtensionId = "ms-python.python";
export const minimumPythonVersion: readonly [number, number] = [3, 10];

export type InterpreterSource = "setting" | "python-extension" | "default";

export interface Interpreter {
    /** What to run: an absolute path, or a bare command looked up on PATH. */
    path: string;
    source: InterpreterSource;
}

/** The part of the Python extension's API (`ms-python.python` exports) that we use. */
export interface PythonExtensionApi {
    environments: {
        getActiveEnvironmentPath(resource?: vscode.Uri): { id: string; path: string };
        resolveEnvironment(
            environment: { id: string; path: string } | string,
        ): Promise<{ executable: { uri?: vscode.Uri } } | undefined>;
    };
}

export function defaultPythonCommand(platform: NodeJS.Platform = process.platform): string {
    return platform === "win32" ? "python" : "python3";
}

/** Expands `${workspaceFolder}`, `${userHome}` and `~`, and resolves relative paths against the workspace folder. */
export function expandSettingPath(value: string, workspaceFolder: string | undefined): string {
    let expanded: string = value.replace(/\$\{userHome\}/g, os.homedir());
    if (workspaceFolder !== undefined) {
        expanded = expanded.replace(/\$\{workspaceFolder\}/g, workspaceFolder);
    }
    if (expanded === "~" || expanded.startsWith("~/")) {
        expanded = path.join(os.homedir(), expanded.slice(1));
    }
    const looksLikePath: boolean = expanded.includes("/") || expanded.includes("\\");
    if (looksLikePath && !path.isAbsolute(expanded) && workspaceFolder !== undefined) {
        expanded = path.resolve(workspaceFolder, expanded);
    }
    return expanded;
}

async function interpreterFromPythonExtension(resource: vscode.Uri | undefined): Promise<string | undefined> {
    const extension: vscode.Extension<PythonExtensionApi> | undefined =
        vscodeapi.getExtension<PythonExtensionApi>(pythonExtensionId);
    if (extension === undefined) {
        return undefined;
    }
    const api: PythonExtensionApi = extension.isActive ? extension.exports : await extension.activate();
    if (api?.environments === undefined) {
        return undefined;
    }
    const active: { id: string; path: string } = api.environments.getActiveEnvironmentPath(resource);
    const resolved = await api.environments.resolveEnvironment(active);
    return resolved?.executable.uri?.fsPath;
}

/** Picks the interpreter to run; never fails (the last resort is `python3`). Errors are logged by the caller's `log`. */
export async function findInterpreter(
    pythonSetting: string,
    log: (message: string) => void = () => undefined,
): Promise<Interpreter> {
    const folder: vscode.WorkspaceFolder | undefined = vscodeapi.workspaceFolders()[0];
    if (pythonSetting !== "") {
        return { path: expandSettingPath(pythonSetting, folder?.uri.fsPath), source: "setting" };
    }
    try {
        const fromExtension: string | undefined = await interpreterFromPythonExtension(folder?.uri);
        if (fromExtension !== undefined && fromExtension !== "") {
            return { path: fromExtension, source: "python-extension" };
        }
    } catch (error) {
        log(`The Python extension did not give an interpreter: ${String(error)}`);
    }
    return { path: defaultPythonCommand(), source: "default" };
}

export function describeSource(source: InterpreterSource): string {
    switch (source) {
        case "setting":
            return "from the modelTrace.python setting";
        case "python-extension":
            return "the Python extension's selected interpreter";
        case "default":
            return "the default; set modelTrace.python to choose another";
    }
}

/** A package the interpreter lacks (`modeltrace.environment.Requirement`). */
export interface MissingRequirement {
    /** Import name. */
    module: string;
    /** What pip installs. */
    package: string;
    /** What does not work without it. */
    needed_for: string;
    /** The server cannot start without it. */
    server: boolean;
}

/** What the check script prints, as JSON on one line. */
export interface InterpreterProbe {
    version: [number, number, number];
    executable: string;
    /** modeltrace's `__version__` ("unknown" when it has none), or null when it could not be imported. */
    modeltrace: string | null;
    /** Why `import modeltrace` failed. */
    error: string | null;
    /** Where modeltrace was imported from (the bundle's copy or the environment's). */
    location?: string;
    /** What the interpreter lacks (`modeltrace.environment.probe`); absent from a modeltrace without it. */
    missing?: MissingRequirement[];
    /** The command that installs `missing` into the interpreter's environment; null when nothing is missing. */
    install?: string[] | null;
}

// NOTE: kept valid Python 2 so that an old interpreter reports its version instead of a SyntaxError.
export const probeScript: string = [
    "import sys, json",
    "info = {'version': list(sys.version_info[:3]), 'executable': sys.executable, 'modeltrace': None, 'error': None}",
    "if sys.version_info >= (3, 10):",
    "    try:",
    "        import modeltrace",
    "        info['modeltrace'] = str(getattr(modeltrace, '__version__', 'unknown'))",
    "        info['location'] = modeltrace.__file__",
    "    except Exception as e:",
    "        info['error'] = '%s: %s' % (type(e).__name__, e)",
    "    else:",
    "        try:",
    "            from modeltrace.environment import probe",
    "            info.update(probe())",
    "        except ImportError:",
    "            pass",
    "print(json.dumps(info))",
].join("\n");

export interface ProcessResult {
    stdout: string;
    stderr: string;
    /** Set when the process could not be started (code "ENOENT", ...) or exited with an error (numeric code). */
    error?: { code?: string | number | null; message: string };
}

export type RunProcess = (command: string, args: string[], env?: NodeJS.ProcessEnv) => Promise<ProcessResult>;

export type ImportStrategy = "useBundled" | "fromEnvironment";

/** The ModelTrace server bundled in this extension (`npm run package` writes it): `tool/`, `libs/`, `fallback/`. */
export const bundledServerFolder: string = path.join(__dirname, "bundled");

/** The bundle folder to run the server from, or undefined: the interpreter's own modeltrace (dev checkouts). */
export function serverBundle(strategy: ImportStrategy, folder: string = bundledServerFolder): string | undefined {
    return strategy === "useBundled" && existsSync(path.join(folder, "tool", "modeltrace")) ? folder : undefined;
}

/**
 * The environment the server and the interpreter probe run in. PYTHONSAFEPATH (Python 3.11+): `-m` and `-c`
 * put the working folder first on sys.path, so a workspace file named like a module the server imports
 * (`modeltrace.py`, `msgpack.py`, ...) would be imported, and run, in place of the real one.
 * With a bundle, its `tool/` (the modeltrace package) goes first on PYTHONPATH, and MODELTRACE_BUNDLE tells
 * modeltrace where its bundled libraries are (`modeltrace.bundled`); the trace worker inherits both.
 */
export function pythonEnvironment(base: NodeJS.ProcessEnv = process.env, bundle?: string): NodeJS.ProcessEnv {
    const environment: NodeJS.ProcessEnv = { ...base, PYTHONUNBUFFERED: "1", PYTHONSAFEPATH: "1" };
    if (bundle !== undefined) {
        const tool: string = path.join(bundle, "tool");
        environment.PYTHONPATH = base.PYTHONPATH ? `${tool}${path.delimiter}${base.PYTHONPATH}` : tool;
        environment.MODELTRACE_BUNDLE = bundle;
    }
    return environment;
}

/** A folder holding no Python code (this bundle's own): the working folder where the workspace must not be one. */
export const codeFreeFolder: string = __dirname;

export const runProcess: RunProcess = (command: string, args: string[], env?: NodeJS.ProcessEnv): Promise<ProcessResult> =>
    new Promise((resolve) => {
        // NOTE: not in the workspace: Python < 3.11 ignores PYTHONSAFEPATH and `-c` puts the working folder on sys.path.
        const options = { timeout: 30_000, windowsHide: true, cwd: codeFreeFolder, env: env ?? pythonEnvironment() };
        execFile(command, args, options, (error, stdout, stderr) => {
            resolve({ stdout: String(stdout), stderr: String(stderr), error: error ?? undefined });
        });
    });

export type InterpreterCheck =
    | { ok: true; probe: InterpreterProbe }
    | { ok: false; problem: string; install?: string[] };

/** "numpy (statistics and the diff), libcst (quick fixes)": what is missing and what it is for. */
export function describeMissing(missing: readonly MissingRequirement[]): string {
    return missing.map((requirement: MissingRequirement) => `${requirement.module} (${requirement.needed_for})`).join(", ");
}

/** A command line as a person types it, arguments with spaces or shell characters quoted. */
export function commandLine(command: readonly string[]): string {
    return command.map((part: string) => (/^[\w@%+=:,./-]+$/.test(part) ? part : `'${part.replace(/'/g, "'\\''")}'`)).join(" ");
}

/**
 * Runs the interpreter once (in the environment the server gets, `bundle` included): is it there, is it
 * Python >= 3.10, can it `import modeltrace`, does it have what the server cannot start without? Says plainly
 * what is missing. Missing packages that only disable a feature are left in `probe.missing` for the caller.
 */
export async function checkInterpreter(
    interpreter: Interpreter,
    run: RunProcess = runProcess,
    bundle?: string,
): Promise<InterpreterCheck> {
    const name: string = `${interpreter.path} (${describeSource(interpreter.source)})`;
    const result: ProcessResult = await run(interpreter.path, ["-c", probeScript], pythonEnvironment(process.env, bundle));
    if (result.error?.code === "ENOENT") {
        return {
            ok: false,
            problem:
                `ModelTrace: cannot find the Python interpreter ${name}. ` +
                `Set modelTrace.python to a Python ${minimumPythonVersion.join(".")}+ interpreter that has modeltrace installed.`,
        };
    }
    let probe: InterpreterProbe;
    try {
        probe = JSON.parse(result.stdout.trim().split("\n").pop() ?? "") as InterpreterProbe;
    } catch {
        const detail: string = (result.stderr.trim() || result.error?.message || "no output").split("\n").slice(-3).join(" ");
        return { ok: false, problem: `ModelTrace: could not run the Python interpreter ${name}: ${detail}` };
    }
    const [major, minor] = probe.version;
    const [minimumMajor, minimumMinor] = minimumPythonVersion;
    if (major < minimumMajor || (major === minimumMajor && minor < minimumMinor)) {
        return {
            ok: false,
            problem:
                `ModelTrace: ${name} is Python ${probe.version.join(".")}; ModelTrace needs Python ${minimumMajor}.${minimumMinor} or newer. ` +
                "Set modelTrace.python to a newer interpreter.",
        };
    }
    if (probe.modeltrace === null) {
        const advice: string =
            bundle === undefined
                ? `Install it into that environment with \`${interpreter.path} -m pip install -e <ModelTrace checkout>\`, ` +
                  "set modelTrace.importStrategy to useBundled (the server this extension carries), " +
                  "or set modelTrace.python to an interpreter that has it."
                : "Set modelTrace.python to another interpreter, or see the logs (ModelTrace: Show Logs).";
        return { ok: false, problem: `ModelTrace: ${name} cannot import modeltrace (${probe.error ?? "unknown error"}). ${advice}` };
    }
    const blocking: MissingRequirement[] = (probe.missing ?? []).filter((requirement: MissingRequirement) => requirement.server);
    if (blocking.length > 0) {
        return {
            ok: false,
            problem:
                `ModelTrace: ${name} lacks ${describeMissing(blocking)}; the server cannot start without it. ` +
                `Install it with \`${commandLine(probe.install ?? [])}\`, or set modelTrace.python to an interpreter that has it.`,
            install: probe.install ?? undefined,
        };
    }
    return { ok: true, probe };
}

export const serverArguments: readonly string[] = ["-m", "modeltrace", "serve"];

/**
 * How languageclient launches the server: `<python> -m modeltrace serve`, LSP on its stdin/stdout, in `cwd`
 * (the workspace folder when it is trusted: model code may open files relative to it; the caller passes
 * `codeFreeFolder` otherwise, since Python < 3.11 ignores PYTHONSAFEPATH and `-m` puts the working folder on sys.path).
 */
export function serverExecutable(interpreter: Interpreter, cwd: string | undefined, bundle?: string): Executable {
    // NOTE: no `transport`: with TransportKind.stdio languageclient appends `--stdio`, which `serve` rejects.
    // Without one it still talks over the child's stdin/stdout.
    return {
        command: interpreter.path,
        args: [...serverArguments],
        options: { cwd, env: pythonEnvironment(process.env, bundle) },
    };
}
