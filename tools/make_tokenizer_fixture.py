#!/usr/bin/env python3
"""Make the tokenizer test fixture: a small Qwen3.6-pipeline tokenizer.json and the ids HF gives.

    python3 tools/make_tokenizer_fixture.py --out tests/fixtures/tokenizer

Needs HF `tokenizers` (not `transformers`); no downloads: the training corpus is embedded below.
Writes to --out:
    tokenizer.json                 trained with tools/qwen_tokenizer.py (merges in this tokenizers
                                   version's own form)
    tokenizer_merges_as_strings.json or tokenizer_merges_as_pairs.json
                                   the same tokenizer with the merges in the other form
    tokenizer_config.json          eos/pad/bos and the chat template
    cases.json                     [{"name", "text", "ids", "decoded"}], ids from
                                   tok.encode(text, add_special_tokens=False).ids,
                                   decoded from tok.decode(ids, skip_special_tokens=False)
    fixture_info.json              tokenizers version, sizes, merge form
The C++ tests (tests/tokenizer/test_fixture.cpp) must reproduce every case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen_tokenizer import ADDED_TOKENS, build_qwen36_tokenizer, save_tokenizer_files  # noqa: E402

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's what we've wanted, isn't it? They'll say I'm right.",
    "Tokenizers split text into pieces; each piece is then merged byte by byte into tokens.",
    "In 2026 the model processed 1,234,567 tokens at 3.14159 tokens per microsecond (approximately).",
    "def encode(text: str) -> list[int]:\n    return [ord(c) for c in text]  # a toy\n\nprint(encode('hi'))\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\r\nreturn sum;\r\n",
    '{"name": "lily", "version": [0, 1, 0], "fast": true, "ratio": 2.5e-3, "url": "https://example.com/a?b=c&d=e"}',
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Äpfel, Öl, Übung.",
    "Le renard brun rapide saute par-dessus le chien paresseux. Café, résumé, naïve, façade, où, élève.",
    "El rápido zorro marrón salta sobre el perro perezoso. ¿Qué tal? ¡Muy bien! Mañana, niño, canción.",
    "Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир! Съешь же ещё этих мягких булок.",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο. Ελληνικά γράμματα: αβγδεζηθ.",
    "Tiếng Việt có dấu: Xin chào thế giới, tôi là một mô hình ngôn ngữ. Người Việt Nam.",
    "你好，世界！今天是2026年8月13日。人工智能正在改变世界，机器学习和深度学习是重要的技术。",
    "东京是日本的首都。我们一起学习中文和日文吧。这是一个测试句子，用于训练分词器。",
    "東京は日本の首都です。カタカナとひらがなを勉強しています。今日はいい天気ですね。",
    "안녕하세요 세계! 한국어는 아름다운 언어입니다. 저는 학생입니다. 감사합니다.",
    "สวัสดีครับ ผมชื่ออเล็กซ์ ภาษาไทยเป็นภาษาที่สวยงาม ขอบคุณมากครับ วันนี้อากาศดี",
    "नमस्ते दुनिया! हिन्दी में क्षत्रिय और ज्ञान शब्द हैं। मैं भारत से हूँ। धन्यवाद।",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ. مرحبا بالعالم! اللغة العربية جميلة جدا.",
    "שָׁלוֹם עוֹלָם! עברית היא שפה יפה. תודה רבה.",
    "Emoji: 😀 😃 🎉 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 🇺🇸 ❤️ ✨ 🚀 🤖",
    "Math: ∑ᵢ xᵢ² ≤ ∞, √2 ≈ 1.414, ½ + ⅓ = ⅚, α→β, ∀x∃y, 𝐀𝐁𝐂 𝕏.",
    "Whitespace   runs\t\ttabs\n\n\nnewlines  \r\n\r\n   and more    spaces at the end   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nSimple.\n</think>\n\n4<|im_end|>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "I'M SURE THEY'LL SAY IT'S WHAT WE'VE DONE. DON'T YOU THINK? HE'D AGREE, SHE'S RIGHT.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
]

SYLLABLES = (
    "ka ri to na me so lu pe an ing tion er th qu ick br own st re de un ly ed es "
    "при вет мир ст ра но ко ли жи ще "
    "αλ επ ου κα λη με "
    "人 工 智 能 世 界 你 好 学 习 中 文 日 本 东 京 "
    "カ タ ひ ら が な "
    "안 녕 하 세 요 한 국 "
    "สวั สดี ครับ ผม ชื่อ ภา ษา ไทย "
    "न म स्ते दु नि या हि न्दी क्ष त्रि "
    "بِ سْ مِ الْ لَّ هِ مر حبا "
    "שָׁ לוֹ ם"
).split()


def synthetic_corpus(n_lines: int = 600) -> list[str]:
    """Pseudo-words from syllables of many scripts: enough distinct words that the vocab size,
    not the corpus, stops training, so the cases' words end up only partly merged."""
    import random

    rng = random.Random(1234)
    lines = []
    for _ in range(n_lines):
        words = []
        for _ in range(rng.randint(4, 14)):
            word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
            words.append(word + rng.choice(["", "", "", ",", ".", "!", "'s", "'ll", " 42", "\n"]))
        lines.append(" ".join(words))
    return lines


