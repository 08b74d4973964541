#!/usr/bin/env python3
"""Writes fixtures/tiny-chat/tokenizer.json: a Qwen3.6-pipeline tokenizer small enough for the
random-weight test model tests/fixtures/models/tiny-a (vocab_size 384).

Same pipeline as the real tokenizer (NFC, the Qwen3.5 split regex, byte-level BPE, the 33 added
tokens; spec tokenizer-chat-api.md section 1), with 256 byte tokens, a few merges learned from
chat-template text, and the added tokens right after them. Standard library only; deterministic.
Run: python3 tests/server/make_test_tokenizer.py
"""

import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from qwen_tokenizer import ADDED_TOKENS as ADDED, QWEN35_SPLIT_PATTERN as SPLIT, bytes_to_unicode  # noqa: E402

MODEL_VOCAB = 384
N_MERGES = MODEL_VOCAB - 256 - len(ADDED) - 7  # a few ids of the model stay unused

CORPUS = """
user assistant system You are a helpful assistant. What is the weather in Paris today?
Please answer the question. Hello, how are you? I am fine, thank you. The answer is
function parameter city name type object properties string required description
Tools You have access to the following functions: If you choose to call a function ONLY reply
in the following format with NO suffix: example_function_name example_parameter_1 value_1
Reminder: Function calls MUST follow the specified format: an inner block must be nested within
XML tags Required parameters MUST be specified You may provide optional reasoning for your
function call in natural language BEFORE the function call, but NOT after If there is no function
call available, answer the question like normal with your current knowledge and do not tell the
user about function calls get_weather Get the weather of a city Oslo Berlin London temperature
count to ten one two three four five six seven eight nine ten the of and to in is it that
"""


def main():
    byte_char = bytes_to_unicode()
    vocab = {byte_char[b]: b for b in range(256)}
    # Words as the split regex roughly makes them (letters with an optional leading space).
    words = collections.Counter(re.findall(r" ?[A-Za-z_]+|\S", CORPUS))
    seqs = {w: [byte_char[b] for b in w.encode()] for w in words}
    merges = []
    while len(merges) < N_MERGES:
        pairs = collections.Counter()
        for w, count in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append([a, b])
        vocab[a + b] = len(vocab)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    added = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": special} for i, (c, special) in enumerate(ADDED)]
    assert len(vocab) + len(added) <= MODEL_VOCAB
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tiny-chat", "tokenizer.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {out}: {len(vocab)} BPE tokens ({len(merges)} merges) + {len(added)} added")


if __name__ == "__main__":
    main()
