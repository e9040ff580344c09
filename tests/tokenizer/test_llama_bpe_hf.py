#!/usr/bin/env python3
"""The Llama 3 (llama-bpe) pre-tokenizer against Hugging Face `tokenizers`,
without a Llama 3 vocabulary.

usage: test_llama_bpe_hf.py CONFORMANCE_BIN SCRATCH_DIR

No Llama 3 model can be fetched here, so the conformance data
tests/data/tokenizer/ggml-vocab-llama-bpe.gguf.inp/.out (ids of Llama 3's own
vocabulary) cannot run (tokenizer_llama-bpe skips without models/llama3.gguf).
This checks the same pre-tokenizer by another route:

  1. HF `tokenizers` trains a byte-level BPE whose pre-tokenizer is exactly
     Llama 3's tokenizer.json one: Split on Llama 3's published regex
     (LLAMA3_REGEX below, "Isolated"), then ByteLevel without its own regex.
     It is trained on those .inp texts, tests/data/text/stories.txt and the
     extra texts below with a vocabulary large enough that most pieces of
     the training text become one token each, so a piece split differently
     gives other ids, not the same ones by luck (and on digits, whose
     merges make \\p{N}{1,3} against \\p{N} visible).
  2. Its tokenizer.json goes into a tiny Hugging Face checkpoint folder
     (random Qwen2-shaped weights, tools/ckpt/make_synthetic.py), which
     cairn opens as it opens any folder: it recognises the regex as
     llama-bpe (ckpt/tokenizer_json.c) or refuses the folder.
  3. HF's ids for every text (the .inp cases, the extra texts, and seeded
     random mixes of letters, digits, contractions, whitespace runs,
     punctuation and non-Latin scripts) are written as conformance data,
     and test_tokenizer_conformance checks cairn's ids against them, and
     that decoding gives each text back.

Exits 77 (ctest: skipped) when `tokenizers` or numpy cannot be imported
(scripts/setup.sh --test installs them); any mismatch fails.

run() below is the whole check for any split regex cairn knows:
test_gpt4o_hf.py runs it for GPT-4o's (gpt-oss's) o200k regex.
"""
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TESTDATA = os.path.join(ROOT, "tests", "data")
SEP = "\n__ggml_vocab_test__\n"

# Llama 3's split regex as meta-llama/Meta-Llama-3-8B's tokenizer.json has it
# (written out here, not taken from cairn or tools/ckpt).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"]

EXTRA = [
    # contractions, any case
    "I'm sure they'll say we've done what she'd do; it's JOHN'S and DON'T.",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D ''s a''b it''ll",
    # numbers: runs of digits in threes, separators, other digit scripts
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 -42 +7 1e10 0x1F 2024-12-05",
    "٣٤٥٦ ١٢٣٤٥ १२३४ ４５６７ Ⅻ ² ½ 7th 21st",
    # whitespace runs and line ends
    "a  b   c    d\t\te\n\nf\r\ng \n h  \n\n  i\t \n",
    "   leading and trailing   ",
    "\n\n\n",
    " \u00a0\u3000x\u2003y",
    # punctuation runs
    "Hello!!! What?! ... (yes) [no] {maybe} <tag> a--b c__d $$$ @user #tag",
    "\"quoted\" 'single' `code` ~tilde~ ^caret^ |pipe| \\back\\ /slash/",
    # non-Latin scripts, marks, emoji
    "日本語のテキスト 中文文本 한국어 텍스트 Ελληνικά Русский текст עברית العربية",
    "e\u0301 cafe\u0301 na\u00efve \u0915\u093f \u0e01\u0e34 a\u0308b",
    "🦙 👨‍👩‍👧 🇫🇷 ❤️ ✓ ™ © → ∑ ∞",
    "mixed日本2024年12月5日 and x²+y²=z² ok",
]

PIECES = ["Hello", "world", "the", "I", "DON", "llama", "x", " ", "  ", "   ", "\n", "\n\n",
          "\r\n", "\t", " \t", "'s", "'T", "'ll", "'Re", "'ve", "'d", "'m", "'", "1", "12",
          "123", "4567", "3.14", "0", "１２", "٣٤", "Ⅻ", "²", "日本語", "한국어", "🦙", "é",
          "e\u0301", "ß", "Ελλάδα", "Привет", "!!!", "...", "?", "-", "_", "$", "@", "#", "(",
          ")", "\"", "\u00a0", "\u3000", ",", ".", ":", ";", "/", "\\", "*", "=", "+"]


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


