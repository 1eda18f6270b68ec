// Sticky scroll shows the hints of the moment it last drew its lines, not the current ones: VS Code redraws the
// sticky lines when the text, the scroll position's set of sticky lines, the layout, the tokens or some editor
// options change, but not when inlay hints change. A traced `def forward(` line carries the arguments' shapes,
// and is the line sticky scroll pins, so after an edit and a fresh trace it kept "(stale)" hints that the editor
// below no longer showed. The redraw: once the hints of a document whose trace changed (traced, stale, failed,
// cleared) have been fetched again, its visible editors' line-number style is switched and switched back, an
// option change that makes VS Code rebuild the sticky lines (StickyScrollController: lineNumbers).
import type * as vscode from "vscode";
import * as vscodeapi from "./vscodeapi";

/** VS Code's TextEditorLineNumbersStyle values (the enum itself is not available to plain-data code). */
export const lineNumbersStyle = { off: 0, on: 1, relative: 2, interval: 3 } as const;

/** The style to switch to for one moment: a different one, whichever the editor has. */
export function nudgedLineNumbers(style: number): number {
    return style === lineNumbersStyle.on ? lineNumbersStyle.interval : lineNumbersStyle.on;
}

/** After the hints VS Code applies (a short wait: the workbench draws them after the provider answers). */
export const redrawDelayMs: number = 300;

export class StickyScrollRedraw {
    /** Documents (URI strings) whose trace changed: their next hints redraw the sticky lines. */
    private readonly pending: Set<string> = new Set();

    /** The trace of `uri` changed: the next hints it gets must reach the sticky lines too. */
    traceChanged(uri: string): void {
        this.pending.add(uri);
    }

    /** The hints of `uri` were fetched: redraw its sticky lines if its trace changed since the last redraw. */
    hintsFetched(uri: string): void {
        if (!this.pending.delete(uri)) {
            return;
        }
        setTimeout(() => this.redraw(uri), redrawDelayMs);
    }

    redraw(uri: string): void {
        for (const editor of vscodeapi.visibleTextEditors()) {
            if (editor.document.uri.toString() !== uri) {
                continue;
            }
            const original: vscode.TextEditorLineNumbersStyle | undefined = editor.options.lineNumbers;
            if (original === undefined) {
                continue;
            }
            editor.options = { lineNumbers: nudgedLineNumbers(original) as vscode.TextEditorLineNumbersStyle };
            editor.options = { lineNumbers: original };
        }
    }
}
