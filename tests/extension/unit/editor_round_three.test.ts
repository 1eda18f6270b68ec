// Issue #32, items 7 and 8 and sticky scroll, on the client side: the status bar says what ran and which sizes the
// hints show; a normal server exit is not an error; the plot names modules on its axis; sticky scroll's lines are
// redrawn once the hints of a document whose trace changed are fetched again.
import { fakeEditor, vscodeFake } from "./vscode_fake";
import * as assert from "node:assert/strict";
import type * as vscode from "vscode";
import { axisName, axisNameIndices, maxAxisNames, plotSvg } from "../../../extension/src/diff_plot";
import { ranText, viewForTraceStatus } from "../../../extension/src/feedback";
import type { DiffPlot, DiffPlotPoint } from "../../../extension/src/lsp_ext";
import { isNormalExit } from "../../../extension/src/restart_queue";
import { lineNumbersStyle, nudgedLineNumbers, redrawDelayMs, StickyScrollRedraw } from "../../../extension/src/sticky";

const ran: string = "Qwen3Config shrunk: hidden 64 of 4096, layers 2 of 36, heads 4 of 32 · 7 tokens · random weights (seed 0)";

describe("what ran, in the status bar", () => {
    it("ends the tooltip of a finished trace with what ran and which sizes the hints show", () => {
        const view = viewForTraceStatus({ state: "idle", message: "Qwen3Model: 52 module calls on 14 lines (1.0 s)", ran, sizes: "traced" });
        assert.equal(view?.text, "$(check) ModelTrace: Qwen3Model");
        assert.equal(
            view?.tooltip,
            `Qwen3Model: 52 module calls on 14 lines (1.0 s)\nRan: ${ran}\n` +
                "Hints: the traced run's sizes (ModelTrace: Toggle the Active File's Hints at Full Size shows the model's own)",
        );
    });

    it("marks full sizes in the item's text and tooltip, also after a toggle that traced nothing", () => {
        const view = viewForTraceStatus({ state: "idle", message: "Qwen3Model: hints at full size (Qwen3Config full size…)", ran, sizes: "full" });
        assert.equal(view?.text, "$(check) ModelTrace: Qwen3Model · full sizes");
        assert.match(view?.tooltip ?? "", /Hints: the model's full sizes \(shape-only on the meta device\), each marked \(full\)/);
    });

    it("keeps what ran on a stale trace, and says nothing of it when the server sent nothing", () => {
        const stale = viewForTraceStatus({ state: "stale", message: "Qwen3Model: the code changed since the last trace", ran });
        assert.match(stale?.tooltip ?? "", new RegExp(`click to trace again\\.\\nRan: ${ran.replace(/[()]/g, "\\$&")}`));
        assert.equal(ranText({ state: "idle", message: "trace cleared" }), "");
    });
});

describe("the log", () => {
    it("takes a normal server exit (a restart) for information, any other exit for an error", () => {
        assert.equal(isNormalExit("Server process exited with code 0."), true);
        assert.equal(isNormalExit("Server process exited with code 1."), false);
        assert.equal(isNormalExit("Server process exited with signal SIGKILL."), false);
    });
});

describe("difference plot axis", () => {
    function point(x: number, path: string, callIndex: number = 0): DiffPlotPoint {
        return { x, path, call_index: callIndex, max_abs_diff: 0.001 * x, status: "match", check: "full", called_at: null };
    }

    it("names every module when they are few, and at most maxAxisNames of many, the divergence always", () => {
        assert.deepEqual(axisNameIndices(4, 1), [0, 1, 2, 3]);
        const many: number[] = axisNameIndices(300, 151);
        assert.ok(many.length <= maxAxisNames + 1, `${many.length} names`);
        assert.ok(many.includes(151) && many.includes(0));
        // no name within half a step of the divergence's
        const step: number = Math.ceil(300 / maxAxisNames);
        assert.ok(many.every((index: number) => index === 151 || Math.abs(index - 151) >= step / 2));
    });

    it("writes module paths under their points, a later call with #N, a long path cut at its start", () => {
        assert.equal(axisName(point(0, "layers.0.self_attn")), "layers.0.self_attn");
        assert.equal(axisName(point(1, "layers.0.mlp", 2)), "layers.0.mlp#2");
        assert.equal(axisName(point(2, "")), "(model)");
        const long: string = axisName(point(3, "model.language_model.layers.31.self_attn.q_proj"));
        assert.ok(long.startsWith("…") && long.endsWith("self_attn.q_proj") && long.length === 30, long);
        const plot: DiffPlot = {
            points: [point(0, "embed_tokens"), { ...point(1, "layers.0.self_attn"), status: "divergence" }, point(2, "norm")],
            layers: [],
            atol: 1e-3,
            first_divergence: 1,
            reference: "/ref.mtrace",
            divergence: null,
        };
        const svg: string = plotSvg(plot);
        const names: string[] = [...svg.matchAll(/<text class="module-name[^"]*"[^>]*>([^<]*)<\/text>/g)].map((match) => match[1] as string);
        assert.deepEqual(names, ["embed_tokens", "layers.0.self_attn", "norm"]);
        assert.match(svg, /class="module-name divergence-name"[^>]*>layers\.0\.self_attn</);
    });
});

describe("sticky scroll redraw", () => {
    beforeEach(() => vscodeFake.reset());

    it("switches to another line-number style and back", () => {
        assert.equal(nudgedLineNumbers(lineNumbersStyle.on), lineNumbersStyle.interval);
        for (const style of [lineNumbersStyle.off, lineNumbersStyle.relative, lineNumbersStyle.interval]) {
            assert.equal(nudgedLineNumbers(style), lineNumbersStyle.on);
        }
    });

    it("redraws the visible editors of a document once its hints are fetched after its trace changed", async () => {
        const editor = fakeEditor("/ws/modeling_qwen3.py", 100) as unknown as { options: { lineNumbers: number } };
        const other = fakeEditor("/ws/other.py", 10) as unknown as { options: { lineNumbers: number } };
        const set: number[] = [];
        let current: number = lineNumbersStyle.on;
        Object.defineProperty(editor, "options", {
            get: () => ({ lineNumbers: current }),
            set: (options: { lineNumbers: number }) => {
                current = options.lineNumbers;
                set.push(current);
            },
        });
        other.options = { lineNumbers: lineNumbersStyle.on };
        vscodeFake.visibleEditors = [editor, other] as never;
        const sticky = new StickyScrollRedraw();
        const uri: string = (editor as unknown as vscode.TextEditor).document.uri.toString();

        sticky.hintsFetched(uri); // no trace changed: nothing to redraw
        sticky.traceChanged(uri);
        sticky.hintsFetched(uri);
        sticky.hintsFetched(uri); // once per change
        await new Promise((resolve) => setTimeout(resolve, redrawDelayMs + 50));
        assert.deepEqual(set, [lineNumbersStyle.interval, lineNumbersStyle.on]);
        assert.equal(current, lineNumbersStyle.on);
        assert.equal(other.options.lineNumbers, lineNumbersStyle.on);
    });
});
