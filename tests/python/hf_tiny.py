"""The commands the tiny-model interop scripts share (qwen3_tiny.py, instella_tiny.py): transformers +
PEFT as the reference side of the Rust interop tests. Every command writes JSON (to --out or stdout)
so the Rust tests read it with serde_json. A script gives `main` its Family (how a random model of
its architecture is built) and any commands of its own.

  make-model  --config CFG.json --seed N --out DIR [--dtype float32|bfloat16] [--max-shard-size SIZE]
              a random model saved with save_pretrained (safetensors); DIR/reference.json holds every
              tensor of its state dict (name -> shape, dtype, values as float32)
  logits      --model DIR --ids IDS.json --out OUT.json [--adapter DIR] [--merge]
              logits [batch][seq][vocab] of the model (with a PEFT adapter applied, optionally merged)
  make-adapter --model DIR --seed N --r R --alpha A --targets q_proj,v_proj --out DIR
              a PEFT adapter whose A and B are both random (PEFT's own init leaves B zero)
  lora-step   --model DIR --adapter DIR --batch BATCH.json --lr LR --out DIR
              [--betas B1,B2] [--eps E] [--weight-decay W] [--max-grad-norm M]
              one torch AdamW step on the adapter (loss: HF causal LM, labels shifted inside, -100
              ignored); saves the updated adapter with save_pretrained and DIR/step.json (loss, grad norm)
  generate    --model DIR --ids IDS.json --max-new-tokens N --out OUT.json
              each row of IDS's greedy continuation by model.generate with its cache (no end token
              stops it): [[token, ...], ...]
  multi       JOBS.json   runs each argv list of JOBS.json ([["logits", "--model", ...], ...]) in this one
              process: interpreter start and imports cost seconds on a busy 2-core machine

IDS.json is [[token, ...], ...]; BATCH.json is {"input_ids": [[...]], "labels": [[...]]}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Family:
    """What differs between the scripts' architectures."""

    # (config fields, dtype) -> a randomly initialised model in that dtype, drawn from torch's
    # current seed (make-model seeds it first).
    build: Callable[[dict, torch.dtype], torch.nn.Module]
    # Whether a saved directory loads through its own code (auto_map in config.json), as the hub
    # repos of architectures transformers does not ship.
    trust_remote_code: bool = False


@dataclass(frozen=True)
class Command:
    """A script's own command: its arguments and what it does."""

    name: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]


def write_json(path: str | None, value) -> None:
    text = json.dumps(value)
    if path is None or path == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(path, "w") as f:
            f.write(text)


def with_adapter(model, adapter: str | None, merge: bool, trainable: bool = False):
    if adapter is None:
        return model
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
    return peft_model.merge_and_unload() if merge else peft_model


