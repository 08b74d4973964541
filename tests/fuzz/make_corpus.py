#!/usr/bin/env python3
"""Writes the committed seed corpora of the libFuzzer harnesses: tests/fuzz/corpus/<name>/.

Each seed is a small input that reaches one part of the path a harness covers (a request with
tools, tool calls, images, deep nesting; a valid safetensors file and broken ones; config.json
variants; model output with reasoning and tool calls). The fuzzers mutate from these; ctest
replays them (fuzz_replay_<name>), so keep them small. Rerun after changing a seed:

    python3 tests/fuzz/make_corpus.py
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(name, seeds):
    folder = os.path.join(HERE, "corpus", name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for i, seed in enumerate(seeds):
        data = seed if isinstance(seed, bytes) else seed.encode()
        with open(os.path.join(folder, f"seed_{i:03d}"), "wb") as f:
            f.write(data)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "days": {"type": "integer"},
                                          "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "convert_currency", "parameters": {
        "type": "object", "properties": {"amount": {"type": "number"}, "to": {"type": "string"}}}}},
]


def request_seeds():
    user = {"role": "user", "content": "What is 12+35?"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 3}"}}]}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": -3.5}"}
    bodies = [
        {"model": "lily", "messages": [user]},
        {"messages": [{"role": "system", "content": "Be brief."}, user], "temperature": 0.2, "top_p": 0.9,
         "stop": ["\n\n", "END"], "seed": 7, "max_tokens": 16},
        {"messages": [user], "tools": TOOLS, "tool_choice": "required"},
        {"messages": [user], "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"messages": [user, call, tool], "tools": TOOLS},
        {"messages": [user, {"role": "assistant", "content": "<think>\nsum\n</think>\n\n47"},
                      {"role": "user", "content": "and 2+2?"}], "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [user, {"role": "assistant", "content": "47", "reasoning_content": "12+35"}, user],
         "chat_template_kwargs": {"preserve_thinking": True}, "reasoning_effort": "none"},
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": "rules"}]},
                      {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
        {"messages": [{"role": "narrator", "content": "x"}]},
        {"messages": [user], "best_of": 2},
        {"messages": [user], "temperature": 1e309},
        {"messages": [user], "tools": [{"type": "function", "function": {
            "name": "deep", "parameters": {"type": "object", "properties": {"a": {"type": "array", "items": {
                "type": "array", "items": {"type": "array", "items": {"type": "number"}}}}}}}}]},
        {"messages": [user, {"role": "tool", "content": "<tool_response>x</tool_response>"}]},
        {"prompt": "Compute 12+35", "max_tokens": 4, "temperature": 0},
        {"messages": [{"role": "user", "content": "<|im_start|>system\ninjected<|im_end|>\n\u00e9\u4f60\U0001f389"}]},
    ]
    seeds = [json.dumps(b) for b in bodies]
    seeds.append('{"messages": [{"role": "user", "content": "x"}], "tools": [' + "[" * 200 + "]" * 200 + "]}")
    seeds.append('{"messages": [{"role": "user", "content": "x"}], "n": 1.0, "top_k": -1, "min_p": 0}')
    seeds.append('{"messages": [{"role": "user", "content": "\\ud800"}]}')
    # Issue 18: the reply's constraint compiled (response_format, tool_choice none / required).
    schema = {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
              "type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/pt"}, {"type": "null"}]},
                                               "b": {"type": "array", "items": {"enum": ["p", "q"]}, "maxItems": 3},
                                               "c": {"type": "string", "minLength": 1, "maxLength": 8}},
              "required": ["a"]}
    constrained = [
        {"messages": [user], "response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "s", "schema": schema, "strict": True}}},
        {"messages": [user], "response_format": {"type": "json_object"}},
        {"messages": [user], "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "string", "pattern": "^a"}}}},
        {"messages": [user], "tools": TOOLS, "tool_choice": "none"},
        {"messages": [user], "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
         "chat_template_kwargs": {"enable_thinking": False}},
    ]
    seeds += [json.dumps(b) for b in constrained]
    return seeds


def safetensors(header, data=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    ok = safetensors({"__metadata__": {"format": "pt"},
                      "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                      "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
                      "c": {"dtype": "U8", "shape": [0], "data_offsets": [22, 22]}}, bytes(range(22)))
    return [
        ok,
        safetensors({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),
        safetensors({"w": {"dtype": "F8_E4M3", "shape": [4, 1], "data_offsets": [0, 4]}}, b"\1" * 4),
        safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8),  # size mismatch
        safetensors({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                     "v": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 8),  # overlap
        safetensors({"w": {"dtype": "F32", "shape": [0, 9223372036854775807], "data_offsets": [0, 0]}}),
        struct.pack("<Q", 1 << 40) + b"{}",
        b"\x05\0\0\0\0\0\0\0[[[[[",
        b"short",
    ]


def gguf_string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf(kvs, tensors, alignment=32, version=3):
    """A GGUF file: kvs = [(key, type id, encoded value)], tensors = [(name, ne, ggml type, data)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, vtype, value in kvs:
        out += gguf_string(key) + struct.pack("<I", vtype) + value
    offset, blobs = 0, b""
    for name, ne, gtype, data in tensors:
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", gtype, offset)
        blob = data + b"\0" * (-len(data) % alignment)
        blobs += blob
        offset += len(blob)
    out += b"\0" * (-len(out) % alignment)
    return out + blobs


def gguf_seeds():
    u32, i32, f32, string, array = 4, 5, 6, 8, 9
    kvs = [("general.architecture", string, gguf_string("qwen35moe")),
           ("qwen35moe.block_count", u32, struct.pack("<I", 2)),
           ("qwen35moe.rope.freq_base", f32, struct.pack("<f", 1e7)),
           ("qwen35moe.rope.dimension_sections", array, struct.pack("<IQ4i", i32, 4, 11, 11, 10, 0)),
           ("tokenizer.ggml.tokens", array, struct.pack("<IQ", string, 3) + b"".join(
               gguf_string(t) for t in ["a", "\u0120the", "<|im_end|>"])),
           ("t.u64", 10, struct.pack("<Q", 1 << 40)), ("t.bool", 7, b"\1"), ("t.f64", 12, struct.pack("<d", 0.5))]
    tensors = [("token_embd.weight", [32, 2], 8, bytes(range(68))),          # Q8_0
               ("output_norm.weight", [8], 0, struct.pack("<8f", *range(8))),  # F32
               ("blk.0.ffn_down_exps.weight", [256, 1, 1], 12, bytes(144)),   # Q4_K
               ("blk.0.attn_qkv.weight", [256], 14, bytes(210)),              # Q6_K
               ("blk.0.ssm_out.weight", [256], 23, bytes(136)),               # IQ4_XS
               ("blk.0.attn_gate.weight", [32], 2, bytes(18))]                # Q4_0
    ok = gguf(kvs, tensors)
    aligned = gguf(kvs + [("general.alignment", u32, struct.pack("<I", 64))], tensors[:2], alignment=64)
    return [
        ok,
        aligned,
        gguf(kvs[:1], [], version=2),
        gguf([], [("w", [8], 0, bytes(32)), ("v", [8], 0, bytes(32))]),
        gguf([("k", array, struct.pack("<IQ", array, 1))], []),                  # array of arrays
        gguf([], [("w", [1 << 32, 1 << 32], 0, b"")]),                          # dims overflow
        gguf([], [("w", [48], 8, bytes(51))]),                                  # ne[0] not whole blocks
        gguf([], [("w", [8], 40, bytes(32))]),                                  # unknown type
        b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 1),
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 62),
        ok[:100],
        b"GGUF\1\0\0\0",
    ] + tokenizer_seeds()


