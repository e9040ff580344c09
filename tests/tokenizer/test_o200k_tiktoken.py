#!/usr/bin/env python3
"""cairn's tokenizer on gpt-oss's real vocabulary (o200k_harmony) against
OpenAI's tiktoken.

usage: test_o200k_tiktoken.py CONFORMANCE_BIN CAIRN_BIN SCRATCH_DIR

No GGUF of gpt-oss can be fetched here, but its vocabulary can: OpenAI's
o200k_base.tiktoken ranks ride in the llama-index-core wheel on PyPI
(tiktoken's cache copy, o200k_vocab.fetch_o200k_base). So:

  1. the rank file is taken from that wheel (pip download, kept in
     SCRATCH_DIR for later runs) and checked against the sha256 tiktoken
     expects; tiktoken loads it offline from there (TIKTOKEN_CACHE_DIR);
  2. o200k_vocab.py turns it into the vocab-only GGUF llama.cpp would write
     for gpt-oss: GPT-2 unicode tokens, merges recovered from the ranks as
     Hugging Face's tiktoken converter recovers them, the harmony specials
     as control tokens, pre "gpt-4o";
  3. tiktoken's ids (encode_ordinary) for: the .inp texts of
     tests/data/tokenizer, tests/data/text whole and by paragraph, the extra
     texts of test_llama_bpe_hf.py and test_gpt4o_hf.py, the texts below
     (code, JSON, numbers, scripts, emoji, whitespace runs, long runs of one
     character, harmony markup as plain text) and seeded random mixes of
     pieces and of code points, are conformance data (o200k-tiktoken), and
     every token of the vocabulary that is valid UTF-8, on its own, is
     another set (o200k-tiktoken-tokens); test_tokenizer_conformance checks
     cairn's ids against them and that decoding gives each text back;
  4. texts with harmony special tokens go through `cairn tokenize
     --parse-special --no-bos` against tiktoken with those specials allowed.

Exits 77 (ctest: skipped) when tiktoken cannot be imported or pip-installed,
or the wheel cannot be downloaded; any mismatch fails.
"""
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TESTDATA = os.path.join(ROOT, "tests", "data")
SEP = "\n__ggml_vocab_test__\n"
sys.path.insert(0, HERE)

import o200k_vocab  # noqa: E402
import test_gpt4o_hf  # noqa: E402
import test_llama_bpe_hf as bpe_hf  # noqa: E402

CODE_C = r'''#include <stdio.h>
#include <stdint.h>

/* sums the bytes of a buffer */
static uint32_t sum(const uint8_t *p, size_t n)
{
    uint32_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i] ^ 0x5a;   // mixed in
    return s;
}

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: %s FILE\n", argv[0]); return 2; }
	printf("%08x\n", sum((const uint8_t *)argv[1], 42));
    return 0;
}
'''

CODE_PY = '''def fib(n: int) -> list[int]:
    """The first n Fibonacci numbers."""
    a, b = 0, 1
    out = []
    while len(out) < n:
        out.append(a)
        a, b = b, a + b
    return out


if __name__ == "__main__":
    print(fib(20))  # [0, 1, 1, 2, ...]
    d = {"k": [1, 2.5, -3e-7], 'x': None, "y": True}
    print(f"{d!r:>40} {0xFF:#06x} {3.14159:.2f}")
'''

CODE_MISC = [
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id\n"
    "WHERE o.created_at >= '2024-01-01' GROUP BY u.id HAVING n > 3 ORDER BY n DESC;",
    "fn main() {\n    let v: Vec<u64> = (1..=10).map(|x| x * x).collect();\n"
    "    println!(\"{:?}\", v);\n}\n",
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Test</title>"
    "</head>\n<body><div class=\"a b\" id='c'>&amp; &lt;tag&gt; &#x1F600;</div></body></html>",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> out.log\ndone\n"
    "echo \"${HOME:-/root}\" && ls -la ~/.config 2>/dev/null || true",
    "const f = async (x) => { await fetch(`/api/${x}?q=${encodeURIComponent(x)}`); };\n"
    "let re = /^[a-z0-9_-]{3,16}$/i; x ??= y?.z ?? 0; a === b !== c;",
    "\\begin{equation} \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2} \\end{equation}",
    "    indented\n\tTabbed\n\t\tTwice\n        eight spaces\n\n\n\nfour newlines",
]

