// End-to-end, trusted workspace: trace the example model from the installed .vsix and check its hints,
// first through the LSP (vscode.executeInlayHintProvider), then on screen (run.mjs, playwright), with VS Code's
// default editor.inlayHints.maximumLength: every assigned name of the attention shows a whole shape.
import * as assert from "node:assert/strict";
import * as vscode from "vscode";
import { askForDomCheck, type DomResult, hostLog } from "./handshake";
import { activateInstalledExtension, describeHints, inlayHints, isTraceHint, labelText, lineOf, openInEditor, sleep } from "./hints";
import { sentinels, trapModelingFile, workerProcesses } from "./traps";

/** The file traced, relative to the workspace (the repo's examples/ folder). */
const modelingFile: string = "tiny_llama/modeling_tiny_llama.py";

/** What must be shown after one trace: the line holding `snippet` gets a hint starting with `labelStartsWith` and containing `labelIncludes`. */
const expectedHints: { snippet: string; labelStartsWith: string; labelIncludes: string }[] = [
    // Right after the assigned name, compact, no float32 (the model's dtype), no ×2 (in the hover).
    { snippet: "hidden_states = self.mlp(hidden_states)", labelStartsWith: ": [1,7,64]", labelIncludes: "" },
    { snippet: "hidden_states = self.input_layernorm(hidden_states)", labelStartsWith: ": [1,7,64]", labelIncludes: "" },
    // line capture is on by default: the value assigned, after the transpose; `_` gets none
    { snippet: "query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)", labelStartsWith: ": [1,4,7,16]", labelIncludes: "" },
    { snippet: "hidden_states, _ = self.self_attn(", labelStartsWith: ": [1,7,64]", labelIncludes: "" },
    { snippet: "hidden_states = self.post_attention_layernorm(hidden_states)", labelStartsWith: ": [1,7,64]", labelIncludes: "" },
];
/** VS Code's default editor.inlayHints.maximumLength: a longer label is cut with "…". */
const defaultMaximumLength: number = 43;
const wholeShape: RegExp = /\[\d+(,\d+)*\]/;

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

    it("shows a whole shape for every assigned name of the attention, on screen at default settings", async function () {
        if (found.length === 0) {
            this.skip();
        }
        const document: vscode.TextDocument = editor.document;
        assert.equal(
            vscode.workspace.getConfiguration("editor.inlayHints").get("maximumLength"),
            defaultMaximumLength,
            "the e2e runs with VS Code's default editor.inlayHints.maximumLength",
        );
        // TinyLlamaAttention.forward: from its signature to its return.
        const first: number = lineOf(document, "input_shape = hidden_states.shape[:-1]");
        const last: number = lineOf(document, "attn_output = self.o_proj(attn_output)") + 1;
        const attention: { line: number; snippet: string; label: string }[] = [];
        for (const hint of await inlayHints(document)) {
            const line: number = hint.position.line;
            if (line < first || line > last) {
                continue;
            }
            const label: string = labelText(hint);
            assert.ok(label.length <= defaultMaximumLength, `line ${line + 1}: ${label} is longer than ${defaultMaximumLength}`);
            assert.match(label, wholeShape, `line ${line + 1}: ${label} holds no whole shape`);
            attention.push({ line, snippet: document.lineAt(line).text.trim(), label });
        }
        hostLog(`attention hints:\n${attention.map((hint) => `  line ${hint.line + 1}: ${hint.label}`).join("\n")}`);
        for (const snippet of ["query_states = self.q_proj(", "key_states = self.k_proj(", "value_states = self.v_proj(", "cos, sin = position_embeddings",
            "attn_output, attn_weights = attention_interface(", "attn_output = self.o_proj(attn_output)"]) {
            assert.ok(attention.some((hint) => hint.line === lineOf(document, snippet)), `no hint on ${snippet}`);
        }
        const position: vscode.Position = new vscode.Position(first, 0);
        editor.selection = new vscode.Selection(position, position);
        const top: vscode.Position = new vscode.Position(Math.max(0, first - 8), 0);
        editor.revealRange(new vscode.Range(top, top), vscode.TextEditorRevealType.AtTop);
        await sleep(1500);
        const result: DomResult = await askForDomCheck({
            mode: "trusted",
            action: "check",
            hints: attention,
            hintsWhole: true,
            languageStatus: "ModelTrace: ready",
            // Over `query_states` (8 spaces of indent, then the name): its own value first, as the hint says.
            hover: { snippet: "query_states = self.q_proj(hidden_states)", firstRow: "query_states", dx: 70 },
        });
        assert.deepEqual(result.failures, []);
        assert.equal(result.ok, true);
    });

    it("starts the hover with the line's assigned value", async function () {
        if (found.length === 0) {
            this.skip();
        }
        const line: number = lineOf(editor.document, "query_states = self.q_proj(hidden_states)");
        const hovers = await vscode.commands.executeCommand<vscode.Hover[]>("vscode.executeHoverProvider", editor.document.uri, new vscode.Position(line, 10));
        const text: string = hovers
            .flatMap((hover: vscode.Hover) => hover.contents)
            .map((content) => (typeof content === "string" ? content : content.value))
            .join("\n");
        const rows: string[] = text.split("\n").filter((row: string) => row.startsWith("| `"));
        assert.match(rows[0] ?? "", /^\| `query_states` \| 0 \| \[1,4,7,16\] \| float32 \|/, text);
        assert.match(text, /×2: this line ran 2 times/);
    });

    it("clears and re-traces from the command palette (no arguments: the active editor's document)", async function () {
        if (found.length === 0) {
            this.skip();
        }
        const document: vscode.TextDocument = editor.document;
        await vscode.window.showTextDocument(document);
        await vscode.commands.executeCommand("modelTrace.clear");
        const traceHints = async (): Promise<vscode.InlayHint[]> =>
            (await inlayHints(document)).filter(isTraceHint);
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

    it("traces a modular file through its generated twin and shows the twin's hints on the modular lines", async () => {
        // copied/qwen3/modular_qwen3.py: Qwen3Attention overrides forward; Qwen3Model is only in the generated file.
        // NOTE: before the folder's modeling file is traced (next test), so these hints can only come from this trace
        const modular: vscode.TextEditor = await openInEditor("copied/qwen3/modular_qwen3.py");
        const document: vscode.TextDocument = modular.document;
        const line: number = lineOf(document, "query_states = self.q_norm(self.q_proj(hidden_states).view(hidden_shape))");
        const started: number = Date.now();
        const result = (await vscode.commands.executeCommand("modelTrace.trace", document.uri.toString())) as { ok: boolean; message?: string };
        assert.equal(result?.ok, true, `tracing the modular file failed: ${JSON.stringify(result)}`);
        let hints: vscode.InlayHint[] = [];
        while (Date.now() - started < traceTimeoutMs) {
            hints = (await inlayHints(document)).filter((hint) => hint.position.line === line);
            if (hints.length > 0) {
                break;
            }
            await sleep(500);
        }
        hostLog(`modular qwen3 traced in ${((Date.now() - started) / 1000).toFixed(1)} s; query_states: ${hints.map(labelText).join(" ")}`);
        assert.deepEqual(hints.map(labelText), [": [1,4,7,16]"]);
        // the methods a modular class inherits unchanged are named, with where their generated lines are
        const lenses = (await vscode.commands.executeCommand("vscode.executeCodeLensProvider", document.uri)) as vscode.CodeLens[];
        const titles: string[] = lenses.map((lens) => lens.command?.title ?? "");
        assert.ok(
            titles.some((title) => /inherited from `\w+\.forward`, \d+ lines: modeling_qwen3\.py:\d+/.test(title)),
            `no inherited-method lens on modular_qwen3.py: ${JSON.stringify(titles)}`,
        );
        await vscode.window.showTextDocument(editor.document);
    });

    it("traces a model folder copied out of transformers (its imports climb above the folder)", async () => {
        // run.mjs copied the installed transformers' models/qwen3/ to copied/qwen3/ (`from ...modeling_utils import`).
        const copied: vscode.TextEditor = await openInEditor("copied/qwen3/modeling_qwen3.py");
        const document: vscode.TextDocument = copied.document;
        assert.match(document.getText(), /^from \.\.\.modeling_utils import/m);
        const line: number = lineOf(document, "query_states = self.q_norm(self.q_proj(hidden_states)");
        const started: number = Date.now();
        const result = (await vscode.commands.executeCommand("modelTrace.trace", document.uri.toString())) as { ok: boolean; message?: string };
        assert.equal(result?.ok, true, `tracing the copied folder failed: ${JSON.stringify(result)}`);
        let hints: vscode.InlayHint[] = [];
        while (Date.now() - started < traceTimeoutMs) {
            hints = (await inlayHints(document)).filter((hint) => hint.position.line === line);
            if (hints.length > 0) {
                break;
            }
            await sleep(500);
        }
        hostLog(`copied qwen3 folder traced in ${((Date.now() - started) / 1000).toFixed(1)} s; query_states: ${hints.map(labelText).join(" ")}`);
        assert.deepEqual(hints.map(labelText), [": [1,4,7,16]"]);
        await vscode.window.showTextDocument(editor.document);
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
