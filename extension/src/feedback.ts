// Feedback where a user looks: a status bar item with the last trace's result, and notifications when a reference
// is set and when a trace diverges from it ("Show Difference" / "Go to Line"). Both can be turned off
// (modelTrace.statusBar, modelTrace.notifications); the views are plain data so unit tests check them directly.
import type * as vscode from "vscode";
import type { DiffResultParams, StatusParams } from "./lsp_ext";
import { readSettings, settingsSection } from "./settings";
import * as vscodeapi from "./vscodeapi";

export const showDifference: string = "Show Difference";
export const goToLine: string = "Go to Line";

/** What the status bar item shows. */
export interface ResultView {
    text: string;
    tooltip: string;
    /** The command a click runs, with its arguments. */
    command: { command: string; title: string; arguments?: unknown[] } | undefined;
}

function fileName(path: string): string {
    return path.split(/[\\/]/).filter((part: string) => part !== "").pop() ?? path;
}

function formatDifference(value: number | null): string {
    if (value === null || !Number.isFinite(value)) {
        return "–";
    }
    return value !== 0 && (Math.abs(value) < 1e-3 || Math.abs(value) >= 1e4) ? value.toExponential(2) : value.toPrecision(4);
}

/** The item after a server status: tracing, traced (the server's summary), failed; undefined: leave it as it is. */
export function viewForTraceStatus(params: StatusParams): ResultView | undefined {
    switch (params.state) {
        case "tracing":
            return { text: "$(sync~spin) ModelTrace", tooltip: params.message ?? "tracing…", command: undefined };
        case "error":
            return {
                text: "$(error) ModelTrace: trace failed",
                tooltip: params.message ?? "The trace failed",
                command: { command: "modelTrace.showLogs", title: "Show Logs" },
            };
        case "idle":
            // NOTE: idle also follows "reference: …" and "trace cleared": only a finished trace says "module calls".
            // A trace compared with a reference ends its message with the result, which modelTrace/diffResult
            // (sent just before) already shows with where it diverges: that view stays.
            // A full-size toggle (`sizes` without "module calls") updates the item too: its text says the sizes.
            if (
                params.message === undefined ||
                !(params.message.includes("module calls") || params.sizes !== undefined) ||
                params.message.includes("the reference")
            ) {
                return undefined;
            }
            return {
                text: `$(check) ModelTrace: ${params.message.split(":")[0]}${params.sizes === "full" ? " · full sizes" : ""}`,
                tooltip: params.message + ranText(params),
                command: undefined,
            };
        case "stale": {
            // NOTE: a stale trace no longer says "✓": what the editor shows is the last trace's, until the next one.
            const model: string | undefined = params.message?.split(":")[0];
            return {
                text: `$(history) ModelTrace: ${model !== undefined && model !== "" ? `${model} ` : ""}(stale)`,
                tooltip:
                    `${params.message ?? "The code changed since the last trace"}. ` +
                    "Hints, gutters and diagnostics show that trace until the next one: click to trace again." +
                    ranText(params),
                command: {
                    command: "modelTrace.trace",
                    title: "Trace Again",
                    ...(params.uri !== undefined ? { arguments: [params.uri] } : {}),
                },
            };
        }
    }
}

/** What ran and which sizes the hints show, as lines that end the tooltip ("" when the server said neither). */
export function ranText(params: StatusParams): string {
    const lines: string[] = [];
    if (params.ran !== undefined) {
        lines.push(`Ran: ${params.ran}`);
    }
    if (params.sizes === "full") {
        lines.push("Hints: the model's full sizes (shape-only on the meta device), each marked (full); the hover keeps the traced values");
    } else if (params.sizes === "traced" || params.ran !== undefined) {
        lines.push("Hints: the traced run's sizes (ModelTrace: Toggle the Active File's Hints at Full Size shows the model's own)");
    }
    return lines.length === 0 ? "" : `\n${lines.join("\n")}`;
}

