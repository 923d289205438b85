"""Reference side of tests/tests/hub.rs, in the venv of scripts/setup-torch: what huggingface_hub
(and transformers, offline) find in the hub cache the Rust fixture wrote. HF_HUB_CACHE names it.

  check  --model REPO --dataset REPO --data-file PATH [--revision R]
         prints JSON: scan_cache_dir's repos (type, id, refs → commit, files per revision) and its
         warnings; try_to_load_from_cache's paths of the model's config.json and tokenizer.json and
         of the dataset's PATH (at R, default main); the rows of that Parquet file; and what
         transformers' AutoConfig / AutoTokenizer read from the model (layers, vocabulary, whether
         the tokenizer has a chat template)
"""

from __future__ import annotations

import argparse
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def check(args) -> None:
    import pyarrow.parquet as pq
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache
    from transformers import AutoConfig, AutoTokenizer

    info = scan_cache_dir()
    repos = []
    for repo in sorted(info.repos, key=lambda r: (r.repo_type, r.repo_id)):
        revisions = {}
        for rev in repo.revisions:
            revisions[rev.commit_hash] = {
                "refs": sorted(rev.refs),
                "files": sorted(str(f.file_path.relative_to(rev.snapshot_path)) for f in rev.files),
            }
        repos.append({"type": repo.repo_type, "id": repo.repo_id, "revisions": revisions})

    def cached(repo, name, repo_type="model"):
        found = try_to_load_from_cache(repo, name, revision=args.revision, repo_type=repo_type)
        return found if isinstance(found, str) else None

    data_file = cached(args.dataset, args.data_file, "dataset")
    config = AutoConfig.from_pretrained(args.model, revision=args.revision)
    tokenizer = AutoTokenizer.from_pretrained(args.model, revision=args.revision)
    print(json.dumps({
        "repos": repos,
        "warnings": [str(w) for w in info.warnings],
        "config": cached(args.model, "config.json"),
        "tokenizer": cached(args.model, "tokenizer.json"),
        "data_file": data_file,
        "data_rows": pq.read_table(data_file).num_rows if data_file else None,
        "layers": config.num_hidden_layers,
        "vocab": len(tokenizer),
        "chat_template": bool(tokenizer.chat_template),
    }))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--model", required=True)
    c.add_argument("--dataset", required=True)
    c.add_argument("--data-file", required=True)
    c.add_argument("--revision", default=None)
    args = parser.parse_args()
    {"check": check}[args.cmd](args)


if __name__ == "__main__":
    main()
