// A fake `vscode` module for unit tests on plain Node: `require("vscode")` returns `vscodeFake`.
// Tests set its fields (settings, trust, active editor, extensions) and read what the client did (messages, items).
import Module from "node:module";

export interface FakeLanguageStatusItem {
    id: string;
    selector: unknown;
    name: string | undefined;
    text: string;
    detail: string | undefined;
    busy: boolean;
    severity: number;
    command: { command: string; title: string } | undefined;
    disposed: boolean;
    dispose(): void;
}

export interface FakeExtension {
    isActive: boolean;
    exports: unknown;
    activate(): Promise<unknown>;
}

export interface FakeUri {
    scheme: string;
    path: string;
    fsPath: string;
    toString(): string;
}

export interface FakeDecorationType {
    options: Record<string, unknown>;
    disposed: boolean;
    dispose(): void;
}

/** A status bar item as the feedback sees it. */
export interface FakeStatusBarItem {
    id: string;
    name: string | undefined;
    text: string;
    tooltip: string | undefined;
    command: unknown;
    visible: boolean;
    show(): void;
    hide(): void;
    dispose(): void;
}

/** An editor as the gutters see it: its document's URI and lines, and the decorations set on it. */
export interface FakeEditor {
    document: { uri: FakeUri; languageId: string; lineCount: number; lineAt(line: number): { range: unknown } };
    /** The lines each decoration type was last set on. */
    decorations: Map<FakeDecorationType, number[]>;
    /** The hover message of each decorated line (decorations set as options). */
    hoverMessages: Map<number, string>;
    setDecorations(type: FakeDecorationType, ranges: ({ line: number } | { range: { line: number }; hoverMessage?: { value: string } })[]): void;
}

export function fakeEditor(path: string, lineCount: number): FakeEditor {
    const editor: FakeEditor = {
        document: {
            uri: fileUri(path),
            languageId: "python",
            lineCount,
            lineAt: (line: number) => ({ range: { line } }),
        },
        decorations: new Map(),
        hoverMessages: new Map(),
        setDecorations(type, ranges): void {
            editor.decorations.set(
                type,
                ranges.map((item) => {
                    if ("range" in item) {
                        if (item.hoverMessage !== undefined) {
                            editor.hoverMessages.set(item.range.line, item.hoverMessage.value);
                        }
                        return item.range.line;
                    }
                    return item.line;
                }),
            );
        },
    };
    return editor;
}

function fileUri(path: string): FakeUri {
    return { scheme: "file", path, fsPath: path, toString: () => `file://${path}` };
}

