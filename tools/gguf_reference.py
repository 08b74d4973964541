#!/usr/bin/env python3
"""Regenerates lily's GGUF fixtures and llama.cpp's reference outputs on them.

Everything under tests/fixtures/models/tiny-a/gguf/ and the vocabulary-only GGUFs of
tests/fixtures/tokenizer/ come from here:

  1. tiny-a-tokenizer: tiny-a has 384 embedding rows, so its tokenizer is lily-tiny's cut to fit:
     the 256 byte tokens, the first 95 merges (ids 256..350: each merge's parts are earlier ids)
     and the 33 added tokens renumbered 351..383 -> gguf/tokenizer/{tokenizer,tokenizer_config}.json.
     llama.cpp loads no GGUF without a vocabulary, and `lily run` on the GGUF tests the tokenizer
     built from it (tests/model/test_gguf_tokenizer.cpp).
  2. tools/hf_to_gguf.py: tiny-a's hf-fused checkpoint with that tokenizer as tiny-a-bf16.gguf and
     tiny-a-q8_0.gguf (our converter), and the two vocabulary-only GGUFs of the tokenizer tests.
  3. llama-quantize (llama.cpp, built outside the tree: ../shared/peer/README.md) from
     tiny-a-bf16.gguf into each type of QUANTS it accepts at this geometry.
  4. tools/llama_logits.cpp (built against that llama.cpp's libllama, see its header) on every
     file: float32 logits of the 150 ids of tiny-a/reference.json (one batch, positions 0..149)
     -> llama-logits-<type>.f32 [150, 384], and 64 greedy tokens from reference.json's
     greedy_prompt; the same on the file's weights dequantized to F32 by llama-quantize
     (llama-logits-<type>-as-f32.f32: llama.cpp's matmuls then round no activations, as lily's
     do not) -> llama-reference.json, which also records the llama.cpp version, the commands,
     each file's sha256 and the types llama-quantize fell back to.

    /usr/bin/python3 tools/gguf_reference.py --llama /work/peer/llama.cpp/build/bin \\
        --logits-tool /work/peer/llama_logits

Only numpy (Debian's python3-numpy) is needed here; --skip-llama does steps 1-2 alone.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_A = os.path.join(ROOT, "tests/fixtures/models/tiny-a")
OUT = os.path.join(TINY_A, "gguf")
LILY_TINY = os.path.join(ROOT, "models/lily-tiny")
TOKENIZER_FIXTURE = os.path.join(ROOT, "tests/fixtures/tokenizer")
# llama-quantize type names, and the file suffix lily's tests look for.
QUANTS = [("Q4_0", "q4_0"), ("Q4_K_M", "q4_k_m"), ("Q5_K_M", "q5_k_m"), ("Q6_K", "q6_k"), ("IQ4_XS", "iq4_xs")]
N_GREEDY = 64


def cut_tokenizer(src_dir, out_dir, vocab_size):
    """lily-tiny's tokenizer cut to `vocab_size` ids: bytes, the first merges, the added tokens."""
    tok = json.load(open(os.path.join(src_dir, "tokenizer.json"), encoding="utf-8"))
    vocab, merges, added = tok["model"]["vocab"], tok["model"]["merges"], tok["added_tokens"]
    n_merges = vocab_size - 256 - len(added)
    by_id = {i: t for t, i in vocab.items()}
    keep = {by_id[i]: i for i in range(256)}
    for r in range(n_merges):
        left, right = merges[r] if isinstance(merges[r], list) else merges[r].split(" ")
        assert left in keep and right in keep and vocab[left + right] == 256 + r, f"merge {r} is not a new id"
        keep[left + right] = 256 + r
    tok["model"]["vocab"] = keep
    tok["model"]["merges"] = merges[:n_merges]
    first = 256 + n_merges
    tok["added_tokens"] = [dict(a, id=first + k) for k, a in enumerate(added)]
    cfg = json.load(open(os.path.join(src_dir, "tokenizer_config.json"), encoding="utf-8"))
    cfg["added_tokens_decoder"] = {str(first + k): {x: a[x] for x in a if x != "id"} for k, a in enumerate(added)}
    # eos stays tiny-a's generation_config.json one (id 2), which the GGUF tests expect.
    cfg.pop("eos_token", None)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def our_files():
    converter = [sys.executable, os.path.join(ROOT, "tools/hf_to_gguf.py")]
    tokenizer_dir = os.path.join(OUT, "tokenizer")
    cut_tokenizer(LILY_TINY, tokenizer_dir, 384)
    for kind in ["bf16", "q8_0"]:
        run(converter + [os.path.join(TINY_A, "hf-fused"), "--tokenizer-dir", tokenizer_dir, "--type", kind,
                         "--out", os.path.join(OUT, f"tiny-a-{kind}.gguf")])
    run(converter + [LILY_TINY, "--vocab-only", "--out", os.path.join(TOKENIZER_FIXTURE, "lily-tiny-vocab.gguf")])
    run(converter + [TOKENIZER_FIXTURE, "--vocab-only", "--out", os.path.join(TOKENIZER_FIXTURE, "tokenizer.gguf")])


