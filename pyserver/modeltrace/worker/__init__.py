"""The worker: the only part of ModelTrace that imports torch and runs model code (in a subprocess).

`client` (no torch) starts and drives it with the `messages` (no torch either: the one module the server, the
CLI and the worker share); `zygote` is the subprocess that keeps torch imported and forks one
child per trace; `job` runs one trace inside that child with `build` (model + inputs), `capture` (hooks),
`stats` (tensor summaries) and `source_map` (which source line made each call).
"""