NUMBERS = [
    "0 00 000 0000 00000 000000 0000000",
    "3.141592653589793 2.718281828459045 6.02214076e23 1.602e-19 -0.0 +1.5E+10",
    "1,234,567.89 1.234.567,89 12 345 678 1'000'000 ₹1,00,000 $19.99 €5 ¥1000 £3",
    "2024-12-05T13:45:30.123Z 13:45 1/2/2025 +1 (555) 123-4567 192.168.0.1 ::1 fe80::1",
    "123456789012345678901234567890 9999999999 10000000000 1e100 0b1011 0o777 0xDEADBEEF",
    "١٢٣٤٥٦٧٨٩٠ ۱۲۳۴۵ ०१२३४५६७८९ ๐๑๒๓ 一二三 ①②③ ⅠⅡⅢ ¹²³ ₁₂₃ ½¼¾",
]

MULTILINGUAL = [
    "日本語の文章です。東京は日本の首都で、人口は約1400万人です。「こんにちは」と言いました。",
    "中文是世界上使用人数最多的语言之一。我们今天去北京，明天去上海！你好吗？",
    "한국어는 한글로 씁니다. 서울은 대한민국의 수도입니다. 안녕하세요!",
    "العربية لغة جميلة. مرحبا بالعالم! هذا نص تجريبي مع أرقام ١٢٣ و 456.",
    "עברית היא שפה שמית. שלום עולם!",
    "हिन्दी भारत की एक प्रमुख भाषा है। नमस्ते दुनिया! यह एक परीक्षण है।",
    "বাংলা ভাষা  தமிழ் மொழி  ತೆಲುಗು  മലയാളം  ગુજરાતી  ਪੰਜਾਬੀ  ଓଡ଼ିଆ",
    "ภาษาไทยเป็นภาษาที่มีวรรณยุกต์ สวัสดีครับ",
    "Tiếng Việt có dấu: Xin chào thế giới! Điều này rất thú vị.",
    "Русский язык: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Ζαφείρι δέξου πάγκαλο.",
    "Deutsch: Größenmaßstäbe für Äpfel, Öl und Übermut. Straße, Fußgänger.",
    "Français : « Où est la bibliothèque ? » — C'est à côté de l'église, n'est-ce pas ?",
    "Español: ¿Dónde está el baño? ¡Qué día tan bonito! Año, niño, pingüino.",
    "Polski: Zażółć gęślą jaźń. Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Türkçe: İstanbul'da ılık bir gün. ISTANBUL istanbul İı",
    "ქართული ენა  Հայերեն լեզու  Монгол хэл  ᠮᠣᠩᠭᠣᠯ  ትግርኛ  ᏣᎳᎩ  ᚠᚢᚦᚨᚱᚲ",
    "Emoji: 😀😃😄😁 👍🏽 👩🏻‍💻 🧑‍🤝‍🧑 🏳️‍🌈 🇯🇵🇺🇸 ❤️‍🔥 1️⃣ #️⃣ © ® ™ ✈️ ☕",
    "Math: ∀x∈ℝ, ∃y: x²+y²≤1 ⇒ √(x²) ≤ 1; ∑ᵢ aᵢ ≈ ∫ f(x) dx ≠ ∞ ⊂ ⊆ ∪ ∩ ∧ ∨ ¬",
    "Box: ┌──┬──┐ │ab│cd│ └──┴──┘ ░▒▓█ ←↑→↓ ♠♣♥♦ ♪♫ ☀☁☂",
    "Fullwidth: ＡＢＣ　ａｂｃ　１２３！？（）「」 ｶﾀｶﾅ",
    "zero\u200bwidth\u200cjoin\u200dhere\ufeffbom \u00adsoft\u2060wj \u202eRTL\u202c",
    "Combining: a\u0300\u0301\u0302\u0303 Z\u0335\u0321\u0327a\u0336\u0322l\u0337g\u0338o "
    "\u1e9b\u0323 \u0041\u030a\u212b",
]

WHITESPACE = [
    " ", "  ", "\t", "\n", "\r\n", "\r", " \n", "\n ", "\n\n\n\n\n", "\t\t\t  \t",
    "a\n\n\n b", "a \n \n \nb", "x\r\n\r\n\r\ny", "end   ", "   start", " \u00a0 \u2009\u3000 ",
    "word\u000bvt\u000cff\u0085nel\u2028ls\u2029ps", "tab\tafter\ttab \t mixed \t\n",
]

LONG = [
    "a" * 5000, " " * 3000, "\n" * 1000, "\t" * 700, "ab" * 2000, "1" * 1001, "." * 999,
    "=" * 513, "-" * 80 + "\n" + "-" * 80, "😀" * 400, "日" * 1200, "é" * 777,
    "\u0301" * 300, "x" + " " * 257 + "y", "Lorem ipsum dolor sit amet, " * 120,
    "ACGT" * 600, "ha" * 333 + "!", "aaaa bbbb " * 300, "/" * 300 + "\n" * 3,
]

HARMONY_PLAIN = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "<|end|><|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant<|channel|>analysis"
    "<|message|>Simple arithmetic.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>")

