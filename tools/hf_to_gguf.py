#!/usr/bin/env python3
"""Writes a Hugging Face Qwen3.5/3.6 MoE checkpoint (qwen3_5_moe) as a GGUF file of llama.cpp's
`qwen35moe` layout (spec section 5c), for lily's tests: tests/fixtures/models/tiny-a/gguf/.

It applies the transforms llama.cpp's converter applies, from the spec, so the GGUF loader has to
undo them: the DeltaNet V heads moved from grouped to tiled order (rows of in_proj_qkv's V part,
in_proj_z, in_proj_a, in_proj_b, A_log, dt_bias, conv1d's V channels; columns of out_proj),
ssm_a = -exp(A_log), +1 on every zero-centred norm, conv1d squeezed, gate_up_proj split into
ffn_gate_exps and ffn_up_exps. The MTP head (mtp.*), when the checkpoint has it, becomes block
N = the main layer count with its nextn tensors (eh_proj = mtp.fc, enorm, hnorm,
shared_head_norm), block_count N + 1 and nextn_predict_layers 1; --no-mtp leaves it out (block_count
N, no nextn key: the older GGUF form).

The tokenizer goes in as llama.cpp's converter writes it (convert_hf_to_gguf.py get_vocab_base,
_set_vocab_gpt2 and gguf-py's SpecialVocab), from tokenizer.json and tokenizer_config.json of the
model directory (or --tokenizer-dir): tokenizer.ggml.model "gpt2", tokenizer.ggml.pre ("qwen35" or
"qwen2", recognised here by the Split regex where llama.cpp hashes the tokens of a test string),
one token per id up to the model's vocab_size (BPE entries NORMAL in their byte-level form, added
tokens by content CONTROL when special or looking special "<|...|>", else USER_DEFINED, the ids
nothing defines "[PAD<id>]" UNUSED), token_type, merges as "left right", the bos / eos / padding
ids tokenizer_config.json names, add_bos_token and chat_template. eos falls back to
generation_config.json's first id (lily's stop token; llama.cpp would read config.json's).
--vocab-only writes the tokenizer alone (as llama.cpp's converter does), for tokenizer tests.
An mlx-lm 4-bit directory (models/lily-tiny) is read dequantized (tools/mlx_format.py, torch):
its matrices then go in as F32 or Q8_0 of the dequantized values (--type bf16 is not exact there).

Matrices are stored as F32, BF16 (exact for a bf16 checkpoint) or Q8_0 (--type; Q8_0 by this file's own quantizer: d = max|x| / 127
rounded to f16, q = round(x / d)); norms, conv1d, ssm_a and dt_bias are F32 as llama.cpp keeps
them. Only numpy (Debian's python3-numpy); the safetensors and GGUF containers are read and
written here.

    /usr/bin/python3 tools/hf_to_gguf.py tests/fixtures/models/tiny-a/hf-fused \\
        --tokenizer-dir tests/fixtures/models/tiny-a/gguf/tokenizer \\
        --type q8_0 --out tests/fixtures/models/tiny-a/gguf/tiny-a-q8_0.gguf
    /usr/bin/python3 tools/hf_to_gguf.py models/lily-tiny --vocab-only --out /tmp/lily-tiny-vocab.gguf
    /usr/bin/python3 tools/hf_to_gguf.py models/lily-tiny --type q8_0 --out /tmp/lily-tiny-q8_0.gguf

(tools/gguf_reference.py runs these for the committed fixtures.)
"""
import argparse
import json
import os
import struct

import numpy as np

GGML_F32, GGML_Q8_0, GGML_BF16 = 0, 8, 30
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
ALIGNMENT = 32


def read_safetensors(folder):
    """All tensors of a model directory as float32 numpy arrays, by name."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            raw = data[begin:end]
            if entry["dtype"] == "BF16":
                arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            elif entry["dtype"] == "F32":
                arr = np.frombuffer(raw, dtype="<f4")
            else:
                raise SystemExit(f"{key}: dtype {entry['dtype']} is not handled")
            out[key] = arr.reshape(entry["shape"]).astype(np.float32)
    return out


def read_checkpoint(folder):
    """HF names as float32 numpy arrays: the safetensors of an HF directory, or an mlx-lm one
    dequantized to HF names by tools/mlx_format.py (needs torch; the values are the 4/8-bit
    codes times their scales plus biases, the norms shifted back by -1)."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    if "quantization" not in cfg:
        return read_safetensors(folder)
    import mlx_format  # noqa: E402  (tools/, next to this file)
    tensors, config = mlx_format.load_mlx_checkpoint(folder)
    return {k: v.float().numpy() for k, v in mlx_format.mlx_to_dequantized_hf(tensors, config).items()}


