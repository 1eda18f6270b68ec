// Typed view of the `modelTrace.*` settings and the initializationOptions sent to the server.
// The server gets every setting once at start, then `workspace/didChangeConfiguration` on changes.
import type * as vscode from "vscode";
import type { ImportStrategy } from "./python";

export const settingsSection = "modelTrace";

export type TraceDtype = "float32" | "float16" | "bfloat16";
export type HintDetail = "shape" | "dtype" | "stats";
export type HintPlacement = "afterName" | "endOfLine";
export type HintSizes = "traced" | "full";
export type AttentionImplementation = "eager" | "sdpa" | "flex_attention";

export interface ModelTraceSettings {
    /** Interpreter path; "" means: ask the Python extension, else python3. */
    python: string;
    /** The server this extension bundles (useBundled), or the interpreter's own modeltrace (fromEnvironment). */
    importStrategy: ImportStrategy;
    device: string;
    dtype: TraceDtype;
    /** transformers' attn_implementation traced models are built with. */
    attention: AttentionImplementation;
    hintDetail: HintDetail;
    /** After each assigned name (fits VS Code's default hint length), or one full label at the line's end. */
    hintPlacement: HintPlacement;
    /** The traced run's sizes, or the model's full sizes (a shape-only run of the unshrunk config, cached per file). */
    hintSizes: HintSizes;
    traceOnSave: boolean;
    /** Start the trace worker when a model file opens in a trusted workspace (the first trace then does not wait). */
    startWorkerOnOpen: boolean;
    /** Line-level capture: tensors assigned on each line, not only module outputs. */
    lines: boolean;
    /** Other files whose lines are captured too (helpers the model calls into); relative: the workspace's. */
    follow: string[];
    /** Seconds. */
    timeout: number;
    /** Full tensors over this many MB keep their statistics only; the trace stores at most maxTraceMB in all. */
    maxTensorMB: number;
    maxTraceMB: number;
    /** Full tensors a trace without a reference keeps (MB in all); 0: statistics only until a reference is set. */
    fullTensorsMB: number;
    /** Full tensors waiting in memory for the trace's writer (MB); past it the forward waits for the disk. */
    tensorMemoryMB: number;
    /** Full-size config on the meta device: shapes and dtypes, no statistics. */
    shapeOnly: boolean;
    /** A local save_pretrained folder to trace with; "" means none. */
    checkpoint: string;
    /** With a checkpoint: accelerate's device map ("auto", or JSON); "" means one device. */
    deviceMap: string;
    /** A recipe file (build_model(), build_inputs(model)) traces are built with; relative: the workspace's; "" none. */
    recipe: string;
    /** A small config.json traces build the model from; relative: the workspace's; "" the shrunk defaults. */
    config: string;
    /** The project file (modeltrace.toml / pyproject.toml) to read; relative: the workspace's; "" the nearest one. */
    projectFile: string;
    /** Tolerances of the diff against a reference trace; null: the diff's defaults. */
    diffAtol: number | null;
    diffRtol: number | null;
    /** Rename maps aligning module paths with the reference's, each "REGEX=>REPLACEMENT". */
    diffMaps: string[];
    /** Re-run the first differing modules on the reference's inputs (reference with full tensors). */
    diffReplay: boolean;
    /** A module mapping file (`modeltrace align`) aligning the trace with its reference instead of names; "" none. */
    diffMapping: string;
    /** Notifications when a reference is set and when a trace diverges from it. */
    notifications: boolean;
    /** The last trace's result in the status bar. */
    statusBar: boolean;
    /** "Trace generate": decode steps after the prefill (1 to 1024). */
    generateSteps: number;
    /** Backward traces: a gradient hint after each traced line's value, gradient rows in hovers. */
    gradientHints: boolean;
}

export const defaultSettings: Readonly<ModelTraceSettings> = {
    python: "",
    importStrategy: "useBundled",
    device: "cpu",
    dtype: "float32",
    attention: "eager",
    hintDetail: "dtype",
    hintPlacement: "afterName",
    hintSizes: "traced",
    traceOnSave: false,
    startWorkerOnOpen: true,
    lines: true,
    follow: [],
    timeout: 120,
    maxTensorMB: 1024,
    maxTraceMB: 8192,
    fullTensorsMB: 256,
    tensorMemoryMB: 1024,
    shapeOnly: false,
    checkpoint: "",
    deviceMap: "",
    recipe: "",
    config: "",
    projectFile: "",
    diffAtol: null,
    diffRtol: null,
    diffMaps: [],
    diffReplay: true,
    diffMapping: "",
    notifications: true,
    statusBar: true,
    generateSteps: 4,
    gradientHints: true,
};

export interface InitializationOptions {
    settings: ModelTraceSettings;
    workspaceTrusted: boolean;
}

const importStrategies: readonly ImportStrategy[] = ["useBundled", "fromEnvironment"];
const dtypes: readonly TraceDtype[] = ["float32", "float16", "bfloat16"];
const attentionImplementations: readonly AttentionImplementation[] = ["eager", "sdpa", "flex_attention"];
const hintDetails: readonly HintDetail[] = ["shape", "dtype", "stats"];
const hintPlacements: readonly HintPlacement[] = ["afterName", "endOfLine"];
const hintSizes: readonly HintSizes[] = ["traced", "full"];

function tolerance(value: unknown): number | null {
    return typeof value === "number" && Number.isFinite(value) && value >= 0 ? value : null;
}

function megabytes(value: unknown, fallback: number): number {
    return typeof value === "number" && Number.isFinite(value) && value >= 0 ? value : fallback;
}

