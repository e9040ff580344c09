#!/usr/bin/env python3
"""Load time and speed per weight format of one model: the GGUF Q4_K_M against Hugging Face
checkpoint folders of the same weights (BF16, AWQ, GPTQ, FP8), all through `cairn bench` on this
machine in one run, so the ratios are what to read (the machines are shared and noisy).

    bench/ckpt/run.py [--cairn build/cairn] [--ckpt build/ckpt] [--gguf MODEL.gguf]
                      [-t THREADS] [-p 512] [-n 128] [-r 2]

The folders are the ones `make test` builds (tests/ckpt/make_material.py real OUT MODEL.gguf):
round-to-nearest AWQ/GPTQ/FP8 made from the GGUF's own weights, so every row is the same model.
Prints a markdown table: disk size, load time (open + repack + upload), pp and tg tokens/s, and
each against the GGUF Q4_K_M.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def bench(cairn, model, a):
    cmd = [cairn, "bench", "-m", model, "-p", str(a.p), "-n", str(a.n), "-r", str(a.r), "--json",
           "--no-bandwidth"]
    if a.t:
        cmd += ["-t", str(a.t)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cairn", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--ckpt", default=os.path.join(ROOT, "build", "ckpt"))
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models",
                                                   "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("-t", type=int, default=0)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=2)
    a = ap.parse_args()
    rows = [("GGUF Q4_K_M", a.gguf), ("GGUF F16", os.path.join(a.ckpt, "qwen-f16.gguf"))]
    for name, folder in [("BF16 folder", "qwen-bf16"), ("AWQ g128", "qwen-awq"),
                         ("GPTQ g128 act-order asym", "qwen-gptq"), ("FP8 per channel", "qwen-fp8")]:
        rows.append((name, os.path.join(a.ckpt, folder)))
    missing = [m for _, m in rows if not os.path.exists(m)]
    if missing:
        sys.exit("missing: %s (make test builds the folders; scripts/get-model the GGUF)"
                 % ", ".join(missing))
    results = [(name, bench(a.cairn, m, a)) for name, m in rows]
    base = results[0][1]
    print(f"| format | disk MB | load s | pp{a.p} t/s | ÷Q4_K_M | tg{a.n} t/s | ÷Q4_K_M | "
          "MB read/token |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results:
        print(f"| {name} | {r['model_bytes'] / 1e6:.0f} | {r['load_s']:.2f} | {r['pp']:.1f} | "
              f"{r['pp'] / base['pp']:.2f} | {r['tg']:.2f} | {r['tg'] / base['tg']:.2f} | "
              f"{r['weight_bytes_per_token'] / 1e6:.0f} |")
    print(f"\n{base['threads']} threads; {a.r} repetitions; model {base['model']}")


if __name__ == "__main__":
    main()
