#!/usr/bin/env python3
"""After a ctest run: which tests did not run here, and why.

    python3 tests/support/skip_report.py BUILD_DIR

Reads BUILD_DIR/Testing/Temporary/LastTest.log (every test's output) and
prints, for each test that reported a skip (exit 77 after saying why:
KT_SKIP in tests/support/support.h, harness.main, or a test's own
"skipped: ..." line), its name and the lines that give the reason. Exits 0:
a skip is visible, not a failure; a test that must run where its needs are
met fails on its own.
"""
import os
import re
import sys

def blocks(log):
    name, lines = None, []
    for line in log:
        m = re.match(r"^\d+/\d+ Testing: (.+)$", line.rstrip("\n"))
        if m:
            if name:
                yield name, lines
            name, lines = m.group(1), []
        elif name:
            lines.append(line.rstrip("\n"))
    if name:
        yield name, lines


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    path = os.path.join(build, "Testing", "Temporary", "LastTest.log")
    if not os.path.exists(path):
        return 0
    skipped = []
    with open(path, errors="replace") as f:
        for name, lines in blocks(f):
            if not any("exiting 77" in ln or ln.startswith("SKIP") or
                       ln.lower().startswith("skipped") for ln in lines):
                continue
            why = [ln for ln in lines if ln.startswith(("SKIP", "skipped", "  ")) and
                   ("skip" in ln.lower() or ln.startswith("  "))]
            skipped.append((name, [w for w in why if w.strip()][:6]))
    if not skipped:
        print("skip report: every test ran")
        return 0
    print("skip report: %d test(s) did not run here (or ran only in part), and why:" % len(skipped))
    for name, why in skipped:
        print("  %s" % name)
        for w in why:
            print("      %s" % w.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
