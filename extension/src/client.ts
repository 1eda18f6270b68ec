// Starts, stops and restarts the language client for `<python> -m modeltrace serve` (LSP over stdio).
// Inlay hints, hovers, code lenses and diagnostics are plain LSP: languageclient handles them without client code.
import type * as vscode from "vscode";
import {
    ExecuteCommandRequest,
    type ExecuteCommandRegistrationOptions,
    type ExecuteCommandSignature,
    LanguageClient,
    type LanguageClientOptions,
    type ProvideInlayHintsSignature,
    type RegistrationData,
    RevealOutputChannelOn,
    type ServerOptions,
    State,
} from "vscode-languageclient/node";
import { missingMessage, offerInstall } from "./environment";
import type { TraceFeedback } from "./feedback";
import type { DiffGutters } from "./gutters";
import * as lspExt from "./lsp_ext";
import { executeCommand } from "./middleware";
import {
    checkInterpreter,
    codeFreeFolder,
    findInterpreter,
    type Interpreter,
    type InterpreterCheck,
    type MissingRequirement,
    runProcess,
    serverArguments,
    serverBundle,
    serverExecutable,
} from "./python";
import { isNormalExit, RestartQueue } from "./restart_queue";
import { StickyScrollRedraw } from "./sticky";
import { initializationOptions, type ModelTraceSettings, readSettings, settingsSection } from "./settings";
import { problemView, restrictedView, startingView, type TraceStatus, viewForServerStatus } from "./status";
import * as vscodeapi from "./vscodeapi";

/** The language client, with a normal exit said as information (not "[Error] Server process exited with code 0."). */
class ModelTraceLanguageClient extends LanguageClient {
    override error(message: string, data?: unknown, showNotification?: boolean | "force"): void {
        if (isNormalExit(message)) {
            this.info(message, data, false);
            return;
        }
        super.error(message, data, showNotification);
    }
}

export class ServerManager implements vscode.Disposable {
    private client: LanguageClient | undefined;
    /**
     * Stand-ins for the server's commands while no server runs (languageclient registers the real ones
     * once the server is up): during a restart they wait for it and pass the call on; after a failed start
     * they say why, instead of VS Code's "command not found".
     */
    private fallbackCommands: vscode.Disposable[] = [];
    private notRunningReason: string = "ModelTrace: the server is not running.";
    private restarting: Promise<void> | undefined;
    /** The modelTrace.python and modelTrace.importStrategy values the running server was started with. */
    private startedWith: string | undefined;
    private projectFiles: vscode.FileSystemWatcher | undefined;
    /** The install offers already shown this session (interpreter and command): each is made once. */
    private readonly offeredInstalls: Set<string> = new Set();
    /** Redraws sticky scroll's lines once the hints of a document whose trace changed are fetched again. */
    private readonly sticky: StickyScrollRedraw = new StickyScrollRedraw();
    private readonly restarts: RestartQueue = new RestartQueue(() =>
        this.restartOnce().catch((error: unknown) => this.fail(`ModelTrace: restarting the server failed: ${String(error)}`)),
    );

    constructor(
        private readonly outputChannel: vscode.LogOutputChannel,
        private readonly status: TraceStatus,
        private readonly gutters: DiffGutters,
        private readonly feedback: TraceFeedback,
    ) {}

    /** The running client, for the client-side commands that ask the server; undefined while none runs. */
    get running(): LanguageClient | undefined {
        return this.client;
    }

    /** Stops the running server (if any) and starts a new one with the current settings and trust. */
    restart(): Promise<void> {
        const restart: Promise<void> = this.restarts.request();
        this.restarting = restart;
        const settled = (): void => {
            if (this.restarting === restart) {
                this.restarting = undefined;
            }
        };
        restart.then(settled, settled);
        return restart;
    }

    /**
     * Restarts when modelTrace.python or modelTrace.importStrategy changed; the other settings reach the server
     * as didChangeConfiguration.
     */
    async onSettingsChanged(): Promise<void> {
        // NOTE: granting trust also fires a change of modelTrace.python (a restricted setting), with the same value.
        if (launchKey(readSettings(vscodeapi.getConfiguration(settingsSection))) !== this.startedWith) {
            await this.restart();
        }
    }

