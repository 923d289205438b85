"""Reference side of the Instella interop tests: transformers + PEFT on tiny random Instella models
(our implementation of AMD's published architecture, tests/python/instella/; transformers ships
none), with the commands and JSON of qwen3_tiny.py: make-model, logits, make-adapter, lora-step,
multi (hf_tiny.py's docstring says what each does).

make-model's CONFIG.json holds InstellaConfig fields (as amd/Instella-3B-Instruct's config.json:
`rope_theta`, `rope_scaling: null` accepted). The saved directory is laid out as the hub repos are:
weights, config.json with `auto_map`, and modeling_instella.py / configuration_instella.py beside
them, so every command loads it with `trust_remote_code=True` and runs the directory's own copy.

Run with the venv of scripts/setup-torch.
"""

from __future__ import annotations

import hf_tiny  # first: it sets the offline environment transformers reads at import
import torch
from hf_tiny import Family
from instella import InstellaConfig, InstellaForCausalLM, register_auto_classes


def build(fields: dict, dtype: torch.dtype) -> InstellaForCausalLM:
    model = InstellaForCausalLM(InstellaConfig(**fields)).to(dtype)
    # make-model's save_pretrained then writes the code files and auto_map beside the weights.
    register_auto_classes()
    return model


if __name__ == "__main__":
    hf_tiny.main(__doc__, Family(build=build, trust_remote_code=True))
