"""Reference side of tests/tests/released_layout.rs: transformers' `Qwen3_5ForConditionalGeneration`
(the layout of the released Qwen3.5/3.6 checkpoints: text model under model.language_model, a
vision tower under model.visual, and the MTP layer's mtp.* tensors, which transformers does not
build and skips at load) on tiny random shapes, and PEFT over it.

  make-released --config TEXT.json --seed N --out DIR
              a tiny random model saved in 20KB shards, then MTP tensors (bf16) added to the last
              shard and the index, as the released checkpoints carry them
  logits-released --model DIR --ids IDS.json --out OUT.json [--adapter DIR]
              the text logits [batch][seq][vocab] (with a PEFT adapter applied)

plus hf_tiny.py's `multi`. Run with the venv of scripts/setup-torch.
"""

from __future__ import annotations

import json
import os

import hf_tiny  # first: it sets the offline environment transformers reads at import
import torch
from hf_tiny import Command, Family, with_adapter, write_json
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

VISION = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "patch_size": 4,
          "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 16}


def make_released(a) -> None:
    with open(a.config) as f:
        text = json.load(f)
    torch.manual_seed(a.seed)
    vision = dict(VISION, out_hidden_size=text["hidden_size"])
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision,
                                                           tie_word_embeddings=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("dt_bias"):
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(a.out, max_shard_size="20KB")
    index_path = os.path.join(a.out, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    last = sorted(set(index["weight_map"].values()))[-1]
    tensors = load_file(os.path.join(a.out, last))
    h = text["hidden_size"]
    mtp = {"mtp.fc.weight": torch.randn(h, 2 * h), "mtp.norm.weight": torch.randn(h),
           "mtp.layers.0.mlp.up_proj.weight": torch.randn(8, h)}
    for name, t in mtp.items():
        tensors[name] = t.to(torch.bfloat16)
        index["weight_map"][name] = last
    save_file(tensors, os.path.join(a.out, last), metadata={"format": "pt"})
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)


def logits(a) -> None:
    model = Qwen3_5ForConditionalGeneration.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager")
    model = with_adapter(model.eval(), a.adapter, merge=False)
    with open(a.ids) as f:
        ids = torch.tensor(json.load(f), dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids).logits
    write_json(a.out, out.float().tolist())


def _make_args(p) -> None:
    p.add_argument("--config", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True)


def _logits_args(p) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--adapter")


if __name__ == "__main__":
    own = [Command("make-released", _make_args, make_released), Command("logits-released", _logits_args, logits)]
    hf_tiny.main(__doc__, Family(build=lambda fields, dtype: Qwen3_5ForConditionalGeneration), own)
