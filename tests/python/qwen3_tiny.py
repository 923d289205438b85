"""Reference side of the interop tests and the CPU bench: transformers + PEFT on tiny Qwen3 shapes
(Qwen3-MoE when the config names `num_experts`).

Run with the venv of scripts/setup-torch. Every command writes JSON (to --out or stdout) so the
Rust tests read it with serde_json. Commands:

  make-model  --config CFG.json --seed N --out DIR [--dtype float32|bfloat16] [--max-shard-size SIZE]
              random Qwen3ForCausalLM saved with save_pretrained (safetensors); DIR/reference.json
              holds every tensor of its state dict (name -> shape, dtype, values as float32)
  logits      --model DIR --ids IDS.json --out OUT.json [--adapter DIR] [--merge]
              logits [batch][seq][vocab] of the model (with a PEFT adapter applied, optionally merged)
  make-adapter --model DIR --seed N --r R --alpha A --targets q_proj,v_proj --out DIR
              a PEFT adapter whose A and B are both random (PEFT's own init leaves B zero)
  lora-step   --model DIR --adapter DIR --batch BATCH.json --lr LR --out DIR
              [--betas B1,B2] [--eps E] [--weight-decay W] [--max-grad-norm M]
              one torch AdamW step on the adapter (loss: HF causal LM, labels shifted inside, -100
              ignored); saves the updated adapter with save_pretrained and DIR/step.json (loss, grad norm)
  run-output  --adapter DIR --merged DIR --messages MSGS.json --out OUT.json
              a mindxtrain run as transformers users load it: the tokenizer and chat template of the
              adapter's directory (ids of the generation prompt), the adapter over the base its
              adapter_config.json names (AutoPeftModelForCausalLM) and the exported merged model
              (AutoModelForCausalLM), each one's logits on those ids
  bench       --config CFG.json --batch B --seq S --threads T [--steps N] [--warmup W] [--r R] [--alpha A] [--full]
              CPU training tok/s of transformers + PEFT (LoRA on all seven projections, AdamW)

  multi       JOBS.json   runs each argv list of JOBS.json ([["logits", "--model", ...], ...]) in this one
              process: interpreter start and imports cost seconds on a busy 2-core machine

IDS.json is [[token, ...], ...]; BATCH.json is {"input_ids": [[...]], "labels": [[...]]}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def write_json(path: str | None, value) -> None:
    text = json.dumps(value)
    if path is None or path == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(path, "w") as f:
            f.write(text)


def load_model(path: str, attn: str = "eager"):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn)
    model.eval()
    return model


def cmd_make_model(a) -> None:
    with open(a.config) as f:
        fields = json.load(f)
    moe = "num_experts" in fields
    config = (Qwen3MoeConfig if moe else Qwen3Config)(**fields)
    torch.manual_seed(a.seed)
    model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(config).to(DTYPES[a.dtype])
    if moe:
        # HF's init draws experts at std 0.02 like every weight; larger ones make the routing,
        # and so a wrong top-k or weighting, visible in the logits.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".mlp." in name:
                    p.mul_(20.0)
    # Norm gains start at exactly 1; perturb them so a loader that ignored them would be caught.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size=a.max_shard_size)
    reference = {
        name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "values": t.float().flatten().tolist()}
        for name, t in model.state_dict().items()
    }
    write_json(os.path.join(a.out, "reference.json"), reference)


def with_adapter(model, adapter: str | None, merge: bool, trainable: bool = False):
    if adapter is None:
        return model
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
    return peft_model.merge_and_unload() if merge else peft_model


def cmd_logits(a) -> None:
    model = with_adapter(load_model(a.model), a.adapter, a.merge)
    with open(a.ids) as f:
        ids = torch.tensor(json.load(f), dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    write_json(a.out, logits.float().tolist())


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


def cmd_make_adapter(a) -> None:
    from peft import LoraConfig, get_peft_model

    model = load_model(a.model)
    config = LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=0.0, target_modules=a.targets.split(","),
                        bias="none", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    torch.manual_seed(a.seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.05)
    peft_model.save_pretrained(a.out)


def cmd_lora_step(a) -> None:
    model = with_adapter(load_model(a.model), a.adapter, merge=False, trainable=True)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    m = sub.add_parser("make-model")
    m.add_argument("--config", required=True)
    m.add_argument("--seed", type=int, required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    m.add_argument("--max-shard-size", default="5GB")

    g = sub.add_parser("logits")
    g.add_argument("--model", required=True)
    g.add_argument("--ids", required=True)
    g.add_argument("--out")
    g.add_argument("--adapter")
    g.add_argument("--merge", action="store_true")

    d = sub.add_parser("make-adapter")
    d.add_argument("--model", required=True)
    d.add_argument("--seed", type=int, required=True)
    d.add_argument("--r", type=int, default=4)
    d.add_argument("--alpha", type=int, default=8)
    d.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    d.add_argument("--out", required=True)

    s = sub.add_parser("lora-step")
    s.add_argument("--model", required=True)
    s.add_argument("--adapter", required=True)
    s.add_argument("--batch", required=True)
    s.add_argument("--lr", type=float, required=True)
    s.add_argument("--betas", default="0.9,0.95")
    s.add_argument("--eps", type=float, default=1e-8)
    s.add_argument("--weight-decay", type=float, default=0.0)
    s.add_argument("--max-grad-norm", type=float, default=0.0)
    s.add_argument("--out", required=True)

    b = sub.add_parser("bench")
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

    r = sub.add_parser("run-output")
    r.add_argument("--adapter", required=True)
    r.add_argument("--merged", required=True)
    r.add_argument("--messages", required=True)
    r.add_argument("--out", required=True)

    u = sub.add_parser("multi")
    u.add_argument("jobs")

    commands = {"make-model": cmd_make_model, "logits": cmd_logits, "make-adapter": cmd_make_adapter,
                "lora-step": cmd_lora_step, "bench": cmd_bench, "run-output": cmd_run_output}
    a = p.parse_args()
    if a.cmd == "multi":
        with open(a.jobs) as f:
            jobs = json.load(f)
        for argv in jobs:
            job = p.parse_args(argv)
            if job.cmd == "multi":
                raise SystemExit("multi does not nest")
            commands[job.cmd](job)
    else:
        commands[a.cmd](a)


if __name__ == "__main__":
    main()
