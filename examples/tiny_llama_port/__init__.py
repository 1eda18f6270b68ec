"""TinyLlamaPort: a port of `examples/tiny_llama` with a realistic porting bug, for ModelTrace's diff demo.

Same configuration, module structure and seed as TinyLlama, so both build identical weights and inputs. The
bug: `rotate_half` pairs interleaved dimensions (0 with 1, 2 with 3: the convention of checkpoints whose q/k
weights were not permuted) while `cos` and `sin` are laid out in halves. `modeltrace diff` against
`examples/reference/tiny_llama.mtrace` stops at `layers.0.self_attn`, between `v_proj` and `o_proj`.
"""

from .configuration_tiny_llama_port import TinyLlamaPortConfig
from .modeling_tiny_llama_port import TinyLlamaPortForCausalLM, TinyLlamaPortModel, TinyLlamaPortPreTrainedModel


__all__ = ["TinyLlamaPortConfig", "TinyLlamaPortForCausalLM", "TinyLlamaPortModel", "TinyLlamaPortPreTrainedModel"]
