// Starts, stops and restarts the language client for `<python> -m modeltrace serve` (LSP over stdio).
// Inlay hints, hovers, code lenses and diagnostics are plain LSP: languageclient handles them without client code.
import type * as vscode from "vscode";
import {
    type ExecuteCommandSignature,
    LanguageClient,
    type LanguageClientOptions,
    RevealOutputChannelOn,
    type ServerOptions,
    State,
    TransportKind,
} from "vscode-languageclient/node";
import * as lspExt from "./lsp_ext";
import { executeCommand } from "./middleware";
import { checkInterpreter, findInterpreter, type Interpreter, type InterpreterCheck } from "./python";
import { RestartQueue } from "./restart_queue";
import { initializationOptions, type ModelTraceSettings, readSettings, settingsSection } from "./settings";
import { problemView, restrictedView, startingView, type TraceStatus, viewForServerStatus } from "./status";
import * as vscodeapi from "./vscodeapi";

export const serverArguments: readonly string[] = ["-m", "modeltrace", "serve"];

export class ServerManager implements vscode.Disposable {
    private client: LanguageClient | undefined;
    /** Stand-ins for the server's commands while no server runs, so that they explain why instead of "not found". */
    private fallbackCommands: vscode.Disposable[] = [];
    private readonly restarts: RestartQueue = new RestartQueue(() => this.restartOnce());

    constructor(
        private readonly outputChannel: vscode.LogOutputChannel,
        private readonly status: TraceStatus,
    ) {}

    get languageClient(): LanguageClient | undefined {
        return this.client;
    }

    /** Stops the running server (if any) and starts a new one with the current settings and trust. */
    restart(): Promise<void> {
        return this.restarts.request();
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
    }

    private async restartOnce(): Promise<void> {
        await this.stop();
        this.status.show(startingView);
        const settings: ModelTraceSettings = readSettings(vscodeapi.getConfiguration(settingsSection));
        const interpreter: Interpreter = await findInterpreter(settings.python, (message: string) =>
            this.outputChannel.warn(message),
        );
        this.outputChannel.info(`Interpreter: ${interpreter.path} (${interpreter.source})`);
        const check: InterpreterCheck = await checkInterpreter(interpreter);
        if (!check.ok) {
            this.fail(check.problem);
            return;
        }
        this.outputChannel.info(
            `Python ${check.probe.version.join(".")} at ${check.probe.executable}, modeltrace ${check.probe.modeltrace}`,
        );
        const trusted: boolean = vscodeapi.isWorkspaceTrusted();
        this.status.restricted = !trusted;
        if (!trusted) {
            this.outputChannel.info("Untrusted workspace: the server starts with tracing disabled.");
        }
        const client: LanguageClient = this.createClient(interpreter, settings, trusted);
        this.disposeFallbackCommands();
        try {
            await client.start();
        } catch (error) {
            await client.dispose(2000).catch(() => undefined);
            this.fail(`ModelTrace: the server did not start (${interpreter.path} ${serverArguments.join(" ")}): ${String(error)}`);
            return;
        }
        this.client = client;
        if (this.status.view === startingView) {
            this.status.show(trusted ? viewForServerStatus({ state: "idle" }) : restrictedView);
        }
    }

    private createClient(interpreter: Interpreter, settings: ModelTraceSettings, trusted: boolean): LanguageClient {
        const workspaceFolder: vscode.WorkspaceFolder | undefined = vscodeapi.workspaceFolders()[0];
        const serverOptions: ServerOptions = {
            command: interpreter.path,
            args: [...serverArguments],
            transport: TransportKind.stdio,
            options: { cwd: workspaceFolder?.uri.fsPath, env: { ...process.env, PYTHONUNBUFFERED: "1" } },
        };
        const clientOptions: LanguageClientOptions = {
            documentSelector: [{ scheme: "file", language: "python" }],
            outputChannel: this.outputChannel,
            revealOutputChannelOn: RevealOutputChannelOn.Never,
            initializationOptions: initializationOptions(settings, trusted),
            synchronize: { configurationSection: settingsSection },
            middleware: {
                executeCommand: (command: string, args: unknown[], next: ExecuteCommandSignature): Promise<unknown> =>
                    executeCommand(command, args, async (filledCommand: string, filledArgs: unknown[]) =>
                        next(filledCommand, filledArgs),
                    ),
            },
        };
        const client: LanguageClient = new LanguageClient("modelTrace", "ModelTrace", serverOptions, clientOptions);
        client.onNotification(lspExt.status, (params: lspExt.StatusParams) => this.status.showServerStatus(params));
        client.onDidChangeState(({ newState }: { newState: State }) => {
            if (newState === State.Stopped && this.client === client) {
                this.status.show(problemView("The server stopped; see the logs (Model Trace: Show Logs)"));
            }
        });
        return client;
    }

    private fail(problem: string): void {
        this.outputChannel.error(problem);
        this.status.show(problemView(problem));
        this.registerFallbackCommands(problem);
        void vscodeapi.showErrorMessage(problem, "Open Settings", "Show Logs").then((choice: string | undefined) => {
            if (choice === "Open Settings") {
                void vscodeapi.executeCommand("workbench.action.openSettings", settingsSection);
            } else if (choice === "Show Logs") {
                this.outputChannel.show();
            }
        });
    }

    private registerFallbackCommands(problem: string): void {
        if (this.fallbackCommands.length > 0) {
            return;
        }
        this.fallbackCommands = Object.values(lspExt.serverCommands).map((command: string) =>
            vscodeapi.registerCommand(command, () => {
                void vscodeapi.showErrorMessage(problem, "Show Logs").then((choice: string | undefined) => {
                    if (choice === "Show Logs") {
                        this.outputChannel.show();
                    }
                });
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
