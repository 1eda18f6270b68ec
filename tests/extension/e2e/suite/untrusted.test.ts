// End-to-end, untrusted workspace (restricted mode): nothing of the workspace is imported or run. run.mjs
// planted traps (see plantTraps): a model package whose modules write a sentinel file outside the workspace
// when imported, a workspace setting pointing modelTrace.python at a workspace "interpreter" that writes one,
// a workspace-root modeltrace.py shadowing the server's package, and traceOnSave on. The user does everything
// the extension offers; no sentinel appears, no worker starts, and the refusal is on screen. Once the user
// trusts the workspace, tracing works and the same traps do fire (so the checks can fail).
import * as assert from "node:assert/strict";
import * as vscode from "vscode";
import { askForDomCheck, type DomResult, hostLog } from "./handshake";
import { activateInstalledExtension, describeHints, inlayHints, isTraceHint, openInEditor, sleep } from "./hints";
import { sentinels, trapModelingFile, workerProcesses } from "./traps";

const modelingFile: string = "tiny_llama/modeling_tiny_llama.py";
const traceTimeoutMs: number = Number(process.env.MODELTRACE_E2E_TRACE_TIMEOUT_S ?? "150") * 1000;
const refusal: string = "ModelTrace: tracing runs this workspace's model code; trust the workspace to enable it.";

async function waitFor<T>(what: () => Promise<T> | T, done: (value: T) => boolean, timeoutMs: number): Promise<T> {
    const deadline: number = Date.now() + timeoutMs;
    let value: T = await what();
    while (!done(value) && Date.now() < deadline) {
        await sleep(1000);
        value = await what();
    }
    return value;
}

