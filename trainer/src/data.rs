//! Training data: JSONL readers, tokenization, chat template, packing and the task generator.