CASES: list[tuple[str, str]] = [
    ("empty", ""),
    ("ascii_sentence", "Hello, world! How are you today?"),
    ("single_char", "a"),
    ("single_space", " "),
    ("contractions", "I'm sure they'll say we've done what you'd've wanted, isn't it?"),
    ("contractions_upper", "I'M SURE THEY'LL SAY IT'S WHAT WE'VE DONE, DON'T YOU THINK? HE'D"),
    ("contractions_mixed_case", "'S 'LL 'Re 'vE 'D 'M 'T ''s 's's"),
    ("contraction_long_s", "it'\u017f the long s"),
    ("digits", "1234567890"),
    ("digits_mixed", "Year 2026: 3.14159, 1,000,000 and 0x1F; v1.2.3-rc4"),
    ("digits_other_scripts", "\u0663\u0664\u0665 \u0661\u0662 \u06f3\u06f4 \u0967\u0968\u0969"),
    ("numbers_no_nl", "\u00bd \u2153 \u00b2 \u216b 3\u00bd"),
    ("digit_run_long", "1234567890" * 30),
    ("spaces_runs", "a  b   c    d"),
    ("leading_spaces", "   leading"),
    ("trailing_spaces", "trailing   "),
    ("only_spaces", "     "),
    ("only_newline", "\n"),
    ("space_newline_space", " \n "),
    ("tabs", "\t\ttabs\tand\t\tmore\t"),
    ("newlines", "line1\nline2\n\nline4\n\n\n"),
    ("crlf", "crlf\r\nline\r\n\r\nend\r\n"),
    ("cr_lf_mix", "\r\r\n\n\ra\rb"),
    ("mixed_whitespace", "mixed \t \n \r\n  x  \n\t y"),
    ("vertical_whitespace", "a\u000bb\u000cc"),
    ("nel", "x\u0085y x\u0085\u0085y \u0085"),
    ("nbsp", "nbsp\u00a0here\u00a0\u00a0x \u00a0!"),
    ("unicode_spaces", "ideographic\u3000space en\u2002quad thin\u2009x\u202fy\u205fz\u1680w"),
    ("line_separators", "a\u2028b\u2029c \u2028 d"),
    ("control_chars", "\x00\x01\x07\x1b[31mred\x1b[0m\x7f\x1c\x1d\x1e\x1f"),
    ("zero_width", "zero\u200bwidth \ufeffbom a\u200db \u180e mvs"),
    ("thai", "สวัสดีครับ ผมชื่ออเล็กซ์"),
    ("thai_short", "สวัสดี"),
    ("devanagari", "नमस्ते दुनिया, हिन्दी में क्षत्रिय"),
    ("devanagari_nukta_exclusion", "\u0958 \u0915\u093c"),
    ("arabic_diacritics", "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ"),
    ("hebrew_niqqud", "שָׁלוֹם עוֹלָם"),
    ("cjk", "你好，世界！今天是2026年8月13日 🎉"),
    ("cjk_word", "人工智能"),
    ("japanese", "東京は日本の首都です。カタカナとひらがな"),
    ("korean", "안녕하세요 세계"),
    ("hangul_jamo_nfc", "\u1100\u1161\u11a8 \u1112\u1161\u11ab"),
    ("cjk_ext_b", "\U00020000\U00020001 \U0002a6d6"),
    ("emoji_zwj", "👨‍👩‍👧‍👦 family"),
    ("emoji_flags", "🏳️‍🌈 🇯🇵🇺🇸🇩🇪 flags"),
    ("emoji_skin_tone", "👍🏽👍🏿 ok"),
    ("emoji_run", "🎉🎉🎉🚀✨"),
    ("combining_marks", "e\u0301\u0302 a\u0308\u0304 o\u0328\u0301"),
    ("zalgo", "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312\u036bg\u030c\u0317\u031a\u035ao"),
    ("leading_mark", "\u0301 leading mark"),
    ("space_then_mark", " \u0301x !\u0301 1\u0301"),
    ("nfc_decomposed_accents", "Cafe\u0301 re\u0301sume\u0301 na\u0131\u0308ve"),
    ("nfc_angstrom", "A\u030angstro\u0308m \u212b \u2126"),
    ("nfc_vietnamese_nfd", unicodedata.normalize("NFD", "Tiếng Việt có dấu")),
    ("mixed_scripts", "Hello世界مرحبا123абвΩ"),
    ("cyrillic_greek", "Привет, мир! Ελληνικά"),
    ("math_alnum", "𝐀𝐁𝐂 𝕏 𝒜 ∑ᵢ xᵢ² ≤ ∞"),
    ("modifier_letters", "ʰʼ ǅ ᾈ ﬁ"),
    ("code", "def f(x):\n    return x**2  # comment\n\tif a != b: pass\n"),
    ("json", '{"key": [1, 2.5e-3, null], "s": "a\\"b"}'),
    ("url", "https://example.com/path?q=1&r=2#frag"),
    ("punctuation", "!!!???...--- ((\"quoted\")) a.b,c;d:e !\n\n"),
    ("punct_space_crlf", "a !\r\n\r\nb ?\n"),
    ("chat_turns", "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi!<|im_end|>"),
    ("lone_special", "<|im_end|>"),
    ("lone_endoftext", "<|endoftext|>"),
    ("adjacent_specials", "<|im_end|><|im_end|><|endoftext|>"),
    ("special_inside_word", "abc<|im_end|>def"),
    ("special_with_spaces", " <|im_start|> x <|im_end|> "),
    ("tool_call", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    ("tool_response", "<tool_response>\n{\"ok\": true}\n</tool_response>"),
    ("all_added_tokens", "".join(content for content, _ in ADDED_TOKENS)),
    ("half_special_1", "<|im_end"),
    ("half_special_2", "<|im_end|"),
    ("half_special_3", "im_end|>"),
    ("half_special_4", "<|im_start|<|im_end|>"),
    ("half_special_5", "<think </think > <|IM_END|> <<|im_end|>> <|im_end|>>"),
    ("think_then_mark", "<think>\u0338 a>\u0338"),
    ("long_word", "supercalifragilisticexpialidocious" * 40),
    ("long_single_letter", "x" * 3000),
    ("long_spaces", " " * 300 + "x"),
    ("long_thai", "สวัสดีครับ" * 50),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/fixtures/tokenizer")
    parser.add_argument("--vocab-size", type=int, default=3000)
    args = parser.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    # The cases' text is not in the corpus: most of their words are only partly merged, so the
    # order of merges matters.
    texts = CORPUS * 4 + synthetic_corpus()
    tok = build_qwen36_tokenizer(texts, args.vocab_size)
    os.makedirs(args.out, exist_ok=True)
    save_tokenizer_files(tok, args.out)

    # The second copy with the merges in the other form.
    with open(os.path.join(args.out, "tokenizer.json"), encoding="utf-8") as f:
        data = json.load(f)
    merges = data["model"]["merges"]
    native_pairs = bool(merges) and isinstance(merges[0], list)
    if native_pairs:
        data["model"]["merges"] = [" ".join(pair) for pair in merges]
        other_name = "tokenizer_merges_as_strings.json"
    else:
        data["model"]["merges"] = [m.split(" ") for m in merges]
        other_name = "tokenizer_merges_as_pairs.json"
    other_path = os.path.join(args.out, other_name)
    with open(other_path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    other = Tokenizer.from_file(other_path)

    cases = []
    bad_roundtrip = []
    for name, text in CASES:
        ids = tok.encode(text, add_special_tokens=False).ids
        if other.encode(text, add_special_tokens=False).ids != ids:
            raise RuntimeError(f"case {name}: {other_name} gives different ids")
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != unicodedata.normalize("NFC", text):
            bad_roundtrip.append(name)
        cases.append({"name": name, "text": text, "ids": ids, "decoded": decoded})
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=True, indent=0)
        f.write("\n")

    info = {
        "tokenizers_version": tokenizers.__version__,
        "bpe_vocab_size": tok.get_vocab_size(with_added_tokens=False),
        "vocab_size_with_added": tok.get_vocab_size(with_added_tokens=True),
        "merges": len(merges),
        "native_merge_form": "pairs" if native_pairs else "strings",
        "other_merge_file": other_name,
        "cases": len(cases),
        "roundtrip_mismatches": bad_roundtrip,
    }
    with open(os.path.join(args.out, "fixture_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    print(json.dumps(info, indent=2))
    print(f"wrote {args.out} ({total / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
