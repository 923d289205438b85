"""The PEFT peer of bench/run.sh: HF transformers + PEFT, SDPA, bf16, random-init Qwen3 shapes,
LoRA r=16 alpha=32 on all seven projections, AdamW on the adapters, labels = inputs.
Prints one JSON line per shape: median seconds per step after warm-up, tokens/s, peak memory as the
driver reports it after each step (`nvidia-smi memory.used`: the measure our side uses) and
torch's own max_memory_allocated.

    python3 bench/peft_peer.py SHAPE BATCH SEQ WARMUP STEPS
"""
import json
import statistics
import subprocess
import sys
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen3Config

SHAPES = {  # hidden, layers, heads, ffn (kv heads 8, head_dim 128, vocab 151936 for all)
    "0.6B": (1024, 28, 16, 3072),
    "1.7B": (2048, 28, 16, 6144),
    "8B": (4096, 36, 32, 12288),
}


def used_gib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[0]) / 1024


def main():
    shape, b, t, warmup, steps = sys.argv[1], *map(int, sys.argv[2:6])
    hidden, layers, heads, ffn = SHAPES[shape]
    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=shape != "8B", max_position_embeddings=40960)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    torch.cuda.reset_peak_memory_stats()
    times, peak = [], 0.0
    for step in range(warmup + steps):
        ids = torch.randint(0, cfg.vocab_size, (b, t), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
        peak = max(peak, used_gib())
    s = statistics.median(times)
    print(json.dumps({"who": "peft", "shape": shape, "batch": b, "seq": t, "s_per_step": round(s, 4),
                      "tok_per_s": round(b * t / s), "peak_gib": round(peak, 1),
                      "torch_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}))


if __name__ == "__main__":
    main()
