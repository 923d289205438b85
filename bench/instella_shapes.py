"""The Instella shapes the GPU peer uses (bench/hf_peer.py), as random-init models of our own
implementation of AMD's published architecture (tests/python/instella/: transformers ships no
Instella, and the hub repo's modeling file cannot be fetched on the GPU machines; ours travels with
the repository).

  instella-3b    amd/Instella-3B-Instruct's config.json as published: 36 layers, hidden 2560, 32 heads
                 (MHA, head_dim 80), FFN 6912, vocab 50304, RoPE theta 10000, 4096 positions, untied head
  instella-tiny  a smoke test of the scripts' logic (HF_PEER_DEVICE=cpu)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from instella import InstellaConfig, published_3b_config, random_model as instella_model  # noqa: E402

SHAPES = {
    "instella-3b": published_3b_config,
    "instella-tiny": lambda: InstellaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=4096, bos_token_id=0, eos_token_id=0, pad_token_id=1),
}

# Why the Liger peer has no Instella row: liger-kernel 0.8.5 patches architectures by their
# transformers module (apply_liger_kernel_to_llama, _to_olmo2, ...; by model_type for an instance)
# and has no entry for `instella`, which transformers does not ship either. Its OLMo 2 patch does
# not fit: OLMo 2 normalises after attention and MLP, Instella before.
NO_LIGER = ("liger-kernel 0.8.5 has no Instella support (it patches the architectures transformers ships, "
            "by module; no instella entry, and its OLMo 2 patch is post-norm where Instella is pre-norm)")


def random_model(shape, device):
    """Our InstellaForCausalLM of `shape` in bf16 with SDPA attention, weights from torch seed 0,
    built on `device`."""
    torch.manual_seed(0)
    with torch.device(device):
        return instella_model(SHAPES[shape](), dtype=torch.bfloat16, attn="sdpa")
