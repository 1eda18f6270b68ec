// What happens to the server's commands on the client: the active document filled in, tracing refused when untrusted.
import { fileUri, vscodeFake } from "./vscode_fake";
import * as assert from "node:assert/strict";
import { executeCommand, fillDocumentArgument, noDocumentMessage, untrustedTraceMessage } from "../../../extension/src/middleware";

const modelingFile = "/ws/tiny_llama/modeling_tiny_llama.py";

function recordingNext() {
    const sent: { command: string; args: unknown[] }[] = [];
    const next = async (command: string, args: unknown[]): Promise<unknown> => {
        sent.push({ command, args });
        return "server result";
    };
    return { sent, next };
}

describe("fillDocumentArgument", () => {
    const python = { uri: fileUri(modelingFile), languageId: "python" } as never;

    it("puts the active document's URI in front of a palette invocation's empty arguments", () => {
        assert.deepEqual(fillDocumentArgument("modelTrace.trace", [], python), [`file://${modelingFile}`]);
        assert.deepEqual(fillDocumentArgument("modelTrace.clear", [], python), [`file://${modelingFile}`]);
    });

    it("keeps arguments that already start with a URI string (code lens, tests)", () => {
        assert.deepEqual(fillDocumentArgument("modelTrace.trace", ["file:///other.py", "TinyLlamaModel"], python), [
            "file:///other.py",
            "TinyLlamaModel",
        ]);
    });

    it("replaces a Uri object (editor menus pass one) by the active document's URI string", () => {
        assert.deepEqual(fillDocumentArgument("modelTrace.trace", [fileUri(modelingFile)], python), [`file://${modelingFile}`]);
    });

    it("gives up without a Python document, and leaves other commands alone", () => {
        assert.equal(fillDocumentArgument("modelTrace.trace", [], undefined), undefined);
        assert.equal(fillDocumentArgument("modelTrace.trace", [], { uri: fileUri("/ws/notes.md"), languageId: "markdown" } as never), undefined);
        assert.deepEqual(fillDocumentArgument("some.other.command", [], undefined), []);
    });
});

describe("executeCommand middleware", () => {
    beforeEach(() => vscodeFake.reset());

    it("sends a palette trace with the active editor's URI", async () => {
        vscodeFake.activeEditor = { document: { uri: fileUri(modelingFile), languageId: "python" } };
        const { sent, next } = recordingNext();
        assert.equal(await executeCommand("modelTrace.trace", [], next), "server result");
        assert.deepEqual(sent, [{ command: "modelTrace.trace", args: [`file://${modelingFile}`] }]);
        assert.deepEqual(vscodeFake.warnings, []);
    });

    it("warns instead of sending when no Python file is open", async () => {
        const { sent, next } = recordingNext();
        assert.equal(await executeCommand("modelTrace.clear", [], next), undefined);
        assert.deepEqual(sent, []);
        assert.deepEqual(vscodeFake.warnings, [noDocumentMessage]);
    });

    it("refuses to trace in an untrusted workspace, and offers the trust editor", async () => {
        vscodeFake.trusted = false;
        vscodeFake.activeEditor = { document: { uri: fileUri(modelingFile), languageId: "python" } };
        vscodeFake.messageReplies = ["Manage Workspace Trust"];
        const { sent, next } = recordingNext();
        assert.equal(await executeCommand("modelTrace.trace", [`file://${modelingFile}`], next), undefined);
        assert.deepEqual(sent, []);
        assert.deepEqual(vscodeFake.warnings, [untrustedTraceMessage]);
        assert.equal(untrustedTraceMessage, "ModelTrace: tracing runs this workspace's model code; trust the workspace to enable it.");
        await new Promise((resolve) => setImmediate(resolve));
        assert.deepEqual(vscodeFake.executedCommands, [{ command: "workbench.trust.manage", args: [] }]);
    });

    it("refuses Trace generate, Trace forward + backward and Create recipe… in an untrusted workspace too", async () => {
        vscodeFake.trusted = false;
        const { sent, next } = recordingNext();
        const commands: string[] = ["modelTrace.traceGenerate", "modelTrace.traceBackward", "modelTrace.createRecipe"];
        for (const command of commands) {
            assert.equal(await executeCommand(command, [`file://${modelingFile}`, "TinyLlamaForCausalLM"], next), undefined);
        }
        assert.deepEqual(sent, []);
        assert.deepEqual(vscodeFake.warnings, commands.map(() => untrustedTraceMessage));
    });

    it("sends a palette Trace generate with the active editor's URI", async () => {
        vscodeFake.activeEditor = { document: { uri: fileUri(modelingFile), languageId: "python" } };
        const { sent, next } = recordingNext();
        await executeCommand("modelTrace.traceGenerate", [], next);
        assert.deepEqual(sent, [{ command: "modelTrace.traceGenerate", args: [`file://${modelingFile}`] }]);
    });

    it("still clears in an untrusted workspace (clearing runs no workspace code)", async () => {
        vscodeFake.trusted = false;
        const { sent, next } = recordingNext();
        await executeCommand("modelTrace.clear", ["file:///ws/a.py"], next);
        assert.deepEqual(sent, [{ command: "modelTrace.clear", args: ["file:///ws/a.py"] }]);
    });
});
