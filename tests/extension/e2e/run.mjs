// End-to-end test of the built .vsix in a real VS Code: code-server (VS Code 1.139 web workbench and a
// real Node extension host) driven by Debian's Chromium through playwright-core. See run.sh for installs.
//
// For each mode (trusted, untrusted, bundled) it starts a fresh code-server, installs the .vsix, opens the
// workspace and runs the mocha suite tests/extension/e2e/suite/<mode>.test.ts INSIDE the extension host
// (the smoke-test-driver payload: extensionDevelopmentPath = a test-only host extension,
// extensionTestsPath = the bundled suite). When the suite has its hints it writes ready.json in the run
// folder; this script then checks the DOM, takes the screenshot and answers in dom-result.json.
//
//   node tests/extension/e2e/run.mjs [--mode trusted|untrusted|bundled|all] [--workspace DIR] [--python PATH]
//                                    [--user-python PATH] [--keep]
// The bundled mode runs the server the .vsix carries with --user-python: an interpreter with torch and
// transformers but no ModelTrace (nor pygls, msgpack, libcst), as a user has who installs only the extension.
import { spawn, spawnSync } from "node:child_process";
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { chromium } from "playwright-core";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const e2eDir = join(repo, ".e2e");
const { values: options } = parseArgs({
    options: {
        mode: { type: "string", default: "all" },
        workspace: { type: "string", default: join(repo, "examples") },
        python: { type: "string", default: join(repo, ".venv/bin/python") },
        "user-python": { type: "string", default: process.env.E2E_USER_PYTHON },
        keep: { type: "boolean", default: false },
    },
});
// NOTE: run.sh installs these (into a cache shared by checkouts) and names them; run this file through it.
const node24 = process.env.E2E_NODE24 ?? join(e2eDir, "node24bin/node");
const codeServer = process.env.E2E_CODE_SERVER;
if (codeServer === undefined || options["user-python"] === undefined) {
    throw new Error("E2E_CODE_SERVER and E2E_USER_PYTHON are unset: run tests/extension/e2e/run.sh, which installs and names them");
}
const mediaDir = join(repo, "media");
// NOTE: a run keeps its screenshots in build/e2e-screenshots (artifacts); the tracked media/ (the README's
// pictures) changes only when asked: MODELTRACE_E2E_UPDATE_MEDIA=1.
const screenshotsDir = join(repo, "build", "e2e-screenshots");
const updateMedia = process.env.MODELTRACE_E2E_UPDATE_MEDIA === "1";
const modeTimeoutMs = 420_000;

function log(message) {
    console.log(`[e2e] ${message}`);
}

function sleep(milliseconds) {
    return new Promise((resolvePromise) => setTimeout(resolvePromise, milliseconds));
}

function freePort() {
    return new Promise((resolvePromise, reject) => {
        const server = createServer();
        server.once("error", reject);
        server.listen(0, "127.0.0.1", () => {
            const { port } = server.address();
            server.close(() => resolvePromise(port));
        });
    });
}

function findVsix() {
    const { version } = JSON.parse(readFileSync(join(repo, "package.json"), "utf8"));
    const vsix = join(repo, "extension/out", `modeltrace-${version}.vsix`);
    if (!existsSync(vsix)) {
        throw new Error(`${vsix} is missing: run \`npm run package\` first`);
    }
    return vsix;
}

/** Fresh folders for one code-server run: user data, extensions, XDG dirs, browser profile, workspace copy. */
function prepareRunFolder(mode) {
    const runDir = mkdtempSync(join(tmpdir(), `modeltrace-e2e-${mode}-`));
    for (const sub of ["user-data/User", "user-data/Machine", "extensions", "xdg-data", "xdg-config", "xdg-cache", "browser"]) {
        mkdirSync(join(runDir, sub), { recursive: true });
    }
    // NOTE: a copy, so the workspace is new to VS Code (never trusted before) and traces do not land in the repo.
    const workspace = join(runDir, "workspace");
    // NOTE: the committed reference trace (examples/reference/) comes along; traces made elsewhere do not.
    const copied = (source) => !/__pycache__$/.test(source) && (!/\.mtrace$/.test(source) || /\/reference\/[^/]+\.mtrace$/.test(source));
    cpSync(options.workspace, workspace, { recursive: true, filter: copied });
    const settings = {
        "workbench.startupEditor": "none",
        "workbench.tips.enabled": false,
        "workbench.enableExperiments": false,
        "workbench.secondarySideBar.defaultVisibility": "hidden",
        "chat.disableAIFeatures": true,
        "telemetry.telemetryLevel": "off",
        "update.mode": "none",
        "extensions.autoCheckUpdates": false,
        "extensions.autoUpdate": false,
        "extensions.ignoreRecommendations": true,
        "git.enabled": false,
        "editor.inlayHints.enabled": "on",
        // NOTE: editor.inlayHints.maximumLength stays at VS Code's default (43): hints must fit it as users see them.
        "editor.minimap.enabled": false,
        "editor.fontSize": 14,
        // NOTE: no startup trust dialog: an untrusted folder opens straight in restricted mode.
        "security.workspace.trust.startupPrompt": "never",
        "modelTrace.python": interpreterFor(mode),
    };
    writeFileSync(join(runDir, "user-data/User/settings.json"), JSON.stringify(settings, null, 2));
    // NOTE: code-server's window is a remote one: machine-scoped settings (modelTrace.python is
    // machine-overridable) are read from the remote machine's settings, not from the user's.
    writeFileSync(join(runDir, "user-data/Machine/settings.json"), JSON.stringify({ "modelTrace.python": interpreterFor(mode) }, null, 2));
    plantTraps(runDir, workspace, mode);
    if (mode === "trusted") {
        copyModelFolder(workspace);
    }
    if (mode === "bundled") {
        captureElsewhere(runDir, workspace);
    }
    return { runDir, workspace };
}

