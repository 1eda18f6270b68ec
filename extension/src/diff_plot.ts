// The difference plot: max abs difference per module call, in the order calls finished, on a log scale,
// with the tolerance line and the first divergence marked. Pure SVG in a script-free webview (no network).
import type { DiffPlot, DiffPlotPoint, LineDiffStatus } from "./lsp_ext";

const width = 960;
const height = 560;
// NOTE: the bottom margin holds the module names, written at a slant under their points.
const margin = { left: 64, right: 24, top: 36, bottom: 196 };
/** At most this many module names on the axis (every n-th call, and always the first divergence). */
export const maxAxisNames: number = 24;
const axisNameLength: number = 30;

export const statusColors: Readonly<Record<LineDiffStatus, string>> = {
    match: "#2ea043",
    mismatch: "#d97706",
    inherited: "#8b8b8b",
    divergence: "#e5322d",
    not_compared: "#8b8b8b",
};

export interface LogScale {
    /** Lowest and highest powers of ten on the axis. */
    low: number;
    high: number;
    /** Where exact zeros (and anything below `10^low`) are drawn. */
    floor: number;
}

/** The decades the plot spans: from below the smallest non-zero difference (or atol / 1000) to above the largest. */
export function logScale(values: readonly number[], atol: number): LogScale {
    const positive: number[] = values.filter((value: number) => value > 0 && Number.isFinite(value));
    const smallest: number = Math.min(atol / 1000, ...positive);
    const largest: number = Math.max(atol * 10, ...positive);
    const low: number = Math.floor(Math.log10(smallest)) - 1;
    const high: number = Math.ceil(Math.log10(largest));
    return { low, high, floor: 10 ** low };
}