def tile_v_heads(x, axis, n_k_heads, ratio, block):
    """HF v head n = kh * ratio + j moves to n' = j * n_k_heads + kh (blocks of `block` along axis)."""
    x = np.moveaxis(x, axis, 0)
    shape = x.shape
    x = x.reshape(n_k_heads, ratio, block, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(x, 0, axis))


def quantize_q8_0(x):
    rows = x.reshape(-1, 32)
    d = (np.abs(rows).max(axis=1) / 127).astype(np.float16)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d.astype(np.float32)))
    q = np.clip(np.round(rows * inv[:, None]), -127, 127).astype(np.int8)
    blocks = np.concatenate([d.view(np.uint8).reshape(-1, 2), q.view(np.uint8)], axis=1)
    return blocks.tobytes()


class Gguf:
    def __init__(self):
        self.kv, self.tensors = [], []

    @staticmethod
    def s(text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    def u32(self, k, v):
        self.kv.append(self.s(k) + struct.pack("<II", T_UINT32, v))

    def f32(self, k, v):
        self.kv.append(self.s(k) + struct.pack("<If", T_FLOAT32, v))

    def str(self, k, v):
        self.kv.append(self.s(k) + struct.pack("<I", T_STRING) + self.s(v))

    def bool(self, k, v):
        self.kv.append(self.s(k) + struct.pack("<IB", T_BOOL, 1 if v else 0))

    def strs(self, k, values):
        self.kv.append(self.s(k) + struct.pack("<IIQ", T_ARRAY, T_STRING, len(values)) +
                       b"".join(self.s(v) for v in values))

    def i32s(self, k, values):
        self.kv.append(self.s(k) + struct.pack("<IIQ", T_ARRAY, T_INT32, len(values)) +
                       struct.pack(f"<{len(values)}i", *values))

    def tensor(self, name, x, qtype):
        """x: float32 array in row-major [..., rows, cols]; ne is the reversed shape."""
        if qtype == GGML_Q8_0 and x.shape[-1] % 32 == 0 and x.ndim >= 2:
            self.tensors.append((name, x.shape[::-1], GGML_Q8_0, quantize_q8_0(x)))
        elif qtype == GGML_BF16 and x.ndim >= 2:  # exact for weights that were bf16: the top 16 bits
            bits = np.ascontiguousarray(x, dtype="<f4").view("<u4")
            assert not (bits & 0xFFFF).any(), f"{name} is not bf16-exact"
            self.tensors.append((name, x.shape[::-1], GGML_BF16, (bits >> 16).astype("<u2").tobytes()))
        else:
            self.tensors.append((name, x.shape[::-1], GGML_F32, x.astype("<f4").tobytes()))

    def write(self, path):
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)) + b"".join(self.kv)
        offset, table = 0, b""
        for name, ne, qtype, data in self.tensors:
            table += self.s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            table += struct.pack("<IQ", qtype, offset)
            offset += len(data) + (-len(data) % ALIGNMENT)
        out = head + table
        out += b"\0" * (-len(out) % ALIGNMENT)
        with open(path, "wb") as f:
            f.write(out)
            for _, _, _, data in self.tensors:
                f.write(data + b"\0" * (-len(data) % ALIGNMENT))


