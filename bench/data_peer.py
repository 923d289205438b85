"""The peer of `mindxtrain-bench data` (tests/src/bench/data.rs): Hugging Face `datasets` and a
tokenizer `map`, as a TRL-style SFT pipeline prepares chat data. Runs in the venv of
scripts/setup-torch. Commands:

  prepare --dir DIR    DIR/train.jsonl -> DIR/train.parquet (pyarrow, row groups of 1,000)
  bench   --dir DIR --seq-len N --num-proc P
                       load DIR/train.parquet with datasets, render every conversation with
                       DIR/qwen3.jinja and tokenise it with DIR/tok (the completion mask by TRL's
                       prompt/completion rule: the prompt is the conversation up to its last
                       assistant turn with the generation prompt), then pack input ids and masks
                       into rows of N (transformers' `group_texts`). Prints
                       {"examples", "rows", "seconds", ...} as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cpu() -> float:
    """CPU seconds (user + system) of this process and its finished children (map's workers)."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def prepare(args) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in open(f"{args.dir}/train.jsonl") if line.strip()]
    pq.write_table(pa.Table.from_pylist(rows), f"{args.dir}/train.parquet", row_group_size=1000)


def bench(args) -> None:
    import datasets
    from transformers import PreTrainedTokenizerFast

    start = time.perf_counter()
    cpu_start = _cpu()

    datasets.disable_progress_bars()
    tok = PreTrainedTokenizerFast.from_pretrained(f"{args.dir}/tok")
    template = open(f"{args.dir}/qwen3.jinja").read()
    seq_len = args.seq_len
    with tempfile.TemporaryDirectory() as cache:
        ds = datasets.load_dataset("parquet", data_files=f"{args.dir}/train.parquet", split="train", cache_dir=cache)

        def encode(batch):
            conversations = batch["messages"]
            prompts = [c[:-1] for c in conversations]
            full = tok.apply_chat_template(conversations, chat_template=template, tokenize=True, return_dict=True)
            prompt = tok.apply_chat_template(
                prompts, chat_template=template, tokenize=True, return_dict=True, add_generation_prompt=True
            )
            ids, masks = [], []
            for f, p in zip(full["input_ids"], prompt["input_ids"]):
                ids.append(f)
                masks.append([0] * len(p) + [1] * (len(f) - len(p)))
            return {"input_ids": ids, "completion_mask": masks}

        ds = ds.map(encode, batched=True, num_proc=args.num_proc, remove_columns=ds.column_names)
        examples = len(ds)
        tokens = sum(len(ids) for ids in ds["input_ids"])

        def group_texts(batch):
            out = {}
            for key in ("input_ids", "completion_mask"):
                flat = [t for seq in batch[key] for t in seq]
                total = len(flat) // seq_len * seq_len
                out[key] = [flat[i : i + seq_len] for i in range(0, total, seq_len)]
            return out

        packed = ds.map(group_texts, batched=True, num_proc=args.num_proc)
        packed = packed.with_format("numpy")[:]  # every packed row in memory, as ours ends
        rows = len(packed["input_ids"])
    seconds = time.perf_counter() - start
    cpu_seconds = _cpu() - cpu_start
    print(json.dumps({"examples": examples, "tokens": tokens, "rows": rows, "seconds": seconds, "cpu_seconds": cpu_seconds, "num_proc": args.num_proc,
                      "datasets": datasets.__version__}))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--dir", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--dir", required=True)
    b.add_argument("--seq-len", type=int, required=True)
    b.add_argument("--num-proc", type=int, default=1)
    args = parser.parse_args()
    {"prepare": prepare, "bench": bench}[args.cmd](args)


if __name__ == "__main__":
    main()