/** The interpreter a mode's VS Code runs ModelTrace with. */
function interpreterFor(mode) {
    return mode === "bundled" ? options["user-python"] : options.python;
}

/**
 * A trace a script captured with `modeltrace.capture` (the repo's .venv) from its own copy of the example, in a
 * folder removed afterwards (as on another machine): RUN/captured/example.mtrace. Load Trace must find the
 * workspace's copy of the file by its content.
 */
function captureElsewhere(runDir, workspace) {
    const elsewhere = join(runDir, "elsewhere");
    cpSync(join(workspace, "tiny_llama"), join(elsewhere, "tiny_llama"), { recursive: true });
    const script = [
        "import sys, torch, modeltrace",
        "sys.path.insert(0, sys.argv[1])",
        "from tiny_llama.configuration_tiny_llama import TinyLlamaConfig",
        "from tiny_llama.modeling_tiny_llama import TinyLlamaModel",
        "torch.manual_seed(0)",
        "model = TinyLlamaModel(TinyLlamaConfig()).eval()",
        "with torch.no_grad(), modeltrace.capture(model, sys.argv[2], lines=True):",
        "    model(input_ids=torch.tensor([[1, 17, 42, 99, 5, 63, 120]]))",
    ].join("\n");
    const trace = join(runDir, "captured", "example.mtrace");
    const captured = spawnSync(options.python, ["-c", script, elsewhere, trace], { encoding: "utf8", timeout: 300_000 });
    if (captured.status !== 0) {
        throw new Error(`capturing the example with modeltrace.capture failed: ${captured.stderr}`);
    }
    rmSync(elsewhere, { recursive: true, force: true });
    log(`captured ${trace} from a copy of the example that is gone now`);
}

/** A copy of the installed transformers' models/qwen3/ folder, as a port starts: copied/qwen3/ in the workspace. */
function copyModelFolder(workspace) {
    const found = spawnSync(options.python, ["-c", "import os, transformers; print(os.path.dirname(transformers.__file__))"], { encoding: "utf8" });
    if (found.status !== 0) {
        throw new Error(`cannot locate transformers with ${options.python}: ${found.stderr}`);
    }
    const source = join(found.stdout.trim(), "models", "qwen3");
    cpSync(source, join(workspace, "copied", "qwen3"), { recursive: true, filter: (path) => !/__pycache__$/.test(path) });
}

/**
 * Workspace files that leave a sentinel file in RUN/sentinels/ (outside the workspace) when anything of them
 * is run: a copy of the example package whose modules write one when imported (trap_llama/, both modes: the
 * trusted suite traces it and must find the sentinel, so the check can fail); in the untrusted workspace also
 * a workspace setting pointing modelTrace.python at a workspace "interpreter" that writes one, and a
 * workspace-root modeltrace.py shadowing the server's own package.
 */
function plantTraps(runDir, workspace, mode) {
    const sentinels = join(runDir, "sentinels");
    mkdirSync(sentinels, { recursive: true });
    const prelude = (name) =>
        `# ModelTrace e2e trap: importing this module writes a sentinel file outside the workspace.\n` +
        `import os as _os\n` +
        `with open(_os.path.join(${JSON.stringify(sentinels)}, "${name}-%d" % _os.getpid()), "w") as _sentinel:\n` +
        `    _sentinel.write(__name__)\n`;
    const source = join(workspace, "tiny_llama");
    if (existsSync(join(source, "modeling_tiny_llama.py"))) {
        const trap = join(workspace, "trap_llama");
        mkdirSync(trap, { recursive: true });
        for (const [name, sentinel] of [["__init__.py", "package-import"], ["configuration_tiny_llama.py", "config-import"], ["modeling_tiny_llama.py", "modeling-import"]]) {
            writeFileSync(join(trap, name), prelude(sentinel) + readFileSync(join(source, name), "utf8"));
        }
        writeFileSync(join(trap, "config.json"), JSON.stringify({ model_type: "tiny_llama", hidden_size: 64, num_hidden_layers: 2 }));
    }
    if (mode === "untrusted") {
        const venvBin = join(workspace, ".venv/bin");
        mkdirSync(venvBin, { recursive: true });
        // A workspace "interpreter": it runs the real one, after leaving its sentinel.
        writeFileSync(
            join(venvBin, "python"),
            `#!/bin/sh\necho "$*" > ${JSON.stringify(sentinels)}/interpreter-$$\nexec ${JSON.stringify(options.python)} "$@"\n`,
            { mode: 0o755 },
        );
        mkdirSync(join(workspace, ".vscode"), { recursive: true });
        writeFileSync(
            join(workspace, ".vscode/settings.json"),
            JSON.stringify({ "modelTrace.python": join(venvBin, "python"), "modelTrace.traceOnSave": true }, null, 2),
        );
        writeFileSync(join(workspace, "modeltrace.py"), prelude("shadow-modeltrace"));
        traceTrapElsewhere(runDir, workspace, sentinels);
    }
}

