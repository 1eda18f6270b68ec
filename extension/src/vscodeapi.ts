// Thin wrappers over the `vscode` API that the rest of the client calls at run time.
// Unit tests replace the `vscode` module with a fake; these keep what they must fake small and explicit.
import * as vscode from "vscode";

export function getConfiguration(section: string, scope?: vscode.ConfigurationScope): vscode.WorkspaceConfiguration {
    return vscode.workspace.getConfiguration(section, scope);
}

export function isWorkspaceTrusted(): boolean {
    return vscode.workspace.isTrusted;
}

export function workspaceFolders(): readonly vscode.WorkspaceFolder[] {
    return vscode.workspace.workspaceFolders ?? [];
}

export function activeTextEditor(): vscode.TextEditor | undefined {
    return vscode.window.activeTextEditor;
}

export function getExtension<T>(extensionId: string): vscode.Extension<T> | undefined {
    return vscode.extensions.getExtension<T>(extensionId);
}

export function showErrorMessage(message: string, ...items: string[]): Thenable<string | undefined> {
    return vscode.window.showErrorMessage(message, ...items);
}

export function showWarningMessage(message: string, ...items: string[]): Thenable<string | undefined> {
    return vscode.window.showWarningMessage(message, ...items);
}

export function executeCommand<T>(command: string, ...args: unknown[]): Thenable<T> {
    return vscode.commands.executeCommand<T>(command, ...args);
}

export function registerCommand(command: string, callback: (...args: unknown[]) => unknown): vscode.Disposable {
    return vscode.commands.registerCommand(command, callback);
}

export function createLogOutputChannel(name: string): vscode.LogOutputChannel {
    return vscode.window.createOutputChannel(name, { log: true });
}

export function createLanguageStatusItem(id: string, selector: vscode.DocumentSelector): vscode.LanguageStatusItem {
    return vscode.languages.createLanguageStatusItem(id, selector);
}

export function onDidChangeConfiguration(listener: (event: vscode.ConfigurationChangeEvent) => void): vscode.Disposable {
    return vscode.workspace.onDidChangeConfiguration(listener);
}

export function onDidGrantWorkspaceTrust(listener: () => void): vscode.Disposable {
    return vscode.workspace.onDidGrantWorkspaceTrust(listener);
}

export function visibleTextEditors(): readonly vscode.TextEditor[] {
    return vscode.window.visibleTextEditors;
}

export function onDidChangeVisibleTextEditors(listener: (editors: readonly vscode.TextEditor[]) => void): vscode.Disposable {
    return vscode.window.onDidChangeVisibleTextEditors(listener);
}

export function createTextEditorDecorationType(
    options: vscode.DecorationRenderOptions,
): vscode.TextEditorDecorationType {
    return vscode.window.createTextEditorDecorationType(options);
}

export function joinPath(base: vscode.Uri, ...segments: string[]): vscode.Uri {
    return vscode.Uri.joinPath(base, ...segments);
}

export function showOpenDialog(options: vscode.OpenDialogOptions): Thenable<vscode.Uri[] | undefined> {
    return vscode.window.showOpenDialog(options);
}

export function showInformationMessage(message: string, ...items: string[]): Thenable<string | undefined> {
    return vscode.window.showInformationMessage(message, ...items);
}

export function createWebviewPanel(viewType: string, title: string): vscode.WebviewPanel {
    return vscode.window.createWebviewPanel(viewType, title, vscode.ViewColumn.Beside, { enableScripts: false });
}

export function markdown(text: string): vscode.MarkdownString {
    return new vscode.MarkdownString(text);
}

export function createStatusBarItem(id: string, priority: number): vscode.StatusBarItem {
    return vscode.window.createStatusBarItem(id, vscode.StatusBarAlignment.Left, priority);
}

export async function showLine(uri: string, line: number): Promise<void> {
    const document: vscode.TextDocument = await vscode.workspace.openTextDocument(vscode.Uri.parse(uri));
    const position: vscode.Position = new vscode.Position(line, 0);
    await vscode.window.showTextDocument(document, { selection: new vscode.Range(position, position), preview: false });
}

/** Runs `command args` as a task in a terminal (its output visible to the user). */
export function executeProcessTask(name: string, command: string, args: string[]): Thenable<vscode.TaskExecution> {
    const task: vscode.Task = new vscode.Task(
        { type: "modelTrace" },
        vscode.TaskScope.Workspace,
        name,
        "ModelTrace",
        new vscode.ProcessExecution(command, args),
    );
    return vscode.tasks.executeTask(task);
}

export function onDidEndTaskProcess(listener: (event: vscode.TaskProcessEndEvent) => void): vscode.Disposable {
    return vscode.tasks.onDidEndTaskProcess(listener);
}

export function writeClipboard(text: string): Thenable<void> {
    return vscode.env.clipboard.writeText(text);
}

export function fileUri(path: string): vscode.Uri {
    return vscode.Uri.file(path);
}

export async function openFile(path: string): Promise<void> {
    const document: vscode.TextDocument = await vscode.workspace.openTextDocument(vscode.Uri.file(path));
    await vscode.window.showTextDocument(document, { preview: false });
}

export function createFileSystemWatcher(globPattern: string): vscode.FileSystemWatcher {
    return vscode.workspace.createFileSystemWatcher(globPattern);
}
