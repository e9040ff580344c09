#!/usr/bin/env python3
"""`cairn run --draft` and `cairn bench --draft` through the real executable.

argv: CAIRN_BIN MODEL HEAD

- greedy output with --draft equals greedy output without it, byte for byte,
  for several prompts and tree shapes (stdout carries only the text);
- stderr reports tau and the draft settings;
- seeded sampling and penalties give the plain run's text too, with --draft
  and with --spec ngram / draft:MODEL / combinations;
- bad --draft values, an unknown --spec method and a file that is not a
  head fail cleanly (exit 1/2, a message, no crash);
- `cairn bench --draft --json` reports tau > 1 and both speeds.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S  # noqa: E402

cairn, model, head = harness.take_argv("CAIRN_BIN", "MODEL", "HEAD")
failures = 0


def run(*args):
    return subprocess.run([cairn, *args], capture_output=True, text=True,
                          timeout=SHORT_HANG_GUARD_S)


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)
    else:
        print("ok:", what)


prompts = ["Once upon a time", "Tom had a red ball", "The sun was", "Lily and Ben went to"]
shapes = [("1", "1", "1"), ("4", "3", "10"), ("6", "10", "60")]
for p in prompts:
    base = run("run", "-m", model, "-p", p, "-n", "150", "--temp", "0", "-t", "1")
    check(base.returncode == 0, "plain run of %r" % p)
    for d, k, n in shapes:
        spec = run("run", "-m", model, "-p", p, "-n", "150", "--temp", "0", "-t", "1",
                   "--draft", head, "--draft-depth", d, "--draft-topk", k, "--draft-n", n)
        check(spec.returncode == 0 and spec.stdout == base.stdout,
              "--draft d%s k%s n%s gives the plain greedy text for %r" % (d, k, n, p))
        check("tau" in spec.stderr, "tau reported")

# sampling with a seed runs and stops at -n
s = run("run", "-m", model, "-p", "Once upon a time", "-n", "40", "--temp", "0.8",
        "--seed", "7", "--draft", head)
check(s.returncode == 0 and len(s.stdout) > 10, "sampled run with --draft")

# bad input
for args, what in [(["--draft-depth", "0"], "depth 0"), (["--draft-topk", "99"], "top-k 99"),
                   (["--draft-n", "x"], "n 'x'")]:
    r = run("run", "-m", model, "-p", "hi", "--draft", head, *args)
    check(r.returncode == 2 and "draft" in r.stderr, "rejects " + what)
r = run("run", "-m", model, "-p", "hi", "--draft", model)
check(r.returncode == 1 and "EAGLE head" in r.stderr, "rejects a model file as a head")
r = run("run", "-m", model, "-p", "hi", "--draft", "/nonexistent.gguf")
check(r.returncode == 1 and "draft head" in r.stderr, "rejects a missing head")
# a step draws as plain decoding does: sampled with a seed, with penalties,
# and through the other methods, the text is the plain run's
for extra in (["--temp", "0.8", "--seed", "7"],
              ["--temp", "0", "--repeat-penalty", "1.3"],
              ["--temp", "0.7", "--seed", "3", "--frequency-penalty", "0.5"]):
    base = run("run", "-m", model, "-p", "Once upon a time", "-n", "80", "-t", "1", *extra)
    for spec in (["--draft", head], ["--spec", "ngram"], ["--spec", "ngram,eagle:" + head],
                 ["--spec", "draft:" + model]):
        r = run("run", "-m", model, "-p", "Once upon a time", "-n", "80", "-t", "1", *extra,
                *spec, "--spec-fixed")
        check(base.returncode == 0 and r.returncode == 0 and r.stdout == base.stdout,
              "%s %s gives the plain run's text" % (" ".join(spec), " ".join(extra)))
r = run("run", "-m", model, "-p", "hi", "--spec", "bogus")
check(r.returncode == 1 and "unknown method" in r.stderr, "rejects an unknown --spec method")

b = run("bench", "-m", model, "-p", "0", "-n", "64", "-r", "1", "-t", "1", "--json",
        "--draft", head)
check(b.returncode == 0, "bench --draft runs")
if b.returncode == 0:
    j = json.loads(b.stdout.strip().splitlines()[-1])
    check(j["tau"] > 1.0 and j["text_plain"] > 0 and j["text_eagle"] > 0,
          "bench reports tau %.2f and both speeds" % j["tau"])

print("eagle cli: %d failed" % failures)
sys.exit(1 if failures else 0)
