"""Build a tokenizer with exactly the Qwen3.5 / Qwen3.6 pipeline, trained on your own text.

Spec: /work/shared/spec/tokenizer-chat-api.md section 1. The real vocabulary (248,044 BPE tokens)
ships with the model; this module makes small tokenizers with the same pipeline for tests and tiny
models (tools/make_tokenizer_fixture.py, train_tiny.py):

    NFC normalizer
    pre-tokenizer Sequence[Split(Regex(QWEN35_SPLIT_PATTERN), "isolated"),
                           ByteLevel(add_prefix_space=False, use_regex=False)]
    BPE model (no unk token, no byte fallback), all 256 byte symbols in the alphabet
    ByteLevel decoder
    the 33 added tokens, with ids right after the BPE vocabulary, in the order of ADDED_TOKENS

Needs the HF `tokenizers` package (the GPU machine has it).
"""

from __future__ import annotations

import json
import os
from typing import Iterable

# spec section 1.2: the split pattern, exactly as in HF tokenization_qwen3_5.py.
QWEN35_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# spec section 1.4: (content, special) in id order; in the real vocabulary the first is id 248044.
# The special flags of the fim/repo/file_sep tokens follow Qwen2.5/3, those of the audio/tts tokens
# are a guess (the spec marks both [U]); check them against the real tokenizer.json.
ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]
assert len(ADDED_TOKENS) == 33

MODEL_MAX_LENGTH = 262144


def bytes_to_unicode() -> dict:
    """The GPT-2 byte-level table: byte -> the printable character a tokenizer.json stores for it
    (printable Latin-1 bytes map to themselves, the other 68 to U+0100.. in byte order)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}
CHAT_TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "qwen36_chat_template.jinja")


def build_qwen36_tokenizer(texts: Iterable[str], vocab_size: int):
    """Trains a byte-level BPE on `texts` (vocab_size counts the 256 byte symbols, not the added
    tokens) and adds the 33 added tokens. Returns a tokenizers.Tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())  # defaults: no unk, no dropout, no byte fallback, no prefixes
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(list(texts), trainer=trainer)

    base = tokenizer.get_vocab_size(with_added_tokens=False)
    for offset, (content, special) in enumerate(ADDED_TOKENS):
        # normalized=False for all, like the real Qwen tokenizer.json: matched in the raw text.
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
        got = tokenizer.token_to_id(content)
        if got != base + offset:
            raise RuntimeError(f"added token {content!r} got id {got}, expected {base + offset}")
    return tokenizer


def tokenizer_config(tokenizer) -> dict:
    """tokenizer_config.json contents (spec section 1.4), with the chat template embedded."""
    with open(CHAT_TEMPLATE_PATH, encoding="utf-8") as f:
        chat_template = f.read()
    added_tokens_decoder = {}
    for content, special in ADDED_TOKENS:
        added_tokens_decoder[str(tokenizer.token_to_id(content))] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def save_tokenizer_files(tokenizer, out_dir: str) -> None:
    """Writes out_dir/tokenizer.json and out_dir/tokenizer_config.json."""
    os.makedirs(out_dir, exist_ok=True)
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tokenizer), f, ensure_ascii=False, indent=2)
        f.write("\n")