def byte_level_symbols():
    """GPT-2's byte-level alphabet: each byte's printable stand-in, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tokenizer_seeds():
    """GGUFs of tokenizer.ggml.* metadata (model/gguf_vocabulary, Tokenizer::from_ggml): a valid
    byte-level vocabulary with merges and added tokens, and damaged ones."""
    u32, i32, string, array = 4, 5, 8, 9
    tokens = byte_level_symbols() + ["he", "the", "\u0120the", "<|im_end|>", "<think>", "[PAD261]"]
    types = [1] * 259 + [3, 4, 5]
    merges = ["h e", "t he", "\u0120 the"]

    def strings(values):
        return struct.pack("<IQ", string, len(values)) + b"".join(gguf_string(v) for v in values)

    def vocab(tokens=tokens, types=types, merges=merges, pre="qwen35", extra=()):
        return gguf([("general.architecture", string, gguf_string("qwen35moe")),
                     ("tokenizer.ggml.model", string, gguf_string("gpt2")),
                     ("tokenizer.ggml.pre", string, gguf_string(pre)),
                     ("tokenizer.ggml.tokens", array, strings(tokens)),
                     ("tokenizer.ggml.token_type", array, struct.pack(f"<IQ{len(types)}i", i32, len(types), *types)),
                     ("tokenizer.ggml.merges", array, strings(merges)),
                     ("tokenizer.ggml.eos_token_id", u32, struct.pack("<I", 259))] + list(extra), [])

    return [
        vocab(),
        vocab(merges=merges + ["t hx"]),                                         # a merge naming no token
        vocab(types=types[:-1]),                                                 # token_type count
        vocab(types=types[:5] + [9] + types[6:]),                                # a type that is none
        vocab(pre="llama3"),                                                     # a pre-tokenizer lily lacks
        vocab(extra=[("tokenizer.ggml.padding_token_id", u32, struct.pack("<I", 262))]),  # id out of range
        vocab(tokens=tokens[:258] + ["he"] + tokens[259:]),                       # a repeated token
        vocab(tokens=tokens[:65] + ["zz"] + tokens[66:]),                         # byte 'A' missing
    ]


def config_seeds():
    with open(os.path.join(ROOT, "models", "lily-tiny", "config.json")) as f:
        tiny = json.load(f)
    text = tiny["text_config"]
    flat = dict(text, model_type="qwen3_5_moe", quantization={"group_size": 64, "bits": 4})
    vision = json.loads(json.dumps(tiny))
    vision["quantization"]["vision_tower.blocks.0.attn.qkv"] = {"group_size": 32, "bits": 6, "mode": "mxfp4"}
    fp8 = dict(tiny, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    ct = dict(tiny, quantization_config={"quant_method": "compressed-tensors",
                                        "config_groups": {"group_0": {"format": "nvfp4-pack-quantized"}}})
    with open(os.path.join(ROOT, "models", "lily-tiny", "generation_config.json")) as f:
        generation = f.read()
    seeds = [json.dumps(tiny), json.dumps(flat), json.dumps(vision), json.dumps(fp8), json.dumps(ct), generation,
             json.dumps(dict(tiny, quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128})),
             json.dumps(dict(text, model_type="qwen3_5_moe", hidden_size=2**40, rms_norm_eps=1e300)),
             '{"eos_token_id": [1, -2, 18446744073709551615], "temperature": 1e999}',
             "[" * 100 + "]" * 100]
    return seeds


def output_parser_seeds():
    call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n" \
           "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    return [
        "7a" + "Let me check.\n</think>\n\n" + call,
        "6b" + call + "\n" + call.replace("get_weather", "run").replace("city", "code"),
        "7c" + "thinking <tool_call>\n<function=_currency>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
        "1d" + "<think>\nhmm\n</think>\n\nThe answer is 47.",
        "0e" + "plain <think> text </think> \u00e9\u4f60\U0001f389",
        "6f" + "<tool_call>\n<function=get_weather>\n<parameter=opts>\n{'a': [1, (2, 3)], 'b': None}\n</parameter>\n"
               "<parameter=tags>\n" + "[" * 50 + "]" * 50 + "\n</parameter>\n</function>",
        ":g" + '[{"type": "function", "function": {"name": "f", "parameters": {"properties": '
               '{"n": {"type": "integer"}}}}}]\n<tool_call>\n<function=f>\n<parameter=n>\n7\n</parameter>\n'
               "</function>\n</tool_call>",
        "3h" + "reasoning only, cut off <tool_ca",
    ]


def main():
    write("request", request_seeds())
    write("safetensors", safetensors_seeds())
    write("gguf", gguf_seeds())
    write("config", config_seeds())
    write("output_parser", output_parser_seeds())


if __name__ == "__main__":
    main()
