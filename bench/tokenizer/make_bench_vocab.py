#!/usr/bin/env python3
"""A large synthetic tokenizer.json for bench_tokenizer where HF `tokenizers` is not installed.

    python3 bench/tokenizer/make_bench_vocab.py --merges 8000 --out /tmp/bench_tok.json
    LILY_TOKENIZER=/tmp/bench_tok.json build/bench/tokenizer/bench_tokenizer

Plain greedy BPE over byte-level words (pre-tokenized crudely, not with the Qwen regex): the ids
mean nothing, the point is a vocabulary and merge table of realistic size for timing. The pipeline
fields are the Qwen3.6 ones, so lily loads it like the real file.
"""

import argparse
import collections
import heapq
import json
import random
import re
import sys

sys.path.insert(0, __file__.rsplit("/", 3)[0] + "/tools")
from qwen_tokenizer import ADDED_TOKENS, QWEN35_SPLIT_PATTERN, bytes_to_unicode  # noqa: E402


def corpus(n_words):
    rng = random.Random(0)
    syllables = "ka ri to na me so lu pe an ing tion er the qu ick br own fox 你 好 世 界 สวั สดี ครับ नम स्ते при вет".split()
    words = []
    for _ in range(n_words):
        w = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
        words.append(w if rng.random() < 0.5 else " " + w)
        if rng.random() < 0.1:
            words.append(str(rng.randint(0, 9)))
    return words


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--merges", type=int, default=8000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sym = bytes_to_unicode()
    counts = collections.Counter(corpus(60000))
    words = [[sym[b] for b in w.encode()] for w in counts]
    freq = list(counts.values())
    vocab = {sym[b]: i for i, b in enumerate(sorted(sym))}
    merges = []
    pairs = collections.Counter()
    where = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[a, b] += freq[wi]
            where[a, b].add(wi)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    while len(merges) < args.merges and heap:
        neg, (a, b) = heapq.heappop(heap)
        c = pairs.get((a, b), 0)
        if c != -neg:  # stale entry
            if c > 0:
                heapq.heappush(heap, (-c, (a, b)))
            continue
        if c < 2:
            break
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
        for wi in list(where[a, b]):
            w = words[wi]
            for x, y in zip(w, w[1:]):
                pairs[x, y] -= freq[wi]
            i, out = 0, []
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for x, y in zip(out, out[1:]):
                pairs[x, y] += freq[wi]
                where[x, y].add(wi)
                heapq.heappush(heap, (-pairs[x, y], (x, y)))
        del pairs[a, b]
    base = len(vocab)
    added = [
        {"id": base + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": s}
        for i, (c, s) in enumerate(ADDED_TOKENS)
    ]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None, "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    print(f"{len(vocab)} tokens, {len(merges)} merges -> {args.out}")


if __name__ == "__main__":
    main()