SPECIAL_TEXTS = [
    HARMONY_PLAIN,
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"location\":\"San Francisco\"}<|call|>",
    "<|startoftext|>Hello<|endoftext|>",
    "abc<|end|>def <|start|> x<|message|>\n<|channel|>\n\n",
    "<|reserved_200000|><|reserved_200013|><|reserved_201087|><|reserved_200018|>",
    "not special: <|reserved_201088|> <|start <|END|> < |end| > <|endofprompt|> <|im_start|>",
    "<|start|><|start|><|end|>  <|return|>\t<|call|>",
]


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


def get_tiktoken():
    try:
        import tiktoken
        return tiktoken
    except ImportError:
        pass
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "tiktoken"],
                       capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        skip("tiktoken is not installed and pip could not install it: %s" %
             (p.stderr.strip().splitlines() or ["?"])[-1])
    try:
        import tiktoken
        return tiktoken
    except ImportError as e:
        skip("tiktoken installed but cannot be imported: %s" % e)


def read_cases(path):
    with open(path, encoding="utf-8", newline="") as f:
        cases = f.read().split(SEP)
    if cases and cases[-1] == "":
        cases.pop()
    return cases


def random_codepoints(n, seed):
    """n texts of random code points: ASCII, scripts, marks, emoji, and any
    assigned-or-not code point below U+30000 (no surrogates)."""
    rng = random.Random(seed)
    ranges = [(0x20, 0x7e), (0x09, 0x0d), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x52f),
              (0x590, 0x6ff), (0x900, 0xdff), (0xe00, 0xeff), (0x1100, 0x11ff),
              (0x2000, 0x206f), (0x2070, 0x2bff), (0x3000, 0x30ff), (0x4e00, 0x9fff),
              (0xac00, 0xd7a3), (0xff00, 0xffef), (0x1f300, 0x1faff), (0x1, 0x2ffff)]
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randint(1, 24)):
            lo, hi = rng.choice(ranges)
            c = rng.randint(lo, hi)
            if 0xd800 <= c <= 0xdfff:
                c = 0x20
            s.append(chr(c))
        out.append("".join(s))
    return out


def write_conformance(scratch, name, texts, enc):
    data = os.path.join(scratch, "tokenizer")
    os.makedirs(data, exist_ok=True)
    base = os.path.join(data, "ggml-vocab-%s.gguf" % name)
    ids = enc.encode_ordinary_batch(texts, num_threads=4)
    with open(base + ".inp", "w", encoding="utf-8", newline="") as f:
        f.write("".join(t + SEP for t in texts))
    with open(base + ".out", "w", encoding="utf-8", newline="") as f:
        for t, row in zip(texts, ids):
            assert row, repr(t)
            f.write(" ".join(map(str, row)) + "\n")
    return ids


