"""The HF peers of bench/run.sh, one per process: HF transformers + PEFT (`peft`) and the same with
Liger kernels 0.8.5 (`liger`: RoPE, RMSNorm, SwiGLU and the fused linear cross-entropy, patched in
before the model is built; on Qwen3-MoE shapes also Liger's fused MoE experts). SDPA, bf16,
random-init Qwen3 shapes (bench/qwen3_shapes.py; Qwen3-MoE: transformers' default `grouped_mm`
experts) or Instella shapes (bench/instella_shapes.py: our modeling file of the published
architecture; Liger has none, so the `liger` peer prints error rows saying so) or Qwen3.6 hybrid
shapes (bench/qwen3_6_shapes.py: transformers' qwen3_5 text model, or qwen3_5_moe for the MoE
hybrid, flash-linear-attention's gated delta rule when importable, Liger's Qwen3.5 (MoE) patch for
`liger`; each row records the kernels found), LoRA r=16 alpha=32 on all seven projections (the
hybrids: all twelve, the MoE hybrid also its shared expert's gate; on Qwen3-MoE, PEFT maps the MLP
ones to the experts), torch AdamW on the adapters. Training forwards pass use_cache=False: with the config's use_cache=True transformers
makes a KV cache and then does not recognise packed rows (masking_utils; the packed rows of the
runs before 2026-12 attended across documents).

Environment: HF_PEER_NO_FLA=1 keeps flash-linear-attention out (see below); HF_PEER_GRAD_CKPT=1 turns on transformers' gradient checkpointing (non-reentrant), as
a recipe's `train.gradient_checkpointing: true`; HF_PEER_TARGETS=q_proj,v_proj,... sets the LoRA
targets (default all seven). Each row records both.

    python3 bench/hf_peer.py PEER SHAPE BATCH SEQ WARMUP STEPS [PACKING]

`HF_PEER_DEVICE=cpu` with SHAPE `tiny` is a smoke test of this script's logic where there is no GPU
(numbers meaningless).

Prints one JSON line per batch kind: `uniform` (one document per row, labels = inputs) and, given
PACKING (bench/run.sh's file: one line per row, the lengths of the documents packed into it), the
`packed` batch of those documents: position ids restart at each document and no attention mask is
passed, which is how transformers recognises packed sequences and keeps attention inside each
document (masking_utils.find_packed_sequence_indices; under SDPA that becomes a block-diagonal
causal mask); the first token of each document is not a target of the one before. Before timing it,
`packing_check` is the largest logit difference between a document inside a packed row and the
same document alone (0 up to bf16 rounding when the packing is honoured, O(1) when not).

Per kind: median seconds per step after WARMUP steps, tokens/s, peak memory as the driver reports
it after each step (`nvidia-smi memory.used`, the measure our side uses; the process's maximum so
far, so the packed kind, timed second, reports at least the uniform kind's) and torch's own
max_memory_allocated for that kind alone.
"""
import json
import os
import statistics
import subprocess
import sys
import time

# HF_PEER_NO_FLA=1: transformers runs its own torch gated delta rule instead of
# flash-linear-attention's (a module set to None in sys.modules fails to import, and transformers
# falls back). For machines where fla refuses to run: fla 0.6 refuses Triton < 3.7.1 on Hopper
# (its issue #640, wrong gradients), and the GPU machines' torch 2.11 has Triton 3.6.
if os.environ.get("HF_PEER_NO_FLA") == "1":
    sys.modules["fla"] = None

import torch

import instella_shapes
import qwen3_6_shapes
import qwen3_shapes
from qwen3_shapes import MOE

DEVICE = os.environ.get("HF_PEER_DEVICE", "cuda")


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def used_gib():
    if DEVICE != "cuda":
        return float("nan")
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[0]) / 1024


def random_model(shape, device):
    if shape in instella_shapes.SHAPES:
        return instella_shapes.random_model(shape, device)
    if shape in qwen3_6_shapes.SHAPES:
        return qwen3_6_shapes.random_model(shape, device)
    return qwen3_shapes.random_model(shape, device)


def documents(b, t, packing):
    if packing is None:
        return [[t]] * b
    rows = [[int(n) for n in line.split()] for line in open(packing) if line.strip()]
    assert len(rows) == b and all(sum(r) == t and min(r) > 0 for r in rows), f"{packing}: not {b} rows of {t}"
    return rows


def batch(docs, t, vocab, gen):
    """input_ids, position_ids (restarting per document) and labels (-100 at each document's first
    token: HF shifts labels, so the token before it predicts nothing)."""
    ids = torch.randint(0, vocab, (len(docs), t), device=DEVICE, generator=gen)
    pos = torch.cat([torch.cat([torch.arange(n) for n in row]).unsqueeze(0) for row in docs]).to(DEVICE)
    labels = ids.masked_fill(pos == 0, -100)
    return ids, pos, labels


