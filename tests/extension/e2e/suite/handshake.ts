// Talks to run.mjs through files in MODELTRACE_E2E_RUN_DIR: the host says what to look for on
// screen (ready.json), run.mjs checks the DOM with playwright and answers (dom-result.json).
import * as fs from "node:fs";
import * as path from "node:path";

export interface DomRequest {
    mode: "trusted" | "untrusted" | "bundled";
    /** "check": look at the screen; "grant-trust": click "Trust" in the open workspace trust editor, as a person would. */
    action: "check" | "grant-trust" | "click-lens";
    /** With action "click-lens": click the first code lens on screen titled `title`, as a person would. */
    lens?: { title: string };
    /** Sticky scroll's lines (hints included) must show each of `includes` and none of `excludes`. */
    sticky?: { includes?: string[]; excludes?: string[] };
    /** Some webview's page must hold each of these (the difference plot's HTML). */
    webviewIncludes?: string[];
    /** Hovering the line holding `snippet` must show a hover holding `text`. */
    hoverIncludes?: { snippet: string; text: string; dx?: number };
    /** After the checks, click the status bar item showing this text, as a person would. */
    clickStatusBar?: string;
    /** Hovering the status bar item showing `item` must show a tooltip holding `includes`. */
    statusBarTooltip?: { item: string; includes: string };
    /** Lines and the hint label expected on each, as found through the LSP in the extension host. */
    hints: { line: number; snippet: string; label: string }[];
    /** Each hint must be drawn whole (not cut by VS Code) inside the visible text area. */
    hintsWhole?: boolean;
    /** Hovering the line holding `snippet` (`dx` pixels into it) must show a table whose first row holds `firstRow`. */
    hover?: { snippet: string; firstRow: string; dx?: number };
    /** The gutter of the line holding `snippet` must show `icon` (a media/ file). */
    gutterAt?: { snippet: string; icon: string }[];
    /** Hovering the gutter mark of the line holding `snippet` (or the line) must show `includes`. */
    gutterHover?: { snippet: string; includes: string };
    /** Text of a notification that must be visible. */
    notification?: string;
    /** Text a status bar item must show. */
    statusBar?: string;
    /** Text the language status hover (the "{ }" item of the status bar) must show. */
    languageStatus?: string;
    /** Icon files (media/) that must be drawn in the glyph margin. */
    gutterIcons?: string[];
    /** A squiggle of this severity must be drawn. */
    squiggle?: "warning" | "error";
    /** Clicking the line holding `snippet` must show the lightbulb, and the quick-fix menu (Ctrl+.) must offer `title`. */
    quickFix?: { snippet: string; title: string };
    /** The name in media/ the screenshot is saved as when the check passes (default screenshot-hints.png). */
    screenshot?: string;
    /** false: keep the screenshot in the run folder only (not for the README). */
    media?: boolean;
    /** After the checks, click `button` on the notification holding `notification`, as a person would. */
    clickNotificationButton?: { notification: string; button: string };
}

export interface DomResult {
    step: number;
    ok: boolean;
    failures: string[];
}

function runDir(): string {
    const dir: string | undefined = process.env.MODELTRACE_E2E_RUN_DIR;
    if (dir === undefined) {
        throw new Error("MODELTRACE_E2E_RUN_DIR is not set: start the tests through tests/extension/e2e/run.mjs");
    }
    return dir;
}

/** Appends to host.log, which run.mjs prints (the extension host's console is not ours to read). */
export function hostLog(line: string): void {
    fs.appendFileSync(path.join(runDir(), "host.log"), `${line}\n`);
}

/** The step of the last request written; read from ready.json, since each test file bundles its own copy of this module. */
function lastStep(): number {
    try {
        return (JSON.parse(fs.readFileSync(path.join(runDir(), "ready.json"), "utf8")) as { step: number }).step;
    } catch {
        return 0;
    }
}

/** Writes ready.json (with a new step number) and waits for run.mjs's dom-result.json of that step. */
export async function askForDomCheck(request: DomRequest, timeoutMs: number = 90_000): Promise<DomResult> {
    const step: number = lastStep() + 1;
    const resultFile: string = path.join(runDir(), "dom-result.json");
    fs.writeFileSync(path.join(runDir(), "ready.json.tmp"), JSON.stringify({ ...request, step }, null, 2));
    fs.renameSync(path.join(runDir(), "ready.json.tmp"), path.join(runDir(), "ready.json"));
    const deadline: number = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
        if (fs.existsSync(resultFile)) {
            const result: DomResult = JSON.parse(fs.readFileSync(resultFile, "utf8")) as DomResult;
            if (result.step === step) {
                return result;
            }
        }
        await new Promise((resolve) => setTimeout(resolve, 250));
    }
    throw new Error(`run.mjs did not answer the DOM check within ${timeoutMs / 1000} s`);
}
