"""Our reference implementation of AMD's Instella architecture (amd/Instella-3B, -3B-Instruct) for
transformers 5.

transformers has no `instella` model: the hub repos ship their own modeling_instella.py, loaded with
`trust_remote_code=True`. Neither the hub nor that file is reachable where our tests and GPU peers
run, so this file implements the published architecture from its description, written for this
project (read against AMD's hf_instella/modeling_instella.py on GitHub, not copied):

  * decoder-only, pre-norm: h = x + attn(pre_attention_layernorm(x)), out = h + mlp(pre_feedforward_layernorm(h)),
    then the final `model.norm` and `lm_head` (tied to the embedding only if `tie_word_embeddings`);
  * RMSNorm: normalise in float32, back to the input dtype, times the weight;
  * attention without biases; `q_norm` / `k_norm` are RMSNorms over the WHOLE q / k projection
    (num_heads * head_dim / num_kv_heads * head_dim wide), applied before the split into heads; then
    RoPE (rotate-half form, theta from the config) and causal softmax attention with
    head_dim = hidden_size / num_attention_heads;
  * MLP: down(silu(gate(x)) * up(x)).

Parameter names are the hub checkpoints' (model.layers.{i}.self_attn.q_norm.weight, ...), so their
safetensors load here and PEFT's target_modules (q_proj ... down_proj) name the same modules.
Attention runs eager (below) or through transformers' attention registry (`sdpa`: torch's
scaled_dot_product_attention); masks come from transformers' masking utils, so padding, the KV
cache of `generate` and packed rows (position ids restarting per document, no attention mask,
use_cache=False) are handled as for transformers' own models. The loss is transformers' causal LM loss (labels aligned
with the inputs, shifted inside, -100 ignored).

This file and configuration_instella.py travel beside a saved model's weights (auto_map in its
config.json), so they import nothing of ours but each other.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_instella import InstellaConfig


class InstellaRMSNorm(nn.Module):
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension, the statistics in float32."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # As the published model: the normalised activations return to the input dtype before the
        # gain is applied (what bf16 training saw).
        return self.weight * normed.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class InstellaRotaryEmbedding(nn.Module):
    """cos/sin tables of unscaled RoPE for the given positions (float32 angles, cast to the input dtype)."""

    rope_type = "default"

    def __init__(self, config: InstellaConfig):
        super().__init__()
        self.config = config
        inv_freq, _ = self.compute_default_rope_parameters(config)
        # Non-persistent: derived from the config, never in a checkpoint. `original_inv_freq` is what
        # transformers' weight initialisation looks for to recompute both after a meta-device build.
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)
        self.original_inv_freq = nn.Buffer(inv_freq.clone(), persistent=False)

    @staticmethod
    def compute_default_rope_parameters(config: InstellaConfig, device=None, **kwargs) -> tuple[torch.Tensor, float]:
        dim = config.head_dim
        theta = config.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
        return inv_freq, 1.0

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        device_type = x.device.type if x.device.type != "mps" else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            angles = position_ids[:, :, None].float() * self.inv_freq[None, None, :].float().to(x.device)
            # rotate-half layout: the same frequency for dimension i and i + head_dim/2.
            emb = torch.cat((angles, angles), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [batch, heads, seq, head_dim]; cos/sin [batch, seq, head_dim]."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def eager_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention, the probabilities in float32. `attention_mask` is transformers' additive
    [batch, 1, q, k] mask (0 or the dtype's minimum), causal and padding already in it. Returns the
    output [batch, seq, heads, head_dim] and the probabilities."""
    groups = module.num_key_value_groups
    if groups > 1:  # each KV head serves `groups` consecutive query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return out, probs


class InstellaAttention(nn.Module):
    def __init__(self, config: InstellaConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        q_width = config.num_attention_heads * self.head_dim
        kv_width = config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_width, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_width, bias=False)
        self.o_proj = nn.Linear(q_width, config.hidden_size, bias=False)
        # Over the whole projection, not per head (unlike Qwen3's q/k norms).
        self.q_norm = InstellaRMSNorm(q_width, config.rms_norm_eps)
        self.k_norm = InstellaRMSNorm(kv_width, config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, seq, _ = hidden_states.shape
        heads_shape = (batch, seq, -1, self.head_dim)
        q = self.q_norm(self.q_proj(hidden_states)).view(heads_shape).transpose(1, 2)
        k = self.k_norm(self.k_proj(hidden_states)).view(heads_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(heads_shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention)
        out, probs = attention(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=self.config.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return self.o_proj(out.reshape(batch, seq, -1)), probs


class InstellaMLP(nn.Module):
    def __init__(self, config: InstellaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class InstellaDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: InstellaConfig, layer_idx: int):
        super().__init__()
        self.self_attn = InstellaAttention(config, layer_idx)
        self.mlp = InstellaMLP(config)
        self.pre_attention_layernorm = InstellaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_feedforward_layernorm = InstellaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        attn, _ = self.self_attn(
            self.pre_attention_layernorm(hidden_states),
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            **kwargs,
        )
        hidden_states = hidden_states + attn
        return hidden_states + self.mlp(self.pre_feedforward_layernorm(hidden_states))


class InstellaPreTrainedModel(PreTrainedModel):
    config_class = InstellaConfig
    config: InstellaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["InstellaDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": InstellaDecoderLayer, "attentions": InstellaAttention}


class InstellaModel(InstellaPreTrainedModel):
    def __init__(self, config: InstellaConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(InstellaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = InstellaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = InstellaRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
        if position_ids is None:
            seen = past_key_values.get_seq_length() if past_key_values is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + seen).unsqueeze(0)
        mask = attention_mask
        # `generate` may hand over masks it already built (a dict per attention kind).
        if isinstance(mask, dict):
            mask = mask["full_attention"]
        else:
            mask = create_causal_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
                position_ids=position_ids,
            )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                attention_mask=mask,
                position_embeddings=position_embeddings,
                past_key_values=past_key_values,
                position_ids=position_ids,
                **kwargs,
            )
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden_states),
            past_key_values=past_key_values if use_cache else None,
        )


class InstellaForCausalLM(InstellaPreTrainedModel, GenerationMixin):
    # Tied only when the config says so (transformers checks tie_word_embeddings).
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: InstellaConfig):
        super().__init__(config)
        self.model = InstellaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        out: BaseModelOutputWithPast = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(out.last_hidden_state[:, keep, :])
        loss = None
        if labels is not None:
            # transformers' causal LM loss: shifts the labels by one inside, ignores -100, averages
            # over the counted tokens (or over num_items_in_batch when the trainer passes it).
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=out.past_key_values,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )


__all__ = ["InstellaForCausalLM", "InstellaModel", "InstellaPreTrainedModel"]
