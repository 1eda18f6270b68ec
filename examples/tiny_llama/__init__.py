"""TinyLlama: a small Llama-style decoder written like a transformers model package (ModelTrace's example)."""

from .configuration_tiny_llama import TinyLlamaConfig
from .modeling_tiny_llama import TinyLlamaForCausalLM, TinyLlamaModel, TinyLlamaPreTrainedModel


__all__ = ["TinyLlamaConfig", "TinyLlamaForCausalLM", "TinyLlamaModel", "TinyLlamaPreTrainedModel"]