function escapeXml(text: string): string {
    return text.replace(/[&<>"']/g, (character: string) => `&#${character.charCodeAt(0)};`);
}

function format(value: number | null): string {
    if (value === null) {
        return "not compared";
    }
    return value === 0 ? "0" : value.toExponential(2);
}

/** The indices of the points named on the axis: evenly spread, at most `maxAxisNames`, the first divergence
 * always, its neighbours closer than half a step left out so that no two names overlap. */
export function axisNameIndices(count: number, firstDivergence: number | null): number[] {
    const step: number = Math.max(1, Math.ceil(count / maxAxisNames));
    const named: number[] = [];
    for (let index: number = 0; index < count; index += step) {
        if (firstDivergence === null || index === firstDivergence || Math.abs(index - firstDivergence) >= step / 2) {
            named.push(index);
        }
    }
    if (firstDivergence !== null && firstDivergence < count && !named.includes(firstDivergence)) {
        named.push(firstDivergence);
    }
    return named.sort((a: number, b: number) => a - b);
}

/** A module call's name on the axis: its path (`#N` for a later call), its start cut to fit. */
export function axisName(point: DiffPlotPoint): string {
    const name: string = (point.call_index === 0 ? point.path : `${point.path}#${point.call_index}`) || "(model)";
    return name.length <= axisNameLength ? name : `…${name.slice(name.length - axisNameLength + 1)}`;
}

/** The plot as an inline `<svg>` element. */
export function plotSvg(plot: DiffPlot): string {
    const points: DiffPlotPoint[] = plot.points;
    const scale: LogScale = logScale(
        points.map((point: DiffPlotPoint) => point.max_abs_diff ?? 0),
        plot.atol,
    );
    const plotWidth: number = width - margin.left - margin.right;
    const plotHeight: number = height - margin.top - margin.bottom;
    const xOf = (x: number): number => margin.left + (points.length <= 1 ? plotWidth / 2 : (x / (points.length - 1)) * plotWidth);
    const yOf = (value: number): number => {
        const exponent: number = Math.log10(Math.max(value, scale.floor));
        return margin.top + ((scale.high - exponent) / (scale.high - scale.low)) * plotHeight;
    };
    const parts: string[] = [
        `<svg xmlns="http://www.w3.org/2000/svg" class="diff-plot" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="max abs difference per module">`,
    ];
    for (let exponent: number = scale.low; exponent <= scale.high; exponent++) {
        const y: number = yOf(10 ** exponent);
        const label: string = exponent === scale.low ? `≤1e${exponent}` : `1e${exponent}`;
        parts.push(
            `<line class="grid" x1="${margin.left}" x2="${width - margin.right}" y1="${y}" y2="${y}"/>`,
            `<text class="tick" x="${margin.left - 8}" y="${y + 4}" text-anchor="end">${label}</text>`,
        );
    }
    const atolY: number = yOf(plot.atol);
    parts.push(
        `<line class="atol" x1="${margin.left}" x2="${width - margin.right}" y1="${atolY}" y2="${atolY}"/>`,
        `<text class="atol-label" x="${width - margin.right}" y="${atolY - 6}" text-anchor="end">atol ${format(plot.atol)}</text>`,
    );
    if (plot.first_divergence !== null && points[plot.first_divergence] !== undefined) {
        const x: number = xOf(plot.first_divergence);
        parts.push(
            `<line class="divergence" x1="${x}" x2="${x}" y1="${margin.top}" y2="${height - margin.bottom}"/>`,
            `<text class="divergence-label" x="${x + 6}" y="${margin.top - 10}">first divergence: ${escapeXml(points[plot.first_divergence].path)}</text>`,
        );
    }
    const compared: DiffPlotPoint[] = points.filter((point: DiffPlotPoint) => point.max_abs_diff !== null);
    if (compared.length > 1) {
        const path: string = compared.map((point: DiffPlotPoint) => `${xOf(point.x)},${yOf(point.max_abs_diff ?? 0)}`).join(" ");
        parts.push(`<polyline class="series" points="${path}"/>`);
    }
    for (const point of points) {
        const value: number = point.max_abs_diff ?? scale.floor;
        const name: string = point.call_index === 0 ? point.path : `${point.path}#${point.call_index}`;
        parts.push(
            `<circle class="point ${point.status}" cx="${xOf(point.x)}" cy="${yOf(value)}" r="${point.status === "divergence" ? 6 : 4}" fill="${statusColors[point.status]}">` +
                `<title>${escapeXml(name || "(model)")}: ${point.status.replace("_", " ")}, max abs diff ${format(point.max_abs_diff)}</title></circle>`,
        );
    }
    const axisY: number = height - margin.bottom;
    for (const index of axisNameIndices(points.length, plot.first_divergence)) {
        const point: DiffPlotPoint = points[index] as DiffPlotPoint;
        const x: number = xOf(point.x);
        const kind: string = index === plot.first_divergence ? "module-name divergence-name" : "module-name";
        parts.push(
            `<line class="grid" x1="${x}" x2="${x}" y1="${axisY}" y2="${axisY + 5}"/>`,
            `<text class="${kind}" transform="translate(${x + 4} ${axisY + 12}) rotate(45)">${escapeXml(axisName(point))}</text>`,
        );
    }
    parts.push(
        `<text class="axis" x="${margin.left + plotWidth / 2}" y="${height - 8}" text-anchor="middle">module calls, in the order they finished (${points.length}; every ${Math.max(1, Math.ceil(points.length / maxAxisNames))} named)</text>`,
        `<text class="axis" transform="translate(16 ${margin.top + plotHeight / 2}) rotate(-90)" text-anchor="middle">max abs difference (log)</text>`,
        "</svg>",
    );
    return parts.join("\n");
}

/** The webview's whole page: the plot, a legend and the reference's name; no scripts, nothing loaded. */
export function plotHtml(plot: DiffPlot, documentName: string): string {
    const summary: string =
        plot.divergence === null
            ? "The trace matches the reference within tolerance."
            : `First divergence: <code>${escapeXml(plot.divergence.path)}</code> (${escapeXml(plot.divergence.class)}), max abs diff ${format(plot.divergence.max_abs_diff)}.`;
    const legend: string = (Object.keys(statusColors) as LineDiffStatus[])
        .map((status: LineDiffStatus) => `<span><i style="background:${statusColors[status]}"></i>${status.replace("_", " ")}</span>`)
        .join(" ");
    return `<!DOCTYPE html>
<html lang="en"><head><meta charset="UTF-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline';">
<title>ModelTrace difference</title>
<style>
body { font-family: var(--vscode-font-family); color: var(--vscode-foreground); }
svg text { fill: var(--vscode-foreground); font-size: 12px; }
.grid { stroke: var(--vscode-editorWidget-border, #8884); stroke-width: 0.5; }
.atol { stroke: #3b82f6; stroke-dasharray: 6 4; }
.atol-label { fill: #3b82f6 !important; }
.divergence { stroke: #e5322d; stroke-width: 1.5; stroke-dasharray: 4 3; }
.divergence-label { fill: #e5322d !important; font-weight: bold; }
svg text.module-name { font-size: 10px; font-family: var(--vscode-editor-font-family, monospace); }
svg text.divergence-name { fill: #e5322d; font-weight: bold; }
.series { fill: none; stroke: var(--vscode-foreground); stroke-opacity: 0.35; }
.legend span { margin-right: 1em; } .legend i { display: inline-block; width: 10px; height: 10px; border-radius: 5px; margin-right: 4px; }
</style></head>
<body><h3>${escapeXml(documentName)} vs <code>${escapeXml(plot.reference)}</code></h3>
<p>${summary}</p>
${plotSvg(plot)}
<p class="legend">${legend}</p>
</body></html>`;
}
