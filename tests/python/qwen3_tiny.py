"""Reference side of the interop tests and the CPU bench: transformers + PEFT on tiny Qwen3 shapes
(Qwen3-MoE when the config names `num_experts`).

Run with the venv of scripts/setup-torch. Every command writes JSON (to --out or stdout) so the
Rust tests read it with serde_json. The shared commands (make-model, logits, make-adapter,
lora-step, multi) are hf_tiny.py's: see its docstring. This script adds:

  run-output  --adapter DIR --merged DIR --messages MSGS.json --out OUT.json
              a mindxtrain run as transformers users load it: the tokenizer and chat template of the
              adapter's directory (ids of the generation prompt), the adapter over the base its
              adapter_config.json names (AutoPeftModelForCausalLM) and the exported merged model
              (AutoModelForCausalLM), each one's logits on those ids
  bench       --config CFG.json --batch B --seq S --threads T [--steps N] [--warmup W] [--r R] [--alpha A] [--full]
              CPU training tok/s of transformers + PEFT (LoRA on all seven projections, AdamW)
"""

from __future__ import annotations

import json
import time

import hf_tiny  # first: it sets the offline environment transformers reads at import
import torch
from hf_tiny import Command, Family, write_json
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM


def build(fields: dict, dtype: torch.dtype):
    moe = "num_experts" in fields
    config = (Qwen3MoeConfig if moe else Qwen3Config)(**fields)
    model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(config).to(dtype)
    if moe:
        # HF's init draws experts at std 0.02 like every weight; larger ones make the routing,
        # and so a wrong top-k or weighting, visible in the logits.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".mlp." in name:
                    p.mul_(20.0)
    return model


def cmd_run_output(a) -> None:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with open(a.messages) as f:
        messages = json.load(f)
    out = {}
    for name, path in (("adapter", a.adapter), ("merged", a.merged)):
        tok = AutoTokenizer.from_pretrained(path)
        enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = enc["input_ids"]
        out[name + "_ids"] = ids[0].tolist()
        out[name + "_text"] = tok.decode(ids[0])
        loader = AutoPeftModelForCausalLM if name == "adapter" else AutoModelForCausalLM
        model = loader.from_pretrained(path, dtype=torch.float32)
        model.eval()
        with torch.no_grad():
            out[name + "_logits"] = model(input_ids=ids).logits[0].float().tolist()
    write_json(a.out, out)


def cmd_bench(a) -> None:
    from peft import LoraConfig, get_peft_model

    torch.set_num_threads(a.threads)
    with open(a.config) as f:
        config = Qwen3Config(**json.load(f))
    torch.manual_seed(0)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation=a.attn, dtype=torch.float32)
    if not a.full:
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=0.0, target_modules=targets,
                                                 bias="none", task_type="CAUSAL_LM"))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.01)
    ids = torch.randint(0, config.vocab_size, (a.batch, a.seq), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = time.perf_counter() - start
    tokens = a.batch * a.seq * a.steps
    write_json(None, {
        "engine": "transformers+peft", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "batch": a.batch, "seq": a.seq, "steps": a.steps, "seconds": seconds, "tokens_per_second": tokens / seconds,
        "attn_implementation": a.attn, "full": a.full,
    })


def _run_output_args(r) -> None:
    r.add_argument("--adapter", required=True)
    r.add_argument("--merged", required=True)
    r.add_argument("--messages", required=True)
    r.add_argument("--out", required=True)


def _bench_args(b) -> None:
    b.add_argument("--config", required=True)
    b.add_argument("--batch", type=int, required=True)
    b.add_argument("--seq", type=int, required=True)
    b.add_argument("--threads", type=int, required=True)
    b.add_argument("--steps", type=int, default=5)
    b.add_argument("--warmup", type=int, default=2)
    b.add_argument("--r", type=int, default=16)
    b.add_argument("--alpha", type=int, default=32)
    b.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    b.add_argument("--full", action="store_true", help="train every weight (no PEFT)")


if __name__ == "__main__":
    hf_tiny.main(
        __doc__,
        Family(build=build),
        [Command("run-output", _run_output_args, cmd_run_output), Command("bench", _bench_args, cmd_bench)],
    )