def run_conformance(binary, name, gguf, scratch):
    t0 = time.time()
    r = subprocess.run([binary, name, gguf], env=dict(os.environ, CAIRN_TESTDATA=scratch),
                       capture_output=True, text=True, timeout=240)
    print("  " + r.stdout.strip() + " (%.1f s)" % (time.time() - t0))
    if r.returncode != 0:
        err = r.stderr.strip().splitlines()
        print("\n".join(e if len(e) < 400 else e[:400] + "..." for e in err[:60]),
              file=sys.stderr)
        if len(err) > 60:
            print("  ... %d more lines" % (len(err) - 60), file=sys.stderr)
    return r.returncode == 0


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    conformance, cairn, scratch = sys.argv[1:]
    os.makedirs(scratch, exist_ok=True)
    t_start = time.time()
    tiktoken = get_tiktoken()
    try:
        rank_file = o200k_vocab.fetch_o200k_base(scratch)
    except o200k_vocab.Unavailable as e:
        skip(str(e))
    except (OSError, subprocess.SubprocessError) as e:
        skip("cannot fetch o200k_base: %s" % e)
    os.environ["TIKTOKEN_CACHE_DIR"] = os.path.dirname(rank_file)
    base = tiktoken.get_encoding("o200k_base")
    print("tiktoken %s, o200k_base from %s (%.1f s)" % (
        getattr(tiktoken, "__version__", "?"), rank_file, time.time() - t_start))

    # 1. the reference: tiktoken's own o200k_base, our parse of the same file,
    # its split regex the one cairn knows as gpt-4o
    tokens = o200k_vocab.load_tiktoken_ranks(rank_file)
    assert base._mergeable_ranks == {t: r for r, t in enumerate(tokens)}, "rank parse"
    assert base._pat_str == test_gpt4o_hf.O200K_REGEX, "o200k_base's regex is not gpt-4o's"
    specials = o200k_vocab.harmony_specials(len(tokens))
    assert len(tokens) + len(specials) == o200k_vocab.N_VOCAB
    harmony = tiktoken.Encoding("o200k_harmony_test", pat_str=base._pat_str,
                                mergeable_ranks=base._mergeable_ranks,
                                special_tokens={t: i for i, t in specials.items()})
    try:
        theirs = tiktoken.get_encoding("o200k_harmony")._special_tokens
    except ValueError:
        theirs = None  # a tiktoken older than o200k_harmony
    if theirs is not None:
        # tiktoken keeps o200k_base's <|endofprompt|> as a second name of
        # 200018; openai-harmony (gpt-oss's own library) has only
        # <|reserved_200018|> there, as this vocabulary does
        extra = {t: i for t, i in theirs.items() if specials.get(i) != t}
        assert extra == {"<|endofprompt|>": 200018}, extra
        assert len(theirs) - 1 == len(specials), (len(theirs), len(specials))

    # 2. the vocabulary
    gguf = os.path.join(scratch, "o200k_harmony.gguf")
    t0 = time.time()
    n, nm = o200k_vocab.build_o200k_harmony_gguf(rank_file, gguf)
    print("  %s: %d tokens, %d merges (%.1f s)" % (gguf, n, nm, time.time() - t0))

    # 3. plain text, encode_ordinary
    texts = []
    seen = set()

    def add(t):
        if t and t not in seen:
            assert SEP not in t and "\0" not in t, repr(t[:80])
            seen.add(t)
            texts.append(t)

    tokdir = os.path.join(TESTDATA, "tokenizer")
    n_inp = 0
    for f in sorted(os.listdir(tokdir)):
        if f.endswith(".inp"):
            for t in read_cases(os.path.join(tokdir, f)):
                n_inp += t not in seen
                add(t)
    for f in sorted(os.listdir(os.path.join(TESTDATA, "text"))):
        with open(os.path.join(TESTDATA, "text", f), encoding="utf-8", newline="") as fh:
            whole = fh.read()
        add(whole)
        for para in whole.split("\n\n"):
            add(para)
    for t in (bpe_hf.EXTRA + test_gpt4o_hf.EXTRA + [CODE_C, CODE_PY] + CODE_MISC + NUMBERS +
              MULTILINGUAL + WHITESPACE + LONG + SPECIAL_TEXTS):
        add(t)
    add(json.dumps({"name": "gpt-oss", "vocab": 201088, "layers": [{"id": i, "w": i * 0.5}
                    for i in range(6)], "ok": True, "none": None, "s": "\u00e9\u65e5\U0001F600"},
                   indent=2))
    add(json.dumps({"ünïcödé": ["日本", "😀", "\t\n"], "esc": "a\"b\\c/d"}, ensure_ascii=False))
    add(json.dumps({"ünïcödé": ["日本", "😀", "\t\n"], "esc": "a\"b\\c/d"}))
    for t in bpe_hf.random_texts(400, 20261205, test_gpt4o_hf.PIECES):
        add(t)
    for t in random_codepoints(400, 7):
        add(t)
    n_tok = sum(map(len, write_conformance(scratch, "o200k-tiktoken", texts, base)))
    print("  o200k-tiktoken: %d texts (%d from tests/data/tokenizer/*.inp), %d tokens, "
          "%d bytes" % (len(texts), n_inp, n_tok, sum(len(t.encode()) for t in texts)))

    # every token that is valid UTF-8, as a text of its own
    singles = []
    for t in tokens:
        try:
            s = t.decode("utf-8")
        except UnicodeDecodeError:
            continue
        # NUL ends a case for the harness (it splits the .inp with strstr)
        if s and "\0" not in s and "__ggml_vocab_test" not in s:
            singles.append(s)
    n_one = sum(len(r) == 1 for r in write_conformance(scratch, "o200k-tiktoken-tokens",
                                                        singles, base))
    print("  o200k-tiktoken-tokens: %d of %d tokens are UTF-8 (%d of them one token as text)"
          % (len(singles), len(tokens), n_one))

    ok = run_conformance(conformance, "o200k-tiktoken", gguf, scratch)
    ok = run_conformance(conformance, "o200k-tiktoken-tokens", gguf, scratch) and ok

    # 4. harmony specials parsed
    bad = 0
    for t in SPECIAL_TEXTS:
        want = harmony.encode(t, allowed_special="all")
        r = subprocess.run([cairn, "tokenize", "-m", gguf, "--no-bos", "--parse-special"],
                           input=t.encode(), capture_output=True, timeout=60)
        got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else None
        if got != want:
            bad += 1
            print("FAIL special %r\n  want: %s\n  got:  %s %s" % (
                t, want, got, r.stderr.decode(errors="replace").strip()), file=sys.stderr)
    print("  specials: %d texts, %d failed" % (len(SPECIAL_TEXTS), bad))
    print("total %.1f s" % (time.time() - t_start))
    return 0 if ok and bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
