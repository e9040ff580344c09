#!/usr/bin/env python3
"""`cairn chat` driven through a pseudo-terminal, on the real instruct model
(greedy, short replies): a two-turn chat whose second turn finds the first
in the cache, `/save`, a reply stopped by Ctrl-C that returns to the prompt
(the program goes on), Ctrl-D to exit; then a restart on the same
--cache-dir, `/load`, and a third turn whose history is reported cached (from
disk: nothing was in memory), `/stats` saying so too. And the same model
given gpt-oss's harmony template: replies are read in channels as they
stream (the model's headers, if it writes any, never shown), and the
conversation goes on from the cache.

usage: test_chat.py CAIRN_BIN       (exit 77 = skipped: model absent)
"""
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S  # noqa: E402

[CAIRN] = harness.take_argv("CAIRN_BIN", usage=__doc__)
MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")

PROMPT = r"\n\r?> "  # the prompt, on a line of its own
TURN = re.compile(r"\[prompt (\d+) tokens, (\d+) cached \(device (\d+), host (\d+), disk (\d+)\); "
                  r"reply (\d+) tokens")
PAGE = 16


class Chat:
    """One `cairn chat` process on a pseudo-terminal."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal is its stdin, stdout and stderr
            try:
                os.execv(CAIRN, [CAIRN, "chat", *args])
            finally:
                os._exit(127)
        self.out = ""  # everything read so far
        self.mark = 0  # where the next expect starts looking

    def read_some(self, deadline):
        r, _, _ = select.select([self.fd], [], [], max(0.0, min(1.0, deadline - time.time())))
        if r:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            if not data:
                raise EOFError
            self.out += data.decode("utf-8", "replace")

    def expect(self, pattern, timeout=SHORT_HANG_GUARD_S):
        """The first match of pattern after the last one; fails on a timeout."""
        rx = re.compile(pattern if isinstance(pattern, str) else pattern.pattern, re.S)
        deadline = time.time() + timeout
        while True:
            m = rx.search(self.out, self.mark)
            if m:
                self.mark = m.end()
                return m
            if time.time() > deadline:
                raise AssertionError(f"timed out waiting for {rx.pattern!r}; output:\n{self.out}")
            try:
                self.read_some(deadline)
            except EOFError:
                raise AssertionError(f"exited waiting for {rx.pattern!r}; output:\n{self.out}")

    def send(self, text):
        os.write(self.fd, text.encode())

    def say(self, line):
        """A user turn; its figures (prompt, cached, device, host, disk, reply)."""
        self.send(line + "\r")
        m = self.expect(TURN)
        self.expect(PROMPT)
        return [int(x) for x in m.groups()]

    def wait_exit(self, timeout=SHORT_HANG_GUARD_S):
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            try:
                self.read_some(deadline)
            except EOFError:
                time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"did not exit; output:\n{self.out}")

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


@unittest.skipUnless(os.path.exists(MODEL), f"real chat model absent ({MODEL or 'unset'})")
class ChatTerminal(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="cairn-chat-")
        self.cache = os.path.join(self.dir.name, "cache")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.kill()
        self.dir.cleanup()

    def start(self, *extra):
        c = Chat("-m", MODEL, "--cache-dir", self.cache, "--temp", "0", "-c", "1024",
                 "--page-size", str(PAGE), "--system", "Answer in one short sentence.", *extra)
        self.procs.append(c)
        c.expect(r"Ctrl-D exits")
        c.expect(r"> ")
        return c

    def test_two_turns_save_restart_load_cached(self):
        c = self.start("-n", "200")
        p1, cached1, *_ = c.say("What is the capital of France?")
        self.assertGreater(p1, 10)
        self.assertIn("Paris", c.out)
        p2, cached2, dev2, _, _, _ = c.say("And of Italy?")
        # the first turn's prompt and reply were kept: only the new turn is computed
        self.assertGreater(p2, p1)
        self.assertGreaterEqual(cached2, PAGE * ((p1 - 1) // PAGE), c.out)
        self.assertEqual(dev2, cached2)

        c.send("/save geo\r")
        m = c.expect(r"saved as 'geo' \(4 messages, (\d+) tokens\)")
        history = int(m.group(1))
        self.assertGreater(history, p2)
        c.expect(PROMPT)

        # Ctrl-C during a reply stops it and returns to the prompt
        c.send("/reset\r")
        c.expect(PROMPT)
        c.send("/system Write at length.\r")
        c.expect(PROMPT)
        c.send("Write a long story about a dragon who learns to paint.\r")
        c.expect(r"to paint\.[^\n]*\n.{8,}")  # the line ended, the reply has begun
        c.send("\x03")
        c.expect(r"\[stopped\]")
        m = c.expect(TURN)
        self.assertLess(int(m.group(6)), 200, "the reply ran to its end: nothing was stopped")
        c.expect(PROMPT)
        c.send("/stats\r")  # still alive and answering
        c.expect(r"conversation: \(unsaved\), 2 messages")
        c.expect(PROMPT)
        c.send("\x04")  # Ctrl-D on an empty line
        self.assertEqual(c.wait_exit(), 0, c.out)

        # a new process on the same cache directory
        c = self.start("-n", "24")
        c.send("/load geo\r")
        c.expect(r"> What is the capital of France\?")
        m = c.expect(r"loaded 'geo': 4 messages, (\d+) tokens in its session")
        self.assertEqual(int(m.group(1)), history)
        c.expect(PROMPT)
        p3, cached3, dev3, host3, disk3, _ = c.say("And of Spain?")
        self.assertGreater(p3, history)
        # the whole history (its last partial page aside) served from the cache:
        # from disk, since the tree started empty
        self.assertGreaterEqual(cached3, PAGE * ((history - 1) // PAGE), c.out)
        self.assertLessEqual(cached3, history, c.out)
        self.assertEqual(disk3 + host3, cached3, c.out)
        self.assertGreater(disk3, 0, c.out)
        c.send("/stats\r")
        m = c.expect(r"conversation: geo, 6 messages")
        m = c.expect(r"(\d+) served from the cache \(device \d+, host \d+, disk (\d+)\)")
        self.assertGreaterEqual(int(m.group(1)), cached3)
        c.expect(PROMPT)
        c.send("/quit\r")
        self.assertEqual(c.wait_exit(), 0, c.out)

    def test_saved_conversation_survives_sigkill(self):
        # /save with a cache directory makes the conversation durable: each
        # turn's record and pages are on disk before its prompt comes back,
        # so a crash (SIGKILL: no shutdown, no write-back) loses nothing
        c = self.start("-n", "24")
        p1, _, *_ = c.say("What is the capital of France?")
        c.send("/save geo\r")
        c.expect(r"saved as 'geo' \(2 messages")
        c.expect(PROMPT)
        p2, *_ = c.say("And of Italy?")  # a turn after the save is kept too
        self.assertGreater(p2, p1)
        c.kill()

        c = self.start("-n", "24")
        c.send("/load geo\r")
        c.expect(r"> And of Italy\?")
        m = c.expect(r"loaded 'geo': 4 messages, (\d+) tokens in its session")
        history = int(m.group(1))
        self.assertGreater(history, p2, c.out)  # the second turn's reply is in it
        c.expect(PROMPT)
        p3, cached3, dev3, host3, disk3, _ = c.say("And of Spain?")
        self.assertGreater(p3, history)
        self.assertGreaterEqual(cached3, PAGE * ((history - 1) // PAGE), c.out)
        self.assertGreater(disk3, 0, c.out)
        c.send("/quit\r")
        self.assertEqual(c.wait_exit(), 0, c.out)

    def templated(self, name):
        """The instruct model with one of tests/chat/templates/real/ as its
        chat template (skipped without the gguf Python package)."""
        try:
            import gguf  # noqa: F401
        except ImportError:
            self.skipTest("the gguf Python package is not installed")
        template = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chat",
                                "templates", "real", name)
        model = os.path.join(self.dir.name, os.path.splitext(name)[0] + ".gguf")
        subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                        "--chat-template-file", template, "--force", MODEL, model],
                       check=True, capture_output=True, timeout=120)
        return model

    def test_harmony_template(self):
        # No small model writes harmony; the instruct model under gpt-oss's
        # template writes whatever it writes, which cairn chat must read in
        # channels: any harmony header it imitates is taken apart, never
        # shown, and the turn's content is what the conversation keeps.
        model = self.templated("openai-gpt-oss-120b.jinja")
        c = Chat("-m", model, "--temp", "0", "-c", "1024", "--page-size", str(PAGE), "-n", "24",
                 "--system", "Answer in one short sentence.")
        self.procs.append(c)
        c.expect(r"harmony template")
        c.expect(r"> ")
        start = len(c.out)
        first = c.say("What is the capital of France?")
        second = c.say("And of Italy?")
        replies = c.out[start:]
        for marker in ("<|message|>", "<|channel|>", "<|start|>assistant"):
            self.assertNotIn(marker, replies)
        self.assertGreater(first[5], 0)
        # the first turn's prompt is the second's beginning: read from the cache
        self.assertGreaterEqual(second[1], first[0] - PAGE, c.out)
        c.send("\x04")
        self.assertEqual(c.wait_exit(), 0, c.out)

    def test_thinking_template(self):
        # Qwen3's template: the banner says the model thinks first, and a
        # reply is read into reasoning (shown apart) and content (kept); the
        # next turn's prompt still begins with the first one's, from the cache
        model = self.templated("Qwen-Qwen3-0.6B.jinja")
        c = Chat("-m", model, "--temp", "0", "-c", "1024", "--page-size", str(PAGE), "-n", "24")
        self.procs.append(c)
        c.expect(r"qwen2 template that thinks first")
        c.expect(r"> ")
        first = c.say("What is the capital of France?")
        second = c.say("And of Italy?")
        self.assertGreater(first[5], 0)
        self.assertGreaterEqual(second[1], first[0] - PAGE, c.out)
        c.send("\x04")
        self.assertEqual(c.wait_exit(), 0, c.out)

    def test_commands_and_errors(self):
        c = self.start("-n", "8")
        c.send("/load nosuch\r")
        c.expect(r"no conversation named 'nosuch'")
        c.expect(PROMPT)
        c.send("/frobnicate\r")
        c.expect(r"unknown command '/frobnicate'")
        c.expect(PROMPT)
        c.send("/help\r")
        c.expect(r"/save NAME")
        c.expect(PROMPT)
        # line editing: Ctrl-U drops what was typed; "Hello!" is typed as
        # "ello", Home, Right, Left, "H", End, "!"
        c.send("wrong\x15")  # Ctrl-U clears what was typed
        c.send("ello\x1b[H\x1b[C\x1b[DH\x1b[F!\r")
        c.expect(r"\[prompt")
        c.expect(PROMPT)
        c.send("/fork copy\r")
        c.expect(r"forked: this copy goes on")
        c.expect(r"saved as 'copy' \(2 messages")
        c.expect(PROMPT)
        c.send("\x1b[A\x1b[A\r")  # Up twice: "Hello!" again (the last line is "/fork copy")
        c.expect(TURN)
        c.expect(PROMPT)
        c.send("typed, then dropped\x03")  # Ctrl-C on text drops it, the program goes on
        c.expect(PROMPT)
        c.send("\x03")  # Ctrl-C on an empty line exits
        self.assertEqual(c.wait_exit(), 0, c.out)
        self.assertIn("Hello!", c.out)


if __name__ == "__main__":
    harness.main()
