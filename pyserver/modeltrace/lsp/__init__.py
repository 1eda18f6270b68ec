"""The ModelTrace language server (pygls): trace results as inlay hints, hovers, code lenses and diagnostics.

One module per LSP feature; `server` holds the state and wires them. Nothing here imports torch.
"""
