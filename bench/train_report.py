"""bench/run.sh's report: reads the rows each side printed (one per shape and batch kind), appends
one JSON line per metric to TRAIN_JSONL and prints the ratio table.

    python3 bench/train_report.py RESULTS_JSONL TRAIN_JSONL GPU DRIVER COMMIT

Metrics, per shape and batch kind (`uniform`, `packed`) and per peer (`hf+peft`,
`hf+peft+liger`, `unsloth`): `train_tok_per_s/...` (ratio = ours / peer: above 1 is faster),
`train_peak_gib/...` (ratio = ours / peer: below 1 is less memory) and `train_mfu/...` (model FLOPs
of one document per row over each side's step time, against the bf16 GEMM ceiling our binary
measured in the same call). A side that failed or was not run gives a line with its `error` and no
value, so a later reader sees what was missing and why.
"""
import datetime
import re
import json
import sys

PEERS = {"peft": "hf+peft", "liger": "hf+peft+liger", "unsloth": "unsloth"}


def mfu(ours, side):
    """`side`'s MFU: our count of model FLOPs per step over its step time, against our ceiling."""
    if "step_flops" in ours and "s_per_step" in side:
        return ours["step_flops"] / side["s_per_step"] / ours["gemm_flops_per_s"]
    return None


def main():
    results, out, gpu, driver, commit = sys.argv[1:6]
    rows = [json.loads(l) for l in open(results) if l.strip().startswith("{")]
    by = {}
    for r in rows:
        by.setdefault((r["shape"], r.get("kind", "uniform")), {})[r["who"]] = r
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = []
    for (shape, kind), sides in by.items():
        o = sides.get("ours", {})
        size = f"{o.get('batch', '?')}x{o.get('seq', '?')}" if "batch" in o else next(
            (f"{r['batch']}x{r['seq']}" for r in sides.values() if "batch" in r), "?")
        for who, peer in PEERS.items():
            if who not in sides:
                continue
            p = sides[who]
            for metric, ov, pv in (("train_tok_per_s", o.get("tok_per_s"), p.get("tok_per_s")),
                                   ("train_peak_gib", o.get("peak_gib"), p.get("peak_gib")),
                                   ("train_mfu", mfu(o, o), mfu(o, p))):
                line = {"date": date, "gpu": gpu, "driver": driver, "commit": commit,
                        "metric": f"{metric}/{shape}/{size}/{kind}", "ours": ov, "peer": peer, "peer_value": pv,
                        "ratio": ov / pv if ov is not None and pv else None}
                for side, r in (("ours", o), ("peer", p)):
                    if "error" in r:
                        line[f"{side}_error"] = r["error"]
                for key in ("documents", "packing_check", "versions", "torch_allocated_gib", "gradient_checkpointing",
                            "lora_targets"):
                    if key in p and metric == "train_tok_per_s":
                        line[f"peer_{key}"] = p[key]
                if metric == "train_tok_per_s" and "documents" in o:
                    line["ours_documents"] = o["documents"]
                lines.append(line)
    with open(out, "a") as f:
        for l in lines:
            f.write(json.dumps(l) + "\n")

    # A missing value prints as "-" in the column's width.
    fmt = lambda v, spec: format(v, spec) if isinstance(v, (int, float)) else format("-", re.sub(r"\.\d+[f%]", "", spec))
    print(f"\n{gpu}, driver {driver}, commit {commit}: tok/s (ratio = ours / peer), peak GiB (driver), MFU")
    print(f"{'shape':<6} {'kind':<8} {'ours':>8} {'peft':>8} {'liger':>8} {'/peft':>6} {'/liger':>7} "
          f"{'ours GiB':>8} {'peft GiB':>8} {'liger GiB':>9} {'ours MFU':>8} {'liger MFU':>9}")
    for (shape, kind), sides in by.items():
        o, pe, li = sides.get("ours", {}), sides.get("peft", {}), sides.get("liger", {})
        tok = lambda r: r.get("tok_per_s")
        ratio = lambda r: tok(o) / tok(r) if tok(o) and tok(r) else None
        print(f"{shape:<6} {kind:<8} {fmt(tok(o), '>8')} {fmt(tok(pe), '>8')} {fmt(tok(li), '>8')} "
              f"{fmt(ratio(pe), '>6.2f')} {fmt(ratio(li), '>7.2f')} {fmt(o.get('peak_gib'), '>8')} "
              f"{fmt(pe.get('peak_gib'), '>8')} {fmt(li.get('peak_gib'), '>9')} {fmt(mfu(o, o), '>8.1%')} {fmt(mfu(o, li), '>9.1%')}")
    errors = {(r["who"], r["error"]) for r in rows if "error" in r}
    for who, error in sorted(errors):
        print(f"{who}: {error}")
    print(f"{len(lines)} lines appended to {out}")


if __name__ == "__main__":
    main()
