// Gutter icons from `modelTrace/lineStatus`: one cached decoration type per diff status (as rust-analyzer
// does), the latest statuses kept per document and drawn again whenever an editor on it becomes visible.
import type * as vscode from "vscode";
import type { LineDiffStatus, LineStatus, LineStatusParams } from "./lsp_ext";
import * as vscodeapi from "./vscodeapi";

export const diffStatuses: readonly LineDiffStatus[] = ["match", "mismatch", "divergence", "not_compared"];

/** The icon in media/ for each status. */
export const gutterIcons: Readonly<Record<LineDiffStatus, string>> = {
    match: "diff-match.svg",
    mismatch: "diff-mismatch.svg",
    divergence: "diff-divergence.svg",
    not_compared: "diff-not-compared.svg",
};

/** The overview ruler (scroll bar) marks the lines that differ; matching lines stay quiet. */
const rulerColors: Readonly<Partial<Record<LineDiffStatus, string>>> = {
    mismatch: "rgba(217, 119, 6, 0.8)",
    divergence: "rgba(229, 50, 45, 0.9)",
};

/** The 0-based lines to decorate with each status (every status present, possibly empty; duplicates dropped). */
export function linesByStatus(lines: readonly LineStatus[]): Map<LineDiffStatus, number[]> {
    const byStatus = new Map<LineDiffStatus, number[]>(diffStatuses.map((status) => [status, []]));
    const seen = new Set<number>();
    for (const { line, status } of lines) {
        const bucket: number[] | undefined = byStatus.get(status);
        if (bucket === undefined || seen.has(line) || !Number.isInteger(line) || line < 0) {
            continue;
        }
        seen.add(line);
        bucket.push(line);
    }
    for (const bucket of byStatus.values()) {
        bucket.sort((a: number, b: number) => a - b);
    }
    return byStatus;
}

export class DiffGutters implements vscode.Disposable {
    private readonly types = new Map<LineDiffStatus, vscode.TextEditorDecorationType>();
    private readonly statuses = new Map<string, Map<LineDiffStatus, number[]>>();
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
            this.statuses.set(params.uri, linesByStatus(params.lines));
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
        const byStatus: Map<LineDiffStatus, number[]> | undefined = this.statuses.get(editor.document.uri.toString());
        if (byStatus === undefined && this.types.size === 0) {
            return;
        }
        for (const status of diffStatuses) {
            const lines: number[] = byStatus?.get(status) ?? [];
            const ranges: vscode.Range[] = lines
                .filter((line: number) => line < editor.document.lineCount)
                .map((line: number) => editor.document.lineAt(line).range);
            editor.setDecorations(this.decorationType(status), ranges);
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
