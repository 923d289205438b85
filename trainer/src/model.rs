//! Qwen3 with an explicit forward/backward per layer, LoRA and full fine-tuning.