def packing_check(model, vocab):
    """Logits of a 96-token document after a 64-token one in one packed row, against the same
    document alone (the first token of each document is where a leak would show least: compare all)."""
    with torch.no_grad():
        ids = torch.randint(0, vocab, (1, 160), device=DEVICE)
        pos = torch.cat([torch.arange(64), torch.arange(96)]).unsqueeze(0).to(DEVICE)
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, 64:].float()
        alone = model(input_ids=ids[:, 64:], position_ids=pos[:, 64:], use_cache=False).logits[0].float()
        return round((packed - alone).abs().max().item(), 4), round(alone.abs().max().item(), 4)


def main():
    peer, shape = sys.argv[1], sys.argv[2]
    b, t, warmup, steps = map(int, sys.argv[3:7])
    packing = sys.argv[7] if len(sys.argv) > 7 else None
    if peer == "liger" and shape in instella_shapes.SHAPES:
        for kind in ("uniform",) + (("packed",) if packing else ()):
            print(json.dumps({"who": peer, "shape": shape, "kind": kind, "error": instella_shapes.NO_LIGER}))
        return
    if peer == "liger" and shape in qwen3_6_shapes.SHAPES:
        # Liger's Qwen3.5 patch (its Qwen3.5-MoE one on the MoE shapes): RMSNorm (zero-centred),
        # SwiGLU (the shared expert's on MoE) and the fused linear cross-entropy; its RoPE is not
        # offered for the hybrids (partial rotary on the gated attention).
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3_5, apply_liger_kernel_to_qwen3_5_moe
        apply = apply_liger_kernel_to_qwen3_5_moe if shape in qwen3_6_shapes.MOE else apply_liger_kernel_to_qwen3_5
        apply(rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True)
    elif peer == "liger":
        # Qwen3-MoE: Liger's fused MoE experts too (its `swiglu` patch for transformers 5).
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3, apply_liger_kernel_to_qwen3_moe
        apply = apply_liger_kernel_to_qwen3_moe if shape in MOE else apply_liger_kernel_to_qwen3
        apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True)
    elif peer != "peft":
        sys.exit(f"unknown peer {peer!r} (peft or liger)")
    from peft import LoraConfig, get_peft_model
    t0 = time.perf_counter()
    model = random_model(shape, DEVICE)
    vocab = model.config.vocab_size
    # On a Qwen3-MoE, PEFT maps the MLP targets to the experts' stacked weights (target_parameters:
    # gate_up_proj at rank 2r, down_proj at r), as ours adapts them.
    hybrid = shape in qwen3_6_shapes.SHAPES
    default = qwen3_6_shapes.targets(shape) if hybrid else "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj".split(",")
    targets = os.environ["HF_PEER_TARGETS"].split(",") if os.environ.get("HF_PEER_TARGETS") else default
    grad_ckpt = os.environ.get("HF_PEER_GRAD_CKPT", "0") == "1"
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets))
    init_s = time.perf_counter() - t0
    import importlib.metadata as md
    versions = {name: md.version(name) for name in ("torch", "transformers", "peft")
                + (("liger-kernel",) if peer == "liger" else ())}
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    kinds = [("uniform", documents(b, t, None))] + ([("packed", documents(b, t, packing))] if packing else [])
    peak = 0.0
    for kind, docs in kinds:
        check = None
        if kind == "packed":
            try:
                check = dict(zip(("max_logit_diff", "max_logit"), packing_check(model, vocab)))
            except Exception as e:  # a check that cannot run must not cost the timing
                check = {"error": f"{type(e).__name__}: {e}"[:300]}
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for step in range(warmup + steps):
            ids, pos, labels = batch(docs, t, vocab, gen)
            sync()
            t0 = time.perf_counter()
            # The uniform kind passes no position ids, as a plain causal batch (HF's fastest path).
            extra = {"position_ids": pos} if kind == "packed" else {}
            loss = model(input_ids=ids, labels=labels, use_cache=False, **extra).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if step >= warmup:
                times.append(time.perf_counter() - t0)
            peak = max(peak, used_gib())
            print(f"{peer} {shape} {kind} step {step}: {time.perf_counter() - t0:.3f} s, loss {loss.item():.4f}",
                  file=sys.stderr)
        s = statistics.median(times)
        row = {"who": peer, "shape": shape, "kind": kind, "batch": b, "seq": t,
               "documents": sum(map(len, docs)), "s_per_step": round(s, 4), "tok_per_s": round(b * t / s),
               "peak_gib": round(peak, 1),
               "torch_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if DEVICE == "cuda" else None,
               "init_s": round(init_s, 1), "versions": versions, "gradient_checkpointing": grad_ckpt,
               "lora_targets": targets}
        if hybrid:
            row["kernels"] = qwen3_6_shapes.kernels()
        if check is not None:
            row["packing_check"] = check
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