describe("ModelTrace in an untrusted workspace", () => {
    it("runs nothing of the workspace, whatever the user does, and says why it does not trace", async () => {
        assert.equal(vscode.workspace.isTrusted, false, "the untrusted run must start code-server without --disable-workspace-trust");
        assert.deepEqual(sentinels(), [], "sentinels before the extension started");
        await activateInstalledExtension();
        const commands: string[] = await vscode.commands.getCommands(true);
        assert.ok(commands.includes("modelTrace.trace"), "modelTrace.trace should exist (the server or the client registers it)");

        // A full-tensor trace of the trap made elsewhere, loaded, against a full-tensor reference: the diff's replay
        // would rebuild the trap (not edited yet), so only the plain comparison runs, and its notes say why.
        const trapDocument: vscode.TextDocument = (await openInEditor(trapModelingFile)).document;
        const loaded = (await vscode.commands.executeCommand("modelTrace.loadTrace", trapDocument.uri.toString(), process.env.MODELTRACE_E2E_TRAP_TRACE)) as
            | { ok: boolean }
            | undefined;
        assert.equal(loaded?.ok, true, `Load Trace of the trap's trace failed: ${JSON.stringify(loaded)}`);
        const compared = (await vscode.commands.executeCommand("modelTrace.setReference", trapDocument.uri.toString(), process.env.MODELTRACE_E2E_REFERENCE)) as
            | { ok: boolean; diff: { match: boolean; notes: string[] } | null }
            | undefined;
        assert.equal(compared?.ok, true, `setReference failed: ${JSON.stringify(compared)}`);
        assert.deepEqual(sentinels(), [], "the diff's replay ran the trap's code in an untrusted workspace");
        assert.equal(compared?.diff?.match, false, `the trap's other seed should diverge: ${JSON.stringify(compared)}`);
        assert.ok(
            compared?.diff?.notes.some((note: string) => note.startsWith("replay not run: ")),
            `no note that the replay did not run: ${JSON.stringify(compared?.diff?.notes)}`,
        );
        await vscode.commands.executeCommand("modelTrace.clear", trapDocument.uri.toString());

        for (const file of [modelingFile, trapModelingFile]) {
            const editor: vscode.TextEditor = await openInEditor(file);
            const document: vscode.TextDocument = editor.document;
            const uri: vscode.Uri = document.uri;
            // The static features are served (so the server runs, with the trap file open): code lenses ...
            const lenses: vscode.CodeLens[] = await waitFor(
                async () => (await vscode.commands.executeCommand<vscode.CodeLens[]>("vscode.executeCodeLensProvider", uri)) ?? [],
                (found: vscode.CodeLens[]) => found.some((lens) => lens.command !== undefined),
                30_000,
            );
            const traceLenses: vscode.CodeLens[] = lenses.filter((lens) => lens.command?.command === "modelTrace.trace");
            assert.ok(
                traceLenses.length > 0,
                `no "Trace forward" code lens on ${file}: the server is not serving it (sentinels: ${JSON.stringify(sentinels())})`,
            );
            // ... every action the user has: the trace command with and without arguments, each lens, ...
            assert.equal(await vscode.commands.executeCommand("modelTrace.trace", uri.toString()), undefined);
            await vscode.commands.executeCommand("modelTrace.trace");
            for (const lens of traceLenses) {
                await vscode.commands.executeCommand(lens.command!.command, ...(lens.command!.arguments ?? []));
            }
            // ... hovers, hints, code actions and diagnostics over the whole file, pin/clear, ...
            for (let line = 0; line < document.lineCount; line += 7) {
                await vscode.commands.executeCommand("vscode.executeHoverProvider", uri, new vscode.Position(line, 12));
            }
            const wholeFile: vscode.Range = new vscode.Range(0, 0, document.lineCount, 0);
            await vscode.commands.executeCommand("vscode.executeCodeActionProvider", uri, wholeFile);
            vscode.languages.getDiagnostics(uri);
            await vscode.commands.executeCommand("modelTrace.pinReference", uri.toString());
            await vscode.commands.executeCommand("modelTrace.clear", uri.toString());
            // ... and an edit saved (traceOnSave is on in the workspace settings).
            await editor.edit((edit: vscode.TextEditorEdit) => edit.insert(new vscode.Position(document.lineCount, 0), "\n# edited\n"));
            assert.ok(await document.save(), `saving ${file} failed`);
            const hints: vscode.InlayHint[] = await inlayHints(document);
            const traced: vscode.InlayHint[] = hints.filter(isTraceHint);
            assert.deepEqual(traced, [], `no trace hints expected on ${file}, got:\n${describeHints(traced)}`);
        }
        // A restart of the server (the user's "Restart Server") reads the settings again: still untrusted.
        await vscode.commands.executeCommand("modelTrace.restartServer");
        await sleep(8000);
        await vscode.commands.executeCommand("modelTrace.trace", (await openInEditor(trapModelingFile)).document.uri.toString());
        await sleep(4000);

        assert.deepEqual(sentinels(), [], "workspace code ran in an untrusted workspace (sentinel files written)");
        assert.deepEqual(workerProcesses(), [], "a trace worker was started in an untrusted workspace");
        hostLog("untrusted: no sentinel written, no worker process started");

        // NOTE: the web workbench under test automation keeps notifications in the center without a toast.
        await vscode.commands.executeCommand("notifications.showList");
        const dom: DomResult = await askForDomCheck({ mode: "untrusted", action: "check", hints: [], notification: refusal });
        assert.deepEqual(dom.failures, []);
    });

    it("traces once the user trusts the workspace, and then the same traps do fire", async () => {
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
            traced = (await inlayHints(editor.document)).filter(isTraceHint);
            if (traced.length === 0) {
                await sleep(2000);
            }
        }
        hostLog(`after granting trust: ${traced.length} trace hints in ${((Date.now() - started) / 1000).toFixed(1)} s`);
        assert.ok(traced.length > 0, "no trace hints after the workspace was trusted");

        // The workspace's interpreter setting now applies (the server restarted through it) ...
        assert.ok(sentinels().some((name) => name.startsWith("interpreter-")), `the workspace interpreter never ran: ${JSON.stringify(sentinels())}`);
        // ... a worker of this run is up, and tracing the trap imports it.
        assert.ok(workerProcesses().length > 0, "no worker process found for this run after a trace");
        const trap: vscode.TextEditor = await openInEditor(trapModelingFile);
        await vscode.commands.executeCommand("modelTrace.trace", trap.document.uri.toString());
        const written: string[] = await waitFor(sentinels, (names: string[]) => names.some((name) => name.startsWith("modeling-import-")), traceTimeoutMs);
        hostLog(`after granting trust, sentinels: ${JSON.stringify(written)}; workers: ${JSON.stringify(workerProcesses())}`);
        assert.ok(written.some((name) => name.startsWith("modeling-import-")), `tracing the trap wrote no sentinel: ${JSON.stringify(written)}`);
        // The workspace-root modeltrace.py is never imported, trusted or not (PYTHONSAFEPATH).
        assert.ok(!written.some((name) => name.startsWith("shadow-modeltrace-")), `the workspace's modeltrace.py was imported: ${JSON.stringify(written)}`);
    });
});
