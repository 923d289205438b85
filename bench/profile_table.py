"""Sum an `ncu --csv --page raw` kernel table per kernel name (bench/profile-step.sh).

Only the last decode step counts: the kernels after the second-to-last `sample_*` launch (a
step ends with its sampling, launched after the graph), so weight init and warm-up drop out.
Prints, slowest first: launches, total µs, share of the kernel sum, DRAM bytes moved and the
achieved TB/s, so a step's time can be set against the bytes it must move.
"""
import csv
import sys
from collections import defaultdict


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path):
    rows = list(csv.reader(open(path)))
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head, units, body = rows[start], rows[start + 1], rows[start + 2:]
    col = {name: head.index(name) for name in head}
    scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}
    time_unit = scale.get(units[col["gpu__time_duration.sum"]].strip(), 1e-3)
    byte_unit = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    body = [r for r in body if len(r) >= len(head)]
    ends = [i for i, r in enumerate(body) if r[col["Kernel Name"]].startswith("sample_")]
    if len(ends) >= 2:
        body = body[ends[-2] + 1 : ends[-1] + 1]
    per = defaultdict(lambda: [0, 0.0, 0.0])
    for r in body:
        name = r[col["Kernel Name"]].split("(")[0][:60]
        entry = per[name]
        entry[0] += 1
        entry[1] += number(r[col["gpu__time_duration.sum"]]) * time_unit
        for metric in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            entry[2] += number(r[col[metric]]) * byte_unit.get(units[col[metric]].strip(), 1)
    total = sum(e[1] for e in per.values())
    print(f"{'kernel':<60} {'launches':>8} {'µs':>10} {'share':>6} {'MB':>9} {'TB/s':>6}")
    for name, (n, us, b) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<60} {n:>8} {us:>10.1f} {us / total:>6.1%} {b / 1e6:>9.1f} {b / us / 1e6 if us else 0:>6.2f}")
    print(f"{'sum':<60} {sum(e[0] for e in per.values()):>8} {total:>10.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
