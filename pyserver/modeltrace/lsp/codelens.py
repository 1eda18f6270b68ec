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
from modeltrace.lsp.project_files import has_recipe


def _line_range(line: int, column: int, length: int) -> types.Range:
    return types.Range(
        start=types.Position(line=line, character=column),
        end=types.Position(line=line, character=column + length),
    )


# NOTE: the lens of a class only a recipe builds stays (it is how the user learns that the class can be traced,
# and clicking it says what to give), but its title says what it needs, before a click that can only fail; a
# "Create recipe…" lens beside it writes one
NEEDS_RECIPE_TITLE = "▶ Trace forward (needs a recipe)"
CREATE_RECIPE_TITLE = "Create recipe…"


def _needs_recipe(ls: ModelTraceServer, path: str, cls: ModuleClass, models: list[ModuleClass]) -> bool:
    """Whether only a recipe can trace the class and none is set (project file or setting): the worker said so at
    its last trace (it left a draft for this class), or its `__init__` takes what no rule can choose (`classes`)
    and the file has no model to run it inside."""
    session = ls.sessions.showing(path)
    draft = session.recipe_draft if session is not None else None
    failed_for_want_of_one = draft is not None and draft.model_class == cls.name
    needs_one = cls.needs_recipe and base_model_name(models) is None
    return (failed_for_want_of_one or needs_one) and not has_recipe(ls, path, cls.name)


def code_lenses(ls: ModelTraceServer, params: types.CodeLensParams) -> list[types.CodeLens]:
    uri = params.text_document.uri
    path = ls.document_path(uri)
    if path is None:
        return []
    classes = ls.document_classes(uri)
    # NOTE: a modular file's base model is often only in its generated twin (`Qwen3Model`): its other classes are
    # traced through that one, as in the generated file
    models = generated_classes(ls, uri) or classes
    lenses = []
    for cls in classes:
        where = _line_range(cls.line, cls.column, len(cls.name))
        needs_recipe = _needs_recipe(ls, path, cls, models)
        title = NEEDS_RECIPE_TITLE if needs_recipe else "▶ Trace forward"
        lenses.append(
            types.CodeLens(
                range=where,
                command=types.Command(title=title, command=methods.TRACE, arguments=trace_arguments(uri, cls, models)),
            )
        )
        if needs_recipe:
            lenses.append(
                types.CodeLens(
                    range=where,
                    command=types.Command(
                        title=CREATE_RECIPE_TITLE, command=methods.CREATE_RECIPE, arguments=[uri, cls.name]
                    ),
                )
            )
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
