// What the client does around the server's commands before sending them: fill in the
// active document for palette invocations, and refuse tracing in an untrusted workspace.
import type * as vscode from "vscode";
import { serverCommands } from "./lsp_ext";
import * as vscodeapi from "./vscodeapi";

export const untrustedTraceMessage: string =
    "ModelTrace: tracing runs this workspace's model code; trust the workspace to enable it.";
export const noDocumentMessage: string = "ModelTrace: open a Python modeling file first, then run this command.";

const manageTrust: string = "Manage Workspace Trust";
const documentCommands: ReadonlySet<string> = new Set<string>(Object.values(serverCommands));

/**
 * The arguments to send for `command`: unchanged when they already start with a document URI,
 * else the active editor's URI in front. undefined when a URI is needed and there is none.
 */
export function fillDocumentArgument(
    command: string,
    args: readonly unknown[],
    activeDocument: vscode.TextDocument | undefined,
): unknown[] | undefined {
    if (!documentCommands.has(command) || typeof args[0] === "string") {
        return [...args];
    }
    if (activeDocument === undefined || activeDocument.languageId !== "python") {
        return undefined;
    }
    // NOTE: a command run from a menu gets the editor's Uri object first; the server wants the string.
    const rest: readonly unknown[] = isUri(args[0]) ? args.slice(1) : args;
    return [activeDocument.uri.toString(), ...rest];
}

function isUri(value: unknown): boolean {
    return typeof value === "object" && value !== null && "scheme" in value && "path" in value;
}

export type ExecuteCommandNext = (command: string, args: unknown[]) => Promise<unknown>;

const referenceCommands: ReadonlySet<string> = new Set<string>([serverCommands.setReference, serverCommands.pinReference]);
const traceCommands: ReadonlySet<string> = new Set<string>([
    serverCommands.trace,
    serverCommands.traceGenerate,
    serverCommands.traceBackward,
    serverCommands.traceRegenerated,
    // NOTE: it traces the class with the recipe it writes
    serverCommands.createRecipe,
]);

/** The reference a `setReference` / `pinReference` result says was set, else undefined (also when the result
 * carries a `message`: the server has told the user already, as `pinReference` does to say what the reference
 * holds, full tensors or statistics only). */
export function referenceSetBy(command: string, result: unknown): string | undefined {
    if (!referenceCommands.has(command) || typeof result !== "object" || result === null) {
        return undefined;
    }
    const { ok, reference, message } = result as { ok?: unknown; reference?: unknown; message?: unknown };
    return ok === true && typeof reference === "string" && typeof message !== "string" ? reference : undefined;
}

/** languageclient `middleware.executeCommand`; `onReferenceSet` hears of a reference the command set. */
export async function executeCommand(
    command: string,
    args: unknown[],
    next: ExecuteCommandNext,
    onReferenceSet?: (reference: string) => void,
): Promise<unknown> {
    // NOTE: messages are not awaited: a notification's promise stays pending until the user closes it.
    if (traceCommands.has(command) && !vscodeapi.isWorkspaceTrusted()) {
        void vscodeapi.showWarningMessage(untrustedTraceMessage, manageTrust).then((choice: string | undefined) => {
            if (choice === manageTrust) {
                void vscodeapi.executeCommand("workbench.trust.manage");
            }
        });
        return undefined;
    }
    const filled: unknown[] | undefined = fillDocumentArgument(command, args, vscodeapi.activeTextEditor()?.document);
    if (filled === undefined) {
        void vscodeapi.showWarningMessage(noDocumentMessage);
        return undefined;
    }
    const result: unknown = await next(command, filled);
    const reference: string | undefined = referenceSetBy(command, result);
    if (reference !== undefined) {
        onReferenceSet?.(reference);
    }
    return result;
}
