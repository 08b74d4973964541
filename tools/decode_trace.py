#!/usr/bin/env python3
"""decode_trace.py TRACE.csv: where a decode step's time goes, from `lily bench --decode-trace`.

The CSV holds one record per block of every traced kernel (src/backend/cuda/common/kernel_trace.h):
t0 block start, t1 after its PDL wait, t2..t4 the kernel's own marks (0: none), t5 block end, in ns.
Blocks are grouped into launches (a kind's blocks that start within GAP_US of each other), the
launches put in the order their waits released, and each launch measured against the one before:

  exposed   end of this launch's last block - end of the previous launch's last block: its share
            of the step's critical path
  release   the previous launch's end -> this launch's first block past its wait
  lead      this launch's first block start -> its first wait release (work done before the wait)
  t2..t4    median over blocks of mark - t1 (each kernel's phases after its wait)
  tail      median over blocks of t5 - t1; spread: last block end - first block's wait release
Printed: per step the sum, and per position in the layer (in_proj, mixer, ...) the mean over layers.
"""
import csv
import statistics
import sys

GAP_US = 12.0


def read(path):
    rows, comment = [], ""
    with open(path) as f:
        first = f.readline()
        if first.startswith("#"):
            comment = first[1:].strip()
        else:
            f.seek(0)
        for r in csv.DictReader(f):
            t = [int(r["t%d" % i]) for i in range(6)]
            rows.append((r["kind"], int(r["block"]), int(r["sm"]), t))
    return rows, comment


def launches_of(rows):
    by_kind = {}
    for kind, block, sm, t in rows:
        by_kind.setdefault(kind, []).append((t, block, sm))
    launches = []
    for kind, recs in by_kind.items():
        recs.sort(key=lambda x: x[0][0])
        cur = [recs[0]]
        for rec in recs[1:]:
            if (rec[0][0] - cur[-1][0][0]) / 1e3 > GAP_US:
                launches.append((kind, cur))
                cur = []
            cur.append(rec)
        launches.append((kind, cur))
    out = []
    for kind, recs in launches:
        ts = [r[0] for r in recs]
        t1 = [t[1] for t in ts if t[1]]
        rel = min(t1) if t1 else min(t[0] for t in ts)
        L = {
            "kind": kind,
            "blocks": len(ts),
            "start": min(t[0] for t in ts),
            "release": rel,
            "last_release": max(t1) if t1 else rel,
            "end": max(t[5] for t in ts),
        }
        for i in (2, 3, 4):
            v = [t[i] - t[1] for t in ts if t[i] and t[1]]
            L["m%d" % i] = statistics.median(v) / 1e3 if v else None
        v = [t[5] - t[1] for t in ts if t[1]]
        L["tail"] = statistics.median(v) / 1e3 if v else None
        out.append(L)
    out.sort(key=lambda L: L["release"])
    return out


def split_steps(launches):
    steps, cur = [], []
    for L in launches:
        cur.append(L)
        if L["kind"] == "argmax":
            steps.append(cur)
            cur = []
    if cur:
        steps.append(cur)
    return steps


def position_names(step):
    """in_proj / mixer / out_proj / route / gate_up / down / lm_head by place in the step."""
    names = []
    for i, L in enumerate(step):
        k = L["kind"]
        if k == "moe_route": n = "route"
        elif k == "moe_gate_up": n = "gate_up"
        elif k == "moe_down": n = "down"
        elif k == "deltanet": n = "mixer (deltanet)"
        elif k == "attention_split": n = "mixer (attention split)"
        elif k == "attention_combine": n = "mixer (attention combine)"
        elif k == "argmax": n = "argmax"
        elif k in ("prefetch_gemv", "mma_gemv", "staged_gemv"):
            nxt = step[i + 1]["kind"] if i + 1 < len(step) else ""
            if nxt == "argmax": n = "lm_head (%s)" % k
            elif nxt in ("deltanet", "attention_split"): n = "in_proj (%s)" % k
            elif nxt == "moe_route": n = "out_proj (%s)" % k
            else: n = "in_proj (%s)" % k  # several input projections in a row
        else: n = k
        names.append(n)
    return names


def fmt(v):
    return "    -" if v is None else "%5.2f" % v


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    rows, comment = read(sys.argv[1])
    print(comment)
    steps = split_steps(launches_of(rows))
    full = [s for s in steps if s and s[-1]["kind"] == "argmax"]
    print("%d launches in %d steps (%d complete)" % (sum(map(len, steps)), len(steps), len(full)))
    agg = {}
    prev_end = None  # continues across steps: a step's first launch follows the last one's argmax
    for si, step in enumerate(full):
        names = position_names(step)
        for L, name in zip(step, names):
            L["exposed"] = (L["end"] - prev_end) / 1e3 if prev_end is not None else None
            L["gap"] = (L["release"] - prev_end) / 1e3 if prev_end is not None else None
            L["lead"] = (L["release"] - L["start"]) / 1e3
            L["spread"] = (L["end"] - L["release"]) / 1e3
            prev_end = L["end"] if prev_end is None else max(prev_end, L["end"])
            if si > 0 or len(full) == 1:  # the first step's launches follow the host's launch
                agg.setdefault(name, []).append(L)
        span = (step[-1]["end"] - step[0]["release"]) / 1e3
        print("step %d: %d launches, %.1f us from the first wait release to the last block's end" %
              (si, len(step), span))
    print()
    print("per position, mean over its launches (us; t2..t4 and tail: median block, after its wait)")
    print("%-34s %5s %6s %8s %7s %6s %6s %6s %6s %6s %7s %8s" %
          ("position", "n", "blocks", "exposed", "release", "lead", "t2", "t3", "t4", "tail", "spread", "sum"))
    total = 0.0
    for name, Ls in sorted(agg.items(), key=lambda kv: -sum(L["exposed"] or 0 for L in kv[1])):
        def mean(key):
            v = [L[key] for L in Ls if L.get(key) is not None]
            return sum(v) / len(v) if v else None
        ssum = sum(L["exposed"] or 0 for L in Ls) / max(1, len(full) - (1 if len(full) > 1 else 0))
        total += ssum
        print("%-34s %5d %6d %8s %7s %6s %6s %6s %6s %6s %7s %8.1f" %
              (name, len(Ls), round(mean("blocks")), fmt(mean("exposed")), fmt(mean("gap")), fmt(mean("lead")),
               fmt(mean("m2")), fmt(mean("m3")), fmt(mean("m4")), fmt(mean("tail")), fmt(mean("spread")), ssum))
    print("%-34s %93.1f us per step (traced kernels; untraced launches sit inside the next one's exposed)" %
          ("total", total))


if __name__ == "__main__":
    main()
