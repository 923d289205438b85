"""Configuration of AMD's Instella (amd/Instella-3B, -3B-Instruct): our transformers 5 config class for
the published architecture, written for this project (see modeling_instella.py for why we have our
own). It reads the hub's config.json unchanged: `rope_theta` and `rope_scaling: null` there become
transformers 5's `rope_parameters` ({"rope_type": "default", "rope_theta": ...}).

Defaults are those of AMD's InstellaConfig (the class inside the hub repo's modeling_instella.py),
not those of the 3B model: the 3B shape is in its own config.json (`instella_3b_instruct.json` beside
this file holds it as published).
"""

from transformers import PretrainedConfig


class InstellaConfig(PretrainedConfig):
    model_type = "instella"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 50304
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    # None means as many as attention heads (multi-head attention, as every published Instella).
    num_key_value_heads: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    use_cache: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = 50279
    tie_word_embeddings: bool = False
    rope_parameters: dict | None = None
    attention_bias: bool = False
    attention_dropout: float | int = 0.0
    rms_norm_eps: float = 1e-5

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)
        # Refused rather than ignored: the head width, GQA grouping and RoPE kind this implementation
        # carries out are the only ones it accepts.
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}:"
                " Instella's head_dim is hidden_size / num_attention_heads"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads"
                f" {self.num_key_value_heads}"
            )
        if self.attention_bias:
            raise ValueError("attention_bias: true is not implemented (Instella's projections have no bias)")
        rope_type = (self.rope_parameters or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(
                f"rope_parameters.rope_type {rope_type!r} (rope_scaling) is not implemented: only unscaled RoPE,"
                " as amd/Instella-3B(-Instruct) publishes it (rope_scaling: null)"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


__all__ = ["InstellaConfig"]
