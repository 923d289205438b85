//! Weights in and out: HF safetensors (single and sharded), PEFT adapters, training state.
