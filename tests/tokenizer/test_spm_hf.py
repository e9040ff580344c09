#!/usr/bin/env python3
"""SentencePiece-style tokenizer.json (BPE with byte_fallback) read from a checkpoint folder,
against Hugging Face `tokenizers` and against the GGUF vocabulary it came from.

usage: test_spm_hf.py CONFORMANCE_BIN SCRATCH_DIR [GEMMA_GGUF]

Hugging Face ships Llama 2, Mistral and Gemma tokenizers as a BPE tokenizer.json whose merges
come from the SentencePiece model; cairn's ckpt/ reads it back as a SentencePiece vocabulary.
For each vocabulary:

  1. tools/ckpt/gguf_to_hf.py --tokenizer-only writes the tokenizer.json a converter would (the
     Llama 2 legacy form, a Prepend of U+2581, for llama-spm; Gemma's, no prefix, for Gemma 3),
     and a tiny checkpoint folder (random weights, tools/ckpt/make_synthetic.py) is put around it.
  2. llama-spm: HF `tokenizers` must give the ids of the published conformance data
     (tests/data/tokenizer/ggml-vocab-llama-spm.gguf.out) from that tokenizer.json, and so must
     cairn from the folder. This checks the writer and the reader against HF's own ids.
  3. Gemma 3 (when its GGUF is given and present): HF's ids from the written tokenizer.json,
     on the llama-spm texts, the extra texts of test_llama_bpe_hf.py and random mixes, are the
     conformance data; cairn must give them from the folder and from the GGUF itself, so the
     folder tokenizes exactly as the model's own vocabulary does.

Exits 77 (ctest: skipped) when `tokenizers` or numpy cannot be imported; any mismatch fails.
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TESTDATA = os.path.join(ROOT, "tests", "data")
TOOLS = os.path.join(ROOT, "tools", "ckpt")
SEP = "\n__ggml_vocab_test__\n"


def skip(why):
    print("skipped: " + why)
    sys.exit(77)


def folder_for(gguf, folder, ckpt_io, ms, np):
    """gguf's tokenizer files plus random weights and a config of its vocabulary's size."""
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    subprocess.run([sys.executable, os.path.join(TOOLS, "gguf_to_hf.py"), "--tokenizer-only",
                    gguf, folder], check=True)
    import json
    with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    ids = list(tj["model"]["vocab"].values()) + [a["id"] for a in tj["added_tokens"]]
    rows = (max(ids) + 1 + 7) // 8 * 8
    ckpt_io.write_folder(folder, ms.as_list(ms.random_weights(np.random.default_rng(5), rows,
                                                              True)))
    ckpt_io.write_json(os.path.join(folder, "config.json"), ms.config(rows, True, 1, 2))
    return os.path.join(folder, "tokenizer.json")


def conformance(binary, name, model, testdata):
    r = subprocess.run([binary, name, model], env=dict(os.environ, CAIRN_TESTDATA=testdata),
                       capture_output=True, text=True, timeout=300)
    print(r.stdout.strip())
    if r.returncode != 0:
        print(r.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"FAIL: cairn's ids for {name} from {model}")


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    binary, scratch = sys.argv[1], sys.argv[2]
    gemma = sys.argv[3] if len(sys.argv) == 4 else None
    try:
        import numpy as np
        from tokenizers import Tokenizer
    except ImportError as e:
        skip(f"cannot import {e.name} (scripts/setup.sh --test installs tokenizers and numpy)")
    sys.path.insert(0, TOOLS)
    sys.path.insert(0, HERE)
    import ckpt_io
    import make_synthetic as ms
    from test_llama_bpe_hf import EXTRA, random_texts

    os.makedirs(scratch, exist_ok=True)
    spm = os.path.join(TESTDATA, "tokenizer", "ggml-vocab-llama-spm.gguf")

    # llama-spm: the published ids, from HF on the written file and from cairn on the folder
    tj = folder_for(spm, os.path.join(scratch, "llama-spm"), ckpt_io, ms, np)
    r = subprocess.run([sys.executable, os.path.join(TOOLS, "check_tokenizer.py"), tj,
                        spm + ".inp", spm + ".out"], capture_output=True, text=True, timeout=300)
    print("HF tokenizers on the written llama-spm tokenizer.json:", r.stdout.strip())
    if r.returncode != 0:
        print(r.stderr[-4000:], file=sys.stderr)
        raise SystemExit("FAIL: the written tokenizer.json does not give the published ids")
    conformance(binary, "llama-spm", os.path.join(scratch, "llama-spm"), TESTDATA)

    if not gemma:
        return
    if not os.path.isfile(gemma):
        print(f"Gemma part skipped: no model at {gemma} (scripts/get-model gemma3-270m-q4_k_m)")
        return
    folder = os.path.join(scratch, "gemma3")
    tj = folder_for(gemma, folder, ckpt_io, ms, np)
    with open(spm + ".inp", encoding="utf-8", newline="") as f:
        cases = f.read().split(SEP)
    if cases and cases[-1] == "":
        cases.pop()
    texts = cases + EXTRA + random_texts(300, 20261207)
    tok = Tokenizer.from_file(tj)
    data = os.path.join(scratch, "data", "tokenizer")
    os.makedirs(data, exist_ok=True)
    base = os.path.join(data, "ggml-vocab-gemma3-hf.gguf")
    with open(base + ".inp", "w", encoding="utf-8", newline="") as f:
        f.write(SEP.join(texts))
    with open(base + ".out", "w", encoding="utf-8", newline="") as f:
        for t in texts:
            f.write(" ".join(str(i) for i in tok.encode(t, add_special_tokens=False).ids) + "\n")
    print(f"gemma3: {len(texts)} texts, HF ids written")
    conformance(binary, "gemma3-hf", folder, os.path.dirname(data))
    conformance(binary, "gemma3-hf", gemma, os.path.dirname(data))


if __name__ == "__main__":
    main()