def random_texts(n, seed, pieces=PIECES):
    """n texts of 1 to 14 random pieces (test_spm_hf.py uses them too)."""
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))) for _ in range(n)]


def run(usage, name, regex, specials, extra, pieces, ignore_merges):
    """Trains a byte-level BPE whose pre-tokenizer is Split(regex, Isolated)
    then ByteLevel (no regex of its own), as Llama 3's and gpt-oss's
    tokenizer.json have it, puts it in a checkpoint folder and has
    test_tokenizer_conformance compare cairn's ids with HF's as vocabulary
    NAME (SCRATCH_DIR/tokenizer/ggml-vocab-NAME.gguf.inp/.out). The texts:
    the llama-bpe .inp cases, `extra`, and random mixes of `pieces`.
    `ignore_merges` is what cairn's pre-tokenizer table gives the GGUF
    pre name the regex maps to (text/tokenizer_pre.c), so HF merges alike.
    Returns the exit status (0 pass, 1 fail; exits 77 to skip)."""
    if len(sys.argv) != 3:
        sys.exit(usage)
    conformance, scratch = sys.argv[1], sys.argv[2]
    try:
        import numpy as np
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
        import tokenizers
    except ImportError as e:
        skip(f"cannot import {e.name} (scripts/setup.sh --test installs tokenizers and numpy)")
    sys.path.insert(0, os.path.join(ROOT, "tools", "ckpt"))
    import ckpt_io
    import make_synthetic as ms

    with open(os.path.join(TESTDATA, "tokenizer", "ggml-vocab-llama-bpe.gguf.inp"),
              encoding="utf-8", newline="") as f:
        cases = f.read().split(SEP)
    if cases and cases[-1] == "":
        cases.pop()  # the file ends with a separator
    with open(os.path.join(TESTDATA, "text", "stories.txt"), encoding="utf-8") as f:
        stories = f.read()
    texts = cases + extra + random_texts(400, 20261205, pieces)
    for t in texts:
        assert SEP not in t and not any(s in t for s in specials), repr(t)

    # 1. the tokenizer, with the pre-tokenizer under test, trained here
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=6000, min_frequency=1, show_progress=False,
                                  special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # the held-out random texts are not trained on: merges on unseen words too
    tok.train_from_iterator(cases + extra + stories.split("\n") + random_texts(200, 7, pieces),
                            trainer=trainer)
    n_vocab = tok.get_vocab_size()

    # 2. a checkpoint folder around it
    folder = os.path.join(scratch, name)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    rows = (n_vocab + 7) // 8 * 8
    bos, eos = (tok.token_to_id(s) for s in specials)
    ckpt_io.write_folder(folder, ms.as_list(ms.random_weights(np.random.default_rng(5), rows,
                                                              True)))
    ckpt_io.write_json(os.path.join(folder, "config.json"), ms.config(rows, True, bos, eos))
    ckpt_io.write_json(os.path.join(folder, "tokenizer_config.json"), {
        "bos_token": specials[0], "eos_token": specials[1], "add_bos_token": False})

    # 3. HF's ids as conformance data, then cairn on the folder
    data = os.path.join(scratch, "tokenizer")
    os.makedirs(data, exist_ok=True)
    base = os.path.join(data, f"ggml-vocab-{name}.gguf")
    with open(base + ".inp", "w", encoding="utf-8", newline="") as f:
        f.write("".join(t + SEP for t in texts))
    with open(base + ".out", "w", encoding="utf-8", newline="") as f:
        for t in texts:
            enc = tok.encode(t, add_special_tokens=False)
            assert tok.decode(enc.ids) == t, "HF does not give back %r" % t
            f.write(" ".join(map(str, enc.ids)) + "\n")
    multi = sum(len(tok.encode(t, add_special_tokens=False).ids) > 1 for t in texts)
    print(f"tokenizers {tokenizers.__version__}: {n_vocab} tokens trained, {len(texts)} texts "
          f"({len(cases)} from ggml-vocab-llama-bpe.gguf.inp), {multi} of several tokens; "
          f"folder {folder}")
    env = dict(os.environ, CAIRN_TESTDATA=scratch)
    r = subprocess.run([conformance, name, folder], env=env, timeout=120)
    return 0 if r.returncode == 0 else 1


def main():
    # ignore_merges: llama-bpe's entry in text/tokenizer_pre.c (Llama 3's
    # tokenizer.json has "ignore_merges": true)
    return run(__doc__, "llama-bpe-hf", LLAMA3_REGEX, SPECIALS, EXTRA, PIECES,
               ignore_merges=True)


if __name__ == "__main__":
    sys.exit(main())
