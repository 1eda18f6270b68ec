// End-to-end, trusted workspace: trace the example model from the installed .vsix and check its hints,
// first through the LSP (vscode.executeInlayHintProvider), then on screen (run.mjs, playwright).
import * as assert from "node:assert/strict";
import * as vscode from "vscode";
import { askForDomCheck, type DomResult, hostLog } from "./handshake";
import { activateInstalledExtension, describeHints, inlayHints, labelText, lineOf, openInEditor, sleep } from "./hints";
import { sentinels, trapModelingFile, workerProcesses } from "./traps";

/** The file traced, relative to the workspace (the repo's examples/ folder). */
const modelingFile: string = "tiny_llama/modeling_tiny_llama.py";

/** What must be shown after one trace: the line holding `snippet` gets a hint starting with `labelStartsWith` and containing `labelIncludes`. */
const expectedHints: { snippet: string; labelStartsWith: string; labelIncludes: string }[] = [
    { snippet: "hidden_states = self.mlp(hidden_states)", labelStartsWith: "→ [1, 7, 64] float32", labelIncludes: "×2" },
    { snippet: "hidden_states = self.input_layernorm(hidden_states)", labelStartsWith: "→ [1, 7, 64] float32", labelIncludes: "×2" },
    // line capture is on by default: a line that assigns several variables names them
    { snippet: "hidden_states, _ = self.self_attn(", labelStartsWith: "→ hidden_states: [1, 7, 64] float32 ×2", labelIncludes: "_: [1, 4, 7, 7] float32 ×2" },
    { snippet: "hidden_states = self.post_attention_layernorm(hidden_states)", labelStartsWith: "→ [1, 7, 64] float32", labelIncludes: "×2" },
];

const traceTimeoutMs: number = Number(process.env.MODELTRACE_E2E_TRACE_TIMEOUT_S ?? "150") * 1000;

function matches(label: string, expected: (typeof expectedHints)[number]): boolean {
    const normalized: string = label.replace(/\u00a0/g, " ").trim();
    return normalized.startsWith(expected.labelStartsWith) && normalized.includes(expected.labelIncludes);
}

describe("ModelTrace in a trusted workspace", () => {
    let editor: vscode.TextEditor;
    const found: { line: number; snippet: string; label: string }[] = [];

    before(async () => {
        assert.equal(vscode.workspace.isTrusted, true, "the trusted run must start code-server with --disable-workspace-trust");
        await activateInstalledExtension();
        editor = await openInEditor(modelingFile);
    });

    it("traces the model and provides the expected inlay hints", async () => {
        const document: vscode.TextDocument = editor.document;
        const lines: number[] = expectedHints.map((expected) => lineOf(document, expected.snippet));
        const started: number = Date.now();
        await vscode.commands.executeCommand("modelTrace.trace", document.uri.toString());
        hostLog(`modelTrace.trace returned after ${((Date.now() - started) / 1000).toFixed(1)} s`);

        let hints: vscode.InlayHint[] = [];
        const missing = (): string[] =>
            expectedHints
                .filter((expected, index) => !hints.some((hint) => hint.position.line === lines[index] && matches(labelText(hint), expected)))
                .map((expected) => expected.snippet);
        while (Date.now() - started < traceTimeoutMs) {
            hints = await inlayHints(document);
            if (missing().length === 0) {
                break;
            }
            await sleep(1000);
        }
        hostLog(`hints after ${((Date.now() - started) / 1000).toFixed(1)} s:\n${describeHints(hints)}`);
        assert.deepEqual(missing(), [], `hints missing or wrong; the server gave:\n${describeHints(hints)}`);
        expectedHints.forEach((expected, index) => {
            const hint = hints.find((candidate) => candidate.position.line === lines[index] && matches(labelText(candidate), expected));
            found.push({ line: lines[index] as number, snippet: expected.snippet, label: labelText(hint as vscode.InlayHint) });
        });
    });

    it("shows the same hints on screen", async function () {
        if (found.length === 0) {
            this.skip();
        }
        const first = found[0] as (typeof found)[number];
        const position: vscode.Position = new vscode.Position(first.line, 0);
        editor.selection = new vscode.Selection(position, position);
        // The first expected line in the lower half of the screen, the code above it in view.
        const top: vscode.Position = new vscode.Position(Math.max(0, first.line - 18), 0);
        editor.revealRange(new vscode.Range(top, top), vscode.TextEditorRevealType.AtTop);
        await sleep(1500);
        const result: DomResult = await askForDomCheck({ mode: "trusted", action: "check", hints: found, languageStatus: "ModelTrace: ready" });
        assert.deepEqual(result.failures, []);
        assert.equal(result.ok, true);
    });

    it("clears and re-traces from the command palette (no arguments: the active editor's document)", async function () {
        if (found.length === 0) {
            this.skip();
        }
        const document: vscode.TextDocument = editor.document;
        await vscode.window.showTextDocument(document);
        await vscode.commands.executeCommand("modelTrace.clear");
        const traceHints = async (): Promise<vscode.InlayHint[]> =>
            (await inlayHints(document)).filter((hint) => labelText(hint).startsWith("→"));
        const clearDeadline: number = Date.now() + 15_000;
        while ((await traceHints()).length > 0 && Date.now() < clearDeadline) {
            await sleep(500);
        }
        assert.deepEqual((await traceHints()).map(labelText), [], "hints left after modelTrace.clear");

        const started: number = Date.now();
        await vscode.commands.executeCommand("modelTrace.trace");
        let hints: vscode.InlayHint[] = [];
        while (Date.now() - started < traceTimeoutMs) {
            hints = await traceHints();
            if (found.every((expected) => hints.some((hint) => hint.position.line === expected.line && labelText(hint) === expected.label))) {
                break;
            }
            await sleep(500);
        }
        hostLog(`warm re-trace from the palette: hints back after ${((Date.now() - started) / 1000).toFixed(1)} s`);
        for (const expected of found) {
            assert.ok(
                hints.some((hint) => hint.position.line === expected.line && labelText(hint) === expected.label),
                `after the palette re-trace, line ${expected.line + 1} lacks ${expected.label}:\n${describeHints(hints)}`,
            );
        }
    });

    it("imports the traced file: tracing the trap package writes its sentinel (the untrusted suite's check can fail)", async () => {
        assert.deepEqual(sentinels().filter((name) => name.startsWith("modeling-import-")), [], "the trap ran before it was traced");
        const trap: vscode.TextEditor = await openInEditor(trapModelingFile);
        await vscode.commands.executeCommand("modelTrace.trace", trap.document.uri.toString());
        const deadline: number = Date.now() + traceTimeoutMs;
        while (!sentinels().some((name) => name.startsWith("modeling-import-")) && Date.now() < deadline) {
            await sleep(1000);
        }
        hostLog(`trusted: sentinels after tracing the trap: ${JSON.stringify(sentinels())}; workers: ${JSON.stringify(workerProcesses())}`);
        assert.ok(sentinels().some((name) => name.startsWith("modeling-import-")), `no sentinel after tracing the trap: ${JSON.stringify(sentinels())}`);
        assert.ok(workerProcesses().length > 0, "no worker process found for this run after a trace");
        await vscode.window.showTextDocument(editor.document);
    });
});
