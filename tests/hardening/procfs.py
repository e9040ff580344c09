"""/proc readings of the server's memory and descriptors, for the hardening
tests (the rest of their plumbing is tests/support/harness.py).

Under `make sanitize` / `make tsan` the server runs with a sanitizer whose own
shadow memory and quarantine dwarf the budgets: the memory bounds are the
release build's promise, so they are reported but not asserted there
(SANITIZER is set).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402

SANITIZER = os.environ.get("CAIRN_SANITIZER", "")


def proc_status(pid):
    """VmHWM / VmRSS / Threads ... of a process, in kB (counts as is)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            parts = v.split()
            if parts and parts[0].isdigit():
                out[k] = int(parts[0])
    return out


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_fds(pid, at_most):
    """Connections close asynchronously: poll (bounded: a hang guard) until
    the process holds at most `at_most` descriptors; returns the count."""
    return harness.poll(lambda: open_fds(pid), lambda n: n <= at_most)
