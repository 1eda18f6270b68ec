// Entry point of the ModelTrace extension: wires the log channel, the status item, the diff gutters, the
// trace-result feedback (status bar, notifications), the language server and the client-side commands together.
import type * as vscode from "vscode";
import { ServerManager } from "./client";
import { TraceFeedback } from "./feedback";
import { DiffGutters } from "./gutters";
import { loadReference, loadTrace, showDiffPlot } from "./reference";
import { settingsSection } from "./settings";
import { TraceStatus } from "./status";
import * as vscodeapi from "./vscodeapi";

let serverManager: ServerManager | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
    const outputChannel: vscode.LogOutputChannel = vscodeapi.createLogOutputChannel("ModelTrace");
    const status: TraceStatus = new TraceStatus();
    const gutters: DiffGutters = new DiffGutters(context.extensionUri);
    const feedback: TraceFeedback = new TraceFeedback();
    const manager: ServerManager = new ServerManager(outputChannel, status, gutters, feedback);
    serverManager = manager;
    context.subscriptions.push(
        outputChannel,
        status,
        gutters,
        feedback,
        manager,
        vscodeapi.registerCommand("modelTrace.loadReference", () => loadReference()),
        vscodeapi.registerCommand("modelTrace.openTrace", (tracePath?: unknown) => loadTrace(tracePath)),
        vscodeapi.registerCommand("modelTrace.showDiffPlot", () => showDiffPlot(manager.running)),
        vscodeapi.registerCommand("modelTrace.restartServer", () => manager.restart()),
        vscodeapi.registerCommand("modelTrace.showLogs", () => outputChannel.show()),
        vscodeapi.registerCommand("modelTrace.goToLine", (uri: unknown, line: unknown) =>
            typeof uri === "string" && typeof line === "number" ? vscodeapi.showLine(uri, line) : undefined,
        ),
        vscodeapi.onDidChangeConfiguration((event: vscode.ConfigurationChangeEvent) => {
            if (
                event.affectsConfiguration(`${settingsSection}.python`) ||
                event.affectsConfiguration(`${settingsSection}.importStrategy`)
            ) {
                void manager.onSettingsChanged();
            }
            if (event.affectsConfiguration(`${settingsSection}.statusBar`)) {
                feedback.refresh();
            }
        }),
        vscodeapi.onDidGrantWorkspaceTrust(() => {
            outputChannel.info("Workspace trusted: restarting the server with tracing enabled.");
            void manager.restart();
        }),
    );
    await manager.restart();
}

export async function deactivate(): Promise<void> {
    await serverManager?.stop();
    serverManager = undefined;
}
