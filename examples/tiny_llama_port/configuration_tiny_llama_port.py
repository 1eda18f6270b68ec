"""TinyLlamaPort model configuration"""

from huggingface_hub.dataclasses import strict

from transformers.configuration_utils import PreTrainedConfig


@strict
class TinyLlamaPortConfig(PreTrainedConfig):
    r"""
    Configuration of a [`TinyLlamaPortModel`]: a Llama-style decoder (RMSNorm, rotary position embeddings,
    grouped-query attention, SwiGLU MLP) small enough to build from scratch in milliseconds.

    ```python
    >>> from tiny_llama_port import TinyLlamaPortConfig, TinyLlamaPortModel

    >>> configuration = TinyLlamaPortConfig()
    >>> model = TinyLlamaPortModel(configuration)
    ```"""

    model_type = "tiny_llama_port"

    vocab_size: int = 128
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int | None = 2
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 512
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = False
    attention_dropout: int | float | None = 0.0

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """Part of `@strict`-powered validation. Validates the architecture of the config."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"The hidden size ({self.hidden_size}) is not a multiple of the number of attention "
                f"heads ({self.num_attention_heads})."
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"The number of attention heads ({self.num_attention_heads}) is not a multiple of the number of "
                f"key/value heads ({self.num_key_value_heads})."
            )


__all__ = ["TinyLlamaPortConfig"]