/**
 * A full-tensor trace of the trap package made outside the editor (as a colleague or CI would), with another seed
 * than the committed reference, so that a diff against that reference has suspects whose replay would rebuild the
 * trap: RUN/trap-candidate.mtrace. Making it imports the trap (its sentinels are removed afterwards).
 */
function traceTrapElsewhere(runDir, workspace, sentinels) {
    const trace = join(runDir, "trap-candidate.mtrace");
    const traced = spawnSync(
        options.python,
        ["-m", "modeltrace", "trace", join(workspace, "trap_llama", "modeling_tiny_llama.py"), "--full-tensors", "--seed", "1", "--out", trace],
        { encoding: "utf8", timeout: 300_000 },
    );
    if (traced.status !== 0) {
        throw new Error(`tracing the trap package for the untrusted run failed: ${traced.stderr}`);
    }
    rmSync(sentinels, { recursive: true, force: true });
    mkdirSync(sentinels, { recursive: true });
    log(`traced the trap package elsewhere: ${trace}`);
}

function codeServerEnv(runDir, mode) {
    return {
        ...process.env,
        PATH: `${dirname(node24)}:${process.env.PATH}`,
        XDG_DATA_HOME: join(runDir, "xdg-data"),
        XDG_CONFIG_HOME: join(runDir, "xdg-config"),
        XDG_CACHE_HOME: join(runDir, "xdg-cache"),
        MODELTRACE_E2E_MODE: mode,
        MODELTRACE_E2E_RUN_DIR: runDir,
        MODELTRACE_E2E_EXTENSIONS_DIR: join(runDir, "extensions"),
        MODELTRACE_E2E_PYTHON: interpreterFor(mode),
        MODELTRACE_E2E_CAPTURED_TRACE: join(runDir, "captured", "example.mtrace"),
        MODELTRACE_E2E_TRAP_TRACE: join(runDir, "trap-candidate.mtrace"),
        MODELTRACE_E2E_REFERENCE: join(repo, "examples", "reference", "tiny_llama.mtrace"),
    };
}

function installVsix(runDir, vsix, env) {
    const result = spawnSync(
        codeServer,
        ["--user-data-dir", join(runDir, "user-data"), "--extensions-dir", join(runDir, "extensions"), "--install-extension", vsix],
        { env, encoding: "utf8", timeout: 120_000 },
    );
    if (result.status !== 0) {
        throw new Error(`code-server --install-extension failed (${result.status}):\n${result.stdout}\n${result.stderr}`);
    }
    log(`installed ${vsix.replace(`${repo}/`, "")}: ${result.stdout.trim().split("\n").pop()}`);
}

