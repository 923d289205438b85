"""The PyTorch FSDP2 peer of the multi-GPU full-SFT bench (scripts/gpu-test-ranks, group `fullsft`):
a full fine-tune of a random-init HF transformers Qwen3ForCausalLM at one of bench/qwen3_shapes.py's
shapes, sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`: each decoder layer, then the root),
the standard FSDP mixed precision (sharded fp32 parameters, bf16 compute, gradients reduced in fp32:
`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`), activation checkpointing on every
decoder layer (torch's non-reentrant `checkpoint_wrapper`), SDPA attention, fused AdamW on the sharded
parameters as our full-SFT recipe has it (lr 1e-5, betas 0.9/0.95, no weight decay, the global
gradient norm clipped at 1.0: our default, and HF Trainer's), and HF's causal-LM loss on random
token ids.

    torchrun --standalone --nproc-per-node 2 bench/fsdp_peer.py [--shape 8B] [--batch 1] [--seq 2048]
        [--steps 8] [--warmup 2] [--param-dtype fp32|bf16] [--device cuda|cpu]

The model is built on the meta device and materialised already sharded (`to_empty` after
`fully_shard`, then a seeded init: normal(0, 0.02) for matrices and embeddings, ones for the norms,
RoPE's frequencies recomputed), so the whole model never sits on one GPU or in host memory.
`--param-dtype bf16` keeps the sharded parameters (and so the gradients and AdamW's moments) in bf16:
the fallback where fp32 master weights do not fit (scripts/gpu-test-ranks retries with it when the
fp32 run runs out of memory, and says so).

Each step (forward, backward, optimizer step, zero_grad) is timed between CUDA synchronizations;
the step's time is the slowest rank's. Reported: the median over the steps after `--warmup` (of
`--steps` in all) of the global tokens/s (every rank's batch x seq over the step's time), and the
peak memory per GPU: torch's `max_memory_allocated` (the largest over the ranks; `peak_mem_gb`,
in GiB = 2^30 bytes, as `mem_unit` says) and `max_memory_reserved` (`peak_reserved_gb`), each rank's
in the `_per_rank` lists. Rank 0 prints that as one JSON object, the last line of its stdout; the
per-step lines and notes go to stderr.

NCCL is used as the caller's environment sets it: NCCL_NVLS_ENABLE=0 (no NVLink multicast) is
exported by scripts/gpu-test-ranks and never changed here. PYTORCH_CUDA_ALLOC_CONF defaults to
`expandable_segments:True` (torchtitan's setting for FSDP2, less fragmentation) unless the caller
sets it; the JSON records the value used.

`--device cpu --shape tiny` (gloo, CPU processes) is a smoke test of this script's logic where there
is no GPU: the same FSDP2 sharding, mixed precision, checkpointing and fused AdamW, numbers
meaningless:

    torchrun --standalone --nproc-per-node 2 bench/fsdp_peer.py --device cpu --shape tiny --steps 3 --warmup 1
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402  (after the allocator setting, read when CUDA starts)
import torch.distributed as dist  # noqa: E402

from qwen3_shapes import MOE, SHAPES, random_model  # noqa: E402

GIB = 2**30


def args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="8B", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=1, help="rows per GPU per step")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=8, help="steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--param-dtype", default="fp32", choices=["fp32", "bf16"],
                   help="dtype of the sharded parameters (fp32: FSDP's standard fp32 master weights)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--grad-clip", type=float, default=1.0,
                   help="global gradient-norm clip, 0 for none (1.0: our recipes' default, and HF Trainer's)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = p.parse_args()
    if a.steps <= a.warmup:
        p.error(f"--steps ({a.steps}) must exceed --warmup ({a.warmup})")
    if a.shape in MOE:
        p.error(f"{a.shape} is a MoE shape: this peer trains the dense Qwen3 shapes")
    return a


def log(rank, msg):
    print(f"fsdp_peer[{rank}]: {msg}", file=sys.stderr, flush=True)


def build(a, device, mesh):
    """The model on the meta device, checkpointed and sharded per decoder layer and at the root,
    then materialised shard by shard on `device` and initialised from a seed."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.param_dtype]
    model = random_model(a.shape, "meta")  # bf16 on meta: no memory, shapes from qwen3_shapes.SHAPES
    model.to(dtype)
    model.config.use_cache = False
    layers = model.model.layers
    for i, layer in enumerate(layers):
        # Non-reentrant checkpointing of the whole decoder layer (torchtitan's "full" AC): only the
        # layer's input is kept; the backward recomputes the rest.
        layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)  # the embedding, final norm and head
    model.to_empty(device=device)
    # The same seed on every rank: on CUDA, DTensor's random ops draw each shard's part of one
    # stream; on a CPU mesh (the smoke test, with a warning) each rank draws its shard alone.
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # RMSNorm weights (input, post-attention, q/k and final norms)
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
        for m in model.modules():  # RoPE's buffers were left uninitialised by to_empty
            if "RotaryEmbedding" in type(m).__name__ and hasattr(m, "inv_freq"):
                fn = m.compute_default_rope_parameters if m.rope_type == "default" else ROPE_INIT_FUNCTIONS[m.rope_type]
                inv, _ = fn(m.config)
                m.inv_freq.copy_(inv)
                if hasattr(m, "original_inv_freq"):
                    m.original_inv_freq.copy_(inv)
    model.train()
    return model


