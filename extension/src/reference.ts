// Client-side commands around reference traces: pick a reference (file dialog → modelTrace.setReference)
// and show the difference plot of the active document (modelTrace/diffPlot → a webview).
// Pinning needs no client code: modelTrace.pinReference goes to the server, the middleware adds the document.
import type * as vscode from "vscode";
import type { LanguageClient } from "vscode-languageclient/node";
import { plotHtml } from "./diff_plot";
import * as lspExt from "./lsp_ext";
import { noDocumentMessage } from "./middleware";
import * as vscodeapi from "./vscodeapi";

export const noDiffMessage: string =
    "ModelTrace: this document has no comparison yet: load or pin a reference trace, then trace it.";

function activePythonDocument(): vscode.TextDocument | undefined {
    const document: vscode.TextDocument | undefined = vscodeapi.activeTextEditor()?.document;
    return document !== undefined && document.languageId === "python" ? document : undefined;
}

/** "Load Reference Trace…": a trace folder or a transformers debugger output, for the active document. */
export async function loadReference(): Promise<unknown> {
    const document: vscode.TextDocument | undefined = activePythonDocument();
    if (document === undefined) {
        void vscodeapi.showWarningMessage(noDocumentMessage);
        return undefined;
    }
    const chosen: vscode.Uri[] | undefined = await vscodeapi.showOpenDialog({
        title: "Reference trace: a .mtrace folder or a transformers debugger output (folder or JSON)",
        openLabel: "Use as Reference",
        canSelectFiles: true,
        canSelectFolders: true,
        canSelectMany: false,
    });
    if (chosen === undefined || chosen.length === 0) {
        return undefined;
    }
    return vscodeapi.executeCommand(lspExt.serverCommands.setReference, document.uri.toString(), chosen[0].fsPath);
}

/**
 * "Load Trace…": a `.mtrace` folder (from the CLI, CI, or a script's `modeltrace.capture`) shown on the files it
 * recorded. The server finds them here by content hash, path or name; the traced model's file is then opened
 * (when it was found and is not the active document).
 */
export async function loadTrace(tracePath?: unknown): Promise<lspExt.LoadTraceResult | undefined> {
    let chosen: string | undefined = typeof tracePath === "string" && tracePath !== "" ? tracePath : undefined;
    if (chosen === undefined) {
        const picked: vscode.Uri[] | undefined = await vscodeapi.showOpenDialog({
            title: "Trace to show: a .mtrace folder",
            openLabel: "Load Trace",
            canSelectFiles: false,
            canSelectFolders: true,
            canSelectMany: false,
        });
        chosen = picked?.[0]?.fsPath;
    }
    if (chosen === undefined) {
        return undefined;
    }
    const active: vscode.TextDocument | undefined = activePythonDocument();
    const owner: string = active?.uri.toString() ?? vscodeapi.fileUri(chosen).toString();
    const result: lspExt.LoadTraceResult | undefined = await vscodeapi.executeCommand(lspExt.serverCommands.loadTrace, owner, chosen);
    const modelFile: string | null | undefined = result?.modelFile;
    if (result?.ok && modelFile && (active === undefined || active.uri.fsPath !== modelFile)) {
        await vscodeapi.openFile(modelFile);
    }
    return result;
}

/** "Show Difference Plot": the active document's latest diff against its reference. */
export async function showDiffPlot(client: LanguageClient | undefined): Promise<vscode.WebviewPanel | undefined> {
    const document: vscode.TextDocument | undefined = activePythonDocument();
    if (document === undefined) {
        void vscodeapi.showWarningMessage(noDocumentMessage);
        return undefined;
    }
    const plot: lspExt.DiffPlot | null | undefined = await client?.sendRequest(lspExt.diffPlot, {
        uri: document.uri.toString(),
    });
    if (plot === null || plot === undefined) {
        void vscodeapi.showInformationMessage(noDiffMessage);
        return undefined;
    }
    const name: string = document.uri.path.split("/").pop() ?? document.uri.path;
    const panel: vscode.WebviewPanel = vscodeapi.createWebviewPanel("modelTrace.diffPlot", `Difference: ${name}`);
    panel.webview.html = plotHtml(plot, name);
    return panel;
}
