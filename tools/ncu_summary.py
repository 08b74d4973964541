#!/usr/bin/env python3
"""Sum an Nsight Compute CSV (gpu__time_duration per kernel) by kernel name.

Usage: ncu --csv --metrics gpu__time_duration.sum ... > ncu.csv
       python3 tools/ncu_summary.py ncu.csv [--steps N]

Prints, per kernel name (template arguments dropped), the launch count, the total time and
its share; with --steps N also the per-step numbers (totals divided by N). ncu serializes
kernels, so the shares matter more than the absolute sum. Standard library only: it runs on
the GPU machine.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def short_name(name: str, keep_templates: bool = False) -> str:
    name = name.replace("(anonymous namespace)", "anon").replace("<unnamed>", "anon")
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)   # arguments
    if not keep_templates:
        name = re.sub(r"<.*>", "", name)  # template arguments
    name = re.sub(r"^[\w:]*::", "", name)  # namespaces
    return name.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--templates", action="store_true", help="keep template arguments in the names")
    a = ap.parse_args()
    lines = open(a.csv, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("no ncu CSV header found", file=sys.stderr)
        return 1
    total = defaultdict(float)
    count = defaultdict(int)
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "ns")
        v = float(row["Metric Value"].replace(",", ""))
        v *= {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3}.get(unit, 1e-3)
        k = short_name(row["Kernel Name"], a.templates)
        total[k] += v
        count[k] += 1
    s = sum(total.values())
    n = sum(count.values())
    print(f"{n} kernels, {s:.1f} us in all; per step (/{a.steps}): {n / a.steps:.0f} kernels, {s / a.steps:.1f} us")
    print(f"{'kernel':<60} {'launches':>9} {'us/step':>10} {'us/launch':>10} {'share':>7}")
    for k in sorted(total, key=total.get, reverse=True):
        print(f"{k:<60} {count[k] / a.steps:>9.0f} {total[k] / a.steps:>10.1f} {total[k] / count[k]:>10.2f} "
              f"{100 * total[k] / s:>6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
