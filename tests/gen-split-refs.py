#!/usr/bin/env python3
"""Generates tests/data/split-refs.h: how each pre-tokenizer splits a set of
texts, computed with the Python `regex` module from the pre-tokenizers'
own regexes (as llama.cpp lists them in llama-vocab.cpp: each regex splits
the pieces of the one before, text between matches stays a piece). An
oracle independent of libtensr's hand-written splitters for the
pre-tokenizers that llama.cpp's test vocabularies do not cover. Texts for
the cased pre-tokenizers (gpt-4o, tekken) stay ASCII: llama.cpp's collapsed
regexes see every non-ASCII letter as both upper and lower case, which no
regex engine reproduces. Run once and commit the output:

    python3 tests/gen-split-refs.py > tests/data/split-refs.h
"""
import sys

import regex

C = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
TAIL = r"\s*[\r\n]+|\s+(?!\S)|\s+"
CASED = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+%s"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*%s")
# kimi-k2 as llama.cpp implements it (unicode.cpp's hand-written splitter):
# its letter words ignore case, unlike the model's own regex, whose cased
# classes would split "HTTPServer" as "HTTPS" "erver"
KIMI_WORD = r"[^\r\n\p{L}\p{N}]?[\p{L}--\p{Han}]+"

PRES = {
    "TKU_PRE_DEFAULT": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "TKU_PRE_FALCON": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "TKU_PRE_DEEPSEEK3": [
        r"\p{N}{1,3}",
        r"[一-龥぀-ゟ゠-ヿ]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|" + TAIL,
    ],
    "TKU_PRE_BLOOM": [r" ?[^(\s|.,!?…。，、।۔،)]+"],
    "TKU_PRE_VIKING": [r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"],
    "TKU_PRE_TEKKEN": [(CASED % ("", "")) + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + TAIL],
    "TKU_PRE_GPT4O": [(CASED % (C + "?", C + "?")) + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + TAIL],
    "TKU_PRE_KIMI_K2": [
        r"[\p{Han}]+|" + KIMI_WORD + C + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + TAIL
    ],
    "TKU_PRE_QWEN2": [C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + TAIL],
    "TKU_PRE_LLAMA3": [C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + TAIL],
    "TKU_PRE_SEED_CODER": [C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|" + TAIL],
    "TKU_PRE_UFAKZEKA": [r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + TAIL],
    "TKU_PRE_LAGUNA": [r"[^\n]+|[\n]+", C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" + TAIL],
    "TKU_PRE_MINICPM5": [r"\p{N}{1,3}", C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|" + TAIL],
}

ASCII = [
    "Hello World",
    "  Hello\n\n  World  ",
    "I'm 12345 years, aren't I?",
    "HTTPServer isOK; parseJSON2XML",
    "don'T stop 'LL 're 've 'd 'm",
    "a...b!!? (x) [y] {z}",
    "x = y+z; // comment\n\tfoo() /* bar */",
    "123,456.78 and 1234567890",
    "CamelCaseWORDSand lower UPPER Mixed",
    "   ",
    "\n\n",
    "end   ",
    "$100 + `code` ~ ^_^ |pipe| <tag> @user #hash",
    ".hidden/path/file.txt\r\n\r\nnext",
    "\t\t  indented\n    code",
    "e.g. U.S.A. vs. U.K.",
    "call();\nreturn 0;\r\n}\n\n",
]
UNICODE = [
    "你好世界 hello 123",
    "Привет, мир! Как дела?",
    "ñandú café résumé",
    "한국어 텍스트입니다",
    "カタカナとひらがな、漢字。",
    "emoji 🦙 test 🚀🚀",
    "full\u3000width\u00a0space",
    "数字１２３ and ４５６",
    "¿Qué? ¡Sí! «quotes»",
]
CASED_PRES = {"TKU_PRE_TEKKEN", "TKU_PRE_GPT4O"}


def split(text, rxs):
    pieces = [text]
    for rx in rxs:
        r = regex.compile(rx, regex.V1)
        out = []
        for p in pieces:
            pos = 0
            for m in r.finditer(p):
                if m.start() > pos:
                    out.append(p[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(p):
                out.append(p[pos:])
        pieces = out
    return pieces


def c_str(s):
    out = '"'
    for b in s.encode():
        if b == 0x22 or b == 0x5C:
            out += "\\" + chr(b)
        elif 0x20 <= b < 0x7F:
            out += chr(b)
        else:
            out += '\\%03o' % b
    return out + '"'


def main():
    print("/* split-refs.h - pre-tokenizer splits computed by tests/gen-split-refs.py")
    print(f" * with Python's regex {regex.__version__}; do not edit. Each row: the")
    print(" * pre-tokenizer, the text, the pieces' lengths in codepoints (0-ended). */")
    print("static const struct split_ref {")
    print("    tku_pre pre;")
    print("    const char *text;")
    print("    unsigned lens[64];")
    print("} split_refs[] = {")
    for pre, rxs in PRES.items():
        texts = ASCII + ([] if pre in CASED_PRES else UNICODE)
        for t in texts:
            lens = [len(p) for p in split(t, rxs)]
            assert sum(lens) == len(t) and len(lens) < 64
            print(f"    {{{pre}, {c_str(t)}, {{{', '.join(map(str, lens))}, 0}}}},")
    print("};")


if __name__ == "__main__":
    sys.exit(main())
