// The trace-result feedback: the status bar item's views, the divergence notification and its actions, and the
// settings that turn them off.
import { vscodeFake } from "./vscode_fake";
import * as assert from "node:assert/strict";
import {
    divergenceMessage,
    goToLine,
    showDifference,
    TraceFeedback,
    viewForDiffResult,
    viewForTraceStatus,
} from "../../../extension/src/feedback";
import type { DiffResultParams } from "../../../extension/src/lsp_ext";
import { referenceSetBy } from "../../../extension/src/middleware";

const diverging: DiffResultParams = {
    uri: "file:///ws/tiny_llama_port/modeling_tiny_llama_port.py",
    reference: "/ws/reference/tiny_llama.mtrace",
    match: false,
    divergence: {
        path: "layers.0.self_attn",
        className: "TinyLlamaPortAttention",
        maxAbsDiff: 0.01073,
        location: { uri: "file:///ws/tiny_llama_port/modeling_tiny_llama_port.py", line: 150 },
    },
    notes: [],
};

function settle(): Promise<void> {
    return new Promise((resolve) => setTimeout(resolve, 0));
}

describe("trace result feedback", () => {
    beforeEach(() => vscodeFake.reset());

    it("shows the last trace's result and where a divergence is", () => {
        assert.deepEqual(viewForTraceStatus({ state: "idle", message: "TinyLlamaModel: 52 module calls on 14 lines (1.0 s)" }), {
            text: "$(check) ModelTrace: TinyLlamaModel",
            tooltip: "TinyLlamaModel: 52 module calls on 14 lines (1.0 s)",
            command: undefined,
        });
        assert.equal(viewForTraceStatus({ state: "idle", message: "trace cleared" }), undefined);
        // Compared with a reference: the diff result's view (sent before) stays.
        assert.equal(viewForTraceStatus({ state: "idle", message: "TinyLlamaPortModel: 30 module calls on 64 lines (1.0 s); differs from the reference" }), undefined);
        assert.equal(viewForTraceStatus({ state: "error", message: "ModelTrace: boom" })?.text, "$(error) ModelTrace: trace failed");
        // An edit makes the trace stale: the item says so (no "✓" left), and a click traces the document again.
        const stale = viewForTraceStatus({
            state: "stale",
            message: "TinyLlamaModel: the code changed since the last trace",
            uri: "file:///ws/modeling_tiny_llama.py",
        });
        assert.equal(stale?.text, "$(history) ModelTrace: TinyLlamaModel (stale)");
        assert.match(stale?.tooltip ?? "", /^TinyLlamaModel: the code changed since the last trace\. /);
        assert.deepEqual(stale?.command, {
            command: "modelTrace.trace",
            title: "Trace Again",
            arguments: ["file:///ws/modeling_tiny_llama.py"],
        });
        const view = viewForDiffResult(diverging);
        assert.equal(view.text, "$(warning) ModelTrace: diverges at layers.0.self_attn");
        assert.match(view.tooltip, /tiny_llama\.mtrace: layers\.0\.self_attn \(TinyLlamaPortAttention\), max abs diff 0\.01073/);
        assert.deepEqual(view.command?.arguments, [diverging.uri, 150]);
        assert.equal(viewForDiffResult({ ...diverging, match: true, divergence: null }).text, "$(pass) ModelTrace: matches reference");
    });

    it("notifies a divergence with Show Difference and Go to Line, and runs the one chosen", async () => {
        const feedback = new TraceFeedback();
        vscodeFake.messageReplies = [showDifference];
        feedback.onDiffResult(diverging);
        await settle();
        assert.equal(vscodeFake.warnings[0], divergenceMessage(diverging));
        assert.deepEqual(vscodeFake.warningItems[0], [showDifference, goToLine]);
        assert.deepEqual(vscodeFake.executedCommands, [{ command: "modelTrace.showDiffPlot", args: [] }]);
        const [item] = vscodeFake.statusBarItems;
        assert.equal(item?.visible, true);
        assert.equal(item?.text, "$(warning) ModelTrace: diverges at layers.0.self_attn");
        // A match updates the item and stays quiet.
        feedback.onDiffResult({ ...diverging, match: true, divergence: null });
        assert.equal(vscodeFake.warnings.length, 1);
        feedback.dispose();
    });

    it("says what limited the comparison: a replay an untrusted workspace did not run", () => {
        const note = "replay not run: it would run this workspace's model code, and the workspace is not trusted (plain comparison)";
        const limited: DiffResultParams = { ...diverging, notes: [note] };
        assert.ok(divergenceMessage(limited)?.endsWith(` Note: ${note}.`));
        assert.ok(viewForDiffResult(limited).tooltip.endsWith(` Note: ${note}.`));
        assert.ok(viewForDiffResult({ ...limited, match: true, divergence: null }).tooltip.endsWith(` Note: ${note}.`));
        assert.ok(!divergenceMessage(diverging)?.includes("Note:"));
    });

    it("says when a reference is set", () => {
        const feedback = new TraceFeedback();
        assert.equal(referenceSetBy("modelTrace.pinReference", { ok: true, reference: "/t/a-reference.mtrace" }), "/t/a-reference.mtrace");
        assert.equal(referenceSetBy("modelTrace.setReference", { ok: false, message: "bad" }), undefined);
        // The server said what the pinned reference holds (full tensors or statistics only): no second message.
        const pinned = { ok: true, reference: "/t/a-reference.mtrace", tensors: "full", message: "ModelTrace: pinned a.py" };
        assert.equal(referenceSetBy("modelTrace.pinReference", pinned), undefined);
        assert.equal(referenceSetBy("modelTrace.trace", { ok: true, reference: "/t/x" }), undefined);
        feedback.onReferenceSet("/t/a-reference.mtrace");
        assert.deepEqual(vscodeFake.informations, [
            "ModelTrace: reference set to a-reference.mtrace. Each trace of this file is now compared with it.",
        ]);
        feedback.dispose();
    });

    it("is quiet when the user turns notifications and the status bar item off", async () => {
        vscodeFake.settings.set("modelTrace.notifications", false);
        vscodeFake.settings.set("modelTrace.statusBar", false);
        const feedback = new TraceFeedback();
        feedback.onReferenceSet("/t/a-reference.mtrace");
        feedback.onDiffResult(diverging);
        await settle();
        assert.deepEqual([vscodeFake.warnings, vscodeFake.informations], [[], []]);
        assert.equal(vscodeFake.statusBarItems[0]?.visible, false);
        vscodeFake.settings.set("modelTrace.statusBar", true);
        feedback.refresh();
        assert.equal(vscodeFake.statusBarItems[0]?.visible, true);
        feedback.dispose();
    });
});
