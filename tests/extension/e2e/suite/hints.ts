// Helpers for reading the installed ModelTrace extension's inlay hints through the vscode API.
import * as vscode from "vscode";

export const extensionId: string = "modeltrace.modeltrace";

export function labelText(hint: vscode.InlayHint): string {
    return typeof hint.label === "string" ? hint.label : hint.label.map((part: vscode.InlayHintLabelPart) => part.value).join("");
}

/** A hint of a trace (a shape after a name, `: [1,7,64]`, or at a line's end, `→ [1,7,64]`), not a static one. */
export function isTraceHint(hint: vscode.InlayHint): boolean {
    return /^(→|:) /.test(labelText(hint));
}

/** The 0-based line whose text contains `snippet`; fails when there is none or more than one. */
export function lineOf(document: vscode.TextDocument, snippet: string): number {
    const lines: number[] = [];
    for (let line = 0; line < document.lineCount; line++) {
        if (document.lineAt(line).text.includes(snippet)) {
            lines.push(line);
        }
    }
    if (lines.length !== 1) {
        throw new Error(`expected one line containing ${JSON.stringify(snippet)} in ${document.uri.fsPath}, found ${lines.length}`);
    }
    return lines[0] as number;
}

export async function inlayHints(document: vscode.TextDocument): Promise<vscode.InlayHint[]> {
    const fullRange: vscode.Range = new vscode.Range(0, 0, document.lineCount, 0);
    const hints: vscode.InlayHint[] | undefined = await vscode.commands.executeCommand<vscode.InlayHint[]>(
        "vscode.executeInlayHintProvider",
        document.uri,
        fullRange,
    );
    return hints ?? [];
}

export function describeHints(hints: vscode.InlayHint[]): string {
    return hints.map((hint: vscode.InlayHint) => `  line ${hint.position.line + 1}: ${labelText(hint)}`).join("\n") || "  (none)";
}

export function sleep(milliseconds: number): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, milliseconds));
}

/** `what()` again every half second until `done` says so or `timeoutMs` passes; its last value either way. */
export async function waitFor<T>(what: () => Promise<T> | T, done: (value: T) => boolean, timeoutMs: number): Promise<T> {
    const deadline: number = Date.now() + timeoutMs;
    let value: T = await what();
    while (!done(value) && Date.now() < deadline) {
        await sleep(500);
        value = await what();
    }
    return value;
}

export async function openInEditor(workspaceRelativePath: string): Promise<vscode.TextEditor> {
    const folder: vscode.WorkspaceFolder | undefined = vscode.workspace.workspaceFolders?.[0];
    if (folder === undefined) {
        throw new Error("no workspace folder is open");
    }
    const document: vscode.TextDocument = await vscode.workspace.openTextDocument(
        vscode.Uri.joinPath(folder.uri, workspaceRelativePath),
    );
    return vscode.window.showTextDocument(document, { preview: false });
}

/** Activates the installed extension and checks it is the .vsix run.mjs installed, not a development copy of the repo. */
export async function activateInstalledExtension(): Promise<vscode.Extension<unknown>> {
    const extension: vscode.Extension<unknown> | undefined = vscode.extensions.getExtension(extensionId);
    if (extension === undefined) {
        throw new Error(`${extensionId} is not installed`);
    }
    const extensionsDir: string | undefined = process.env.MODELTRACE_E2E_EXTENSIONS_DIR;
    if (extensionsDir === undefined || !extension.extensionPath.startsWith(extensionsDir)) {
        throw new Error(`${extensionId} was loaded from ${extension.extensionPath}, not from the .vsix installed in ${extensionsDir}`);
    }
    await extension.activate();
    return extension;
}