def llama_version(llama_bin):
    out = subprocess.run([os.path.join(llama_bin, "llama-bench"), "--version"], capture_output=True, text=True)
    return " ".join((out.stdout + out.stderr).strip().splitlines()[:2])


def quantize(llama_bin, record):
    """llama-quantize bf16 -> each type; the types it refuses are recorded with its message."""
    src = os.path.join(OUT, "tiny-a-bf16.gguf")
    for qtype, suffix in QUANTS:
        dst = os.path.join(OUT, f"tiny-a-{suffix}.gguf")
        cmd = [os.path.join(llama_bin, "llama-quantize"), src, dst, qtype, "2"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        entry = {"command": " ".join(["llama-quantize", "tiny-a-bf16.gguf", os.path.basename(dst), qtype, "2"])}
        if res.returncode != 0:
            entry["refused"] = (res.stdout + res.stderr).strip().splitlines()[-3:]
            if os.path.exists(dst):
                os.remove(dst)
        else:
            # A row of 128 or 64 values is no whole block of 256: llama-quantize falls back to
            # Q5_0 (for Q4_K), Q5_1 (Q5_K), Q8_0 (Q6_K) or IQ4_NL (IQ4_XS) for such tensors.
            entry["fallbacks"] = [l.strip() for l in res.stdout.splitlines() + res.stderr.splitlines()
                                  if "required fallback" in l]
        record["quantize"][suffix] = entry


SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read_table(data):
    """A GGUF's metadata bytes, tensor table [(name, ne, type, offset)], alignment, data start."""
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)

    def skip_string(p):
        return p + 8 + struct.unpack_from("<Q", data, p)[0]

    def skip_value(p, vtype):
        if vtype == 8:
            return skip_string(p)
        if vtype == 9:
            etype, count = struct.unpack_from("<IQ", data, p)
            p += 12
            for _ in range(count):
                p = skip_value(p, etype)
            return p
        return p + SCALAR_BYTES[vtype]

    alignment = 32
    for _ in range(n_kv):
        key_end = skip_string(pos)
        key = data[pos + 8:key_end].decode()
        vtype = struct.unpack_from("<I", data, key_end)[0]
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", data, key_end + 4)[0]
        pos = skip_value(key_end + 4, vtype)
    kv_bytes = data[24:pos]
    infos = []
    for _ in range(n_tensors):
        name_end = skip_string(pos)
        name = data[pos + 8:name_end].decode()
        n_dims = struct.unpack_from("<I", data, name_end)[0]
        ne = struct.unpack_from(f"<{n_dims}Q", data, name_end + 4)
        ttype, offset = struct.unpack_from("<IQ", data, name_end + 4 + 8 * n_dims)
        infos.append((name, ne, ttype, offset))
        pos = name_end + 4 + 8 * n_dims + 12
    return kv_bytes, infos, alignment, pos + (-pos % alignment)


GGML_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K",
              14: "Q6_K", 20: "IQ4_NL", 23: "IQ4_XS", 30: "BF16"}


def tensor_types(path):
    """How many tensors of each type a GGUF holds."""
    _, infos, _, _ = read_table(open(path, "rb").read())
    counts = {}
    for _, _, t, _ in infos:
        counts[GGML_NAMES.get(t, str(t))] = counts.get(GGML_NAMES.get(t, str(t)), 0) + 1
    return dict(sorted(counts.items()))