function createFake() {
    const fake = {
        /** What each `getConfiguration(section).get(key)` returns, by "section.key". */
        settings: new Map<string, unknown>(),
        trusted: true,
        folders: [] as { uri: FakeUri; name: string; index: number }[],
        activeEditor: undefined as { document: { uri: FakeUri; languageId: string } } | undefined,
        installedExtensions: new Map<string, FakeExtension>(),
        /** Replies the next message boxes give, in order ("button clicked"). */
        messageReplies: [] as (string | undefined)[],
        warnings: [] as string[],
        errors: [] as string[],
        /** Each warning's buttons, in order. */
        warningItems: [] as string[][],
        informations: [] as string[],
        statusBarItems: [] as FakeStatusBarItem[],
        executedCommands: [] as { command: string; args: unknown[] }[],
        statusItems: [] as FakeLanguageStatusItem[],
        visibleEditors: [] as FakeEditor[],
        decorationTypes: [] as FakeDecorationType[],
        /** Tasks run with `tasks.executeTask`: the command line of their ProcessExecution. */
        executedTasks: [] as { name: string; command: string; args: string[] }[],
        /** The exit code each next task ends with (undefined: it never ends). */
        taskExitCodes: [] as (number | undefined)[],
        clipboard: "",

        reset(): void {
            fake.settings.clear();
            fake.trusted = true;
            fake.folders = [];
            fake.activeEditor = undefined;
            fake.installedExtensions.clear();
            fake.messageReplies = [];
            fake.warnings = [];
            fake.errors = [];
            fake.warningItems = [];
            fake.informations = [];
            fake.statusBarItems = [];
            fake.executedCommands = [];
            fake.statusItems = [];
            fake.visibleEditors = [];
            fake.decorationTypes = [];
            fake.executedTasks = [];
            fake.taskExitCodes = [];
            fake.clipboard = "";
            taskEndListeners.clear();
        },
    };

    const message = (store: "warnings" | "errors" | "informations") =>
        (text: string, ...items: string[]): Promise<string | undefined> => {
            fake[store].push(text);
            if (store === "warnings") {
                fake.warningItems.push(items);
            }
            return Promise.resolve(fake.messageReplies.shift());
        };

    type TaskEndListener = (event: { execution: unknown; exitCode: number | undefined }) => void;
    const taskEndListeners: Set<TaskEndListener> = new Set();

    const vscode = {
        TaskScope: { Global: 1, Workspace: 2 },
        ProcessExecution: class {
            constructor(
                public process: string,
                public args: string[],
            ) {}
        },
        Task: class {
            constructor(
                public definition: unknown,
                public scope: unknown,
                public name: string,
                public source: string,
                public execution: { process: string; args: string[] },
            ) {}
        },
        tasks: {
            executeTask: (task: { name: string; execution: { process: string; args: string[] } }): Promise<unknown> => {
                fake.executedTasks.push({ name: task.name, command: task.execution.process, args: task.execution.args });
                const execution = { task };
                const exitCode: number | undefined = fake.taskExitCodes.shift();
                if (exitCode !== undefined) {
                    setTimeout(() => {
                        for (const listener of [...taskEndListeners]) {
                            listener({ execution, exitCode });
                        }
                    }, 0);
                }
                return Promise.resolve(execution);
            },
            onDidEndTaskProcess: (listener: TaskEndListener) => {
                taskEndListeners.add(listener);
                return { dispose: () => taskEndListeners.delete(listener) };
            },
        },
        env: {
            clipboard: {
                writeText: (text: string): Promise<void> => {
                    fake.clipboard = text;
                    return Promise.resolve();
                },
            },
        },
        LanguageStatusSeverity: { Information: 0, Warning: 1, Error: 2 },
        StatusBarAlignment: { Left: 1, Right: 2 },
        MarkdownString: class {
            constructor(public value: string) {}
        },
        Uri: {
            file: fileUri,
            parse: (value: string) => fileUri(value.replace(/^file:\/\//, "")),
            joinPath: (base: FakeUri, ...segments: string[]) => fileUri([base.path, ...segments].join("/")),
        },
        workspace: {
            get isTrusted(): boolean {
                return fake.trusted;
            },
            get workspaceFolders() {
                return fake.folders.length === 0 ? undefined : fake.folders;
            },
            getConfiguration: (section: string) => ({
                get: (key: string): unknown => fake.settings.get(`${section}.${key}`),
            }),
            onDidChangeConfiguration: () => ({ dispose: () => undefined }),
            onDidGrantWorkspaceTrust: () => ({ dispose: () => undefined }),
        },
        window: {
            get activeTextEditor() {
                return fake.activeEditor;
            },
            get visibleTextEditors() {
                return fake.visibleEditors;
            },
            onDidChangeVisibleTextEditors: () => ({ dispose: () => undefined }),
            createTextEditorDecorationType: (options: Record<string, unknown>): FakeDecorationType => {
                const type: FakeDecorationType = {
                    options,
                    disposed: false,
                    dispose(): void {
                        type.disposed = true;
                    },
                };
                fake.decorationTypes.push(type);
                return type;
            },
            showWarningMessage: message("warnings"),
            showErrorMessage: message("errors"),
            showInformationMessage: message("informations"),
            createStatusBarItem: (id: string): FakeStatusBarItem => {
                const item: FakeStatusBarItem = {
                    id,
                    name: undefined,
                    text: "",
                    tooltip: undefined,
                    command: undefined,
                    visible: false,
                    show: () => {
                        item.visible = true;
                    },
                    hide: () => {
                        item.visible = false;
                    },
                    dispose: () => {
                        item.visible = false;
                    },
                };
                fake.statusBarItems.push(item);
                return item;
            },
        },
        extensions: {
            getExtension: (id: string): FakeExtension | undefined => fake.installedExtensions.get(id),
        },
        commands: {
            executeCommand: (command: string, ...args: unknown[]): Promise<unknown> => {
                fake.executedCommands.push({ command, args });
                return Promise.resolve(undefined);
            },
            registerCommand: () => ({ dispose: () => undefined }),
        },
        languages: {
            createLanguageStatusItem: (id: string, selector: unknown): FakeLanguageStatusItem => {
                const item: FakeLanguageStatusItem = {
                    id,
                    selector,
                    name: undefined,
                    text: "",
                    detail: undefined,
                    busy: false,
                    severity: 0,
                    command: undefined,
                    disposed: false,
                    dispose(): void {
                        item.disposed = true;
                    },
                };
                fake.statusItems.push(item);
                return item;
            },
        },
    };
    return { fake, vscode };
}

type Fakes = ReturnType<typeof createFake>;
const globalKey = "__modelTraceVscodeFake";
const holder = globalThis as unknown as Record<string, Fakes | undefined>;
// NOTE: each test bundle has its own copy of this file; one shared instance lives on globalThis.
const fakes: Fakes = holder[globalKey] ?? (holder[globalKey] = createFake());

type Load = (request: string, parent: unknown, isMain: boolean) => unknown;
const moduleWithLoad = Module as unknown as { _load: Load & { __vscodeFake?: true } };
if (moduleWithLoad._load.__vscodeFake !== true) {
    const originalLoad: Load = moduleWithLoad._load;
    const load = ((request: string, parent: unknown, isMain: boolean): unknown =>
        request === "vscode" ? fakes.vscode : originalLoad(request, parent, isMain)) as Load & { __vscodeFake?: true };
    load.__vscodeFake = true;
    moduleWithLoad._load = load;
}

export const vscodeFake = fakes.fake;
export { fileUri };