async function startCodeServer(runDir, workspace, mode, env) {
    const port = await freePort();
    const config = join(runDir, "config.yaml");
    writeFileSync(config, `bind-addr: 127.0.0.1:${port}\nauth: none\ncert: false\n`);
    const args = [
        String(Math.ceil(modeTimeoutMs / 1000) + 60),
        codeServer,
        "--config", config,
        "--user-data-dir", join(runDir, "user-data"),
        "--extensions-dir", join(runDir, "extensions"),
        "--disable-telemetry",
        "--disable-update-check",
        ...(mode !== "untrusted" ? ["--disable-workspace-trust"] : []),
        "--disable-getting-started-override",
        "--reconnection-grace-time", "30",
        "--vscode-option", "enable-smoke-test-driver",
        workspace,
    ];
    const logFile = join(runDir, "code-server.log");
    const child = spawn("timeout", args, { env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
    const chunks = [];
    child.stdout.on("data", (data) => chunks.push(data));
    child.stderr.on("data", (data) => chunks.push(data));
    child.on("exit", () => {
        // NOTE: code-server may exit after its mode has passed and removed its run folder: nothing to keep then
        if (existsSync(runDir)) writeFileSync(logFile, Buffer.concat(chunks));
    });
    const flushLog = () => writeFileSync(logFile, Buffer.concat(chunks));
    const started = Date.now();
    while (Date.now() - started < 60_000) {
        if (child.exitCode !== null) {
            flushLog();
            throw new Error(`code-server exited with ${child.exitCode}; see ${logFile}`);
        }
        try {
            const response = await fetch(`http://127.0.0.1:${port}/healthz`);
            if (response.ok) {
                log(`code-server up on 127.0.0.1:${port} after ${((Date.now() - started) / 1000).toFixed(1)} s (pid ${child.pid})`);
                return { child, port, flushLog };
            }
        } catch {
            // not listening yet
        }
        await sleep(250);
    }
    flushLog();
    throw new Error(`code-server did not answer /healthz within 60 s; see ${logFile}`);
}

function stopCodeServer(server) {
    if (server === undefined || server.child.exitCode !== null) {
        return;
    }
    // NOTE: the process group we started: timeout, code-server, its extension host and the Python server.
    try {
        process.kill(-server.child.pid, "SIGTERM");
    } catch {
        // already gone
    }
}

function testUrl(port, workspace) {
    const remote = (path) => `vscode-remote://127.0.0.1:${port}${path}`;
    const payload = [
        ["extensionDevelopmentPath", remote(join(repo, "tests/extension/e2e/host"))],
        ["extensionTestsPath", remote(join(repo, "extension/out/e2e/index"))],
    ];
    return `http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}&payload=${encodeURIComponent(JSON.stringify(payload))}`;
}

/**
 * Runs in the page: the text of every rendered view line whose code (its text without the inlay hints drawn in
 * it) contains `snippet`, of its hint spans, and of the hint spans drawn whole inside the editor's visible text
 * area (not scrolled or clipped off to the right), with the line's box.
 */
function renderedLines(snippet) {
    const normalize = (text) => (text ?? "").replace(/\u00a0/g, " ");
    const isHint = (node) => node.parentElement?.closest('[class*="dyn-rule-"]') != null;
    const codeText = (line) => {
        const walker = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
        let text = "";
        for (let node = walker.nextNode(); node !== null; node = walker.nextNode()) {
            text += isHint(node) ? "" : node.textContent;
        }
        return normalize(text);
    };
    return [...document.querySelectorAll(".monaco-editor .view-line")]
        .filter((line) => codeText(line).includes(snippet))
        .map((line) => {
            const area = line.closest(".monaco-scrollable-element")?.getBoundingClientRect();
            const spans = [...line.querySelectorAll('span[class*="dyn-rule-"]')];
            const inside = (span) => {
                const box = span.getBoundingClientRect();
                return area !== undefined && box.width > 0 && box.left >= area.left && box.right <= area.right;
            };
            const box = line.getBoundingClientRect();
            return {
                text: normalize(line.textContent),
                hints: spans.map((span) => normalize(span.textContent)),
                visibleHints: spans.filter(inside).map((span) => normalize(span.textContent)),
                box: { x: box.left, y: box.top, width: box.width, height: box.height },
            };
        });
}

/** Runs in the page: the icon files of the glyph-margin decorations level with the view line at `top`. */
function gutterIconsAt(top) {
    return [...document.querySelectorAll(".monaco-editor .glyph-margin-widgets .cgmr")]
        .filter((element) => Math.abs(element.getBoundingClientRect().top - top) < 3)
        .map((element) => {
            const box = element.getBoundingClientRect();
            const icon = (/([\w-]+\.svg)/.exec(decodeURIComponent(getComputedStyle(element).backgroundImage ?? "")) ?? [null, "?"])[1];
            return { icon, x: box.left + box.width / 2, y: box.top + box.height / 2 };
        });
}

/** The first rendered line whose code holds `snippet`, with its glyph-margin icons; undefined when not on screen. */
async function findLine(page, snippet) {
    const [line] = await page.evaluate(renderedLines, snippet);
    if (line === undefined) {
        return undefined;
    }
    return { ...line, icons: await page.evaluate(gutterIconsAt, line.box.y) };
}

/** Moves the mouse to (x, y) as a person would and returns the hover's text ("" when none holding `hasText` shows). */
async function hoverText(page, x, y, hasText) {
    await page.mouse.move(5, 5);
    await sleep(300);
    await page.mouse.move(x, y);
    const hover = page.locator(".monaco-hover:not(.hidden)", { hasText }).first();
    try {
        await hover.waitFor({ state: "visible", timeout: 15_000 });
        return (await hover.innerText()).replace(/\u00a0/g, " ");
    } catch {
        return "";
    }
}

function allHintTexts() {
    return [...document.querySelectorAll('.monaco-editor .view-line span[class*="dyn-rule-"]')].map((span) =>
        (span.textContent ?? "").replace(/\u00a0/g, " "),
    );
}

/** Runs in the page: the icon file of every glyph-margin decoration on screen, and the squiggles drawn. */
function gutterAndSquiggles() {
    const icons = [...document.querySelectorAll(".monaco-editor .glyph-margin-widgets .cgmr")].map((element) => {
        // NOTE: the icon's URL is percent-encoded (…%2Fmedia%2Fdiff-match.svg).
        const image = decodeURIComponent(getComputedStyle(element).backgroundImage ?? "");
        return (/([\w-]+\.svg)/.exec(image) ?? [null, image])[1];
    });
    const squiggles = (severity) => document.querySelectorAll(`.monaco-editor .view-overlays .squiggly-${severity}`).length;
    return { icons, warning: squiggles("warning"), error: squiggles("error") };
}

/**
 * As a person would: click the line holding `snippet` (the cursor lands inside the diagnostic's range), see
 * the lightbulb, press Ctrl+. and find `title` in the quick-fix menu (left open for the screenshot).
 */
async function checkQuickFix(page, { snippet, title }) {
    const failures = [];
    const line = page.locator(".monaco-editor .view-line", { hasText: snippet }).first();
    try {
        await line.waitFor({ state: "visible", timeout: 20_000 });
        const box = await line.boundingBox();
        // NOTE: a little inside the text (the diagnostic's range starts at the first non-blank character)
        await page.mouse.click(box.x + 60, box.y + box.height / 2);
    } catch (error) {
        failures.push(`the line ${JSON.stringify(snippet)} is not on screen (${String(error).split("\n")[0]})`);
        return failures;
    }
    // NOTE: the lightbulb is drawn in the glyph margin (codicon-lightbulb-autofix …) or as a content widget
    const lightbulb = page.locator(".monaco-editor [class*='lightbulb' i]").first();
    try {
        await lightbulb.waitFor({ state: "visible", timeout: 20_000 });
        log(`lightbulb on screen (${await lightbulb.getAttribute("class")})`);
    } catch {
        failures.push("no lightbulb after clicking the diagnostic's line");
    }
    await page.keyboard.press("Control+Period");
    const item = page.locator(".action-widget", { hasText: title }).first();
    try {
        await item.waitFor({ state: "visible", timeout: 20_000 });
        log(`quick-fix menu on screen: ${(await item.innerText()).replace(/\s+/g, " ").trim()}`);
    } catch {
        const shown = await page.locator(".action-widget").allInnerTexts().catch(() => []);
        failures.push(`the quick-fix menu does not offer ${JSON.stringify(title)} (shown: ${JSON.stringify(shown)})`);
    }
    return failures;
}

/** Clicks "Trust" in the workspace trust editor that the extension-host test opened. */
/** Clicks the first code lens titled `title` on screen, as a person would. */
async function clickLens(page, { title }) {
    const lens = page.locator(".monaco-editor .codelens-decoration a", { hasText: title });
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
        const texts = await lens.allTextContents();
        const index = texts.findIndex((text) => text.replace(/\u00a0/g, " ").trim() === title);
        if (index >= 0) {
            await lens.nth(index).click();
            log(`clicked the code lens ${JSON.stringify(title)}`);
            return [];
        }
        await sleep(500);
    }
    const shown = await page.locator(".monaco-editor .codelens-decoration a").allTextContents();
    return [`no code lens ${JSON.stringify(title)} on screen (lenses: ${JSON.stringify(shown)})`];
}

/** Sticky scroll's lines (with the hints drawn in them) must hold each of `includes` and none of `excludes`. */
async function checkSticky(page, { includes = [], excludes = [] }) {
    let text = "";
    const holds = () => includes.every((part) => text.includes(part)) && !excludes.some((part) => text.includes(part));
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
        text = (await page.locator(".monaco-editor .sticky-widget").allInnerTexts()).join("\n").replace(/\u00a0/g, " ");
        if (holds()) {
            log(`sticky scroll: ${text.replace(/\s+/g, " ").trim().slice(0, 300)}`);
            return [];
        }
        await sleep(500);
    }
    return [`sticky scroll shows ${JSON.stringify(text)}: expected ${JSON.stringify(includes)}, not ${JSON.stringify(excludes)}`];
}

