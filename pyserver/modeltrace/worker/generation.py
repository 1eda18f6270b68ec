"""Generation traces (`trace --generate N`): the prefill and N decode steps under capture, with the model's cache.

Greedy and deterministic: `model.generate(..., do_sample=False, num_beams=1, use_cache=True)` with exactly N + 1
new tokens (an end-of-sequence token does not stop it early), or the recipe's own `generate(model, inputs, steps)`
(see docs/generation-and-training.md). Every call of the traced model itself (the root module) starts a step, so each module
record belongs to the step it ran in; after each step the cache's key/value tensors of every layer are
summarised (and kept whole within the size limits with `--full-tensors`). Runs inside the worker child.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modeltrace.errors import ModelTraceError
from modeltrace.trace.records import CacheEntry, GenerationRecord
from modeltrace.worker.capture import ModuleCapture
from modeltrace.worker.messages import TraceRequest
from modeltrace.worker.stats import summarize


# NOTE: inputs that make sense for one forward pass but not for a generation loop, which makes its own: the
# builder's `use_cache=False`, labels, and positions or cache state fixed for the prompt only.
_NOT_FOR_GENERATE = frozenset(
    {
        "use_cache",
        "labels",
        "past_key_values",
        "cache_position",
        "position_ids",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "decoder_position_ids",
    }
)
# NOTE: heads that generate text, in the order a file's classes are preferred for `--generate` without
# `--model`: where a file has both, its `…ForConditionalGeneration` is the whole model and its `…ForCausalLM` a
# part (`BartForCausalLM` is BART's decoder alone).
GENERATING_HEADS = (
    ("ForConditionalGeneration", "encoder-decoder or multimodal generator"),
    ("ForCausalLM", "decoder-only language model"),
    ("LMHeadModel", "GPT-2-style language model"),
)


def recipe_function(request: TraceRequest, name: str) -> Any:
    """The recipe's function `name` (`generate`, `build_loss`), if the request has a recipe that defines one.

    The recipe is already imported by the builder, under `modeltrace_recipe_{stem}` (`build.build_from_recipe`)."""
    recipe = request.recipe
    if not recipe:
        return None
    module = sys.modules.get(f"modeltrace_recipe_{Path(recipe).resolve().stem}")
    function = getattr(module, name, None) if module is not None else None
    return function if callable(function) else None


def _can_generate(model_class: type) -> bool:
    can_generate = getattr(model_class, "can_generate", None)
    try:
        return bool(can_generate()) if callable(can_generate) else False
    except Exception:  # noqa: BLE001 - a class that cannot say cannot generate
        return False


def generating_classes(file: Path) -> list[str]:
    """The classes of a modeling file that can generate, preferred first (see `GENERATING_HEADS`)."""
    from modeltrace.worker.building import import_user_file, module_classes

    classes = [cls for cls in module_classes(import_user_file(file)) if _can_generate(cls)]
    rank = {suffix: position for position, (suffix, _) in enumerate(GENERATING_HEADS)}

    def preference(cls: type) -> tuple[int, int]:
        ranks = [rank[suffix] for suffix in rank if cls.__name__.endswith(suffix)]
        return (min(ranks) if ranks else len(rank), len(cls.__name__))

    return [cls.__name__ for cls in sorted(classes, key=preference)]


def choose_generating_class(request: TraceRequest) -> TraceRequest:
    """`--generate` on a modeling file without `--model`: the request for the file's generating class
    (`…ForCausalLM`); the request itself otherwise."""
    if request.recipe or request.model:
        return request
    names = generating_classes(Path(request.file))
    return dataclasses.replace(request, model=names[0]) if names else request


def check_can_generate(model: nn.Module, request: TraceRequest) -> None:
    """A clear message for `--generate` on a model that cannot generate (an encoder, a base model without head)."""
    if request.shape_only:
        raise ModelTraceError("--generate runs real decode steps; it cannot run with --shape-only (meta device)")
    if recipe_function(request, "generate") is not None:
        return
    if callable(getattr(model, "generate", None)) and _can_generate(type(model)):
        return
    name = type(model).__name__
    instead = generating_classes(Path(request.file)) if not request.recipe else []
    if instead:
        advice = f"trace --model {instead[0]} --generate N (a class of this file with a language-model head)"
    else:
        advice = (
            "this file has no class that can generate; trace a forward pass (no --generate), or pass "
            "--recipe with a generate(model, inputs, steps) function"
        )
    raise ModelTraceError(f"{name} cannot generate (no language-model head, or an encoder only): {advice}")


def generation_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The built inputs as `generate` takes them: the prompt, its masks and any other modality."""
    return {name: value for name, value in kwargs.items() if name not in _NOT_FOR_GENERATE and value is not None}