    async stop(): Promise<void> {
        const client: LanguageClient | undefined = this.client;
        this.client = undefined;
        if (client !== undefined) {
            try {
                await client.dispose(5000);
            } catch (error) {
                this.outputChannel.warn(`Stopping the server: ${String(error)}`);
            }
        }
    }

    dispose(): void {
        void this.stop();
        this.disposeFallbackCommands();
        this.projectFiles?.dispose();
    }

    private async restartOnce(): Promise<void> {
        await this.stop();
        this.gutters.clear();
        this.notRunningReason = "ModelTrace: the server is not running.";
        this.registerFallbackCommands();
        this.status.show(startingView);
        const settings: ModelTraceSettings = readSettings(vscodeapi.getConfiguration(settingsSection));
        this.startedWith = launchKey(settings);
        const interpreter: Interpreter = await findInterpreter(settings.python, (message: string) =>
            this.outputChannel.warn(message),
        );
        this.outputChannel.info(`Interpreter: ${interpreter.path} (${interpreter.source})`);
        const bundle: string | undefined = serverBundle(settings.importStrategy);
        this.outputChannel.info(
            bundle !== undefined
                ? `Server: the ModelTrace bundled in the extension (${bundle})`
                : "Server: the interpreter's own modeltrace (modelTrace.importStrategy fromEnvironment, or no bundle)",
        );
        const check: InterpreterCheck = await checkInterpreter(interpreter, runProcess, bundle);
        if (!check.ok) {
            this.fail(check.problem, check.install);
            return;
        }
        this.outputChannel.info(
            `Python ${check.probe.version.join(".")} at ${check.probe.executable}, modeltrace ${check.probe.modeltrace}` +
                (check.probe.location !== undefined ? ` from ${check.probe.location}` : ""),
        );
        this.offerMissing(interpreter.path, check.probe.missing ?? [], check.probe.install ?? undefined);
        const trusted: boolean = vscodeapi.isWorkspaceTrusted();
        this.status.restricted = !trusted;
        if (!trusted) {
            this.outputChannel.info("Untrusted workspace: the server starts with tracing disabled.");
        }
        const client: LanguageClient = this.createClient(interpreter, settings, trusted);
        try {
            await client.start();
        } catch (error) {
            await client.dispose(2000).catch(() => undefined);
            this.fail(`ModelTrace: the server did not start (${interpreter.path} ${serverArguments.join(" ")}): ${String(error)}`);
            return;
        }
        this.disposeFallbackCommands();
        this.client = client;
        if (this.status.view === startingView) {
            this.showReady();
        }
    }

    private showReady(): void {
        this.status.show(this.status.restricted ? restrictedView : viewForServerStatus({ state: "idle" }));
    }

    /** One watcher of the project files (modeltrace.toml, pyproject.toml) for every client this manager starts. */
    private projectFileWatcher(): vscode.FileSystemWatcher {
        this.projectFiles ??= vscodeapi.createFileSystemWatcher("**/{modeltrace.toml,pyproject.toml}");
        return this.projectFiles;
    }