/** Some webview's page (its frames are nested iframes) must hold each of `parts`. */
async function checkWebview(page, parts) {
    const deadline = Date.now() + 15_000;
    let seen = [];
    while (Date.now() < deadline) {
        seen = [];
        for (const frame of page.frames()) {
            const html = await frame.evaluate(() => document.body?.innerHTML ?? "").catch(() => "");
            if (html !== "") {
                seen.push(html);
            }
        }
        const found = seen.find((html) => parts.every((part) => html.includes(part)));
        if (found !== undefined) {
            log(`webview holds ${JSON.stringify(parts)}`);
            return [];
        }
        await sleep(500);
    }
    return [`no webview holds ${JSON.stringify(parts)} (${seen.length} frames read)`];
}

async function grantTrust(page) {
    const button = page.locator(".workspace-trust-editor .monaco-button", { hasText: /^Trust/ }).first();
    try {
        await button.waitFor({ state: "visible", timeout: 20_000 });
        log(`clicking "${(await button.textContent())?.trim()}" in the workspace trust editor`);
        await button.click();
        return [];
    } catch (error) {
        const buttons = await page.locator(".monaco-button").allTextContents();
        return [`no Trust button in the workspace trust editor (${String(error).split("\n")[0]}); buttons: ${JSON.stringify(buttons)}`];
    }
}

