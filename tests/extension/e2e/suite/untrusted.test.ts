// End-to-end, untrusted workspace (restricted mode): the installed extension refuses to trace
// with a clear message and no hints appear; once the user trusts the workspace, tracing works.
import * as assert from "node:assert/strict";
import * as vscode from "vscode";
import { askForDomCheck, type DomResult, hostLog } from "./handshake";
import { activateInstalledExtension, describeHints, inlayHints, labelText, openInEditor, sleep } from "./hints";

const modelingFile: string = "tiny_llama/modeling_tiny_llama.py";
const traceTimeoutMs: number = Number(process.env.MODELTRACE_E2E_TRACE_TIMEOUT_S ?? "150") * 1000;
const refusal: string = "ModelTrace: tracing runs this workspace's model code; trust the workspace to enable it.";

describe("ModelTrace in an untrusted workspace", () => {
    it("refuses to trace and shows why", async () => {
        assert.equal(vscode.workspace.isTrusted, false, "the untrusted run must start code-server without --disable-workspace-trust");
        await activateInstalledExtension();
        const editor: vscode.TextEditor = await openInEditor(modelingFile);
        const commands: string[] = await vscode.commands.getCommands(true);
        assert.ok(commands.includes("modelTrace.trace"), "modelTrace.trace should exist (the server or the client registers it)");

        const result: unknown = await vscode.commands.executeCommand("modelTrace.trace", editor.document.uri.toString());
        assert.equal(result, undefined);
        await sleep(5000);
        const hints: vscode.InlayHint[] = await inlayHints(editor.document);
        const traced: vscode.InlayHint[] = hints.filter((hint) => labelText(hint).includes("→"));
        assert.deepEqual(traced, [], `no trace hints expected, got:\n${describeHints(traced)}`);

        // NOTE: the web workbench under test automation keeps notifications in the center without a toast.
        await vscode.commands.executeCommand("notifications.showList");
        const dom: DomResult = await askForDomCheck({ mode: "untrusted", action: "check", hints: [], notification: refusal });
        assert.deepEqual(dom.failures, []);
    });

    it("traces once the user trusts the workspace (the server restarts with tracing enabled)", async () => {
        const granted: Promise<void> = new Promise((resolve) => vscode.workspace.onDidGrantWorkspaceTrust(() => resolve()));
        await vscode.commands.executeCommand("workbench.trust.manage");
        const dom: DomResult = await askForDomCheck({ mode: "untrusted", action: "grant-trust", hints: [] });
        assert.deepEqual(dom.failures, []);
        await granted;
        assert.equal(vscode.workspace.isTrusted, true);

        const editor: vscode.TextEditor = await openInEditor(modelingFile);
        const started: number = Date.now();
        let traced: vscode.InlayHint[] = [];
        while (traced.length === 0 && Date.now() - started < traceTimeoutMs) {
            // A trace run while the server restarts waits for the new server.
            await vscode.commands.executeCommand("modelTrace.trace", editor.document.uri.toString());
            traced = (await inlayHints(editor.document)).filter((hint) => labelText(hint).startsWith("→"));
            if (traced.length === 0) {
                await sleep(2000);
            }
        }
        hostLog(`after granting trust: ${traced.length} trace hints in ${((Date.now() - started) / 1000).toFixed(1)} s`);
        assert.ok(traced.length > 0, "no trace hints after the workspace was trusted");
    });
});
