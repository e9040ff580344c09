#!/usr/bin/env python3
"""Checks the file contract of llama_ref.py --out / --hidden.

The C forward-pass tests read these files, so their layout is checked here
by running the CLI as they do:
  * the sizes are n_tokens * n_vocab and n_tokens * dim float32 values;
  * every row of --out is the output projection of the same row of --hidden
    (so rows are positions, in order, and nothing is transposed);
  * the pass is causal: the first rows of a longer prompt equal the rows of
    the shorter prompt alone;
  * the last row's argmax is the first greedily generated token.
usage: check_ref_files.py MODEL WORKDIR
"""

import os
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    sys.exit(77)  # ctest: skipped

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402  (exits 77 itself when gguf is missing)


def run_ref(model, tokens, workdir, tag):
    out = os.path.join(workdir, f"ref_{tag}_logits.f32")
    hid = os.path.join(workdir, f"ref_{tag}_hidden.f32")
    subprocess.run([sys.executable, os.path.join(HERE, "llama_ref.py"), model,
                    "--tokens", ",".join(map(str, tokens)), "--out", out, "--hidden", hid],
                   check=True)
    return np.fromfile(out, dtype="<f4"), np.fromfile(hid, dtype="<f4")


def main():
    model, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    m = llama_ref.Model(model)
    prompt = [1, 403, 407, 261, 378]

    logits, hidden = run_ref(model, prompt, workdir, "full")
    assert logits.size == len(prompt) * m.n_vocab, logits.size
    assert hidden.size == len(prompt) * m.dim, hidden.size
    logits = logits.reshape(len(prompt), m.n_vocab)
    hidden = hidden.reshape(len(prompt), m.dim)
    assert np.all(np.isfinite(logits)) and np.all(np.isfinite(hidden))

    projected = hidden.astype(np.float64) @ m.output.T
    assert np.allclose(projected, logits, rtol=1e-4, atol=1e-4), \
        np.abs(projected - logits).max()

    short, _ = run_ref(model, prompt[:3], workdir, "short")
    short = short.reshape(3, m.n_vocab)
    assert np.allclose(short, logits[:3], rtol=0, atol=1e-5), np.abs(short - logits[:3]).max()
    # ... while an earlier token does reach the later rows (attention is not
    # limited to the token itself): changing token 1 changes row 2.
    other, _ = run_ref(model, [1, 404, 407], workdir, "other")
    other = other.reshape(3, m.n_vocab)
    assert np.abs(other[2] - short[2]).max() > 1e-3

    assert int(np.argmax(logits[-1])) == 432, int(np.argmax(logits[-1]))
    print("check_ref_files: ok")


if __name__ == "__main__":
    main()
