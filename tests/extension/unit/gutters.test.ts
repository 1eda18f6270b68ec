// `modelTrace/lineStatus` as gutter icons, and the difference plot drawn from `modelTrace/diffPlot`.
import { fakeEditor, fileUri, vscodeFake } from "./vscode_fake";
import * as assert from "node:assert/strict";
import type * as vscode from "vscode";
import { logScale, plotHtml, plotSvg } from "../../../extension/src/diff_plot";
import { DiffGutters, gutterIcons, linesByStatus } from "../../../extension/src/gutters";
import type { DiffPlot } from "../../../extension/src/lsp_ext";

const extensionUri = fileUri("/ext") as unknown as vscode.Uri;

function iconOf(type: { options: Record<string, unknown> }): string {
    return String((type.options.gutterIconPath as { path: string }).path);
}

describe("diff gutters", () => {
    beforeEach(() => vscodeFake.reset());

    it("groups lines by status, drops duplicates and bad lines, keeps each status", () => {
        const grouped = linesByStatus([
            { line: 9, status: "match" },
            { line: 3, status: "divergence" },
            { line: 1, status: "match" },
            { line: 3, status: "match" },
            { line: -1, status: "mismatch" },
            { line: 4, status: "inherited" },
        ]);
        assert.deepEqual(Object.fromEntries(grouped), {
            match: [1, 9],
            mismatch: [],
            inherited: [4],
            divergence: [3],
            not_compared: [],
        });
    });

    it("decorates visible editors of the document with one cached decoration type per status", () => {
        const editor = fakeEditor("/ws/modeling_port.py", 20);
        const other = fakeEditor("/ws/other.py", 20);
        vscodeFake.visibleEditors = [editor, other];
        const gutters = new DiffGutters(extensionUri);

        gutters.show({
            uri: "file:///ws/modeling_port.py",
            lines: [
                { line: 2, status: "match" },
                { line: 5, status: "divergence" },
                { line: 6, status: "mismatch" },
                { line: 7, status: "not_compared" },
                { line: 8, status: "inherited" },
                { line: 99, status: "match" },
            ],
        });

        assert.equal(vscodeFake.decorationTypes.length, 5);
        const byIcon = new Map([...editor.decorations].map(([type, lines]) => [iconOf(type), lines]));
        assert.deepEqual(Object.fromEntries(byIcon), {
            [`/ext/media/${gutterIcons.match}`]: [2],
            [`/ext/media/${gutterIcons.mismatch}`]: [6],
            [`/ext/media/${gutterIcons.inherited}`]: [8],
            [`/ext/media/${gutterIcons.divergence}`]: [5],
            [`/ext/media/${gutterIcons.not_compared}`]: [7],
        });
        // An inherited difference has its own icon, neither the match's nor the mismatch's, and no ruler mark.
        assert.equal(new Set(Object.values(gutterIcons)).size, Object.keys(gutterIcons).length);
        const inherited = vscodeFake.decorationTypes.find((type) => iconOf(type).endsWith(gutterIcons.inherited));
        assert.equal(inherited?.options.overviewRulerColor, undefined);
        assert.equal(other.decorations.size, 0);

        // Each mark's hover says what decides it; without a message, the status in words.
        assert.deepEqual(Object.fromEntries(editor.hoverMessages), {
            2: "**ModelTrace** · match against the reference",
            5: "**ModelTrace** · divergence against the reference",
            6: "**ModelTrace** · mismatch against the reference",
            7: "**ModelTrace** · not compared against the reference",
            8: "**ModelTrace** · inherited against the reference",
        });

        gutters.show({ uri: "file:///ws/modeling_port.py", lines: [{ line: 3, status: "match" }] });
        assert.equal(vscodeFake.decorationTypes.length, 5, "decoration types are created once and reused");
        assert.deepEqual([...editor.decorations.values()], [[3], [], [], [], []]);

        gutters.clear();
        assert.deepEqual([...editor.decorations.values()], [[], [], [], [], []]);
        gutters.dispose();
        assert.ok(vscodeFake.decorationTypes.every((type) => type.disposed));
    });
});

describe("gutter messages", () => {
    beforeEach(() => vscodeFake.reset());

    it("puts the server's message (the deciding call and its layer) in the mark's hover", () => {
        const editor = fakeEditor("/ws/modeling_port.py", 20);
        vscodeFake.visibleEditors = [editor];
        const gutters = new DiffGutters(extensionUri);
        const message = "Differs from the reference: layers.1.self_attn.q_proj, max abs diff 0.02 (its inputs already differ)";
        gutters.show({ uri: "file:///ws/modeling_port.py", lines: [{ line: 4, status: "mismatch", message }] });
        assert.equal(editor.hoverMessages.get(4), `**ModelTrace** · ${message}`);
        gutters.dispose();
    });
});

describe("difference plot", () => {
    const plot: DiffPlot = {
        points: [
            { x: 0, path: "embed_tokens", call_index: 0, max_abs_diff: 0, status: "match", check: "full", called_at: null },
            { x: 1, path: "layers.0.self_attn", call_index: 0, max_abs_diff: 0.0107, status: "divergence", check: "full", called_at: null },
            { x: 2, path: "layers.0.mlp", call_index: 0, max_abs_diff: null, status: "not_compared", check: null, called_at: null },
            { x: 3, path: "norm", call_index: 0, max_abs_diff: 0.05, status: "mismatch", check: "full", called_at: null },
        ],
        layers: [],
        atol: 1e-3,
        first_divergence: 1,
        reference: "/ref/tiny_llama.mtrace",
        divergence: { path: "layers.0.self_attn", class: "TinyLlamaAttention", max_abs_diff: 0.0107, max_rel_diff: 0.92 },
    };

    it("spans whole decades around atol and the differences, with zeros on the floor", () => {
        assert.deepEqual(logScale([0, 0.0107, 0.05], 1e-3), { low: -7, high: -1, floor: 1e-7 });
        assert.deepEqual(logScale([], 1e-3), { low: -7, high: -2, floor: 1e-7 });
    });

    it("draws each module on a log scale, the atol line and the first divergence", () => {
        const svg = plotSvg(plot);
        const y = (name: string): number => Number(new RegExp(`cy="([\\d.]+)"[^>]*><title>${name}`).exec(svg)?.[1]);
        assert.ok(y("embed_tokens") > y("layers.0.self_attn") && y("layers.0.self_attn") > y("norm"), "bigger is higher");
        assert.equal(y("layers.0.mlp"), y("embed_tokens"), "not compared and zero sit on the floor");
        assert.match(svg, /<line class="atol"/);
        assert.match(svg, /atol 1\.00e-3/);
        assert.match(svg, /<line class="divergence"/);
        assert.match(svg, /first divergence: layers\.0\.self_attn/);
        assert.match(svg, /class="point divergence"[^>]*r="6"/);
        assert.equal((svg.match(/<circle /g) ?? []).length, 4);
    });

    it("is a page without scripts or remote content", () => {
        const html = plotHtml(plot, "modeling_port.py");
        assert.match(html, /default-src 'none'/);
        assert.doesNotMatch(html, /<script|https?:\/\/(?!www\.w3\.org)/);
        assert.match(html, /First divergence: <code>layers\.0\.self_attn<\/code> \(TinyLlamaAttention\), max abs diff 1\.07e-2/);
    });
});