def main():
    a = args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    from torch.distributed.device_mesh import init_device_mesh

    if a.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
        sync = torch.cuda.synchronize
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        sync = lambda: None  # noqa: E731
    mesh = init_device_mesh(a.device, (world,))
    if rank == 0:
        log(rank, f"world {world}, {a.shape}, {a.batch}x{a.seq} a GPU, params {a.param_dtype}, "
                  f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE', '(unset)')}, "
                  f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}")
    t0 = time.perf_counter()
    model = build(a, device, mesh)
    n_params = sum(p.numel() for p in model.parameters())  # DTensors: the global count
    # Sharded state per GPU: parameters and gradients in the parameter dtype, AdamW's two moments
    # (torch keeps them in the parameter dtype).
    each = {"fp32": 4, "bf16": 2}[a.param_dtype]
    state_gib = n_params * each * 4 / world / GIB
    # AdamW as our recipe runs it: betas (0.9, 0.95) (our default), no weight decay (the recipe's).
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    sync()
    init_s = time.perf_counter() - t0
    if rank == 0:
        log(rank, f"{n_params / 1e9:.2f}B parameters; sharded parameters + gradients + AdamW moments "
                  f"~{state_gib:.1f} GiB a GPU before activations and gathered layers; init {init_s:.1f} s")
    vocab = model.config.vocab_size
    gen = torch.Generator(device=device).manual_seed(1 + rank)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    step = 0
    try:
        for step in range(a.steps):
            ids = torch.randint(0, vocab, (a.batch, a.seq), device=device, generator=gen)
            sync()
            s0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            if a.grad_clip > 0:  # over DTensors: each rank's shards' norms, all-reduced
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            dt = time.perf_counter() - s0
            times.append(dt)
            mem = f", {torch.cuda.max_memory_allocated() / GIB:.1f} GiB peak" if a.device == "cuda" else ""
            log(rank, f"step {step + 1}/{a.steps}: {dt:.3f} s, loss {loss.item():.4f}{mem}")
    except torch.OutOfMemoryError as e:
        last = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        log(rank, f"out of memory at step {step + 1} with --param-dtype {a.param_dtype} "
                  f"(sharded state ~{state_gib:.1f} GiB a GPU): {last}")
        sys.stdout.flush()
        os._exit(3)  # the other ranks wait in a collective: torchrun ends them when this one exits

    # The step's time is the slowest rank's (they meet in every collective, so they differ little).
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    times = t.tolist()
    if a.device == "cuda":
        mem = torch.tensor([torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB],
                           dtype=torch.float64, device=device)
    else:
        mem = torch.tensor([float("nan"), float("nan")], dtype=torch.float64, device=device)
    mems = [torch.zeros_like(mem) for _ in range(world)]
    dist.all_gather(mems, mem)
    if rank == 0:
        timed = times[a.warmup:]
        tokens = world * a.batch * a.seq
        s = statistics.median(timed)
        alloc = [round(m[0].item(), 2) for m in mems] if a.device == "cuda" else None
        reserved = [round(m[1].item(), 2) for m in mems] if a.device == "cuda" else None
        import importlib.metadata as md
        row = {
            "peer": "fsdp2", "tokens_per_s": round(tokens / s, 1),
            "peak_mem_gb": max(alloc) if alloc else None, "peak_reserved_gb": max(reserved) if reserved else None,
            "mem_unit": "GiB", "steps": a.steps, "warmup": a.warmup, "world": world, "batch": a.batch,
            "seq": a.seq, "param_dtype": a.param_dtype, "shape": a.shape, "device": a.device,
            "s_per_step": round(s, 4), "step_s": [round(x, 4) for x in times],
            "tokens_per_step": tokens, "peak_mem_gb_per_rank": alloc, "peak_reserved_gb_per_rank": reserved,
            "params": n_params, "init_s": round(init_s, 1), "activation_checkpointing": "every decoder layer",
            "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32"}, "optimizer": "AdamW fused, betas (0.9, 0.95), weight decay 0",
            "lr": a.lr, "grad_clip": a.grad_clip, "attention": "sdpa",
            "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "versions": {n: md.version(n) for n in ("torch", "transformers")},
        }
        if a.device == "cuda":
            row["gpu"] = torch.cuda.get_device_name(device)
        print(json.dumps(row), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
