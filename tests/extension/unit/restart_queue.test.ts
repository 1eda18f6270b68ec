// Restarts run one at a time; requests during a restart fold into a single next one.
import * as assert from "node:assert/strict";
import { RestartQueue } from "../../../extension/src/restart_queue";

describe("RestartQueue", () => {
    it("runs one restart per burst of requests made while another is running", async () => {
        const log: string[] = [];
        let release: () => void = () => undefined;
        let count = 0;
        const queue = new RestartQueue(async () => {
            count += 1;
            const run = count;
            log.push(`start ${run}`);
            if (run === 1) {
                await new Promise<void>((resolve) => (release = resolve));
            }
            log.push(`end ${run}`);
        });
        const first = queue.request();
        await new Promise((resolve) => setImmediate(resolve));
        const second = queue.request();
        const third = queue.request();
        assert.equal(second, third, "requests during a restart share the queued one");
        release();
        await Promise.all([first, second, third]);
        assert.deepEqual(log, ["start 1", "end 1", "start 2", "end 2"]);
    });

    it("keeps going after a failed restart", async () => {
        let calls = 0;
        const queue = new RestartQueue(async () => {
            calls += 1;
            if (calls === 1) {
                throw new Error("python not found");
            }
        });
        await assert.rejects(queue.request(), /python not found/);
        await queue.request();
        assert.equal(calls, 2);
    });
});
