"""The Qwen3 shapes the GPU benchmarks use, as random-init HF models (shared by bench/hf_peer.py and
bench/serving_peer.py; our side's shapes are in trainer/examples/gpu_step.rs and serve_bench/)."""
import torch

SHAPES = {  # vocab, hidden, layers, heads, kv heads, head_dim, ffn
    "0.6B": (151936, 1024, 28, 16, 8, 128, 3072),
    "1.7B": (151936, 2048, 28, 16, 8, 128, 6144),
    "8B": (151936, 4096, 36, 32, 8, 128, 12288),
    "30B-A3B": (151936, 2048, 48, 32, 4, 128, 6144),
    "tiny": (1000, 64, 2, 4, 2, 16, 128),  # smoke tests of the scripts' logic
    "tiny-moe": (1000, 64, 2, 4, 2, 16, 128),
}
MOE = {  # experts, experts per token, expert FFN (every layer sparse, as the released models)
    "30B-A3B": (128, 8, 768),
    "tiny-moe": (8, 2, 32),
}
UNTIED = {"8B", "30B-A3B"}


def random_model(shape, device):
    """HF transformers' Qwen3 (Qwen3-MoE for the MoE shapes) of `shape` in bf16 with SDPA attention,
    weights from torch seed 0, built on `device`; the embedding is tied below 8B, as the released
    models. MoE experts run transformers' default implementation (`grouped_mm` on a GPU that has
    it: torch's grouped GEMM, its fastest)."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    vocab, hidden, layers, heads, kv, hd, ffn = SHAPES[shape]
    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=shape not in UNTIED, max_position_embeddings=40960)
    if shape in MOE:
        experts, k, f = MOE[shape]
        cfg = Qwen3MoeConfig(num_experts=experts, num_experts_per_tok=k, moe_intermediate_size=f, norm_topk_prob=True,
                             decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False, **common)
    else:
        cfg = Qwen3Config(**common)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
