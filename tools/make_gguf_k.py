#!/usr/bin/env python3
"""Write the full-size random-weight qwen35moe GGUF of ../shared/peer/make_gguf.py with its big
matrices in Q4_K (and the LM head in Q6_K), for the CPU decode comparison of issue 41.

make_gguf.py (the peer's writer: geometry, metadata, tensor table, parallel writers) is loaded
from --peer and given one more block type; everything else is its own. Q4_K blocks
{f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: random codes, every 6-bit scale and min 17 in the
first four sub-blocks and 1 in the last four (the byte pattern 0x11), dmin = 7.5 d so that each
sub-block's values are zero-mean, d +-std / (17 * 4.61) with a random sign per block.
A real Q4_K_M holds Q4_K for most matrices and Q6_K for the LM head, attn_v and half of the
ffn_down tensors; this file has Q4_K everywhere but the LM head (bytes a weight within ~3%).

Usage: python3 tools/make_gguf_k.py --out synth-q4_k.gguf [--peer ../shared/peer/make_gguf.py]
       (other options as make_gguf.py's; --tiny for a quick check)
"""
import importlib.util
import os
import sys

import numpy as np


def load_peer(path):
    spec = importlib.util.spec_from_file_location("make_gguf", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_gguf"] = mod  # the writer processes find its functions by module name
    spec.loader.exec_module(mod)
    return mod


def main():
    argv = sys.argv[1:]
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peer", "make_gguf.py")
    if "--peer" in argv:
        i = argv.index("--peer")
        peer = argv[i + 1]
        del argv[i:i + 2]
    mg = load_peer(peer)
    mg.QTYPES["q4_k"] = (12, 256, 144)
    mg.FTYPE_MOSTLY_Q4_0 = 15  # general.file_type: LLAMA_FTYPE_MOSTLY_Q4_K_M
    base_chunk = mg.quant_chunk
    q4_std = float(np.sqrt((16 * 16 - 1) / 12.0))

    def quant_chunk(rng, qt, nblocks, std):
        if qt != "q4_k":
            return base_chunk(rng, qt, nblocks, std)
        buf = mg._raw_bytes(rng, nblocks * 144).reshape(nblocks, 144)
        d = std / (17 * q4_std)
        sign = mg._raw_bytes(rng, nblocks) >= 128
        buf[:, 0:2] = np.where(sign, np.float16(d), np.float16(-d)).astype("<f2").view(np.uint8).reshape(nblocks, 2)
        buf[:, 2:4] = np.where(sign, np.float16(7.5 * d), np.float16(-7.5 * d)).astype("<f2").view(np.uint8).reshape(
            nblocks, 2)
        buf[:, 4:16] = 0x11
        return buf

    mg.quant_chunk = quant_chunk
    sys.argv = [sys.argv[0]] + ["--wtype", "q4_k", "--embd-type", "q4_k", "--out-type", "q6_k"] + argv
    return mg.main()


if __name__ == "__main__":
    sys.exit(main())
