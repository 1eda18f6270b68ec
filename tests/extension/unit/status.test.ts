// `modelTrace/status` notifications as the language status item shows them.
import { vscodeFake } from "./vscode_fake";
import * as assert from "node:assert/strict";
import { TraceStatus, viewForServerStatus } from "../../../extension/src/status";

describe("status item", () => {
    beforeEach(() => vscodeFake.reset());

    it("maps each server state to text, busy and severity", () => {
        const shown = (state: "idle" | "tracing" | "stale" | "error", uri?: string) => {
            const view = viewForServerStatus({ state, message: "details", uri });
            return [view.text, view.busy, view.severity];
        };
        assert.deepEqual(shown("tracing", "file:///a.py"), ["ModelTrace: tracing…", true, "information"]);
        assert.deepEqual(shown("idle", "file:///a.py"), ["ModelTrace: ready", false, "information"]);
        assert.deepEqual(shown("idle"), ["ModelTrace: ready", false, "information"]);
        assert.deepEqual(shown("stale", "file:///a.py"), ["ModelTrace: stale", false, "warning"]);
        assert.deepEqual(shown("error", "file:///a.py"), ["ModelTrace: error", false, "error"]);
    });

    it("writes the view onto a python language status item", () => {
        const status = new TraceStatus();
        const item = vscodeFake.statusItems[0];
        assert.ok(item !== undefined);
        assert.equal(item.id, "modelTrace.status");
        assert.deepEqual(item.selector, { language: "python" });
        assert.equal(item.name, "ModelTrace");
        assert.equal(item.text, "ModelTrace: starting…");
        assert.equal(item.busy, true);

        status.showServerStatus({ state: "tracing", uri: "file:///a.py" });
        assert.equal(item.text, "ModelTrace: tracing…");
        assert.equal(item.busy, true);

        status.showServerStatus({ state: "error", message: "worker crashed (SIGSEGV)", uri: "file:///a.py" });
        assert.deepEqual([item.text, item.busy, item.severity, item.detail], ["ModelTrace: error", false, 2, "worker crashed (SIGSEGV)"]);
        assert.deepEqual(item.command, { command: "modelTrace.showLogs", title: "Show Logs" });

        status.showServerStatus({ state: "idle", message: "TinyLlamaModel: 52 module calls on 14 lines (3.1 s)", uri: "file:///a.py" });
        assert.deepEqual([item.text, item.severity, item.detail], ["ModelTrace: ready", 0, "TinyLlamaModel: 52 module calls on 14 lines (3.1 s)"]);

        status.dispose();
        assert.equal(item.disposed, true);
    });

    it("shows an idle server as restricted in an untrusted workspace", () => {
        const status = new TraceStatus();
        status.restricted = true;
        status.showServerStatus({ state: "idle" });
        const item = vscodeFake.statusItems[0];
        assert.equal(item?.text, "ModelTrace: restricted");
        assert.equal(item?.severity, 1);
        status.showServerStatus({ state: "error", message: "parse error" });
        assert.equal(item?.text, "ModelTrace: error");
    });
});