function oneOf<T extends string>(value: unknown, allowed: readonly T[], fallback: T): T {
    return typeof value === "string" && (allowed as readonly string[]).includes(value) ? (value as T) : fallback;
}

/** Reads the settings, replacing values of the wrong type or out of range by their defaults. */
export function readSettings(configuration: Pick<vscode.WorkspaceConfiguration, "get">): ModelTraceSettings {
    const python: unknown = configuration.get("python");
    const device: unknown = configuration.get("device");
    const traceOnSave: unknown = configuration.get("traceOnSave");
    const startWorkerOnOpen: unknown = configuration.get("startWorkerOnOpen");
    const lines: unknown = configuration.get("lines");
    const follow: unknown = configuration.get("follow");
    const timeout: unknown = configuration.get("timeout");
    const maxTensorMB: unknown = configuration.get("maxTensorMB");
    const maxTraceMB: unknown = configuration.get("maxTraceMB");
    const fullTensorsMB: unknown = configuration.get("fullTensorsMB");
    const tensorMemoryMB: unknown = configuration.get("tensorMemoryMB");
    const shapeOnly: unknown = configuration.get("shapeOnly");
    const checkpoint: unknown = configuration.get("checkpoint");
    const deviceMap: unknown = configuration.get("deviceMap");
    const recipe: unknown = configuration.get("recipe");
    const config: unknown = configuration.get("config");
    const projectFile: unknown = configuration.get("projectFile");
    const diffMaps: unknown = configuration.get("diffMaps");
    const diffReplay: unknown = configuration.get("diffReplay");
    const diffMapping: unknown = configuration.get("diffMapping");
    const notifications: unknown = configuration.get("notifications");
    const statusBar: unknown = configuration.get("statusBar");
    const generateSteps: unknown = configuration.get("generateSteps");
    const gradientHints: unknown = configuration.get("gradientHints");
    return {
        python: typeof python === "string" ? python.trim() : defaultSettings.python,
        importStrategy: oneOf(configuration.get("importStrategy"), importStrategies, defaultSettings.importStrategy),
        device: typeof device === "string" && device.trim() !== "" ? device.trim() : defaultSettings.device,
        dtype: oneOf(configuration.get("dtype"), dtypes, defaultSettings.dtype),
        attention: oneOf(configuration.get("attention"), attentionImplementations, defaultSettings.attention),
        hintDetail: oneOf(configuration.get("hintDetail"), hintDetails, defaultSettings.hintDetail),
        hintPlacement: oneOf(configuration.get("hintPlacement"), hintPlacements, defaultSettings.hintPlacement),
        hintSizes: oneOf(configuration.get("hintSizes"), hintSizes, defaultSettings.hintSizes),
        traceOnSave: typeof traceOnSave === "boolean" ? traceOnSave : defaultSettings.traceOnSave,
        startWorkerOnOpen: typeof startWorkerOnOpen === "boolean" ? startWorkerOnOpen : defaultSettings.startWorkerOnOpen,
        lines: typeof lines === "boolean" ? lines : defaultSettings.lines,
        follow: Array.isArray(follow)
            ? follow.filter((item: unknown): item is string => typeof item === "string" && item.trim() !== "").map((item) => item.trim())
            : defaultSettings.follow,
        timeout: typeof timeout === "number" && Number.isFinite(timeout) && timeout > 0 ? timeout : defaultSettings.timeout,
        maxTensorMB: megabytes(maxTensorMB, defaultSettings.maxTensorMB),
        maxTraceMB: megabytes(maxTraceMB, defaultSettings.maxTraceMB),
        fullTensorsMB: megabytes(fullTensorsMB, defaultSettings.fullTensorsMB),
        tensorMemoryMB: megabytes(tensorMemoryMB, defaultSettings.tensorMemoryMB),
        shapeOnly: typeof shapeOnly === "boolean" ? shapeOnly : defaultSettings.shapeOnly,
        checkpoint: typeof checkpoint === "string" ? checkpoint.trim() : defaultSettings.checkpoint,
        deviceMap: typeof deviceMap === "string" ? deviceMap.trim() : defaultSettings.deviceMap,
        recipe: typeof recipe === "string" ? recipe.trim() : defaultSettings.recipe,
        config: typeof config === "string" ? config.trim() : defaultSettings.config,
        projectFile: typeof projectFile === "string" ? projectFile.trim() : defaultSettings.projectFile,
        diffAtol: tolerance(configuration.get("diffAtol")),
        diffRtol: tolerance(configuration.get("diffRtol")),
        diffMaps: Array.isArray(diffMaps) ? diffMaps.filter((item: unknown): item is string => typeof item === "string") : [],
        diffReplay: typeof diffReplay === "boolean" ? diffReplay : defaultSettings.diffReplay,
        diffMapping: typeof diffMapping === "string" ? diffMapping.trim() : defaultSettings.diffMapping,
        notifications: typeof notifications === "boolean" ? notifications : defaultSettings.notifications,
        statusBar: typeof statusBar === "boolean" ? statusBar : defaultSettings.statusBar,
        generateSteps:
            typeof generateSteps === "number" && Number.isInteger(generateSteps) && generateSteps >= 1 && generateSteps <= 1024
                ? generateSteps
                : defaultSettings.generateSteps,
        gradientHints: typeof gradientHints === "boolean" ? gradientHints : defaultSettings.gradientHints,
    };
}

export function initializationOptions(settings: ModelTraceSettings, workspaceTrusted: boolean): InitializationOptions {
    return { settings: { ...settings, diffMaps: [...settings.diffMaps] }, workspaceTrusted };
}
