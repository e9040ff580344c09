#!/usr/bin/env python3
"""`cairn run --spec medusa:HEADS` and `--spec eagle3:HEAD` through the executable.

argv: CAIRN_BIN MODEL MEDUSA_HEADS TOOLS_DIR REF_DIR SCRATCH_DIR

- greedy output with Medusa heads (alone, beside n-grams) and with an
  EAGLE-3 head (converted from the published layout by
  tests/eagle3/eagle3_fixture.py) equals greedy output without them, byte for
  byte; seeded sampling and penalties give the plain run's text too;
- eagle3 beside medusa, a head file of the wrong kind and a missing one fail
  cleanly (exit 1, a message).
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S  # noqa: E402

cairn, model, medusa, tools, ref, scratch = harness.take_argv(
    "CAIRN_BIN", "MODEL", "MEDUSA_HEADS", "TOOLS_DIR", "REF_DIR", "SCRATCH_DIR")
failures = 0
fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eagle3",
                       "eagle3_fixture.py")
subprocess.run([sys.executable, fixture, tools, ref, model, scratch], check=True)
eagle3 = os.path.join(scratch, "eagle3.gguf")


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


methods = [["--spec", "medusa:" + medusa], ["--spec", "ngram,medusa:" + medusa],
           ["--spec", "eagle3:" + eagle3]]
for p in ["Once upon a time", "Tom had a red ball", "The sun was"]:
    base = run("run", "-m", model, "-p", p, "-n", "120", "--temp", "0", "-t", "1")
    check(base.returncode == 0, "plain run of %r" % p)
    for spec in methods:
        r = run("run", "-m", model, "-p", p, "-n", "120", "--temp", "0", "-t", "1", *spec,
                "--spec-fixed")
        check(r.returncode == 0 and r.stdout == base.stdout,
              "%s gives the plain greedy text for %r" % (" ".join(spec), p))
for extra in (["--temp", "0.8", "--seed", "7"], ["--temp", "0", "--repeat-penalty", "1.3"]):
    base = run("run", "-m", model, "-p", "Once upon a time", "-n", "80", "-t", "1", *extra)
    for spec in methods:
        r = run("run", "-m", model, "-p", "Once upon a time", "-n", "80", "-t", "1", *extra,
                *spec, "--spec-fixed")
        check(base.returncode == 0 and r.returncode == 0 and r.stdout == base.stdout,
              "%s %s gives the plain run's text" % (" ".join(spec), " ".join(extra)))

r = run("run", "-m", model, "-p", "hi", "--spec", "medusa:%s,eagle3:%s" % (medusa, eagle3))
check(r.returncode == 1 and "cannot go beside" in r.stderr, "rejects eagle3 beside medusa")
r = run("run", "-m", model, "-p", "hi", "--spec", "medusa:" + eagle3)
check(r.returncode == 1 and "not a Medusa head" in r.stderr, "rejects an EAGLE-3 file as Medusa")
r = run("run", "-m", model, "-p", "hi", "--spec", "eagle3:/nonexistent.gguf")
check(r.returncode == 1 and "EAGLE-3 head" in r.stderr, "rejects a missing EAGLE-3 head")

print("spec heads cli: %d failed" % failures)
sys.exit(1 if failures else 0)
