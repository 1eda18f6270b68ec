// What the interpreter lacks that the extension cannot bundle (compiled packages: torch, numpy, safetensors,
// libcst), said once with the feature each one serves, and the one command that installs them, run as a task.
import type * as vscode from "vscode";
import { commandLine, describeMissing, type MissingRequirement } from "./python";
import * as vscodeapi from "./vscodeapi";

export const installChoice = "Install";
export const copyChoice = "Copy Command";

/** The notification's text: which interpreter lacks what, what stops working, and the command. */
export function missingMessage(interpreter: string, missing: readonly MissingRequirement[], install: readonly string[]): string {
    return (
        `ModelTrace: ${interpreter} lacks ${describeMissing(missing)}. ` +
        `Install ${missing.length === 1 ? "it" : "them"} into that environment with \`${commandLine(install)}\`.`
    );
}

/**
 * Runs `install` (`PYTHON -m pip install ...`) as a VS Code task, in a terminal the user sees; resolves with its
 * exit code (undefined when the task could not start).
 */
export async function runInstall(install: readonly string[]): Promise<number | undefined> {
    const [command, ...args] = install;
    const execution: vscode.TaskExecution = await vscodeapi.executeProcessTask(
        `install ${args.slice(3).join(" ")}`,
        command,
        args,
    );
    return new Promise((resolve) => {
        const listener: vscode.Disposable = vscodeapi.onDidEndTaskProcess((event: vscode.TaskProcessEndEvent) => {
            if (event.execution === execution) {
                listener.dispose();
                resolve(event.exitCode);
            }
        });
    });
}

/**
 * Says what is missing (a warning with "Install" and "Copy Command"); on "Install", runs the command and calls
 * `onInstalled` when pip succeeded (the caller restarts the server so that the new packages are seen).
 */
export async function offerInstall(
    message: string,
    install: readonly string[],
    onInstalled: () => unknown,
    log: (message: string) => void,
): Promise<void> {
    // NOTE: VS Code runs no tasks in an untrusted workspace: there the command can only be copied.
    const choices: string[] = vscodeapi.isWorkspaceTrusted() ? [installChoice, copyChoice] : [copyChoice];
    const choice: string | undefined = await vscodeapi.showWarningMessage(message, ...choices);
    if (choice === copyChoice) {
        await vscodeapi.writeClipboard(commandLine(install));
        return;
    }
    if (choice !== installChoice) {
        return;
    }
    log(`Running ${commandLine(install)}`);
    let exitCode: number | undefined;
    try {
        exitCode = await runInstall(install);
    } catch (error) {
        log(`The install task did not start: ${String(error)}`);
    }
    if (exitCode === 0) {
        log("Installed; restarting the server.");
        await onInstalled();
    } else {
        const problem: string = `ModelTrace: \`${commandLine(install)}\` failed (exit code ${exitCode ?? "unknown"}); see its terminal.`;
        log(problem);
        void vscodeapi.showErrorMessage(problem);
    }
}
