#!/usr/bin/env python3
"""The GPT-4o / gpt-oss (o200k) pre-tokenizer against Hugging Face
`tokenizers`, without an o200k vocabulary.

usage: test_gpt4o_hf.py CONFORMANCE_BIN SCRATCH_DIR

The same check as test_llama_bpe_hf.py (its run()), for the split regex of
gpt-oss's tokenizer.json (O200K_REGEX below; GPT-4o's o200k_base, Llama 4):
HF `tokenizers` trains a byte-level BPE whose pre_tokenizer is gpt-oss's
Sequence[Split(O200K_REGEX, Isolated), ByteLevel(use_regex false)], cairn
opens it in a checkpoint folder, must recognise the regex as `gpt-4o`
(ckpt/tokenizer_json.c, text/tokenizer_pre.c) and must give HF's ids on
the llama-bpe .inp texts, test_llama_bpe_hf.py's extra texts, the o200k
texts below (case changes inside words, in Latin and other cased scripts,
with combining marks; contractions after upper and lower runs; symbols
that take newlines and slashes) and random mixes of pieces.

Exits 77 (ctest: skipped) when `tokenizers` or numpy cannot be imported;
any mismatch fails.
"""
import sys

import test_llama_bpe_hf as base

# gpt-oss's split regex as openai/gpt-oss-20b's tokenizer.json has it
# (written out here, not taken from cairn or tools/ckpt).
O200K_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|startoftext|>", "<|endoftext|>"]

EXTRA = [
    # CamelCase: an upper run, then a lower run, is one piece
    "HelloWorld getHTTPResponseCode iPhone McDonald's XMLHttpRequest parseJSON2HTML "
    "camelCaseVariable PascalCase snake_case SCREAMING_CASE ABCdef abcDEF aBcDeF IOError",
    # contractions after upper and lower runs, any case
    "DON'T it's JOHN'S McDonald'S We'RE THEY'LL i'M she'D You'Ve can'T O'Neil rock'n'roll "
    "HELLO'sWorld o'clock 'TIS ''s x'",
    # case changes in other scripts, composed and with combining marks
    "naïve Ångström éÉ ÉCOLE École ÀÉÎÕÜàéîõü Straße STRASSE ǅemal ǈubljana ǋ ǲ",
    "e\u0301E\u0301 A\u030aNGSTRO\u0308M a\u0323\u0302 X\u0301y\u0308Z q\u0307\u0323Q",
    "ΑθήναΑΘΗΝΑ ΣίσυφοςΣ МоскваМОСКВА ՀայաստանՀԱՅ ႠႡა",
    # Devanagari (Lo letters, Mn/Mc matras and virama), Thai, Arabic
    "हिन्दी भाषा में नमस्ते, कृपया ध्यान दें। क्षत्रिय श्री ज्ञान",
    "ภาษาไทย ที่นี่ العَرَبِيَّة مرحبا",
    # Vietnamese: stacked diacritics, upper and lower
    "Tiếng Việt: Người Ở ĐÂU, ỨNG DỤNG, Ễ ễ Ặ ặ, quốc ngữ NGƯỜIViệt",
    # modifier letters and other letters next to case runs
    "ʰello ˢᵐᵃˡˡ 日本語Text テキストABC 한국어Word ーー々〻ABCー",
    # digits in threes
    "1 12 123 1234 12345 1234567890 12,345,678 ١٢٣٤٥٦٧ v1.2.3 A1B22C333D4444 x²³",
    # slashes and newlines after symbols
    "a/b//c\n/d",
    "path/to/file.txt /usr/local/bin// https://example.com/a/b?c=d ./x ../y",
    "!!!\n/next ?\n\n//x ...\r\n/ \"quote\"\n/ x+=1;\n// comment\n/* block */\n",
    "}\n/\n/\n{\n  ]\r\n\r\n/ a\n/",
    # whitespace runs
    "a  b   c\t\t\n\n  \n d \r\n\r\n   e   ",
    "    \n    ",
    " \t \n \t ",
    "x\n \n  \n   y",
]

PIECES = base.PIECES + [
    "HelloWorld", "HTTP", "Response", "iPhone", "Mc", "Donald", "XML", "É", "Å", "ǅ", "ǈ",
    "ʰ", "ー", "\u0301", "\u0308", "\u0323", "हि", "न्", "दी", "ế", "Ứ", "ỆT", "ΑΘ", "θή",
    "МОС", "ква", "'S", "'RE", "'LL", "'t", "//", "\n/", "!\n/", "/\n", "a/b", "\r\n/",
]


def main():
    # ignore_merges: gpt-4o's entry in text/tokenizer_pre.c
    return base.run(__doc__, "gpt-4o-hf", O200K_REGEX, SPECIALS, base.EXTRA + EXTRA, PIECES,
                    ignore_merges=False)


if __name__ == "__main__":
    sys.exit(main())
