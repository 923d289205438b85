"""Reference side of the data interop tests (tests/tests/data_interop.rs), in the venv of
scripts/setup-torch. Commands (JSON out):

  tables   --jsonl IN --out DIR
           the records of IN written as users have them: DIR/hub (the hub's Parquet layout: two train
           shards with small row groups, one test shard), DIR/single.arrow (Arrow IPC file format),
           DIR/saved (datasets.save_to_disk, a DatasetDict with a train split), DIR/renamed.parquet
           (`messages` as `conversations`), DIR/string_messages.parquet (`messages` as strings),
           DIR/int_messages.parquet (`messages` as lists of integers), DIR/corrupt.parquet (a page of
           row group 1 overwritten); prints {"corrupt_row_group": 1}
  render   --cases CASES.json --out OUT.json
           for each case {template, tokenizer_dir, messages, tools, add_generation_prompt,
           enable_thinking}: transformers' apply_chat_template text and ids, and the assistant mask:
           return_assistant_tokens_mask for templates with {% generation %} (what TRL's
           assistant_only_loss uses), else TRL's prompt/completion rule applied turn by turn
           (render(messages[:i], add_generation_prompt=True) is the prompt of assistant turn i,
           render(messages[:i+1]) its completion)
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tables(args) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import datasets

    rows = [json.loads(line) for line in open(args.jsonl) if line.strip()]
    table = pa.Table.from_pylist(rows)
    out = args.out
    os.makedirs(f"{out}/hub/data", exist_ok=True)
    half = len(rows) // 2
    train = table.slice(0, len(rows) - 3)
    pq.write_table(train.slice(0, half), f"{out}/hub/data/train-00000-of-00002.parquet", row_group_size=7)
    pq.write_table(train.slice(half), f"{out}/hub/data/train-00001-of-00002.parquet", row_group_size=5,
                   compression="zstd")
    pq.write_table(table.slice(len(rows) - 3), f"{out}/hub/data/test-00000-of-00001.parquet")
    with pa.ipc.new_file(f"{out}/single.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=6):
            w.write_batch(batch)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(f"{out}/saved")
    pq.write_table(table.rename_columns(["conversations" if c == "messages" else c for c in table.column_names]),
                   f"{out}/renamed.parquet")
    pq.write_table(pa.table({"messages": [json.dumps(r["messages"]) for r in rows]}), f"{out}/string_messages.parquet")
    pq.write_table(pa.table({"messages": [[1, 2]] * 4}), f"{out}/int_messages.parquet")
    path = f"{out}/corrupt.parquet"
    pq.write_table(train, path, row_group_size=7, compression="none")
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    with open(path, "r+b") as f:
        f.seek(column.data_page_offset)
        f.write(b"\xff" * 24)
    print(json.dumps({"corrupt_row_group": 1}))


def render(args) -> None:
    from transformers import PreTrainedTokenizerFast

    cases = json.load(open(args.cases))
    tokenizers = {}
    results = []
    for case in cases:
        tok = tokenizers.get(case["tokenizer_dir"])
        if tok is None:
            tok = tokenizers[case["tokenizer_dir"]] = PreTrainedTokenizerFast.from_pretrained(case["tokenizer_dir"])
        template = open(case["template"]).read()
        kwargs = dict(chat_template=template, tools=case["tools"], enable_thinking=case["enable_thinking"])

        def apply(messages, generation_prompt, **extra):
            return tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, **kwargs, **extra)

        messages = case["messages"]
        text = apply(messages, case["add_generation_prompt"], tokenize=False)
        out = apply(messages, case["add_generation_prompt"], tokenize=True, return_dict=True)
        ids = list(out["input_ids"])
        if "{% generation %}" in template or "{%- generation" in template:
            masked = apply(messages, False, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            mask = list(masked["assistant_masks"])
        else:
            # TRL's prompt/completion rule, turn by turn, on the whole rendering's tokens.
            full = apply(messages, False, tokenize=False)
            enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
            mask = [0] * len(enc["input_ids"])
            for i, m in enumerate(messages):
                if m["role"] != "assistant":
                    continue
                prompt = apply(messages[:i], True, tokenize=False)
                turn = apply(messages[: i + 1], False, tokenize=False)
                if len(turn) > len(prompt) and turn.startswith(prompt) and full.startswith(turn):
                    start, end = len(prompt.encode()), len(turn.encode())
                    for t, (a, b) in enumerate(enc["offset_mapping"]):
                        a, b = len(full[:a].encode()), len(full[:b].encode())
                        if a < end and start < max(b, a + 1):
                            mask[t] = 1
        results.append({"text": text, "ids": ids, "mask": mask})
    json.dump(results, open(args.out, "w"))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tables")
    t.add_argument("--jsonl", required=True)
    t.add_argument("--out", required=True)
    r = sub.add_parser("render")
    r.add_argument("--cases", required=True)
    r.add_argument("--out", required=True)
    args = parser.parse_args()
    {"tables": tables, "render": render}[args.cmd](args)


if __name__ == "__main__":
    main()