def iter_cache(cache: Any) -> Iterator[tuple[int, str, torch.Tensor, torch.Tensor]]:
    """`(layer, kind, key, value)` for every layer of a transformers cache (`DynamicCache`, an encoder-decoder's
    `EncoderDecoderCache`, the legacy tuple of tuples), kind "self" or "cross"."""
    if cache is None:
        return
    if hasattr(cache, "self_attention_cache") and hasattr(cache, "cross_attention_cache"):
        yield from iter_cache(cache.self_attention_cache)
        for layer, _, key, value in iter_cache(cache.cross_attention_cache):
            yield layer, "cross", key, value
        return
    layers = getattr(cache, "layers", None)
    if isinstance(layers, (list, tuple)):
        for layer, entry in enumerate(layers):
            key, value = getattr(entry, "keys", None), getattr(entry, "values", None)
            if isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor):
                yield layer, "self", key, value
        return
    if hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):
        for layer, (key, value) in enumerate(zip(cache.key_cache, cache.value_cache)):
            if isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor):
                yield layer, "self", key, value
        return
    if isinstance(cache, (tuple, list)):
        for layer, entry in enumerate(cache):
            if isinstance(entry, (tuple, list)) and len(entry) >= 2:
                yield layer, "self", entry[0], entry[1]
                if len(entry) >= 4:
                    yield layer, "cross", entry[2], entry[3]


def _output_cache(output: Any) -> Any:
    # NOTE: `past_key_values` until transformers renamed the field `cache`; either may be there
    for name in ("past_key_values", "cache"):
        cache = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
        if cache is not None:
            return cache
    return None


class CacheRecorder:
    """A forward hook on the traced model: after each of its calls (one step), the cache's tensors summarised."""

    def __init__(self, capture: ModuleCapture, total: int = 0, progress: Callable[[str], None] | None = None) -> None:
        self.capture = capture
        self.entries: list[CacheEntry] = []
        self.steps = 0
        self.total = total
        self.progress = progress

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        step = self.steps
        self.steps += 1
        if self.progress is not None:
            self.progress("prefill done" if step == 0 else f"decode step {step} of {self.total - 1}")
        capture = self.capture
        for layer, kind, key, value in iter_cache(_output_cache(output)):
            summaries = []
            for name, tensor in (("key", key), ("value", value)):
                # NOTE: right away, not pending: a cache's tensors are replaced or written in place next step
                summary = summarize(tensor.detach(), f"{kind}.{layer}.{name}")
                if capture.full_tensors:
                    capture._keep_unless_meta(tensor, summary, f"cache/{step}/{kind}/{layer}/{name}")
                summaries.append(summary)
            self.entries.append(CacheEntry(step, layer, kind, summaries[0], summaries[1]))


def run_generation(
    model: nn.Module,
    args: tuple,
    kwargs: dict[str, Any],
    steps: int,
    capture: ModuleCapture,
    request: TraceRequest,
    progress: Callable[[str], None] | None = None,
) -> GenerationRecord:
    """Generate greedily (`steps` decode steps after the prefill) under `capture`; returns what the trace adds.
    `progress` hears of each step as it ends (the editor's progress bar)."""
    if steps < 1:
        raise ModelTraceError(f"--generate {steps}: expected a number of decode steps >= 1")
    recorder = CacheRecorder(capture, steps + 1, progress)
    handle = model.register_forward_hook(recorder)
    recipe_generate = recipe_function(request, "generate")
    inputs = generation_inputs(kwargs)
    prompt = inputs.get("input_ids", args[0] if args else None)
    try:
        if recipe_generate is not None:
            generated = recipe_generate(model, dict(kwargs) if kwargs else args, steps)
            call = "recipe"
        else:
            generated = _generate(model, args, inputs, steps)
            call = "generate"
    finally:
        handle.remove()
    sequences = getattr(generated, "sequences", generated)
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2:
        raise ModelTraceError(
            f"{'the recipe generate()' if call == 'recipe' else type(model).__name__ + '.generate'} returned "
            f"{type(generated).__name__}; expected token ids of shape [batch, length]"
        )
    start = _start_length(model, inputs, prompt, sequences, call)
    root_calls = [record.index for record in capture.records if record.path == ""]
    return GenerationRecord(
        steps=len(root_calls),
        step_starts=[0, *root_calls[1:]],
        prompt_length=start,
        generated_ids=sequences[:, start:].tolist(),
        call=call,
        cache=recorder.entries,
    )


def _generate(model: nn.Module, args: tuple, inputs: dict[str, Any], steps: int) -> Any:
    config = getattr(model, "generation_config", None)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        pad = getattr(config, "eos_token_id", None)
        pad = pad[0] if isinstance(pad, (list, tuple)) and pad else pad
    options: dict[str, Any] = {
        "max_new_tokens": steps + 1,
        "min_new_tokens": steps + 1,  # NOTE: an end-of-sequence token must not end the trace early
        "do_sample": False,
        "num_beams": 1,
        "use_cache": True,
        "return_dict_in_generate": True,
        "pad_token_id": pad if pad is not None else 0,
    }
    return model.generate(*args[:1], **inputs, **options)


def _start_length(model: nn.Module, inputs: dict[str, Any], prompt: Any, sequences: torch.Tensor, call: str) -> int:
    """Where the generated ids start in `sequences`: after the prompt (decoder-only) or the decoder's start."""
    if call == "recipe" and isinstance(prompt, torch.Tensor) and sequences.shape[1] <= prompt.shape[-1]:
        return 0  # the recipe returned only the new tokens
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        decoder = inputs.get("decoder_input_ids")
        return int(decoder.shape[-1]) if isinstance(decoder, torch.Tensor) else 1
    return int(prompt.shape[-1]) if isinstance(prompt, torch.Tensor) else 0
