// End-to-end, trusted workspace (after reference.test): the `_can_record_outputs` check. A copy of the example's
// modeling file with one entry removed gets a "missing-recorder" warning from the server (pull diagnostics);
// VS Code offers its quick fix (vscode.executeCodeActionProvider), the lightbulb and the quick-fix menu show it
// on screen (run.mjs, playwright), and applying it gives back the original text; the warning then goes away.
import * as assert from "node:assert/strict";
import * as vscode from "vscode";
import { askForDomCheck, type DomResult, hostLog } from "./handshake";
import { activateInstalledExtension, sleep, waitFor } from "./hints";

const originalFile: string = "tiny_llama/modeling_tiny_llama.py";
/** The broken copy sits in its own folder of the workspace (the package's relative imports need not resolve). */
const brokenFile: string = "recorders_check/modeling_tiny_llama.py";
const removed: string = '        "attentions": TinyLlamaAttention,\n';

function recorderDiagnostics(uri: vscode.Uri): vscode.Diagnostic[] {
    return vscode.languages.getDiagnostics(uri).filter((diagnostic: vscode.Diagnostic) => diagnostic.source === "ModelTrace recorders");
}

describe("ModelTrace: _can_record_outputs quick fix", () => {
    it("warns about the removed entry, offers the fix on screen, and the fix writes it back", async () => {
        await activateInstalledExtension();
        // one editor on screen (the earlier suites leave a split and a webview open)
        await vscode.commands.executeCommand("workbench.action.closeAllEditors");
        const folder: vscode.WorkspaceFolder = vscode.workspace.workspaceFolders![0];
        const original: string = Buffer.from(await vscode.workspace.fs.readFile(vscode.Uri.joinPath(folder.uri, originalFile))).toString("utf8");
        assert.ok(original.includes(removed), `${originalFile} no longer has the line this test removes`);
        const brokenUri: vscode.Uri = vscode.Uri.joinPath(folder.uri, brokenFile);
        await vscode.workspace.fs.writeFile(brokenUri, Buffer.from(original.replace(removed, ""), "utf8"));
        const document: vscode.TextDocument = await vscode.workspace.openTextDocument(brokenUri);
        const editor: vscode.TextEditor = await vscode.window.showTextDocument(document, { preview: false });

        // the warning, through the VS Code API
        const diagnostics: vscode.Diagnostic[] = await waitFor(() => recorderDiagnostics(brokenUri), (found) => found.length > 0, 60_000);
        assert.equal(diagnostics.length, 1, `expected one recorder diagnostic, got ${JSON.stringify(diagnostics.map((d) => d.message))}`);
        const [diagnostic] = diagnostics;
        assert.equal(diagnostic.code, "missing-recorder");
        assert.equal(diagnostic.severity, vscode.DiagnosticSeverity.Warning);
        assert.match(diagnostic.message, /'attentions'/);
        assert.equal(document.lineAt(diagnostic.range.start.line).text.trim(), "_can_record_outputs = {");
        hostLog(`recorders: diagnostic on line ${diagnostic.range.start.line + 1}: ${diagnostic.message}`);

        // the quick fix VS Code gets for it
        const actions: vscode.CodeAction[] = await waitFor(
            async () =>
                (await vscode.commands.executeCommand<vscode.CodeAction[]>(
                    "vscode.executeCodeActionProvider",
                    brokenUri,
                    diagnostic.range,
                    vscode.CodeActionKind.QuickFix.value,
                )) ?? [],
            (found: vscode.CodeAction[]) => found.some((action) => action.title.includes("TinyLlamaAttention")),
            30_000,
        );
        const fix: vscode.CodeAction | undefined = actions.find((action) => action.title.includes("TinyLlamaAttention"));
        assert.ok(fix !== undefined, `no quick fix writing TinyLlamaAttention among ${JSON.stringify(actions.map((a) => a.title))}`);
        assert.equal(fix.kind?.value, vscode.CodeActionKind.QuickFix.value);
        assert.equal(fix.isPreferred, true);
        assert.ok(fix.edit !== undefined, "the quick fix has no edit");
        hostLog(`recorders: quick fix "${fix.title}"`);

        // on screen: clicking the diagnostic's line shows the lightbulb, and Ctrl+. the fix in the quick-fix menu
        editor.revealRange(diagnostic.range, vscode.TextEditorRevealType.InCenter);
        await sleep(1500);
        const result: DomResult = await askForDomCheck({
            mode: "trusted",
            action: "check",
            hints: [],
            squiggle: "warning",
            quickFix: { snippet: "_can_record_outputs = {", title: fix.title },
            screenshot: "screenshot-recorders.png",
        });
        assert.deepEqual(result.failures, []);

        // applying it gives back the original text, and the warning goes away
        assert.equal(await vscode.workspace.applyEdit(fix.edit!), true, "applying the quick fix failed");
        assert.equal(document.getText(), original);
        const after: vscode.Diagnostic[] = await waitFor(() => recorderDiagnostics(brokenUri), (found) => found.length === 0, 30_000);
        assert.deepEqual(after.map((d) => d.message), []);
        await document.save();
        hostLog("recorders: the fix wrote the entry back; no recorder diagnostic left");
    });
});
