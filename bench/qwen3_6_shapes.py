"""The Qwen3.6 hybrid shapes the GPU peer uses (bench/hf_peer.py), as random-init models of
transformers' own `qwen3_5` text model (Qwen3_5ForCausalLM); our side's shape is in
trainer/examples/gpu_step.rs.

  qwen3.6-27b    Qwen/Qwen3.6-27B's text model as its model card and config.json publish it: 64
                 layers (3 Gated DeltaNet : 1 gated attention), hidden 5120, FFN 17408, attention
                 24 q / 4 kv heads of 256 with RoPE on a quarter (theta 1e7), Gated DeltaNet 16 q/k
                 and 48 v heads of 128 with a 4-tap conv, vocab 248320, untied head
  qwen3.6-35b-a3b  Qwen/Qwen3.6-35B-A3B's text model (transformers' qwen3_5_moe, Qwen3_5MoeForCausalLM)
                 as its config.json publishes it: 40 layers (3:1 as above), hidden 2048, every MLP
                 sparse: 256 experts of 512, 8 routed per token (top-k renormalised, no balance loss:
                 output_router_logits off) plus a shared expert of 512 gated by sigmoid(shared_expert_gate);
                 attention 16 q / 2 kv heads of 256, RoPE on a quarter (theta 1e7), Gated DeltaNet 16
                 q/k and 32 v heads of 128, vocab 248320, untied head
  qwen3.6-tiny   a smoke test of the scripts' logic (HF_PEER_DEVICE=cpu)
  qwen3.6-tiny-moe  the same with experts

transformers runs its fastest path when the kernels are importable (its hub-kernel fallbacks): the
gated delta rule from flash-linear-attention (`fla`, Triton; carried as a wheel in .whl/) and the
causal conv1d from the `causal_conv1d` package (a CUDA extension with no wheel on PyPI for this
torch: without it transformers runs its torch conv1d path, which `kernels()` reports).
"""
import torch

# The LoRA targets of these shapes: PEFT's `all-linear` minus the head, all twelve projections; on
# the MoE shapes `gate_proj`/`up_proj`/`down_proj` match the shared expert's, and its
# `shared_expert_gate` is a Linear too, while the routed experts are 3-D parameters PEFT leaves
# alone (ours adapts the same: TargetModule::EVERY on a hybrid).
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
           "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]
MOE_TARGETS = TARGETS + ["shared_expert_gate"]

SHAPES = {  # vocab, hidden, layers, heads, kv heads, head_dim, ffn, (linear qk heads, v heads, head dim)
    "qwen3.6-27b": (248320, 5120, 64, 24, 4, 256, 17408, (16, 48, 128)),
    "qwen3.6-35b-a3b": (248320, 2048, 40, 16, 2, 256, 512, (16, 32, 128)),
    "qwen3.6-tiny": (1000, 64, 4, 4, 2, 16, 128, (2, 4, 16)),
    "qwen3.6-tiny-moe": (1000, 64, 4, 4, 2, 16, 32, (2, 4, 16)),
}
# The MoE shapes' experts: count, routed per token, expert FFN (the shared expert's is `ffn` above).
MOE = {
    "qwen3.6-35b-a3b": (256, 8, 512),
    "qwen3.6-tiny-moe": (8, 2, 32),
}


def targets(shape):
    return MOE_TARGETS if shape in MOE else TARGETS


def kernels():
    """Which fast kernels transformers found (what the peer ran on)."""
    found = {}
    for name, module in (("fla", "fla"), ("causal_conv1d", "causal_conv1d")):
        try:
            if __import__(module) is None:
                raise ImportError(f"{module} kept out (HF_PEER_NO_FLA=1)")
            found[name] = True
        except Exception as e:  # an absent or broken package is a fact of the row, not an error
            found[name] = f"{type(e).__name__}: {e}"[:200]
    return found


def random_model(shape, device):
    """transformers' Qwen3_5ForCausalLM (Qwen3_5MoeForCausalLM for a MoE shape) of `shape` in bf16
    with SDPA attention, weights from torch seed 0, built on `device`."""
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

    vocab, hidden, layers, heads, kv, hd, ffn, (lk, lv, lhd) = SHAPES[shape]
    common = dict(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=1e-6,
        linear_num_key_heads=lk, linear_num_value_heads=lv, linear_key_head_dim=lhd, linear_value_head_dim=lhd,
        linear_conv_kernel_dim=4, full_attention_interval=4, tie_word_embeddings=False,
        max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    if shape in MOE:
        experts, per_token, expert_ffn = MOE[shape]
        cfg = Qwen3_5MoeTextConfig(num_experts=experts, num_experts_per_tok=per_token,
                                   moe_intermediate_size=expert_ffn, shared_expert_intermediate_size=ffn,
                                   output_router_logits=False, **common)
    else:
        cfg = Qwen3_5TextConfig(intermediate_size=ffn, **common)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