async function checkDom(page, request, runDir) {
    if (request.action === "grant-trust") {
        const failures = await grantTrust(page);
        return { step: request.step, ok: failures.length === 0, failures };
    }
    if (request.action === "click-lens") {
        const failures = await clickLens(page, request.lens);
        return { step: request.step, ok: failures.length === 0, failures };
    }
    const failures = [];
    for (const hint of request.hints) {
        const label = hint.label.replace(/\u00a0/g, " ").trim();
        let lines = [];
        const deadline = Date.now() + 20_000;
        while (Date.now() < deadline) {
            lines = await page.evaluate(renderedLines, hint.snippet);
            if (lines.some((line) => line.hints.join("").includes(label))) {
                break;
            }
            await sleep(500);
        }
        if (lines.length === 0) {
            failures.push(`line ${hint.line + 1} (${hint.snippet}) is not rendered on screen`);
        } else if (!lines.some((line) => line.hints.join("").includes(label))) {
            failures.push(`line ${hint.line + 1} shows hints ${JSON.stringify(lines.map((line) => line.hints))}, not ${JSON.stringify(label)}`);
        } else if (request.hintsWhole && !lines.some((line) => line.visibleHints.join("").includes(label) && !line.hints.some((text) => text.trim().endsWith("…")))) {
            // Whole: the span holds the entire label (VS Code cut nothing) and it lies inside the visible text area.
            failures.push(`line ${hint.line + 1}: ${JSON.stringify(label)} is not whole on screen (visible hints ${JSON.stringify(lines.map((line) => line.visibleHints))})`);
        } else {
            log(`on screen, line ${hint.line + 1}: ${lines[0].text.trim()}`);
        }
    }
    if (request.hover !== undefined) {
        // Hover the assigned name as a person would: the first row of the first table must be its value.
        const line = await findLine(page, request.hover.snippet);
        const text = line === undefined ? "" : await hoverText(page, line.box.x + (request.hover.dx ?? 10), line.box.y + line.box.height / 2, "ModelTrace");
        const rows = text.split("\n").filter((row) => /\[[\d,]+\]/.test(row));
        if (rows.length === 0 || !rows[0].includes(request.hover.firstRow)) {
            failures.push(`the hover of ${JSON.stringify(request.hover.snippet)} does not start with ${JSON.stringify(request.hover.firstRow)}: ${JSON.stringify(text.slice(0, 400))}`);
        } else {
            log(`hover first row: ${rows[0].replace(/\s+/g, " ").trim()}`);
        }
        await page.mouse.move(5, 5);
    }
    for (const expected of request.gutterAt ?? []) {
        let found;
        const deadline = Date.now() + 20_000;
        while (Date.now() < deadline) {
            found = await findLine(page, expected.snippet);
            if (found?.icons.some((item) => item.icon === expected.icon)) {
                break;
            }
            await sleep(500);
        }
        const icons = found?.icons.map((item) => item.icon) ?? [];
        if (!icons.includes(expected.icon)) {
            failures.push(`the gutter of ${JSON.stringify(expected.snippet)} shows ${JSON.stringify(icons)}, not ${expected.icon}${found === undefined ? " (line not on screen)" : ""}`);
        } else {
            log(`gutter: ${expected.icon} on ${expected.snippet}`);
        }
    }
    if (request.notification !== undefined) {
        const toast = page.locator(".notification-list-item-message", { hasText: request.notification });
        try {
            await toast.first().waitFor({ state: "visible", timeout: 20_000 });
            log(`notification on screen: ${(await toast.first().textContent())?.trim()}`);
        } catch {
            const shown = await page.locator(".notification-list-item-message").allTextContents();
            failures.push(`no notification ${JSON.stringify(request.notification)}; shown: ${JSON.stringify(shown)}`);
        }
    }
    if (request.statusBar !== undefined) {
        const item = page.locator(".statusbar-item", { hasText: request.statusBar });
        try {
            await item.first().waitFor({ state: "visible", timeout: 20_000 });
            log(`status bar: ${(await item.first().innerText()).trim()}`);
        } catch {
            const shown = await page.locator(".statusbar-item").allInnerTexts();
            failures.push(`no status bar item ${JSON.stringify(request.statusBar)}; shown: ${JSON.stringify(shown)}`);
        }
    }
    if (request.gutterIcons !== undefined || request.squiggle !== undefined) {
        let seen = { icons: [], warning: 0, error: 0 };
        const missing = () => [
            ...(request.gutterIcons ?? []).filter((icon) => !seen.icons.includes(icon)).map((icon) => `gutter icon ${icon}`),
            ...(request.squiggle !== undefined && seen[request.squiggle] === 0 ? [`${request.squiggle} squiggle`] : []),
        ];
        const deadline = Date.now() + 20_000;
        while (Date.now() < deadline) {
            seen = await page.evaluate(gutterAndSquiggles);
            if (missing().length === 0) {
                break;
            }
            await sleep(500);
        }
        if (missing().length > 0) {
            failures.push(`not on screen: ${missing().join(", ")} (gutter icons: ${JSON.stringify(seen.icons)}, squiggles: ${seen.warning} warning, ${seen.error} error)`);
        } else {
            const counts = {};
            for (const icon of seen.icons) {
                counts[icon] = (counts[icon] ?? 0) + 1;
            }
            log(`on screen: gutter icons ${JSON.stringify(counts)}, ${seen.warning} warning squiggle(s)`);
        }
    }
    if (request.quickFix !== undefined) {
        failures.push(...(await checkQuickFix(page, request.quickFix)));
    }
    if (request.sticky !== undefined) {
        failures.push(...(await checkSticky(page, request.sticky)));
    }
    if (request.webviewIncludes !== undefined) {
        failures.push(...(await checkWebview(page, request.webviewIncludes)));
    }
    if (request.mode === "untrusted") {
        const traced = (await page.evaluate(allHintTexts)).filter((text) => /(→ |: )\[[\d,]/.test(text));
        if (traced.length > 0) {
            failures.push(`trace hints on screen in an untrusted workspace: ${JSON.stringify(traced)}`);
        }
    }
    const screenshotName = request.screenshot ?? "screenshot-hints.png";
    const shot = join(runDir, `${request.mode}-${screenshotName}`);
    // NOTE: below the title bar, which says "[Extension Development Host]" in a test run.
    const titlebar = await page.locator(".part.titlebar").boundingBox();
    const top = titlebar === null ? 0 : Math.round(titlebar.y + titlebar.height);
    const viewport = page.viewportSize();
    await page.screenshot({ path: shot, clip: { x: 0, y: top, width: viewport.width, height: viewport.height - top } });
    mkdirSync(screenshotsDir, { recursive: true });
    copyFileSync(shot, join(screenshotsDir, `${request.mode}-${screenshotName}`));
    if (updateMedia && request.mode === "trusted" && failures.length === 0 && request.media !== false) {
        copyFileSync(shot, join(mediaDir, screenshotName));
        log(`screenshot saved to media/${screenshotName} (MODELTRACE_E2E_UPDATE_MEDIA=1)`);
    } else {
        log(`screenshot saved to build/e2e-screenshots/${request.mode}-${screenshotName}`);
    }
    if (request.quickFix !== undefined) {
        await page.keyboard.press("Escape");
    }
    if (request.gutterHover !== undefined) {
        // After the screenshot: the mark's hover (its message says which call and layer decide it), on the icon,
        // else on the line's text (a decoration's hover message shows on the range it decorates).
        const { snippet, includes } = request.gutterHover;
        const line = await findLine(page, snippet);
        let text = "";
        let where = "gutter icon";
        if (line !== undefined && line.icons.length > 0) {
            text = await hoverText(page, line.icons[0].x, line.icons[0].y, includes);
        }
        if (line !== undefined && !text.includes(includes)) {
            where = "line";
            text = await hoverText(page, line.box.x + 10, line.box.y + line.box.height / 2, includes);
        }
        if (!text.includes(includes)) {
            failures.push(`no hover saying ${JSON.stringify(includes)} on the mark of ${JSON.stringify(snippet)}${line === undefined ? " (line not on screen)" : ""}`);
        } else {
            log(`gutter mark hover (on the ${where}): ${text.replace(/\s+/g, " ").trim().slice(0, 300)}`);
        }
        await page.mouse.move(5, 5);
    }
    if (request.hoverIncludes !== undefined) {
        // After the screenshot: hover the line as a person would and read the whole hover.
        const { snippet, text: expected, dx } = request.hoverIncludes;
        const line = await findLine(page, snippet);
        const text = line === undefined ? "" : await hoverText(page, line.box.x + (dx ?? 10), line.box.y + line.box.height / 2, expected);
        if (!text.includes(expected)) {
            failures.push(`the hover of ${JSON.stringify(snippet)} does not say ${JSON.stringify(expected)}${line === undefined ? " (line not on screen)" : ""}`);
        } else {
            log(`hover: ${text.replace(/\s+/g, " ").trim().slice(0, 300)}`);
        }
        await page.mouse.move(5, 5);
    }
    if (request.statusBarTooltip !== undefined) {
        const { item, includes } = request.statusBarTooltip;
        const target = page.locator(".statusbar-item", { hasText: item }).first();
        // NOTE: read from the whole page, whatever class the workbench gives the item's hover
        let text = "";
        for (let attempt = 0; attempt < 3 && !text.includes(includes); attempt++) {
            try {
                await target.waitFor({ state: "visible", timeout: 10_000 });
                await page.mouse.move(5, 5);
                await sleep(500);
                const box = await target.boundingBox();
                await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2, { steps: 5 });
                const deadline = Date.now() + 5_000;
                while (Date.now() < deadline && !text.includes(includes)) {
                    await sleep(500);
                    text = (await page.evaluate(() => document.body.innerText)).replace(/\u00a0/g, " ");
                }
            } catch (error) {
                log(`status bar tooltip: ${error}`);
            }
        }
        if (!text.includes(includes)) {
            const hovers = await page.locator(".monaco-hover, .workbench-hover, [role=tooltip]").allInnerTexts().catch(() => []);
            failures.push(`the tooltip of the status bar item ${JSON.stringify(item)} does not say ${JSON.stringify(includes)} (hovers: ${JSON.stringify(hovers)})`);
        } else {
            const at = text.indexOf(includes);
            log(`status bar tooltip: ${text.slice(Math.max(0, at - 300), at + 150).replace(/\s+/g, " ").trim()}`);
        }
        await page.mouse.move(700, 400);
    }
    if (request.languageStatus !== undefined) {
        // After the screenshot: the hover covers the editor.
        await page.locator('[id="status.languageStatus"]').hover();
        const hover = page.locator(".language-status-hover, .monaco-hover", { hasText: request.languageStatus }).first();
        try {
            await hover.waitFor({ state: "visible", timeout: 10_000 });
            log(`language status: ${(await hover.innerText()).replace(/\s+/g, " ").trim()}`);
        } catch {
            failures.push(`the language status hover does not show ${JSON.stringify(request.languageStatus)}`);
        }
        await page.mouse.move(700, 400);
    }
    if (request.clickStatusBar !== undefined) {
        const item = page.locator(".statusbar-item", { hasText: request.clickStatusBar }).first();
        try {
            await item.waitFor({ state: "visible", timeout: 20_000 });
            await item.click();
            log(`clicked the status bar item ${JSON.stringify(request.clickStatusBar)}`);
        } catch {
            const shown = await page.locator(".statusbar-item").allInnerTexts();
            failures.push(`no status bar item ${JSON.stringify(request.clickStatusBar)} to click; shown: ${JSON.stringify(shown)}`);
        }
    }
    if (request.clickNotificationButton !== undefined) {
        // After the screenshot: a person clicks the notification's button (it runs what it offers).
        const { notification, button } = request.clickNotificationButton;
        const item = page.locator(".notification-list-item", { hasText: notification }).first();
        const target = item.locator(".monaco-button", { hasText: button }).first();
        try {
            await target.waitFor({ state: "visible", timeout: 20_000 });
            await target.click();
            log(`clicked "${button}" on the notification ${JSON.stringify(notification)}`);
        } catch {
            const buttons = await item.locator(".monaco-button").allTextContents().catch(() => []);
            failures.push(`no "${button}" button on the notification ${JSON.stringify(notification)} (buttons: ${JSON.stringify(buttons)})`);
        }
    }
    return { step: request.step, ok: failures.length === 0, failures };
}