def looks_special(token):
    """llama.cpp's does_token_look_special for byte-level vocabularies."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
            or (token.startswith("<unused") and token.endswith(">")))


def pre_tokenizer_name(tok):
    """tokenizer.ggml.pre for a tokenizer.json: the Qwen Split regexes lily implements."""
    pre = tok.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    patterns = [s["pattern"].get("Regex") for s in steps if s.get("type") == "Split"]
    names = {QWEN35_SPLIT: "qwen35", QWEN2_SPLIT: "qwen2"}
    if len(patterns) != 1 or patterns[0] not in names:
        raise SystemExit(f"tokenizer.json: pre-tokenizer {json.dumps(pre)[:200]} is not one lily implements")
    return names[patterns[0]]


def write_tokenizer(g, tokenizer_dir, vocab_size, fallback_eos):
    """The tokenizer.ggml.* keys and tokenizer.chat_template, as llama.cpp's converter writes them."""
    tok = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8"))
    cfg_path = os.path.join(tokenizer_dir, "tokenizer_config.json")
    tcfg = json.load(open(cfg_path, encoding="utf-8")) if os.path.exists(cfg_path) else {}
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"tokenizer.json: model type {model.get('type')} is not byte-level BPE")
    by_id = {i: (t, TOKEN_NORMAL) for t, i in model["vocab"].items()}
    added = {}
    for a in tok.get("added_tokens", []):
        kind = TOKEN_CONTROL if a["special"] or looks_special(a["content"]) else TOKEN_USER_DEFINED
        by_id[a["id"]] = (a["content"], kind)
        added[a["content"]] = a["id"]
    vocab_size = vocab_size or max(by_id) + 1
    assert max(by_id) < vocab_size, f"tokenizer ids go up to {max(by_id)}, the model has {vocab_size} rows"
    tokens = [by_id.get(i, (f"[PAD{i}]", TOKEN_UNUSED)) for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    g.str("tokenizer.ggml.model", "gpt2")
    g.str("tokenizer.ggml.pre", pre_tokenizer_name(tok))
    g.strs("tokenizer.ggml.tokens", [t for t, _ in tokens])
    g.i32s("tokenizer.ggml.token_type", [k for _, k in tokens])
    g.strs("tokenizer.ggml.merges", merges)
    ids = {}
    for kind in ["bos", "eos", "unk", "sep", "pad"]:
        entry = tcfg.get(f"{kind}_token")
        content = entry.get("content") if isinstance(entry, dict) else entry
        if isinstance(content, str) and content in added:
            ids[kind] = added[content]
    if "eos" not in ids and fallback_eos is not None:
        ids["eos"] = fallback_eos
    names = {"bos": "bos", "eos": "eos", "unk": "unknown", "sep": "seperator", "pad": "padding"}
    for kind, i in ids.items():
        g.u32(f"tokenizer.ggml.{names[kind]}_token_id", i)
    for kind in ["bos", "eos"]:
        if isinstance(tcfg.get(f"add_{kind}_token"), bool):
            g.bool(f"tokenizer.ggml.add_{kind}_token", tcfg[f"add_{kind}_token"])
    if isinstance(tcfg.get("chat_template"), str):
        g.str("tokenizer.chat_template", tcfg["chat_template"])
    return ids.get("eos")


def write_layer(g, t, text, L, b, layer_type, qtype):
    """One decoder layer: HF names under L ("model.language_model.layers.3."), GGUF under b ("blk.3.")."""
    hk, hv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dv = text["linear_value_head_dim"]
    ratio, key_dim = hv // hk, hk * text["linear_key_head_dim"]
    g.tensor(b + "attn_norm.weight", t[L + "input_layernorm.weight"] + 1, GGML_F32)
    g.tensor(b + "post_attention_norm.weight", t[L + "post_attention_layernorm.weight"] + 1, GGML_F32)
    if layer_type == "linear_attention":
        a = L + "linear_attn."
        qkv = t[a + "in_proj_qkv.weight"].copy()
        qkv[2 * key_dim:] = tile_v_heads(qkv[2 * key_dim:], 0, hk, ratio, dv)
        conv = t[a + "conv1d.weight"][:, 0, :].copy()  # [C, 1, K] -> [C, K]
        conv[2 * key_dim:] = tile_v_heads(conv[2 * key_dim:], 0, hk, ratio, dv)
        g.tensor(b + "attn_qkv.weight", qkv, qtype)
        g.tensor(b + "attn_gate.weight", tile_v_heads(t[a + "in_proj_z.weight"], 0, hk, ratio, dv), qtype)
        g.tensor(b + "ssm_beta.weight", tile_v_heads(t[a + "in_proj_b.weight"], 0, hk, ratio, 1), qtype)
        g.tensor(b + "ssm_alpha.weight", tile_v_heads(t[a + "in_proj_a.weight"], 0, hk, ratio, 1), qtype)
        g.tensor(b + "ssm_conv1d.weight", conv, GGML_F32)
        g.tensor(b + "ssm_dt.bias", tile_v_heads(t[a + "dt_bias"], 0, hk, ratio, 1), GGML_F32)
        g.tensor(b + "ssm_a", -np.exp(tile_v_heads(t[a + "A_log"], 0, hk, ratio, 1)), GGML_F32)
        g.tensor(b + "ssm_norm.weight", t[a + "norm.weight"], GGML_F32)  # the gated norm: no +1
        g.tensor(b + "ssm_out.weight", tile_v_heads(t[a + "out_proj.weight"], 1, hk, ratio, dv), qtype)
    else:
        s = L + "self_attn."
        for hf, gg in [("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                       ("o_proj", "attn_output")]:
            g.tensor(b + gg + ".weight", t[s + hf + ".weight"], qtype)
        g.tensor(b + "attn_q_norm.weight", t[s + "q_norm.weight"] + 1, GGML_F32)
        g.tensor(b + "attn_k_norm.weight", t[s + "k_norm.weight"] + 1, GGML_F32)
    m = L + "mlp."
    inter = text["moe_intermediate_size"]
    gate_up = t[m + "experts.gate_up_proj"]  # [E, 2I, H]
    g.tensor(b + "ffn_gate_inp.weight", t[m + "gate.weight"], qtype)
    g.tensor(b + "ffn_gate_exps.weight", gate_up[:, :inter], qtype)
    g.tensor(b + "ffn_up_exps.weight", gate_up[:, inter:], qtype)
    g.tensor(b + "ffn_down_exps.weight", t[m + "experts.down_proj"], qtype)
    g.tensor(b + "ffn_gate_inp_shexp.weight", t[m + "shared_expert_gate.weight"][0], GGML_F32)
    for hf, gg in [("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")]:
        g.tensor(b + gg + ".weight", t[m + "shared_expert." + hf + ".weight"], qtype)


def first_eos(model_dir):
    path = os.path.join(model_dir, "generation_config.json")
    if not os.path.exists(path):
        return None
    eos = json.load(open(path)).get("eos_token_id")
    return eos[0] if isinstance(eos, list) else eos


def convert_vocab_only(model_dir, tokenizer_dir):
    """The tokenizer alone, with general.architecture (llama.cpp's --vocab-only)."""
    cfg_path = os.path.join(model_dir, "config.json")
    cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    g = Gguf()
    g.str("general.architecture", "qwen35moe")
    g.str("general.name", os.path.basename(os.path.normpath(model_dir)) + " (vocabulary only)")
    write_tokenizer(g, tokenizer_dir, cfg.get("text_config", cfg).get("vocab_size"), first_eos(model_dir))
    return g


def convert(model_dir, qtype, mtp, tokenizer_dir):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    text = cfg.get("text_config", cfg)
    t = read_checkpoint(model_dir)
    p = "model.language_model."
    hk, hv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dk, dv = text["linear_key_head_dim"], text["linear_value_head_dim"]
    rope = text.get("rope_parameters", {})
    head_dim = text["head_dim"]
    n_layers = text["num_hidden_layers"]

    g = Gguf()
    g.str("general.architecture", "qwen35moe")
    g.str("general.name", "lily tiny-a (random weights)")
    mtp = mtp and "mtp.fc.weight" in t
    g.u32("qwen35moe.block_count", n_layers + (1 if mtp else 0))
    if mtp:
        g.u32("qwen35moe.nextn_predict_layers", 1)
    g.u32("qwen35moe.context_length", text["max_position_embeddings"])
    g.u32("qwen35moe.embedding_length", text["hidden_size"])
    g.u32("qwen35moe.attention.head_count", text["num_attention_heads"])
    g.u32("qwen35moe.attention.head_count_kv", text["num_key_value_heads"])
    g.u32("qwen35moe.attention.key_length", head_dim)
    g.u32("qwen35moe.attention.value_length", head_dim)
    g.f32("qwen35moe.attention.layer_norm_rms_epsilon", text["rms_norm_eps"])
    g.f32("qwen35moe.rope.freq_base", rope.get("rope_theta", text.get("rope_theta")))
    g.u32("qwen35moe.rope.dimension_count", int(head_dim * text["partial_rotary_factor"]))
    g.i32s("qwen35moe.rope.dimension_sections", list(rope.get("mrope_section", [11, 11, 10])) + [0])
    g.u32("qwen35moe.expert_count", text["num_experts"])
    g.u32("qwen35moe.expert_used_count", text["num_experts_per_tok"])
    g.u32("qwen35moe.expert_feed_forward_length", text["moe_intermediate_size"])
    g.u32("qwen35moe.expert_shared_feed_forward_length", text["shared_expert_intermediate_size"])
    g.u32("qwen35moe.ssm.conv_kernel", text["linear_conv_kernel_dim"])
    g.u32("qwen35moe.ssm.state_size", dk)
    g.u32("qwen35moe.ssm.group_count", hk)
    g.u32("qwen35moe.ssm.time_step_rank", hv)
    g.u32("qwen35moe.ssm.inner_size", hv * dv)
    g.u32("qwen35moe.full_attention_interval", text["full_attention_interval"])
    if os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
        write_tokenizer(g, tokenizer_dir, text["vocab_size"], first_eos(model_dir))
    else:
        print(f"note: {tokenizer_dir} has no tokenizer.json: the GGUF holds no tokenizer (llama.cpp will not load it)")
        g.u32("tokenizer.ggml.eos_token_id", first_eos(model_dir))

    g.tensor("token_embd.weight", t[p + "embed_tokens.weight"], qtype)
    g.tensor("output_norm.weight", t[p + "norm.weight"] + 1, GGML_F32)
    if "lm_head.weight" in t:
        g.tensor("output.weight", t["lm_head.weight"], qtype)
    for i in range(n_layers):
        write_layer(g, t, text, f"{p}layers.{i}.", f"blk.{i}.", text["layer_types"][i], qtype)
    if mtp:
        b = f"blk.{n_layers}."
        experts = text["num_experts"]
        for kind in ["gate_proj", "up_proj", "down_proj"]:  # published per expert: stacked like the main layers'
            t[f"mtp.layers.0.mlp.experts.{kind}"] = np.stack(
                [t[f"mtp.layers.0.mlp.experts.{e}.{kind}.weight"] for e in range(experts)])
        t["mtp.layers.0.mlp.experts.gate_up_proj"] = np.concatenate(
            [t["mtp.layers.0.mlp.experts.gate_proj"], t["mtp.layers.0.mlp.experts.up_proj"]], axis=1)
        write_layer(g, t, text, "mtp.layers.0.", b, "full_attention", qtype)
        g.tensor(b + "nextn.eh_proj.weight", t["mtp.fc.weight"], qtype)
        g.tensor(b + "nextn.enorm.weight", t["mtp.pre_fc_norm_embedding.weight"] + 1, GGML_F32)
        g.tensor(b + "nextn.hnorm.weight", t["mtp.pre_fc_norm_hidden.weight"] + 1, GGML_F32)
        g.tensor(b + "nextn.shared_head_norm.weight", t["mtp.norm.weight"] + 1, GGML_F32)
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", choices=["f32", "bf16", "q8_0"], default="bf16")
    ap.add_argument("--no-mtp", action="store_true", help="leave the MTP head out")
    ap.add_argument("--tokenizer-dir", help="tokenizer.json and tokenizer_config.json from here (default: model_dir)")
    ap.add_argument("--vocab-only", action="store_true", help="write the tokenizer alone, no weights")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    qtype = {"f32": GGML_F32, "bf16": GGML_BF16, "q8_0": GGML_Q8_0}[args.type]
    tokenizer_dir = args.tokenizer_dir or args.model_dir
    if args.vocab_only:
        g = convert_vocab_only(args.model_dir, tokenizer_dir)
    else:
        g = convert(args.model_dir, qtype, not args.no_mtp, tokenizer_dir)
    g.write(args.out)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
