// Runs server restarts one at a time, folding requests that arrive during a restart into one more.
// Settings changes, trust grants and the "Restart Server" command can all ask at once (ruff-vscode does the same).

export class RestartQueue {
    private running: Promise<void> = Promise.resolve();
    private queued: Promise<void> | undefined;

    constructor(private readonly restartOnce: () => Promise<void>) {}

    /** Resolves when a restart that began after this call has finished. */
    request(): Promise<void> {
        if (this.queued !== undefined) {
            return this.queued;
        }
        const next: Promise<void> = this.running.then(async () => {
            this.queued = undefined;
            await this.restartOnce();
        });
        this.queued = next;
        this.running = next.catch(() => undefined);
        return next;
    }
}

/** languageclient logs every exit of the server process as an error, a normal restart's code 0 included: that
 * one is information (the client logs it so, instead of "[Error] Server process exited with code 0."). */
export function isNormalExit(message: string): boolean {
    return message === "Server process exited with code 0.";
}
