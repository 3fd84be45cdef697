#!/usr/bin/env python3
"""Builds the golden-test corpus for the tokenizer (multilingual, emoji, code, whitespace runs, digits,
added/special tokens inside text, tricky code points, real English paragraphs). Seeded and reproducible.

usage: make_tokenizer_corpus.py SOTU_DATA_DIR MOBY_DATA_DIR OUT.json
"""
import glob
import re
import json
import os
import random
import sys

HANDWRITTEN = [
    "Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading", "x  y   z    w",
    "tabs\tand\t\ttabs", "line\nbreak", "crlf\r\nline", "mixed \r\n \n\n\r   \t\n", "\n\n\n", "   ", "",
    "It's what we're sure they'll do, I'd say, you've seen; SHE'S, THEY'LL, WE'RE, I'M, 'S 'T 'RE 'VE 'M 'LL 'D",
    "don'T won'Ll ma'am 'ſ 'K (Kelvin) 'k",
    "12345 3.14159 1,000,000 -42 +7 0x1F 1e-9 2024-11-30 12:30:45",
    "² ½ Ⅻ ٣٤٥ ۱۲۳ １２３ ⁴ ₂ 𝟙𝟚",
    "中文测试：我爱北京天安门。", "日本語のテキストです。カタカナ、ひらがな、漢字。", "한국어 텍스트입니다.",
    "Русский текст, ёЁ.", "Ελληνικά κείμενο", "العربية نص تجريبي", "עברית טקסט", "हिन्दी पाठ परीक्षण",
    "ภาษาไทย ทดสอบ", "Tiếng Việt có dấu", "Zażółć gęślą jaźń", "façade naïve coöperate résumé",
    "e\u0301 (e + combining acute) vs é; A\u030a vs Å; \u212b angstrom; ﬁ ligature",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🔥 🧑🏿‍🚀",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "#include <vector>\nint main() { std::vector<int> v{1,2,3}; for (auto& x : v) x *= 2; return 0; }\n",
    '{"key": [1, 2, {"nested": null}], "s": "a\\"b"}',
    "for (i = 0; i < n; ++i) {\n\t\tsum += a[i] * b[i];\n\t}",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning here\n</think>\n\nanswer", "text<tool_call>{\"name\": \"f\"}</tool_call>more",
    "<|endoftext|><|endoftext|>", "<|im_start", "im_end|>", "<|im_end|x", "a<|im_end|>b<|im_start|>c",
    "<tool_response>\nok\n</tool_response>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "<｜begin▁of▁sentence｜>deepseek<｜end▁of▁sentence｜>", "<|start|>user<|message|>hi<|end|>",
    "<|channel|>analysis<|message|>x<|return|>", "<|begin_of_text|><|eot_id|>",
    "nbsp\u00a0here", "ls\u2028ps\u2029", "ideo\u3000space", "nel\u0085x", "bom\ufeffx", "mvs\u180ex", "zw\u200bsp",
    "vt\x0bff\x0c", "a\u00a0\u00a0 b", "  \u00a0x", "\u3000\u3000中", "ZWJ\u200d ZWNJ\u200c",
    "URL https://example.com/path?q=1&r=two#frag and email someone@example.org",
    "CamelCaseWord snake_case_word kebab-case-word SCREAMING_CASE",
    "Ünïcödé ÀÉÎÕÜ àéîõü ß ẞ İ ı",
    "a" * 300, "ab " * 100, " " * 40 + "x", "\n" * 10 + "y", "!!!???...,,,;;;:::", "$$$ %%% ^^^ &&& ***",
]

TRICKY = (list("aAzZ09 .,;:'\"!?-_/\\()[]{}<>@#$%^&*+=~`|") + ["\t", "\n", "\r", "\x0b", "\x0c"] +
          ["\u00a0", "\u2028", "\u2029", "\u3000", "\u0085", "\u200b", "\u200d", "\u180e", "\u2009", "\u202f",
           "\u0301", "\u0308", "\u212a", "\u017f", "\u00b2", "\u00bd", "\u216b", "\u0663", "\uff11", "\u00e9",
           "\u00df", "\u0130", "\u4e2d", "\u6587", "\u3042", "\u30ab", "\ud55c", "\u0434", "\u05d0", "\u0627",
           "\u0928", "\u0e01", "\U0001f600", "\U0001f44d", "\U0001f3fd", "\u2764", "\ufe0f", "\U0001f1eb",
           "\U0001f1f7", "'s", "'S", "'ll", "'LL", "'re", "<think>", "</think>", "<|im_end|>", "<|endoftext|>",
           "<tool_call>", " ", "  ", "   ", "\n\n", "\r\n"])


def paragraphs(pattern, rng, count):
    out = []
    files = sorted(glob.glob(pattern))
    for path in rng.sample(files, min(count, len(files))):
        with open(path, encoding="utf-8") as f:
            paras = [p.strip()[:1200] for p in re.split(r"\n\s*\n|\n", f.read()) if len(p.strip()) > 40]
        if paras:
            out.append(rng.choice(paras))
    return out


def main():
    sotu, moby, out = sys.argv[1:4]
    rng = random.Random(20261130)
    corpus = list(HANDWRITTEN)
    corpus += paragraphs(os.path.join(sotu, "*.txt"), rng, 60)
    corpus += paragraphs(os.path.join(moby, "chapter_*.txt"), rng, 60)
    for _ in range(1500):
        corpus.append("".join(rng.choice(TRICKY) for _ in range(rng.randint(1, 24))))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(corpus, f, ensure_ascii=False, indent=0)
    print(len(corpus), "strings,", sum(len(s) for s in corpus), "chars")


if __name__ == "__main__":
    main()
