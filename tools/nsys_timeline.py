#!/usr/bin/env python3
"""Per-kernel durations and launch gaps of a decode step as it really runs (in the graph, with
PDL overlap), from an Nsight Systems trace. ncu times kernels one at a time, serialized; this
shows what each costs inside the overlapped step and how much time sits between kernels.

Usage (GPU machine; scripts/device_check.sh PHASES=timeline does this):
  nsys profile --capture-range=cudaProfilerApi --cuda-graph-trace=node -o step \
      lily bench --synthetic --prefill-lengths none --decode-depths 4096 --decode-tokens 8 --repeats 1
  nsys stats --report cuda_gpu_trace --format csv --output step step.nsys-rep
  python3 tools/nsys_timeline.py step_cuda_gpu_trace.csv --steps 8

Prints, per kernel name: launches per step, mean duration, and the mean gap from the end of
the previous kernel to its start (negative: it overlapped its predecessor); then the step's
wall time, the busy time (union of kernel intervals) and the idle time. Standard library only.
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def short_name(name: str) -> str:
    name = name.replace("(anonymous namespace)", "anon").replace("<unnamed>", "anon")
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"<.*>", "", name)
    return re.sub(r"^[\w:]*::", "", name).strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=1, help="decode steps in the trace")
    a = ap.parse_args()
    with open(a.csv, encoding="utf-8", errors="replace") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print("no rows", file=sys.stderr)
        return 1
    start_key = next(k for k in rows[0] if k.startswith("Start"))
    dur_key = next(k for k in rows[0] if k.startswith("Duration"))
    name_key = "Name" if "Name" in rows[0] else next(k for k in rows[0] if "Name" in k)
    kernels = []
    for r in rows:
        name = r[name_key]
        if name.startswith("[CUDA mem") or not r[dur_key]:
            continue  # copies and sets: not kernels
        kernels.append((float(r[start_key]), float(r[dur_key]), short_name(name)))
    kernels.sort()
    count, total, gap = defaultdict(int), defaultdict(float), defaultdict(float)
    prev_end = None
    busy, cur_s, cur_e = 0.0, None, None
    for s, d, n in kernels:
        count[n] += 1
        total[n] += d
        if prev_end is not None:
            gap[n] += s - prev_end
        prev_end = s + d if prev_end is None else max(prev_end, s + d)
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, s + d
        else:
            cur_e = max(cur_e, s + d)
    busy += cur_e - cur_s
    wall = kernels[-1][0] + kernels[-1][1] - kernels[0][0]
    steps = max(1, a.steps)
    print(f"{len(kernels)} kernels; per step: {len(kernels) / steps:.0f} kernels, wall {wall / steps / 1e3:.1f} us, "
          f"busy {busy / steps / 1e3:.1f} us, idle {(wall - busy) / steps / 1e3:.1f} us")
    print(f"{'kernel':44s} {'per step':>8s} {'mean us':>8s} {'us/step':>8s} {'mean gap us':>11s}")
    for n in sorted(total, key=lambda k: -total[k]):
        print(f"{n[:44]:44s} {count[n] / steps:8.1f} {total[n] / count[n] / 1e3:8.2f} "
              f"{total[n] / steps / 1e3:8.1f} {gap[n] / count[n] / 1e3:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
