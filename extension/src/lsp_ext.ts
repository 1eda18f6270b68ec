// The ModelTrace server's custom LSP methods and command names: a one-to-one mirror of
// pyserver/modeltrace/lsp/methods.py (tests/python/lsp/test_methods.py compares the two). On this side every
// `modelTrace/...` method and server command lives here and nowhere else.
// NOTE: from the protocol package, not vscode-languageclient, so that unit tests can load it without `vscode`.
import * as lc from "vscode-languageserver-protocol";

/** Commands the server advertises through `workspace/executeCommand`. */
export const serverCommands = {
    /** Arguments: [documentUri: string, className?: string]. */
    trace: "modelTrace.trace",
    /** Arguments: [documentUri: string, className?: string]: greedy generation, modelTrace.generateSteps steps. */
    traceGenerate: "modelTrace.traceGenerate",
    /** Arguments: [documentUri: string, className?: string]: forward, a loss and its backward pass. */
    traceBackward: "modelTrace.traceBackward",
    /** Arguments: [documentUri: string]. */
    clear: "modelTrace.clear",
    /** Arguments: [documentUri: string, path: string] (a trace folder or transformers debugger output). */
    setReference: "modelTrace.setReference",
    /**
     * Arguments: [documentUri: string, path: string] (a .mtrace folder): shows the trace's hints on the files it
     * recorded, found here by content hash, path or name. Result: LoadTraceResult.
     */
    loadTrace: "modelTrace.loadTrace",
    /** Arguments: [documentUri: string]. */
    pinReference: "modelTrace.pinReference",
    /**
     * Arguments: [documentUri: string, className?: string] (a modular file in a transformers checkout): its
     * generated file regenerated into a temporary folder, the copy traced, and its hints shown on the modular
     * document itself (the result's `regenerated` is the copy's path). Offered by a code action.
     */
    traceRegenerated: "modelTrace.traceRegenerated",
    /**
     * Arguments: [documentUri: string, className?: string]: a recipe written next to the model file from what the
     * last failed trace tried (or a trace run first to learn it), registered in the project file, opened, and
     * traced when it has nothing left to fill in. Result: CreateRecipeResult. Offered by the failure's
     * notification and a code lens.
     */
    createRecipe: "modelTrace.createRecipe",
    /**
     * Arguments: [documentUri: string, show?: boolean]: the document's hints at the model's full sizes (shape-only
     * on the meta device, cached per file), or back at the traced sizes; no `show`: a toggle. Result: FullSizesResult.
     */
    fullSizes: "modelTrace.fullSizes",
} as const;

/** What "Create recipe…" wrote. */
export interface CreateRecipeResult {
    ok: boolean;
    message?: string;
    /** The recipe file written (never an existing one). */
    recipe?: string;
    /** The project file it is registered in (modeltrace.toml or pyproject.toml). */
    projectFile?: string;
    /** Names still to fill in (0-based lines in `todoLines`); empty: it was traced at once. */
    todo?: string[];
    todoLines?: number[];
    /** The trace run with it, when it had nothing left to fill in. */
    trace?: { ok: boolean; message?: string };
}

export interface FullSizesResult {
    ok: boolean;
    /** Which sizes the document's hints show now. */
    sizes?: "traced" | "full";
    message?: string;
}

/** Where "Load Trace…" found a file the trace recorded (`trace.relocate.SourceMatch`). */
export interface LoadedSourceFile {
    recorded: string;
    /** null: not found here. */
    path: string | null;
    how: "recorded path" | "same content" | "same name" | "not found";
    /** The file found differs from the one captured: its hints may be off. */
    changed: boolean;
}

export interface LoadTraceResult {
    ok: boolean;
    message?: string;
    modelClass?: string;
    modules?: number;
    files?: LoadedSourceFile[];
    /** The traced model's file as found here; null when the trace names none or it was not found. */
    modelFile?: string | null;
}

export type ServerCommand = (typeof serverCommands)[keyof typeof serverCommands];

export type ServerState = "idle" | "tracing" | "stale" | "error";

export interface StatusParams {
    state: ServerState;
    message?: string;
    /** The document the status is about, when it is about one. */
    uri?: string;
    /** What ran, in one line: config class, sizes against the config's own, tokens, weights (trace/ran.py). */
    ran?: string;
    /** Which sizes the document's hints show: the traced run's, or the model's full sizes (modelTrace.hintSizes). */
    sizes?: "traced" | "full";
}

/** Server → client: what the server is doing, for the language status item. */
export const status = new lc.NotificationType<StatusParams>("modelTrace/status");

/** "inherited": the line's calls differ only through their inputs (the difference starts earlier). */
export type LineDiffStatus = "match" | "mismatch" | "inherited" | "divergence" | "not_compared";

export interface LineStatus {
    /** 0-based line in the document. */
    line: number;
    /** The most telling status of the line's calls (divergence > mismatch > match > inherited > not_compared). */
    status: LineDiffStatus;
    /** What decides the mark (the call, its layer, how the line's other calls compare): the mark's hover. */
    message?: string;
    /** The code changed since the trace (the mark moved with its unchanged line; its message says so too). */
    stale?: boolean;
}

export interface LineStatusParams {
    uri: string;
    lines: LineStatus[];
}

/** Server → client: per-line diff status of a document against its reference trace (gutters). */
export const lineStatus = new lc.NotificationType<LineStatusParams>("modelTrace/lineStatus");

export interface DiffResultDivergence {
    /** Module path of the first divergence ("" for the root). */
    path: string;
    className: string;
    maxAbsDiff: number | null;
    /** Where to look: the first differing line inside the module when known, else its call site; 0-based line. */
    location: { uri: string; line: number } | null;
}

export interface DiffResultParams {
    /** The traced document. */
    uri: string;
    /** The reference trace's path. */
    reference: string;
    match: boolean;
    divergence: DiffResultDivergence | null;
    /** What limited the comparison: a replay not run and why (an untrusted workspace), statistics-only pairs, ... */
    notes: string[];
}

/** Server → client: a document's trace was compared with its reference (after each trace, and when one is set). */
export const diffResult = new lc.NotificationType<DiffResultParams>("modelTrace/diffResult");

export interface SourceLocation {
    file: string;
    /** 1-based, as in the trace JSON. */
    line: number;
}

export interface DiffPlotParams {
    uri: string;
}

export interface DiffPlotPoint {
    /** Position in the order module calls finished. */
    x: number;
    path: string;
    call_index: number;
    /** null when the call could not be compared numerically. */
    max_abs_diff: number | null;
    status: LineDiffStatus;
    check: string | null;
    called_at: SourceLocation | null;
}

export interface DiffPlotLayer {
    layer: string;
    max_abs_diff: number;
    status: LineDiffStatus;
}

export interface DiffPlot {
    points: DiffPlotPoint[];
    layers: DiffPlotLayer[];
    atol: number;
    /** x of the first divergence, null when the traces agree. */
    first_divergence: number | null;
    /** The reference trace's path. */
    reference: string;
    /** The first divergence as `modeltrace diff --format json` reports it. */
    divergence: { path: string; class: string; max_abs_diff: number | null; max_rel_diff: number | null } | null;
}

/** Client → server: the plot of the document's latest diff against its reference; null without one. */
export const diffPlot = new lc.RequestType<DiffPlotParams, DiffPlot | null, void>("modelTrace/diffPlot");
