"""AMD's Instella in transformers 5: our reference implementation of the published architecture
(configuration_instella.py, modeling_instella.py) and the helpers to build and save it the way the
hub repos are laid out.

`instella_3b_instruct.json` is amd/Instella-3B-Instruct's config.json as published (hub commit
fc0015153b3d7fcf409161e0ca00226fcbc0c1f0, 784 bytes): the 3B shape the GPU peer builds.
"""

import json
import os

import torch

from .configuration_instella import InstellaConfig
from .modeling_instella import InstellaForCausalLM

PUBLISHED_3B_INSTRUCT = os.path.join(os.path.dirname(__file__), "instella_3b_instruct.json")


def published_3b_config(**overrides) -> InstellaConfig:
    """amd/Instella-3B-Instruct's config as published, read through our config class."""
    with open(PUBLISHED_3B_INSTRUCT) as f:
        fields = json.load(f)
    # The published file names the hub's own code; what reads it here is ours.
    fields.pop("auto_map")
    return InstellaConfig(**{**fields, **overrides})


def random_model(config: InstellaConfig, dtype: torch.dtype = torch.float32, attn: str = "eager") -> InstellaForCausalLM:
    """A randomly initialised Instella (transformers' init, from torch's current seed)."""
    return InstellaForCausalLM._from_config(config, dtype=dtype, attn_implementation=attn)


def register_auto_classes() -> None:
    """From now on, save_pretrained of these classes lays a directory out as the hub repos are: the two
    code files beside the weights and `auto_map` in config.json, so
    `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` loads it (transformers'
    custom-code saving copies a registered class's module file and the files it imports relatively)."""
    InstellaConfig.register_for_auto_class()
    InstellaForCausalLM.register_for_auto_class("AutoModelForCausalLM")


def save_with_code(model: InstellaForCausalLM, out: str, **save_kwargs) -> None:
    """save_pretrained in the hub repos' layout (see register_auto_classes)."""
    register_auto_classes()
    model.save_pretrained(out, **save_kwargs)


__all__ = ["InstellaConfig", "InstellaForCausalLM", "published_3b_config", "random_model", "register_auto_classes", "save_with_code"]
