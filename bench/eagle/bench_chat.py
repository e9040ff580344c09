#!/usr/bin/env python3
"""EAGLE on a chat model: tau and tokens/s on held-out coding-assistant prompts.

For each prompt of tools/eagle_prompts.py's held_out() (none of them in the
head's training data), `cairn run --chat --temp 0` answers once without a head
and once per draft-tree shape with it, and this reads the generation speed
and tau (tokens per target forward) that cairn run logs. Greedy speculation
gives exactly the plain output (tests/eagle checks this); the script checks
it as well. Prints a markdown table.

    bench/eagle/bench_chat.py --model models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --head models/qwen2.5-coder-0.5b-instruct-eagle.gguf [-n 128] [-t 2] \
        [--shapes 4,4,8 3,1,3] [--prompts 3] [--adaptive]

(`cairn bench --draft --text` measures the same on raw text, but it tokenizes
--text without special tokens, so it cannot give the model its chat template.)
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import eagle_prompts  # noqa: E402


def run(a, system, user, shape):
    cmd = [a.cairn, "run", "-m", a.model, "--chat", "--temp", "0", "-n", str(a.n),
           "-t", str(a.t), "-p", user]
    if system:
        cmd += ["--system", system]
    if shape:
        cmd += ["--spec", "eagle:" + a.head, "--draft-depth", str(shape[0]),
                "--draft-topk", str(shape[1]), "--draft-n", str(shape[2])]
        if not a.adaptive:
            # tau is the head's, not the controller's: without this cairn pauses
            # speculation that does not pay and drafts less on those steps
            cmd += ["--spec-fixed"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"generated (\d+) tokens in ([\d.]+) s", r.stderr)
    tau = re.search(r"tau ([\d.]+)", r.stderr)
    return r.stdout, int(m.group(1)), float(m.group(2)), float(tau.group(1)) if tau else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cairn", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--head", default=os.path.join(ROOT, "models",
                                                   "qwen2.5-coder-0.5b-instruct-eagle.gguf"))
    ap.add_argument("-n", type=int, default=128, help="answer tokens at most")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("--shapes", nargs="+", default=["4,4,8", "3,1,3"],
                    help="draft trees as depth,top_k,n_draft")
    ap.add_argument("--prompts", type=int, default=0, help="use only the first N held-out prompts")
    ap.add_argument("--adaptive", action="store_true",
                    help="let cairn's controller pause speculation (default: --spec-fixed)")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes]
    prompts = eagle_prompts.held_out()
    if a.prompts:
        prompts = prompts[:a.prompts]

    plain_tok = plain_s = 0
    per_shape = {s: [0, 0.0, 0.0] for s in shapes}  # tokens, seconds, tau * tokens
    for system, user in prompts:
        text, n, sec, _ = run(a, system, user, None)
        plain_tok, plain_s = plain_tok + n, plain_s + sec
        for s in shapes:
            t2, n2, sec2, tau = run(a, system, user, s)
            if t2 != text:
                raise SystemExit("bench_chat.py: speculative output differs from plain for %r"
                                 % user[:40])
            acc = per_shape[s]
            acc[0] += n2
            acc[1] += sec2
            acc[2] += tau * n2
        print("done: %r (%d tokens)" % (user[:50], n), file=sys.stderr)

    plain = plain_tok / plain_s
    print("| depth | top_k | n | tau | plain tok/s | EAGLE tok/s | speed-up |")
    print("| ----: | ----: | --: | --: | ----------: | ----------: | -------: |")
    for s in shapes:
        n, sec, taun = per_shape[s]
        print("| %5d | %5d | %3d | %.2f | %11.1f | %11.1f | %7.2fx |"
              % (s[0], s[1], s[2], taun / n, plain, n / sec, n / sec / plain))
    print("\n%d held-out prompts, greedy, up to %d tokens each (%d in all), %d threads; model %s, "
          "head %s%s" % (len(prompts), a.n, plain_tok, a.t, os.path.basename(a.model),
                         os.path.basename(a.head), "" if a.adaptive else ", --spec-fixed"))


if __name__ == "__main__":
    main()
