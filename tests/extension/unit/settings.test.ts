// Settings as read from the configuration, and the initializationOptions the server receives.
import { vscodeFake } from "./vscode_fake";
import * as assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { defaultSettings, initializationOptions, readSettings, settingsSection } from "../../../extension/src/settings";
import * as vscodeapi from "../../../extension/src/vscodeapi";

describe("settings", () => {
    beforeEach(() => vscodeFake.reset());

    it("reads every modelTrace setting into the initializationOptions, with the trust flag", () => {
        vscodeFake.settings.set("modelTrace.python", " /venv/bin/python ");
        vscodeFake.settings.set("modelTrace.importStrategy", "fromEnvironment");
        vscodeFake.settings.set("modelTrace.device", "cuda:1");
        vscodeFake.settings.set("modelTrace.dtype", "bfloat16");
        vscodeFake.settings.set("modelTrace.attention", "sdpa");
        vscodeFake.settings.set("modelTrace.hintDetail", "stats");
        vscodeFake.settings.set("modelTrace.hintPlacement", "endOfLine");
        vscodeFake.settings.set("modelTrace.hintSizes", "full");
        vscodeFake.settings.set("modelTrace.traceOnSave", true);
        vscodeFake.settings.set("modelTrace.startWorkerOnOpen", false);
        vscodeFake.settings.set("modelTrace.lines", true);
        vscodeFake.settings.set("modelTrace.follow", [" helpers/rope.py ", ""]);
        vscodeFake.settings.set("modelTrace.timeout", 30);
        vscodeFake.settings.set("modelTrace.maxTensorMB", 0.5);
        vscodeFake.settings.set("modelTrace.maxTraceMB", 0);
        vscodeFake.settings.set("modelTrace.fullTensorsMB", 64);
        vscodeFake.settings.set("modelTrace.tensorMemoryMB", 256);
        vscodeFake.settings.set("modelTrace.shapeOnly", true);
        vscodeFake.settings.set("modelTrace.checkpoint", " /models/tiny-llama ");
        vscodeFake.settings.set("modelTrace.deviceMap", " auto ");
        vscodeFake.settings.set("modelTrace.recipe", " recipes/block.py ");
        vscodeFake.settings.set("modelTrace.projectFile", " tools/modeltrace.toml ");
        vscodeFake.settings.set("modelTrace.config", " /configs/tiny.json ");
        vscodeFake.settings.set("modelTrace.diffAtol", 1e-4);
        vscodeFake.settings.set("modelTrace.diffRtol", 0);
        vscodeFake.settings.set("modelTrace.diffMaps", ["h\\.(\\d+)=>layers.\\1"]);
        vscodeFake.settings.set("modelTrace.diffReplay", false);
        vscodeFake.settings.set("modelTrace.diffMapping", " maps/port.map ");
        vscodeFake.settings.set("modelTrace.notifications", false);
        vscodeFake.settings.set("modelTrace.statusBar", false);
        vscodeFake.settings.set("modelTrace.generateSteps", 16);
        vscodeFake.settings.set("modelTrace.gradientHints", false);
        const options = initializationOptions(readSettings(vscodeapi.getConfiguration(settingsSection)), false);
        assert.deepEqual(options, {
            settings: {
                python: "/venv/bin/python",
                importStrategy: "fromEnvironment",
                device: "cuda:1",
                dtype: "bfloat16",
                attention: "sdpa",
                hintDetail: "stats",
                hintPlacement: "endOfLine",
                hintSizes: "full",
                traceOnSave: true,
                startWorkerOnOpen: false,
                lines: true,
                follow: ["helpers/rope.py"],
                timeout: 30,
                maxTensorMB: 0.5,
                maxTraceMB: 0,
                fullTensorsMB: 64,
                tensorMemoryMB: 256,
                shapeOnly: true,
                checkpoint: "/models/tiny-llama",
                deviceMap: "auto",
                recipe: "recipes/block.py",
                config: "/configs/tiny.json",
                projectFile: "tools/modeltrace.toml",
                diffAtol: 1e-4,
                diffRtol: 0,
                diffMaps: ["h\\.(\\d+)=>layers.\\1"],
                diffReplay: false,
                diffMapping: "maps/port.map",
                notifications: false,
                statusBar: false,
                generateSteps: 16,
                gradientHints: false,
            },
            workspaceTrusted: false,
        });
    });

    it("replaces missing, mistyped and out-of-range values by the defaults", () => {
        vscodeFake.settings.set("modelTrace.device", "  ");
        vscodeFake.settings.set("modelTrace.dtype", "float64");
        vscodeFake.settings.set("modelTrace.attention", "flash_attention_2");
        vscodeFake.settings.set("modelTrace.follow", "helpers.py");
        vscodeFake.settings.set("modelTrace.hintDetail", 3);
        vscodeFake.settings.set("modelTrace.hintPlacement", "middle");
        vscodeFake.settings.set("modelTrace.hintSizes", "huge");
        vscodeFake.settings.set("modelTrace.notifications", "no");
        vscodeFake.settings.set("modelTrace.traceOnSave", "yes");
        vscodeFake.settings.set("modelTrace.startWorkerOnOpen", "no");
        vscodeFake.settings.set("modelTrace.lines", "no");
        vscodeFake.settings.set("modelTrace.timeout", -5);
        vscodeFake.settings.set("modelTrace.shapeOnly", "yes");
        vscodeFake.settings.set("modelTrace.checkpoint", 3);
        vscodeFake.settings.set("modelTrace.deviceMap", 3);
        vscodeFake.settings.set("modelTrace.maxTensorMB", -1);
        vscodeFake.settings.set("modelTrace.maxTraceMB", "big");
        vscodeFake.settings.set("modelTrace.tensorMemoryMB", -3);
        vscodeFake.settings.set("modelTrace.diffAtol", -1);
        vscodeFake.settings.set("modelTrace.diffRtol", "0.1");
        vscodeFake.settings.set("modelTrace.diffMaps", "a=>b");
        vscodeFake.settings.set("modelTrace.diffReplay", "no");
        vscodeFake.settings.set("modelTrace.generateSteps", 2.5);
        vscodeFake.settings.set("modelTrace.gradientHints", "yes");
        assert.deepEqual(readSettings(vscodeapi.getConfiguration(settingsSection)), defaultSettings);
    });

    it("matches what package.json contributes: same names, same defaults", () => {
        const manifest = JSON.parse(readFileSync(join(__dirname, "../../../package.json"), "utf8")) as {
            contributes: { configuration: { properties: Record<string, { default: unknown; enum?: string[] }> } };
        };
        const contributed = manifest.contributes.configuration.properties;
        const fromManifest: Record<string, unknown> = {};
        for (const [key, property] of Object.entries(contributed)) {
            fromManifest[key.replace(/^modelTrace\./, "")] = property.default;
        }
        assert.deepEqual(fromManifest, { ...defaultSettings });
        assert.deepEqual(contributed["modelTrace.dtype"]?.enum, ["float32", "float16", "bfloat16"]);
        assert.deepEqual(contributed["modelTrace.attention"]?.enum, ["eager", "sdpa", "flex_attention"]);
        assert.deepEqual(contributed["modelTrace.hintDetail"]?.enum, ["shape", "dtype", "stats"]);
        assert.deepEqual(contributed["modelTrace.hintPlacement"]?.enum, ["afterName", "endOfLine"]);
        assert.deepEqual(contributed["modelTrace.hintSizes"]?.enum, ["traced", "full"]);
    });

    it("keeps modelTrace.python and importStrategy out of reach of untrusted workspace settings", () => {
        const manifest = JSON.parse(readFileSync(join(__dirname, "../../../package.json"), "utf8")) as {
            capabilities: { untrustedWorkspaces: { supported: string; restrictedConfigurations: string[] } };
        };
        assert.equal(manifest.capabilities.untrustedWorkspaces.supported, "limited");
        assert.deepEqual(manifest.capabilities.untrustedWorkspaces.restrictedConfigurations, ["modelTrace.python", "modelTrace.importStrategy"]);
    });
});