async function runMode(mode, vsix) {
    log(`=== ${mode} workspace ===`);
    const { runDir, workspace } = prepareRunFolder(mode);
    const env = codeServerEnv(runDir, mode);
    log(`run folder ${runDir}`);
    let server;
    let browser;
    const failures = [];
    try {
        installVsix(runDir, vsix, env);
        server = await startCodeServer(runDir, workspace, mode, env);
        browser = await chromium.launchPersistentContext(join(runDir, "browser"), {
            executablePath: "/usr/bin/chromium",
            headless: true,
            viewport: { width: 1400, height: 900 },
            args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"],
        });
        const page = browser.pages()[0] ?? (await browser.newPage());
        let exitCode;
        await page.exposeFunction("codeAutomationExit", (code) => {
            exitCode = code;
        });
        await page.exposeFunction("codeAutomationLog", (type, args) => {
            writeFileSync(join(runDir, "extension-host-console.log"), `${type}: ${JSON.stringify(args)}\n`, { flag: "a" });
        });
        await page.goto(testUrl(server.port, workspace));
        log("workbench loading; extension-host tests running");

        const readyFile = join(runDir, "ready.json");
        let lastStep = 0;
        const started = Date.now();
        while (exitCode === undefined && Date.now() - started < modeTimeoutMs) {
            const request = existsSync(readyFile) ? JSON.parse(readFileSync(readyFile, "utf8")) : undefined;
            if (request !== undefined && request.step > lastStep) {
                lastStep = request.step;
                const result = await checkDom(page, request, runDir);
                failures.push(...result.failures.map((failure) => `DOM: ${failure}`));
                writeFileSync(join(runDir, "dom-result.json.tmp"), JSON.stringify(result));
                renameSync(join(runDir, "dom-result.json.tmp"), join(runDir, "dom-result.json"));
            }
            await sleep(250);
        }
        const hostLog = join(runDir, "host.log");
        if (existsSync(hostLog)) {
            console.log(readFileSync(hostLog, "utf8").replace(/^/gm, "    host| ").trimEnd());
        }
        if (exitCode === undefined) {
            await page.screenshot({ path: join(runDir, "timeout.png") });
            failures.push(`the extension-host tests did not finish within ${modeTimeoutMs / 1000} s (screenshot ${join(runDir, "timeout.png")})`);
        } else if (exitCode !== 0) {
            failures.push(`the extension-host tests exited with ${exitCode}`);
        }
        if (lastStep === 0 && exitCode === 0) {
            failures.push("the extension-host tests never asked for the DOM check");
        }
    } catch (error) {
        failures.push(String(error?.stack ?? error));
    } finally {
        await browser?.close().catch(() => undefined);
        stopCodeServer(server);
        await sleep(500);
        server?.flushLog();
    }
    if (failures.length > 0) {
        log(`${mode}: FAILED\n  - ${failures.join("\n  - ")}`);
        log(`logs kept in ${runDir} (code-server.log, host.log, user-data/logs/)`);
    } else {
        log(`${mode}: passed`);
        if (!options.keep) {
            rmSync(runDir, { recursive: true, force: true });
        }
    }
    return failures.length === 0;
}

