// End-to-end, trusted workspace (after recorders.test): a plain module whose build fails (`scale` is an argument
// no name or annotation explains) is traced from its lens as a user clicks it; the failure leaves a
// "Create recipe…" lens, which writes a recipe next to the file with what the trace tried and a TODO for `scale`;
// filling it in and saving the recipe traces the module with it (hints on its lines).
import * as assert from "node:assert/strict";
import * as vscode from "vscode";
import { hostLog } from "./handshake";
import { activateInstalledExtension, describeHints, inlayHints, labelText, lineOf, waitFor } from "./hints";

const blockFile: string = "recipe_check/block.py";
const block: string = [
    "import torch",
    "from torch import nn",
    "",
    "",
    "class ScaledBlock(nn.Module):",
    "    def __init__(self, dim, scale):",
    "        super().__init__()",
    "        self.proj = nn.Linear(dim, dim)",
    "        self.scale = scale",
    "",
    "    def forward(self, x):",
    "        projected = self.proj(x) * self.scale",
    "        return torch.relu(projected)",
    "",
].join("\n");

async function lenses(uri: vscode.Uri): Promise<vscode.CodeLens[]> {
    return (await vscode.commands.executeCommand<vscode.CodeLens[]>("vscode.executeCodeLensProvider", uri, 10)) ?? [];
}

function titled(found: vscode.CodeLens[], title: string): vscode.CodeLens | undefined {
    return found.find((lens: vscode.CodeLens) => lens.command?.title === title);
}

/** What a click on a code lens does: run its command with its arguments. */
async function click(lens: vscode.CodeLens): Promise<unknown> {
    const command: vscode.Command = lens.command as vscode.Command;
    return vscode.commands.executeCommand(command.command, ...(command.arguments ?? []));
}

describe("ModelTrace: Create recipe…", () => {
    it("offers Create recipe… on a plain module whose build fails, and traces it with the recipe once saved", async () => {
        await activateInstalledExtension();
        await vscode.commands.executeCommand("workbench.action.closeAllEditors");
        const folder: vscode.WorkspaceFolder = vscode.workspace.workspaceFolders![0];
        const blockUri: vscode.Uri = vscode.Uri.joinPath(folder.uri, blockFile);
        await vscode.workspace.fs.writeFile(blockUri, Buffer.from(block, "utf8"));
        const document: vscode.TextDocument = await vscode.workspace.openTextDocument(blockUri);
        await vscode.window.showTextDocument(document, { preview: false });

        const before: vscode.CodeLens[] = await waitFor(() => lenses(blockUri), (found) => found.length > 0, 60_000);
        const traceLens: vscode.CodeLens | undefined = titled(before, "▶ Trace forward (needs a recipe)");
        assert.ok(traceLens, `no "needs a recipe" lens: ${before.map((lens) => lens.command?.title).join(", ")}`);
        const failed = (await click(traceLens)) as { ok: boolean; message: string; needsRecipe?: string };
        hostLog(`recipe: the lens's trace answered ${JSON.stringify(failed)}`);
        assert.equal(failed.ok, false);
        assert.equal(failed.needsRecipe, "ScaledBlock");
        assert.ok(!/--recipe|--config|pass --/.test(failed.message), `a message names a command-line flag: ${failed.message}`);

        const after: vscode.CodeLens[] = await waitFor(() => lenses(blockUri), (found) => titled(found, "Create recipe…") !== undefined, 30_000);
        const createLens: vscode.CodeLens | undefined = titled(after, "Create recipe…");
        assert.ok(createLens, `the failure offers no Create recipe… lens: ${after.map((lens) => lens.command?.title).join(", ")}`);
        const created = (await click(createLens)) as { ok: boolean; recipe: string; projectFile: string; todo: string[] };
        hostLog(`recipe: Create recipe… answered ${JSON.stringify(created)}`);
        assert.equal(created.ok, true);
        assert.deepEqual(created.todo, ["scale"]);
        assert.ok(created.recipe.endsWith("recipe_check/block_ScaledBlock_recipe.py"), created.recipe);

        // the server asked VS Code to open the recipe; fill in what ModelTrace could not choose, and save
        const recipeUri: vscode.Uri = vscode.Uri.file(created.recipe);
        const recipe: vscode.TextDocument = await waitFor(
            () => vscode.workspace.textDocuments.find((open: vscode.TextDocument) => open.uri.fsPath === recipeUri.fsPath),
            (open) => open !== undefined,
            30_000,
        ).then((open) => open ?? vscode.workspace.openTextDocument(recipeUri));
        const placeholder: number = lineOf(recipe, "scale=None,");
        const edit: vscode.WorkspaceEdit = new vscode.WorkspaceEdit();
        edit.replace(recipeUri, recipe.lineAt(placeholder).range, "        scale=2.0,");
        assert.ok(await vscode.workspace.applyEdit(edit));
        assert.ok(await recipe.save(), "the recipe was not saved");

        const projected: number = lineOf(document, "projected = self.proj(x)");
        const hints: vscode.InlayHint[] = await waitFor(
            () => inlayHints(document),
            (found) => found.some((hint) => hint.position.line === projected && labelText(hint).includes("[1,7,64]")),
            150_000,
        );
        hostLog(`recipe: hints after saving the recipe:\n${describeHints(hints)}`);
        assert.ok(
            hints.some((hint) => hint.position.line === projected && labelText(hint).includes("[1,7,64]")),
            `no hint from the recipe's trace on line ${projected + 1}:\n${describeHints(hints)}`,
        );
    });

    after(async () => {
        // NOTE: the suites after this one read the notification center and the editors on screen
        await vscode.commands.executeCommand("notifications.clearAll");
        await vscode.commands.executeCommand("workbench.action.closeAllEditors");
    });
});