/** The item after a comparison with the reference. */
export function viewForDiffResult(params: DiffResultParams): ResultView {
    const reference: string = fileName(params.reference);
    const notes: string = noteText(params);
    if (params.match || params.divergence === null) {
        return {
            text: "$(pass) ModelTrace: matches reference",
            tooltip: `Every compared module matches ${reference}${notes}`,
            command: { command: "modelTrace.showDiffPlot", title: showDifference },
        };
    }
    const divergence = params.divergence;
    const where: string = divergence.path || "(root)";
    return {
        text: `$(warning) ModelTrace: diverges at ${where}`,
        tooltip: `First divergence from ${reference}: ${where} (${divergence.className}), max abs diff ${formatDifference(divergence.maxAbsDiff)}. Click to go to the line.${notes}`,
        command:
            divergence.location === null
                ? { command: "modelTrace.showDiffPlot", title: showDifference }
                : { command: "modelTrace.goToLine", title: goToLine, arguments: [divergence.location.uri, divergence.location.line] },
    };
}

/** The notification text for a diverging trace; undefined when it matches (no notification then). */
export function divergenceMessage(params: DiffResultParams): string | undefined {
    if (params.match || params.divergence === null) {
        return undefined;
    }
    const divergence = params.divergence;
    return (
        `ModelTrace: ${fileName(params.uri)} diverges from the reference at ${divergence.path || "(root)"} ` +
        `(${divergence.className}), max abs diff ${formatDifference(divergence.maxAbsDiff)}.${noteText(params)}`
    );
}

/** The diff's notes (what limited it, e.g. a replay an untrusted workspace did not run), as a trailing sentence. */
function noteText(params: DiffResultParams): string {
    const notes: string[] = params.notes ?? [];
    return notes.length === 0 ? "" : ` Note: ${notes.join("; ")}.`;
}

export function referenceSetMessage(reference: string): string {
    return `ModelTrace: reference set to ${fileName(reference)}. Each trace of this file is now compared with it.`;
}

export class TraceFeedback implements vscode.Disposable {
    private readonly item: vscode.StatusBarItem;

    constructor() {
        this.item = vscodeapi.createStatusBarItem("modelTrace.result", 50);
        this.item.name = "ModelTrace result";
    }

    private get settings(): { notifications: boolean; statusBar: boolean } {
        return readSettings(vscodeapi.getConfiguration(settingsSection));
    }

    /** `modelTrace/status`: the item follows tracing, traced and failed. */
    onStatus(params: StatusParams): void {
        const view: ResultView | undefined = viewForTraceStatus(params);
        if (view !== undefined) {
            this.showView(view);
        }
    }

    /** `modelTrace/diffResult`: the item says match or where it diverges; a divergence notifies. */
    onDiffResult(params: DiffResultParams): void {
        this.showView(viewForDiffResult(params));
        const message: string | undefined = divergenceMessage(params);
        if (message === undefined || !this.settings.notifications) {
            return;
        }
        const location = params.divergence?.location ?? null;
        const actions: string[] = location === null ? [showDifference] : [showDifference, goToLine];
        void vscodeapi.showWarningMessage(message, ...actions).then((choice: string | undefined) => {
            if (choice === showDifference) {
                void vscodeapi.executeCommand("modelTrace.showDiffPlot");
            } else if (choice === goToLine && location !== null) {
                void vscodeapi.showLine(location.uri, location.line);
            }
        });
    }

    /** A `modelTrace.setReference` / `pinReference` result: says that the reference is set. */
    onReferenceSet(reference: string): void {
        if (this.settings.notifications) {
            void vscodeapi.showInformationMessage(referenceSetMessage(reference));
        }
    }

    /** The settings changed: hide or show the item. */
    refresh(): void {
        if (this.settings.statusBar && this.item.text !== "") {
            this.item.show();
        } else {
            this.item.hide();
        }
    }

    dispose(): void {
        this.item.dispose();
    }

    private showView(view: ResultView): void {
        this.item.text = view.text;
        this.item.tooltip = view.tooltip;
        this.item.command = view.command;
        this.refresh();
    }
}
