"""Every custom name of the ModelTrace protocol, defined once: commands, notifications and requests.

The editor's `extension/src/lsp_ext.ts` mirrors this module one to one (as rust-analyzer's `lsp_ext.ts` mirrors
its `lsp_ext.rs`); `tests/python/lsp/test_methods.py` compares the two.
"""

from __future__ import annotations


# Commands the server advertises through `workspace/executeCommand` (arguments in lsp_ext.ts).
TRACE = "modelTrace.trace"
CLEAR = "modelTrace.clear"
TRACE_GENERATE = "modelTrace.traceGenerate"
TRACE_BACKWARD = "modelTrace.traceBackward"
LOAD_TRACE = "modelTrace.loadTrace"
SET_REFERENCE = "modelTrace.setReference"
PIN_REFERENCE = "modelTrace.pinReference"
# a modular file regenerated into a temporary folder and traced there (`lsp/commands.py`)
TRACE_REGENERATED = "modelTrace.traceRegenerated"
# a recipe written from what a failed trace tried, registered in the project file, opened and traced
CREATE_RECIPE = "modelTrace.createRecipe"
# the document's hints at the model's full sizes, or back at the traced ones (`lsp/full_sizes.py`)
FULL_SIZES = "modelTrace.fullSizes"

# Notifications, server → client.
STATUS = "modelTrace/status"
LINE_STATUS = "modelTrace/lineStatus"
DIFF_RESULT = "modelTrace/diffResult"

# Requests, client → server.
DIFF_PLOT = "modelTrace/diffPlot"

SERVER_COMMANDS = (
    TRACE,
    CLEAR,
    TRACE_GENERATE,
    TRACE_BACKWARD,
    LOAD_TRACE,
    SET_REFERENCE,
    PIN_REFERENCE,
    TRACE_REGENERATED,
    CREATE_RECIPE,
    FULL_SIZES,
)
NOTIFICATIONS = (STATUS, LINE_STATUS, DIFF_RESULT)
REQUESTS = (DIFF_PLOT,)
