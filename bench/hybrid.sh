#!/usr/bin/env bash
# Qwen3.6-27B (the Gated DeltaNet hybrid) against its peers, in ONE call on one GPU machine:
# bench/run.sh at the published text model's shape (bench/qwen3_6_shapes.py; ours in
# trainer/examples/gpu_step.rs), LoRA r16 alpha32 on all twelve projections on both sides, one row of
# 4096 tokens by default. The peers: HF transformers + PEFT with flash-linear-attention's Triton
# gated delta rule (the wheels in .whl/: fla_core, flash_linear_attention, einops; without them
# transformers runs its torch loop and the row's `kernels` says so; causal-conv1d has no wheel for
# this torch, so transformers' torch conv runs), and the same + Liger's Qwen3.5 patch (RMSNorm,
# SwiGLU, fused linear cross-entropy). Both sides checkpoint activations as the recipe asks. Same timing rule, packed batch and peak-memory report as
# bench/run.sh; lines go to train.jsonl.
#   run(command="COMMIT=<hash> bench/hybrid.sh", carry=["target-gpu/carry-train", ".whl"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
export SHAPES=${SHAPES:-qwen3.6-27b:1:4096} PEERS=${PEERS:-ours peft liger} JSONL=${JSONL:-train}
# The recipe's gradient_checkpointing: true, on both sides (CHECKPOINTING=0 measures without: at
# 1 x 4096 the HF peers then run out of the H200's memory).
CHECKPOINTING=${CHECKPOINTING:-1}
export GPU_STEP_CHECKPOINTING=$CHECKPOINTING HF_PEER_GRAD_CKPT=$CHECKPOINTING
exec bench/run.sh
