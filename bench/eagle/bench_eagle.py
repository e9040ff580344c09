#!/usr/bin/env python3
"""EAGLE speculative decoding on the bundled model: tau and tokens/s.

For each draft-tree shape, `cairn bench --draft` generates the same greedy
text (temperature 0) with and without speculation, after each prompt, and
reports tau (tokens emitted per target forward) and both speeds. Prints a
markdown table; the output is identical either way (tests/eagle checks that).

    bench/eagle/bench_eagle.py [--cairn build/cairn] [--model M] [--head H]
                               [-n 256] [-r 3] [-t 1]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = [  # depth, top_k, n_draft
    (1, 1, 1), (3, 1, 3), (4, 2, 6), (5, 4, 12), (5, 8, 32), (6, 10, 60),
]
PROMPTS = ["Once upon a time", "Tom and his dog", "The little bird was sad because",
           "One day, Lily went to the park"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cairn", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K.gguf"))
    ap.add_argument("--head", default=os.path.join(ROOT, "models", "stories260K-eagle.gguf"))
    ap.add_argument("-n", type=int, default=256, help="tokens generated per run")
    ap.add_argument("-r", type=int, default=3, help="timed repetitions")
    ap.add_argument("-t", type=int, default=1, help="threads")
    a = ap.parse_args()

    rows = []
    for depth, k, n in SHAPES:
        taus, plain, eagle = [], [], []
        for text in PROMPTS:
            out = subprocess.run(
                [a.cairn, "bench", "-m", a.model, "-p", "0", "-n", str(a.n), "-r", str(a.r),
                 "-t", str(a.t), "--json", "--draft", a.head, "--draft-depth", str(depth),
                 "--draft-topk", str(k), "--draft-n", str(n), "--text", text],
                check=True, capture_output=True, text=True).stdout
            j = json.loads(out.strip().splitlines()[-1])
            taus.append(j["tau"])
            plain.append(j["text_plain"])
            eagle.append(j["text_eagle"])
        mean = lambda v: sum(v) / len(v)
        rows.append((depth, k, n, mean(taus), mean(plain), mean(eagle)))

    print("| depth | top_k | n | tau | plain tok/s | EAGLE tok/s | speed-up |")
    print("| ----: | ----: | --: | --: | ----------: | ----------: | -------: |")
    for depth, k, n, tau, p, e in rows:
        print("| %5d | %5d | %3d | %.2f | %11.0f | %11.0f | %7.2fx |" % (depth, k, n, tau, p, e, e / p))
    print("\n%d prompts x %d greedy tokens, %d threads, %d reps; model %s, head %s"
          % (len(PROMPTS), a.n, a.t, a.r, os.path.basename(a.model), os.path.basename(a.head)))


if __name__ == "__main__":
    sys.exit(main())