class Commands:
    """The shared commands, bound to one Family."""

    def __init__(self, family: Family):
        self.family = family

    def load_model(self, path: str, attn: str = "eager"):
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation=attn, trust_remote_code=self.family.trust_remote_code
        )
        model.eval()
        return model

    def make_model(self, a) -> None:
        with open(a.config) as f:
            fields = json.load(f)
        torch.manual_seed(a.seed)
        model = self.family.build(fields, DTYPES[a.dtype])
        # Norm gains start at exactly 1; perturb them so a loader that ignored them would be caught.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.add_(torch.randn_like(p) * 0.1)
        model.save_pretrained(a.out, safe_serialization=True, max_shard_size=a.max_shard_size)
        reference = {
            name: {
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "values": t.float().flatten().tolist(),
            }
            for name, t in model.state_dict().items()
        }
        write_json(os.path.join(a.out, "reference.json"), reference)

    def logits(self, a) -> None:
        model = with_adapter(self.load_model(a.model), a.adapter, a.merge)
        with open(a.ids) as f:
            ids = torch.tensor(json.load(f), dtype=torch.long)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        write_json(a.out, logits.float().tolist())

    def generate(self, a) -> None:
        model = self.load_model(a.model)
        # Every one of the N tokens, whatever a random model draws.
        model.generation_config.eos_token_id = None
        with open(a.ids) as f:
            rows = json.load(f)
        out = []
        for row in rows:
            ids = torch.tensor([row], dtype=torch.long)
            # An explicit mask: generate would otherwise take a prompt token equal to the pad id
            # for padding.
            mask = torch.ones_like(ids)
            with torch.no_grad():
                y = model.generate(
                    ids, attention_mask=mask, max_new_tokens=a.max_new_tokens, do_sample=False, pad_token_id=0
                )
            out.append(y[0, len(row) :].tolist())
        write_json(a.out, out)

    def make_adapter(self, a) -> None:
        from peft import LoraConfig, get_peft_model

        model = self.load_model(a.model)
        config = LoraConfig(
            r=a.r,
            lora_alpha=a.alpha,
            lora_dropout=0.0,
            target_modules=a.targets.split(","),
            bias="none",
            task_type="CAUSAL_LM",
        )
        peft_model = get_peft_model(model, config)
        torch.manual_seed(a.seed)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn_like(p) * 0.05)
        peft_model.save_pretrained(a.out)

    def lora_step(self, a) -> None:
        model = with_adapter(self.load_model(a.model), a.adapter, merge=False, trainable=True)
        model.train()
        with open(a.batch) as f:
            batch = json.load(f)
        input_ids = torch.tensor(batch["input_ids"], dtype=torch.long)
        labels = torch.tensor(batch["labels"], dtype=torch.long)
        params = [p for p in model.parameters() if p.requires_grad]
        b1, b2 = (float(x) for x in a.betas.split(","))
        opt = torch.optim.AdamW(params, lr=a.lr, betas=(b1, b2), eps=a.eps, weight_decay=a.weight_decay)
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        if a.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        opt.step()
        model.save_pretrained(a.out)
        write_json(os.path.join(a.out, "step.json"), {"loss": loss.item(), "grad_norm": float(norm)})

    def shared(self) -> list[Command]:
        return [
            Command("make-model", _make_model_args, self.make_model),
            Command("logits", _logits_args, self.logits),
            Command("make-adapter", _make_adapter_args, self.make_adapter),
            Command("lora-step", _lora_step_args, self.lora_step),
            Command("generate", _generate_args, self.generate),
        ]


def _make_model_args(m: argparse.ArgumentParser) -> None:
    m.add_argument("--config", required=True)
    m.add_argument("--seed", type=int, required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    m.add_argument("--max-shard-size", default="5GB")


def _logits_args(g: argparse.ArgumentParser) -> None:
    g.add_argument("--model", required=True)
    g.add_argument("--ids", required=True)
    g.add_argument("--out")
    g.add_argument("--adapter")
    g.add_argument("--merge", action="store_true")


def _generate_args(g: argparse.ArgumentParser) -> None:
    g.add_argument("--model", required=True)
    g.add_argument("--ids", required=True)
    g.add_argument("--max-new-tokens", type=int, required=True)
    g.add_argument("--out", required=True)


def _make_adapter_args(d: argparse.ArgumentParser) -> None:
    d.add_argument("--model", required=True)
    d.add_argument("--seed", type=int, required=True)
    d.add_argument("--r", type=int, default=4)
    d.add_argument("--alpha", type=int, default=8)
    d.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    d.add_argument("--out", required=True)


def _lora_step_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", required=True)
    s.add_argument("--adapter", required=True)
    s.add_argument("--batch", required=True)
    s.add_argument("--lr", type=float, required=True)
    s.add_argument("--betas", default="0.9,0.95")
    s.add_argument("--eps", type=float, default=1e-8)
    s.add_argument("--weight-decay", type=float, default=0.0)
    s.add_argument("--max-grad-norm", type=float, default=0.0)
    s.add_argument("--out", required=True)


def main(doc: str, family: Family, own: list[Command] = ()) -> None:
    """Parses argv into one of the shared commands, the script's own, or `multi`, and runs it."""
    commands = Commands(family).shared() + list(own)
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for c in commands:
        c.add_arguments(sub.add_parser(c.name))
    sub.add_parser("multi").add_argument("jobs")
    run = {c.name: c.run for c in commands}
    a = p.parse_args()
    if a.cmd == "multi":
        with open(a.jobs) as f:
            jobs = json.load(f)
        for argv in jobs:
            job = p.parse_args(argv)
            if job.cmd == "multi":
                raise SystemExit("multi does not nest")
            run[job.cmd](job)
    else:
        run[a.cmd](a)