async function main() {
    for (const required of [node24, codeServer, "/usr/bin/chromium"]) {
        if (!existsSync(required)) {
            throw new Error(`${required} is missing: run tests/extension/e2e/run.sh --install`);
        }
    }
    if (!existsSync(options.python)) {
        throw new Error(`${options.python} is missing: create the repo's .venv (pip install -e pyserver) or pass --python`);
    }
    if ((options.mode === "all" || options.mode === "bundled") && !existsSync(options["user-python"])) {
        throw new Error(`${options["user-python"]} is missing: run tests/extension/e2e/run.sh (it creates it) or pass --user-python`);
    }
    const vsix = findVsix();
    const build = spawnSync(process.execPath, [join(repo, "extension/esbuild.mjs"), "--e2e"], { stdio: "inherit" });
    if (build.status !== 0) {
        throw new Error("building the extension-host test suite failed");
    }
    const modes = options.mode === "all" ? ["trusted", "untrusted", "bundled"] : [options.mode];
    const started = Date.now();
    let passed = 0;
    for (const mode of modes) {
        if (await runMode(mode, vsix)) {
            passed += 1;
        }
    }
    log(`done in ${((Date.now() - started) / 1000).toFixed(0)} s`);
    console.log(`e2e: ${passed} passed, ${modes.length - passed} failed`);
    return passed === modes.length ? 0 : 1;
}

main().then(
    (code) => process.exit(code),
    (error) => {
        console.error(`[e2e] ${error?.message ?? error}`);
        process.exit(2);
    },
);
