// Gutter icons from `modelTrace/lineStatus`: one cached decoration type per diff status (as rust-analyzer
// does), the latest statuses kept per document and drawn again whenever an editor on it becomes visible.
// Each mark's hover says what decides it (the call and its layer), from the server's message. A difference a line
// only inherits through its inputs gets its own quiet mark (a grey ring with a down arrow), neither green nor orange.
import type * as vscode from "vscode";
import type { LineDiffStatus, LineStatus, LineStatusParams } from "./lsp_ext";
import * as vscodeapi from "./vscodeapi";

export const diffStatuses: readonly LineDiffStatus[] = ["match", "mismatch", "inherited", "divergence", "not_compared"];

/** The icon in media/ for each status. */
export const gutterIcons: Readonly<Record<LineDiffStatus, string>> = {
    match: "diff-match.svg",
    mismatch: "diff-mismatch.svg",
    inherited: "diff-inherited.svg",
    divergence: "diff-divergence.svg",
    not_compared: "diff-not-compared.svg",
};

/** The overview ruler (scroll bar) marks the lines where a difference arises; matching and inherited lines stay quiet. */
const rulerColors: Readonly<Partial<Record<LineDiffStatus, string>>> = {
    mismatch: "rgba(217, 119, 6, 0.8)",
    divergence: "rgba(229, 50, 45, 0.9)",
};

/** A mark's hover: the server's message, or the status in words when it sent none. */
export function markMessage(status: LineDiffStatus, message: string | undefined): string {
    const text: string = message ?? `${status.replace("_", " ")} against the reference`;
    return `**ModelTrace** · ${text}`;
}

/** One line's mark: its 0-based line and hover text. */
export interface LineMark {
    line: number;
    message: string;
}

/** The marks to draw with each status (every status present, possibly empty; duplicate lines dropped). */
export function marksByStatus(lines: readonly LineStatus[]): Map<LineDiffStatus, LineMark[]> {
    const byStatus = new Map<LineDiffStatus, LineMark[]>(diffStatuses.map((status) => [status, []]));
    const seen = new Set<number>();
    for (const { line, status, message } of lines) {
        const bucket: LineMark[] | undefined = byStatus.get(status);
        if (bucket === undefined || seen.has(line) || !Number.isInteger(line) || line < 0) {
            continue;
        }
        seen.add(line);
        bucket.push({ line, message: markMessage(status, message) });
    }
    for (const bucket of byStatus.values()) {
        bucket.sort((a: LineMark, b: LineMark) => a.line - b.line);
    }
    return byStatus;
}

/** The 0-based lines to decorate with each status. */
export function linesByStatus(lines: readonly LineStatus[]): Map<LineDiffStatus, number[]> {
    return new Map([...marksByStatus(lines)].map(([status, marks]) => [status, marks.map((mark: LineMark) => mark.line)]));
}

export class DiffGutters implements vscode.Disposable {
    private readonly types = new Map<LineDiffStatus, vscode.TextEditorDecorationType>();
    private readonly statuses = new Map<string, Map<LineDiffStatus, LineMark[]>>();
    private readonly subscription: vscode.Disposable;

    constructor(private readonly extensionUri: vscode.Uri) {
        this.subscription = vscodeapi.onDidChangeVisibleTextEditors((editors: readonly vscode.TextEditor[]) => {
            for (const editor of editors) {
                this.draw(editor);
            }
        });
    }

    /** A `modelTrace/lineStatus` notification: replaces the document's gutters (no lines: removes them). */
    show(params: LineStatusParams): void {
        if (params.lines.length === 0) {
            this.statuses.delete(params.uri);
        } else {
            this.statuses.set(params.uri, marksByStatus(params.lines));
        }
        for (const editor of vscodeapi.visibleTextEditors()) {
            if (editor.document.uri.toString() === params.uri) {
                this.draw(editor);
            }
        }
    }

    /** Removes every gutter icon (the server restarted). */
    clear(): void {
        const uris: string[] = [...this.statuses.keys()];
        for (const uri of uris) {
            this.show({ uri, lines: [] });
        }
    }

    dispose(): void {
        this.subscription.dispose();
        for (const type of this.types.values()) {
            type.dispose();
        }
        this.types.clear();
        this.statuses.clear();
    }

    private draw(editor: vscode.TextEditor): void {
        const byStatus: Map<LineDiffStatus, LineMark[]> | undefined = this.statuses.get(editor.document.uri.toString());
        if (byStatus === undefined && this.types.size === 0) {
            return;
        }
        for (const status of diffStatuses) {
            const marks: LineMark[] = byStatus?.get(status) ?? [];
            // NOTE: a decoration's hoverMessage shows on the line's text and on its gutter icon.
            const decorations: vscode.DecorationOptions[] = marks
                .filter((mark: LineMark) => mark.line < editor.document.lineCount)
                .map((mark: LineMark) => ({
                    range: editor.document.lineAt(mark.line).range,
                    hoverMessage: vscodeapi.markdown(mark.message),
                }));
            editor.setDecorations(this.decorationType(status), decorations);
        }
    }

    private decorationType(status: LineDiffStatus): vscode.TextEditorDecorationType {
        let type: vscode.TextEditorDecorationType | undefined = this.types.get(status);
        if (type === undefined) {
            const ruler: string | undefined = rulerColors[status];
            type = vscodeapi.createTextEditorDecorationType({
                gutterIconPath: vscodeapi.joinPath(this.extensionUri, "media", gutterIcons[status]),
                gutterIconSize: "contain",
                ...(ruler !== undefined ? { overviewRulerColor: ruler, overviewRulerLane: 4 } : {}),
            });
            this.types.set(status, type);
        }
        return type;
    }
}
