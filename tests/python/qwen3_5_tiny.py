"""Reference side of the Qwen3.5/3.6 interop tests: transformers' own `Qwen3_5ForCausalLM` (the
dense text model: Gated DeltaNet layers mixed with gated attention) or, when CONFIG.json has
`num_experts`, `Qwen3_5MoeForCausalLM` (every MLP routed experts plus a gated shared expert), and
PEFT on tiny random shapes, with the shared commands of hf_tiny.py (make-model, logits,
make-adapter, lora-step, multi; its docstring says what each does). make-model's CONFIG.json holds
`Qwen3_5TextConfig` (or `Qwen3_5MoeTextConfig`) fields.

transformers runs the Gated DeltaNet in its torch fallback here (no flash-linear-attention on the
CPU venv), the code our kernels are checked against in delta_rule_reference.rs.

Run with the venv of scripts/setup-torch.
"""

from __future__ import annotations

import hf_tiny  # first: it sets the offline environment transformers reads at import
import torch
from hf_tiny import Family
from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig


def build(fields: dict, dtype: torch.dtype) -> torch.nn.Module:
    if "num_experts" in fields:
        model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**fields)).to(dtype)
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**fields)).to(dtype)
    # dt_bias starts at exactly 1 and the projections at std 0.02, which leaves the gates nearly
    # constant; moved off that, a wrong gate or decay shows in the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("dt_bias"):
                p.add_(torch.randn_like(p) * 0.5)
            elif "linear_attn.in_proj" in name:
                p.mul_(10.0)
            elif name.endswith("shared_expert_gate.weight") or name.endswith("mlp.gate.weight"):
                # σ(0.02-scale logits) is ~0.5 for every token, and a router that weak makes
                # near-ties; scaled up, a wrong gate or routing shows in the logits.
                p.mul_(20.0)
    return model


if __name__ == "__main__":
    hf_tiny.main(__doc__, Family(build=build))
