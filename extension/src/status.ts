// The "ModelTrace" language status item shown for Python files: what the server is doing.
// The server pushes `modelTrace/status`; the client adds its own states (starting, restricted, problem).
import * as vscode from "vscode";
import type { StatusParams } from "./lsp_ext";
import * as vscodeapi from "./vscodeapi";

export type StatusSeverity = "information" | "warning" | "error";

/** What the item shows, independent of the vscode API so it can be checked directly. */
export interface StatusView {
    text: string;
    detail: string | undefined;
    busy: boolean;
    severity: StatusSeverity;
    /** The command its link runs, with its title. */
    command: { command: string; title: string } | undefined;
}

const traceLink = { command: "modelTrace.trace", title: "Trace" };
const logsLink = { command: "modelTrace.showLogs", title: "Show Logs" };

export function viewForServerStatus(params: StatusParams): StatusView {
    switch (params.state) {
        case "tracing":
            return { text: "ModelTrace: tracing…", detail: params.message, busy: true, severity: "information", command: logsLink };
        case "stale":
            return {
                text: "ModelTrace: stale",
                detail: params.message ?? "The file changed since it was traced",
                busy: false,
                severity: "warning",
                command: traceLink,
            };
        case "error":
            return { text: "ModelTrace: error", detail: params.message, busy: false, severity: "error", command: logsLink };
        case "idle":
            // NOTE: idle follows a finished trace, but also a cancelled or cleared one: the server's message
            // ("TinyLlamaModel: 52 module calls on 14 lines (3.1 s)", "trace cleared") says which.
            return {
                text: "ModelTrace: ready",
                detail: params.message,
                busy: false,
                severity: "information",
                command: traceLink,
            };
    }
}

export const startingView: StatusView = {
    text: "ModelTrace: starting…",
    detail: undefined,
    busy: true,
    severity: "information",
    command: logsLink,
};

export const restrictedView: StatusView = {
    text: "ModelTrace: restricted",
    detail: "Tracing is off until the workspace is trusted",
    busy: false,
    severity: "warning",
    command: { command: "workbench.trust.manage", title: "Manage Trust" },
};

export function problemView(problem: string): StatusView {
    return { text: "ModelTrace: not running", detail: problem, busy: false, severity: "error", command: logsLink };
}

function toSeverity(severity: StatusSeverity): vscode.LanguageStatusSeverity {
    switch (severity) {
        case "information":
            return vscode.LanguageStatusSeverity.Information;
        case "warning":
            return vscode.LanguageStatusSeverity.Warning;
        case "error":
            return vscode.LanguageStatusSeverity.Error;
    }
}

export class TraceStatus implements vscode.Disposable {
    private readonly item: vscode.LanguageStatusItem;
    private current: StatusView = startingView;
    /** In an untrusted workspace an idle server shows as "restricted": tracing is off there. */
    restricted: boolean = false;

    constructor() {
        this.item = vscodeapi.createLanguageStatusItem("modelTrace.status", { language: "python" });
        this.item.name = "ModelTrace";
        this.show(startingView);
    }

    get view(): StatusView {
        return this.current;
    }

    show(view: StatusView): void {
        this.current = view;
        this.item.text = view.text;
        this.item.detail = view.detail;
        this.item.busy = view.busy;
        this.item.severity = toSeverity(view.severity);
        this.item.command = view.command;
    }

    showServerStatus(params: StatusParams): void {
        this.show(this.restricted && params.state === "idle" ? restrictedView : viewForServerStatus(params));
    }

    dispose(): void {
        this.item.dispose();
    }
}
