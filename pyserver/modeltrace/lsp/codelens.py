"""Code lenses: "▶ Trace forward" above each `nn.Module` class ("▶ Trace generate" above a class that derives from
`GenerationMixin`,
"▶ Trace forward + backward" above a model class), "✕ Clear trace" once the document has hints, and in a modular
file "↳ forward: inherited from `LlamaAttention.forward`, …" for each method a class inherits (`modular`).

Classes are found statically (`classes`), so lenses work in untrusted workspaces and before any trace. While
the user types code that does not parse, the lenses of the last version that did stay in place.
"""

from __future__ import annotations

from lsprotocol import types

from modeltrace.lsp import methods
from modeltrace.lsp.classes import ModuleClass, base_model_name, trace_arguments
from modeltrace.lsp.context import ModelTraceServer
from modeltrace.lsp.modular import generated_classes, inherited_lenses


def _line_range(line: int, column: int, length: int) -> types.Range:
    return types.Range(
        start=types.Position(line=line, character=column),
        end=types.Position(line=line, character=column + length),
    )


# NOTE: the lens of a class only a recipe builds stays (it is how the user learns that the class can be traced,
# and clicking it says what to give), but its title says what it needs, before a click that can only fail
NEEDS_RECIPE_TITLE = "▶ Trace forward (needs modelTrace.recipe)"


def _trace_title(ls: ModelTraceServer, cls: ModuleClass, models: list[ModuleClass]) -> str:
    """The "Trace forward" lens title: said to need a recipe when only one can build the class (no recipe set,
    and no model in the file to run it inside)."""
    if cls.needs_recipe and not ls.settings.recipe and base_model_name(models) is None:
        return NEEDS_RECIPE_TITLE
    return "▶ Trace forward"


def code_lenses(ls: ModelTraceServer, params: types.CodeLensParams) -> list[types.CodeLens]:
    uri = params.text_document.uri
    path = ls.document_path(uri)
    if path is None:
        return []
    classes = ls.document_classes(uri)
    # NOTE: a modular file's base model is often only in its generated twin (`Qwen3Model`): its other classes are
    # traced through that one, as in the generated file
    models = generated_classes(ls, uri) or classes
    lenses = [
        types.CodeLens(
            range=_line_range(cls.line, cls.column, len(cls.name)),
            command=types.Command(
                title=_trace_title(ls, cls, models), command=methods.TRACE, arguments=trace_arguments(uri, cls, models)
            ),
        )
        for cls in classes
    ]
    for cls in classes:
        if not cls.is_model or cls.is_abstract_model:
            continue
        where = _line_range(cls.line, cls.column, len(cls.name))
        if cls.generates:
            lenses.append(
                types.CodeLens(
                    range=where,
                    command=types.Command(
                        title="▶ Trace generate", command=methods.TRACE_GENERATE, arguments=[uri, cls.name]
                    ),
                )
            )
        lenses.append(
            types.CodeLens(
                range=where,
                command=types.Command(
                    title="▶ Trace forward + backward", command=methods.TRACE_BACKWARD, arguments=[uri, cls.name]
                ),
            )
        )
    # NOTE: a modular file's classes run methods written elsewhere: a lens per inherited method opens it
    lenses.extend(inherited_lenses(ls, uri))
    loaded = ls.sessions.trace_showing(path)
    if loaded is not None:
        # NOTE: next to the lens of the class that was traced, when it is in this document; else at the top.
        traced = next((cls for cls in classes if cls.name == loaded.model_class), None)
        where = _line_range(traced.line, traced.column, len(traced.name)) if traced else _line_range(0, 0, 0)
        lenses.append(
            types.CodeLens(
                range=where, command=types.Command(title="✕ Clear trace", command=methods.CLEAR, arguments=[uri])
            )
        )
    return lenses
