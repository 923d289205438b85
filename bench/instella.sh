#!/usr/bin/env bash
# Instella-3B against its peer, in ONE call on one GPU machine: bench/run.sh at amd/Instella-3B-Instruct's
# published shape (bench/instella_shapes.py: 36 layers, hidden 2560, 32 heads MHA, FFN 6912, vocab
# 50304) and recipes/instella_3b_lora.yaml's batch: per_device 4 x seq_len 2048, its
# gradient_checkpointing: true is a memory setting: ours fits without it, so the peer runs without it too
# (HF_PEER_GRAD_CKPT=1 measures it with). The peers:
#   ours    the trainer's gpu-step binary, as in bench/run.sh (if it knows the shape)
#   peft    HF transformers 5.17 + PEFT 0.21 on OUR modeling file (tests/python/instella/):
#           transformers ships no Instella and the hub's modeling_instella.py cannot be fetched on
#           the GPU machine; SDPA, bf16, LoRA r16 alpha32 on all seven projections (the recipe
#           adapts q/k/v/o only: HF_PEER_TARGETS=q_proj,k_proj,v_proj,o_proj), AdamW
#   liger   none: liger-kernel has no Instella support; its rows say so (bench/instella_shapes.py)
# Same timing rule, packed batch and peak-memory report as bench/run.sh; lines go to train.jsonl.
#   run(command="COMMIT=<hash> bench/instella.sh", carry=["target-gpu/carry-train"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
export SHAPES=${SHAPES:-instella-3b:4:2048} PEERS=${PEERS:-ours peft liger} JSONL=${JSONL:-train}
export HF_PEER_GRAD_CKPT=${HF_PEER_GRAD_CKPT:-0}
exec bench/run.sh