def widen_bf16(path):
    """Rewrites a GGUF with its BF16 and Q8_0 tensors as F32: llama-quantize never converts the
    router (ffn_gate_inp), so its F32 output keeps it BF16 (llama.cpp's converter) or Q8_0 (ours).
    Metadata bytes are copied as they are."""
    import numpy as np
    data = open(path, "rb").read()
    kv_bytes, infos, alignment, data_start = read_table(data)
    blobs = []
    for name, ne, ttype, offset in infos:
        n = int(np.prod(ne))
        start = data_start + offset
        if ttype == 0:  # F32
            raw = data[start:start + 4 * n]
        elif ttype == 30:  # BF16: the top half of an f32
            raw = (np.frombuffer(data, dtype="<u2", count=n, offset=start).astype("<u4") << 16).tobytes()
        elif ttype == 8:  # Q8_0 (our converter's router): blocks of f16 d, 32 x int8
            blocks = np.frombuffer(data, dtype=np.uint8, count=n // 32 * 34, offset=start).reshape(-1, 34)
            d = blocks[:, :2].copy().view("<f2").astype(np.float32)
            raw = (d * blocks[:, 2:].view(np.int8).astype(np.float32)).astype("<f4").tobytes()
        else:
            raise SystemExit(f"{name}: type {ttype} left after llama-quantize F32")
        blobs.append(raw)
    head = data[:24] + kv_bytes
    table, offset = b"", 0
    for (name, ne, _, _), blob in zip(infos, blobs):
        table += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", len(ne))
        table += b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", 0, offset)
        offset += len(blob) + (-len(blob) % alignment)
    out = head + table
    out += b"\0" * (-len(out) % alignment)
    with open(path, "wb") as f:
        f.write(out)
        for blob in blobs:
            f.write(blob + b"\0" * (-len(blob) % alignment))


def llama_outputs(logits_tool, path, logits_path, ids, prompt):
    cmd = [logits_tool, path, logits_path, str(N_GREEDY), ",".join(map(str, ids)), ",".join(map(str, prompt))]
    return json.loads(run(cmd, capture_output=True, text=True).stdout)


def reference_outputs(llama_bin, logits_tool, record, scratch):
    """Per file: llama.cpp on it as it is, and on its weights dequantized to F32 by llama-quantize
    (the same weight values, llama.cpp's matmuls then in fp32 as lily's: no activation rounding)."""
    ref = json.load(open(os.path.join(TINY_A, "reference.json")))
    ids, prompt = ref["ids"], ref["greedy_prompt"]
    for name in sorted(os.listdir(OUT)):
        if not (name.startswith("tiny-a-") and name.endswith(".gguf")):
            continue
        kind = name[len("tiny-a-"):-len(".gguf")]
        path = os.path.join(OUT, name)
        logits = f"llama-logits-{kind}.f32"
        out = llama_outputs(logits_tool, path, os.path.join(OUT, logits), ids, prompt)
        as_f32 = os.path.join(scratch, f"{kind}-as-f32.gguf")
        run([os.path.join(llama_bin, "llama-quantize"), "--allow-requantize", path, as_f32, "F32", "2"],
            capture_output=True)
        widen_bf16(as_f32)
        logits_f32 = f"llama-logits-{kind}-as-f32.f32"
        out_f32 = llama_outputs(logits_tool, as_f32, os.path.join(OUT, logits_f32), ids, prompt)
        os.remove(as_f32)
        record["files"][kind] = {"sha256": sha256(path), "bytes": os.path.getsize(path), "n_vocab": out["n_vocab"],
                                 "tensor_types": tensor_types(path),
                                 "logits": logits, "greedy": out["greedy"],
                                 "logits_as_f32": logits_f32, "greedy_as_f32": out_f32["greedy"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama", help="llama.cpp's build/bin (llama-quantize)")
    ap.add_argument("--logits-tool", help="tools/llama_logits.cpp built against that llama.cpp")
    ap.add_argument("--skip-llama", action="store_true", help="only our own converter's files")
    args = ap.parse_args()
    our_files()
    if args.skip_llama:
        return
    ref = json.load(open(os.path.join(TINY_A, "reference.json")))
    record = {"llama_cpp": llama_version(args.llama),
              "source": "llama.cpp bundled in the npm package node-llama-cpp@3.22.1 (../shared/peer/README.md), "
                        "CPU build -DGGML_NATIVE=ON",
              "logits_command": "llama_logits FILE.gguf OUT.f32 64 IDS PROMPT (tools/llama_logits.cpp: one batch "
                                "of the 150 ids at positions 0..149, logits for all; then greedy from the prompt)",
              "ids": ref["ids"], "greedy_prompt": ref["greedy_prompt"], "quantize": {}, "files": {}}
    quantize(args.llama, record)
    record["as_f32_command"] = "llama-quantize --allow-requantize FILE.gguf FILE-as-f32.gguf F32 2"
    reference_outputs(args.llama, args.logits_tool, record, tempfile.mkdtemp())
    with open(os.path.join(OUT, "llama-reference.json"), "w") as f:
        text = json.dumps(record, indent=1)
        # id lists on one line each
        f.write(re.sub(r"\[\s+([-0-9,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("ids",)}, indent=1)[:3000])


if __name__ == "__main__":
    main()
