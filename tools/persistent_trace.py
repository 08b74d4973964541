#!/usr/bin/env python3
"""Where a persistent decode step's time goes, from the CSV of
`bench_persistent_step --trace DEPTH FILE` (one row a task: its block, op, layer, counters and
thread 0's begin / ready / staged / products done / done times in ns from the step's first begin;
0 where the op has no such mark).

Prints: the step's span; per op, the tasks, their summed run time (ready -> done) and wait time
(begin -> ready), the mean and worst run; the products' parts (staging the input row, the
products, the rest); how busy the blocks were; the span of each layer's ops;
and the critical path walked back from the last task to finish (each task's start is held by the
later of its block's previous task and the last producer of the counter it waited on).

    python3 tools/persistent_trace.py trace.csv [--layers N] [--path N]
"""
import argparse
import csv
import signal
from collections import defaultdict


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("block", "index", "layer", "slot", "first", "count", "signal", "wait0", "wait1", "known",
                  "begin", "ready", "staged", "dotted", "done"):
            r[k] = int(r[k])
    return rows


def us(ns):
    return ns / 1000.0


def per_op(rows, span):
    stats = defaultdict(lambda: [0, 0, 0, 0])  # tasks, run, wait, worst run
    for r in rows:
        s = stats[r["op"]]
        run = r["done"] - r["ready"]
        s[0] += 1
        s[1] += run
        s[2] += r["ready"] - r["begin"]
        s[3] = max(s[3], run)
    blocks = len({r["block"] for r in rows})
    print(f"{'op':18} {'tasks':>6} {'run us':>10} {'% busy':>7} {'mean us':>8} {'worst':>7} {'wait us':>10}")
    total_run = sum(s[1] for s in stats.values())
    for op, s in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        print(f"{op:18} {s[0]:6d} {us(s[1]):10.0f} {100 * s[1] / total_run:7.1f} {us(s[1]) / s[0]:8.2f} "
              f"{us(s[3]):7.1f} {us(s[2]):10.0f}")
    print(f"blocks {blocks}: run {us(total_run) / blocks:.0f} us a block on average of the {us(span):.0f} us span "
          f"({100 * total_run / (blocks * span):.0f}% busy), waiting the rest")


def phases(rows):
    """Mean time of each part of a product task: ready -> input staged -> products (thread 0's warp) -> done."""
    acc = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        if r["staged"] and r["dotted"]:
            a = acc[r["op"]]
            a[0] += 1
            a[1] += r["staged"] - r["ready"]
            a[2] += r["dotted"] - r["staged"]
            a[3] += r["done"] - r["dotted"]
    if not acc:
        return
    print(f"\n{'op':18} {'tasks':>6} {'stage us':>9} {'products':>9} {'rest us':>8}   (means)")
    for op, a in sorted(acc.items()):
        print(f"{op:18} {a[0]:6d} {us(a[1]) / a[0]:9.2f} {us(a[2]) / a[0]:9.2f} {us(a[3]) / a[0]:8.2f}")


def per_layer(rows, limit):
    spans = defaultdict(lambda: [1 << 62, 0])
    for r in rows:
        s = spans[(r["layer"], r["op"])]
        s[0] = min(s[0], r["ready"])
        s[1] = max(s[1], r["done"])
    order = ["embed", "in_proj", "deltanet_core", "attention_split", "attention_combine", "out_proj", "router",
             "top_k", "gate_up", "down", "lm_head", "advance"]
    layers = sorted({k[0] for k in spans})
    print("\nlayer: each op's first ready .. last done (us)")
    for layer in layers[:limit]:
        parts = [f"{op} {us(spans[(layer, op)][0]):.1f}..{us(spans[(layer, op)][1]):.1f}" for op in order
                 if (layer, op) in spans]
        print(f"{layer:3d}: " + ", ".join(parts))
    firsts = [min(spans[(l, op)][0] for op in order if (l, op) in spans) for l in layers]
    lasts = [max(spans[(l, op)][1] for op in order if (l, op) in spans) for l in layers]
    print(f"layer period (first ready to next first ready): "
          f"{us(firsts[-1] - firsts[0]) / max(1, len(layers) - 1):.1f} us; last done {us(lasts[-1]):.0f} us")


def critical_path(rows, limit):
    producers = defaultdict(list)
    for r in rows:
        if r["signal"] >= 0:
            producers[r["signal"]].append(r)
    by_block = defaultdict(dict)
    for r in rows:
        by_block[r["block"]][r["index"]] = r
    t = max(rows, key=lambda r: r["done"])
    path = []
    while t is not None and len(path) < limit:
        path.append(t)
        prev = by_block[t["block"]].get(t["index"] - 1)
        latest = None
        for c in (t["wait0"], t["wait1"]):
            if c >= 0 and producers[c]:
                p = max(producers[c], key=lambda r: r["done"])
                if latest is None or p["done"] > latest["done"]:
                    latest = p
        # The wait held the task if its ready came after the previous task of the block was done.
        if latest is not None and (prev is None or latest["done"] > prev["done"]):
            t = latest
        else:
            t = prev
    print(f"\ncritical path, last first ({len(path)} tasks shown):")
    print(f"{'op':18} {'layer':>5} {'block':>5} {'first':>6} {'begin':>9} {'ready':>9} {'done':>9} {'run':>7}")
    by_op = defaultdict(int)
    for r in path:
        by_op[r["op"]] += r["done"] - r["ready"]
    for r in path[:60]:
        print(f"{r['op']:18} {r['layer']:5d} {r['block']:5d} {r['first']:6d} {us(r['begin']):9.1f} "
              f"{us(r['ready']):9.1f} {us(r['done']):9.1f} {us(r['done'] - r['ready']):7.2f}")
    print("run time on the path by op: " + ", ".join(f"{op} {us(v):.0f} us" for op, v in
                                                    sorted(by_op.items(), key=lambda kv: -kv[1])))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--path", type=int, default=100000)
    args = ap.parse_args()
    rows = load(args.csv)
    span = max(r["done"] for r in rows) - min(r["begin"] for r in rows)
    print(f"{len(rows)} tasks, step span {us(span):.0f} us")
    per_op(rows, span)
    phases(rows)
    per_layer(rows, args.layers)
    critical_path(rows, args.path)


if __name__ == "__main__":
    main()
