#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/blocks.gguf: random blocks of each GGUF block type lily decodes,
and the values llama.cpp's own Python package (gguf-py) decodes them to, as an independent
reference for src/model/gguf_dequant.cpp (tests/model/test_gguf_blocks.cpp reads it).

The file itself is written by gguf-py's GGUFWriter, so reading it also checks lily's parser
against another writer. gguf-py is not a dependency of lily: point --gguf-py at the gguf-py
folder of a llama.cpp checkout outside the tree (../shared/peer/README.md says how to get one);
numpy is Debian's python3-numpy.

    /usr/bin/python3 tools/gguf_block_vectors.py --gguf-py /tmp/llama.cpp/gguf-py

For each type T: tensor "T.blocks" (type T, 4 rows of 2 blocks) and "T.values" (F32, the same
shape, gguf-py's dequantization). The block bytes are random, with the f16 scale fields set to
finite values of either sign, so every code, scale and bit pattern occurs.
"""
import argparse
import sys

import numpy as np

# Offsets of the f16 scale fields inside each block (ggml-common.h's block_* structs).
F16_FIELDS = {"Q4_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_XS": [0],
              "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "IQ4_NL": [0]}
ROWS, BLOCKS_PER_ROW = 4, 2


def random_blocks(gguf, name, rng):
    qtype = gguf.GGMLQuantizationType[name]
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(ROWS, BLOCKS_PER_ROW, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        scale = (rng.uniform(0.001, 0.05, size=(ROWS, BLOCKS_PER_ROW)) * rng.choice([-1, 1], size=(ROWS, BLOCKS_PER_ROW)))
        raw[:, :, off:off + 2] = scale.astype("<f2").view(np.uint8).reshape(ROWS, BLOCKS_PER_ROW, 2)
    return qtype, raw.reshape(ROWS, BLOCKS_PER_ROW * block_bytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf-py", required=True, help="the gguf-py folder of a llama.cpp checkout")
    ap.add_argument("--out", default="tests/fixtures/gguf/blocks.gguf")
    ap.add_argument("--seed", type=int, default=41)
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf  # noqa: E402

    rng = np.random.default_rng(args.seed)
    writer = gguf.GGUFWriter(args.out, arch="lily-block-vectors")
    for name in ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]:
        qtype, raw = random_blocks(gguf, name, rng)
        values = gguf.quants.dequantize(raw, qtype).astype(np.float32)
        writer.add_tensor(f"{name}.blocks", raw, raw_dtype=qtype)
        writer.add_tensor(f"{name}.values", values)
    # Plain types: random values as stored, and gguf-py's conversion back to float.
    x = rng.normal(0, 1, size=(ROWS, 64)).astype(np.float32)
    half = x.astype(np.float16)
    writer.add_tensor("F16.blocks", half)
    writer.add_tensor("F16.values", half.astype(np.float32))
    bf = gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16)
    writer.add_tensor("BF16.blocks", bf, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.add_tensor("BF16.values", gguf.quants.dequantize(bf, gguf.GGMLQuantizationType.BF16).astype(np.float32))
    # The 32-value types llama-quantize falls back to (added after the others: their vectors kept).
    for name in ["Q4_1", "Q5_0", "Q5_1", "IQ4_NL"]:
        qtype, raw = random_blocks(gguf, name, rng)
        writer.add_tensor(f"{name}.blocks", raw, raw_dtype=qtype)
        writer.add_tensor(f"{name}.values", gguf.quants.dequantize(raw, qtype).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
