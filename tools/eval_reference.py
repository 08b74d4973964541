#!/usr/bin/env python3
"""Reference logits of a text, for `lily eval --ref-logits`.

    python3 tools/eval_reference.py --model DIR --text FILE --out FILE.f32
        [--tokenizer TOKENIZER.json] [--max-tokens N] [--dtype float32|bfloat16] [--device cpu|cuda]
    lily eval -m DIR --text FILE --ref-logits FILE.f32 [--max-tokens N]

Tokenizes FILE with DIR/tokenizer.json through the `tokenizers` library (add_special_tokens=False,
as lily does: nothing is added), runs transformers on the same weights (HF or mlx 4-bit layouts,
see tools/reference_logits.py, whose loader and forward this uses) and writes float32
little-endian logits [T, vocab]. Needs torch, transformers 5.x and tokenizers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_logits import forward_logits, load_model_from_dir, log, set_determinism  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json + safetensors)")
    ap.add_argument("--text", required=True, help="UTF-8 text file, tokenized as it is")
    ap.add_argument("--out", required=True, help="output: float32 little-endian [T, vocab]")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: the model directory's)")
    ap.add_argument("--max-tokens", type=int, default=0, help="only the first N tokens (0: all), as lily eval's")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    set_determinism()

    tok = Tokenizer.from_file(a.tokenizer or os.path.join(a.model, "tokenizer.json"))
    with open(a.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    ids = tok.encode(text, add_special_tokens=False).ids
    if a.max_tokens > 0:
        ids = ids[: a.max_tokens]
    if len(ids) < 2:
        sys.exit(f"{a.text}: {len(ids)} token(s); perplexity needs at least 2")
    log(f"{len(ids)} tokens from {a.text}")

    t0 = time.time()
    model, kind = load_model_from_dir(a.model, dtype=getattr(torch, a.dtype), device=a.device)
    log(f"loaded {a.model} via {kind} in {time.time() - t0:.1f}s")
    logits = forward_logits(model, ids)  # [T, vocab] float32
    vocab = model.config.text_config.vocab_size
    assert logits.shape == (len(ids), vocab), logits.shape
    assert torch.isfinite(logits).all(), "non-finite logits"
    logits.contiguous().numpy().astype("<f4").tofile(a.out)
    nll = torch.nn.functional.cross_entropy(logits[:-1].double(), torch.tensor(ids[1:]))
    log(f"wrote {a.out}: [{len(ids)}, {vocab}] float32; transformers perplexity {float(nll.exp()):.6f}")


if __name__ == "__main__":
    main()