    private createClient(interpreter: Interpreter, settings: ModelTraceSettings, trusted: boolean): LanguageClient {
        const workspaceFolder: vscode.WorkspaceFolder | undefined = vscodeapi.workspaceFolders()[0];
        // NOTE: untrusted: not in the workspace, so that nothing of it can land on the server's sys.path.
        const serverOptions: ServerOptions = serverExecutable(
            interpreter,
            trusted ? workspaceFolder?.uri.fsPath : codeFreeFolder,
            serverBundle(settings.importStrategy),
        );
        const clientOptions: LanguageClientOptions = {
            documentSelector: [{ scheme: "file", language: "python" }],
            outputChannel: this.outputChannel,
            revealOutputChannelOn: RevealOutputChannelOn.Never,
            initializationOptions: initializationOptions(settings, trusted),
            // NOTE: project files are not Python documents: the server hears of their edits through this watcher
            // (a fixed project file loses its diagnostic before the next trace)
            synchronize: { configurationSection: settingsSection, fileEvents: this.projectFileWatcher() },
            middleware: {
                executeCommand: (command: string, args: unknown[], next: ExecuteCommandSignature): Promise<unknown> =>
                    executeCommand(
                        command,
                        args,
                        async (filledCommand: string, filledArgs: unknown[]) => next(filledCommand, filledArgs),
                        (reference: string) => this.feedback.onReferenceSet(reference),
                    ),
                provideInlayHints: async (
                    document: vscode.TextDocument,
                    range: vscode.Range,
                    token: vscode.CancellationToken,
                    next: ProvideInlayHintsSignature,
                ) => {
                    const hints = await next(document, range, token);
                    this.sticky.hintsFetched(document.uri.toString());
                    return hints;
                },
            },
        };
        const client: LanguageClient = new ModelTraceLanguageClient("modelTrace", "ModelTrace", serverOptions, clientOptions);
        // NOTE: the stand-ins go at the moment languageclient registers the server's commands (the names must
        // be free then), not before start(): so a command run during a restart never finds its name unbound.
        const executeCommandFeature = client.getFeature(ExecuteCommandRequest.method);
        const registerServerCommands = executeCommandFeature.register.bind(executeCommandFeature);
        executeCommandFeature.register = (data: RegistrationData<ExecuteCommandRegistrationOptions>): void => {
            this.disposeFallbackCommands();
            registerServerCommands(data);
        };
        client.onNotification(lspExt.status, (params: lspExt.StatusParams) => {
            if (params.uri !== undefined && params.state !== "tracing") {
                this.sticky.traceChanged(params.uri);
            }
            this.status.showServerStatus(params);
            this.feedback.onStatus(params);
        });
        client.onNotification(lspExt.lineStatus, (params: lspExt.LineStatusParams) => this.gutters.show(params));
        client.onNotification(lspExt.diffResult, (params: lspExt.DiffResultParams) => this.feedback.onDiffResult(params));
        // After a crash languageclient restarts the server by itself (a few times): follow it on the status item.
        client.onDidChangeState(({ newState }: { newState: State }) => {
            if (this.client !== client) {
                return;
            }
            if (newState === State.Stopped) {
                this.status.show(problemView("The server stopped; see the logs (ModelTrace: Show Logs)"));
            } else if (newState === State.Running) {
                this.showReady();
            }
        });
        return client;
    }

    /** Says once what the interpreter lacks (features that will not work) and offers the command that installs it. */
    private offerMissing(interpreter: string, missing: readonly MissingRequirement[], install: string[] | undefined): void {
        if (missing.length === 0 || install === undefined) {
            return;
        }
        const message: string = missingMessage(interpreter, missing, install);
        this.outputChannel.warn(message);
        const key: string = `${interpreter}\n${install.join(" ")}`;
        if (this.offeredInstalls.has(key)) {
            return;
        }
        this.offeredInstalls.add(key);
        void offerInstall(message, install, () => this.restart(), (line: string) => this.outputChannel.info(line));
    }

    private fail(problem: string, install?: string[]): void {
        this.outputChannel.error(problem);
        this.status.show(problemView(problem));
        this.notRunningReason = problem;
        this.registerFallbackCommands();
        if (install !== undefined) {
            void offerInstall(problem, install, () => this.restart(), (line: string) => this.outputChannel.info(line));
            return;
        }
        void vscodeapi.showErrorMessage(problem, "Open Settings", "Show Logs").then((choice: string | undefined) => {
            if (choice === "Open Settings") {
                void vscodeapi.executeCommand("workbench.action.openSettings", settingsSection);
            } else if (choice === "Show Logs") {
                this.outputChannel.show();
            }
        });
    }

    private registerFallbackCommands(): void {
        if (this.fallbackCommands.length > 0) {
            return;
        }
        this.fallbackCommands = Object.values(lspExt.serverCommands).map((command: string) =>
            vscodeapi.registerCommand(command, async (...args: unknown[]): Promise<unknown> => {
                await this.restarting?.catch(() => undefined);
                if (this.client !== undefined && this.fallbackCommands.length === 0) {
                    return vscodeapi.executeCommand(command, ...args);
                }
                void vscodeapi.showErrorMessage(this.notRunningReason, "Show Logs").then((choice: string | undefined) => {
                    if (choice === "Show Logs") {
                        this.outputChannel.show();
                    }
                });
                return undefined;
            }),
        );
    }

    private disposeFallbackCommands(): void {
        for (const command of this.fallbackCommands) {
            command.dispose();
        }
        this.fallbackCommands = [];
    }
}

/** What a server start depends on beyond didChangeConfiguration: the interpreter setting and the import strategy. */
function launchKey(settings: ModelTraceSettings): string {
    return `${settings.python}\n${settings.importStrategy}`;
}
