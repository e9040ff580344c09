#!/usr/bin/env python3
"""Check a tokenizer.json against llama.cpp-style conformance data.

    check_tokenizer.py TOKENIZER_JSON INP OUT

INP holds the test texts separated by "\\n__ggml_vocab_test__\\n"; OUT one line per case with the
space-separated token ids the reference (Hugging Face) tokenizer gives without special tokens
(no BOS). The tokenizer is loaded with HF `tokenizers` (Tokenizer.from_file) and every case must
give exactly those ids. Prints each mismatch; exits 1 if there is any.
"""

import sys

from tokenizers import Tokenizer


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    tok = Tokenizer.from_file(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8", newline="") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")
    with open(sys.argv[3], encoding="utf-8", newline="") as f:
        want = f.read().split("\n")
    # the .inp starts with nothing special and ends with a separator-less last case; the .out
    # ends with a newline, so its last split piece is empty.
    if want and want[-1] == "":
        want.pop()
    if texts and texts[-1] == "" and len(texts) == len(want) + 1:
        texts.pop()
    if len(texts) != len(want):
        print(f"{len(texts)} texts but {len(want)} id lines", file=sys.stderr)
        return 1
    bad = 0
    for i, (t, w) in enumerate(zip(texts, want)):
        exp = [int(x) for x in w.split()]
        got = tok.encode(t, add_special_tokens=False).ids
        if got != exp:
            bad += 1
            print(f"case {i} {t!r}:\n  want {exp}\n  got  {got}", file=sys.stderr)
    print(f"{len(texts) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
