#!/usr/bin/env python3
"""Misbehaving clients against a real `cairn serve`: disconnects in the
middle of streams, half a message then silence, and clients that never read
their output. In each case the server must drop that client, release what it
held (running requests, file descriptors, buffers) and keep serving everyone
else with exactly the output a fresh server gives.

usage: test_connections.py CAIRN_BIN MODEL [unittest args...]

Greedy everywhere; no timing thresholds (waits are bounded hang guards).
"""
import os
import socket
import struct
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, LOG_GUARD_S, N_CTX, Reference as ref, request  # noqa: E402
import procfs  # noqa: E402  (tests/hardening/procfs.py)

harness.configure(*harness.take_argv("CAIRN_BIN", "MODEL"))

LONG = "Once upon a time"   # greedy runs to the end of the context on this prompt
BYSTANDER = ["The little dog", "Lily and Tom went to the park", "Sam had a red ball."]


class Case(harness.ServerCase):
    TMP_PREFIX = "cairn-hard-"

    def bystander_check(self, srv, n=16):
        """A new client gets exactly the reference output for a few prompts."""
        with srv.client(timeout=HANG_GUARD_S) as c:
            for p in BYSTANDER:
                want = ref.cont(ref.tok(p, True), n)
                self.assertEqual(c.generate(prompt=p, max_tokens=n, temperature=0).tokens, want)

    def read_first_notification(self, sock):
        unpacker = harness.unpacker()
        while True:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, "closed before streaming anything")
            unpacker.feed(chunk)
            for m in unpacker:
                if m[0] == 2:
                    return m
                self.assertNotEqual(m[0], 1, f"answered before streaming: {m}")


# --------------------------------------------------------------------------
class DisconnectMidStream(Case):
    def test_clients_vanish_mid_stream(self):
        srv = self.start()
        c = self.client(srv)
        max_tokens = N_CTX - len(ref.tok(LONG, True))
        before = c.cache_stats()["generated_tokens"]
        fds_before = procfs.open_fds(srv.proc.pid)

        # 8 clients with 2 long streams each; every stream has started
        socks = []
        for k in range(8):
            s = self.raw_socket(srv)
            for m in (1, 2):
                s.sendall(request("generate", {"prompt": LONG, "max_tokens": max_tokens,
                                               "temperature": 0, "stream": True}, m))
            socks.append(s)
        for s in socks:
            self.read_first_notification(s)
        # a bystander is served while they all run
        self.bystander_check(srv)
        # then they go, in different ways
        for k, s in enumerate(socks):
            how = k % 4
            if how == 0:       # orderly close
                s.close()
            elif how == 1:     # reset (SO_LINGER 0): RST, unread data dropped
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            elif how == 2:     # half close: EOF on the server's side, we still read
                s.shutdown(socket.SHUT_WR)
            else:              # half of a third request, then close
                data = request("generate", {"prompt": LONG, "max_tokens": 8}, 3)
                s.sendall(data[: len(data) // 2])
                s.close()
        st = harness.wait_idle(c)
        self.assertEqual((st["running"], st["waiting"]), (0, 0))
        generated = st["generated_tokens"] - before
        # cancelled, not run to the end: the half-closed ones can still read,
        # and see the server close after it cancelled them, with no final
        # answer for either stream (one that ran to its end would have one).
        # No bound on the tokens generated: that would depend on the speed.
        for k, s in enumerate(socks):
            if k % 4 == 2:
                got, closed = harness.read_until_closed(s)
                msgs = harness.messages(got)
                self.assertTrue(closed)
                self.assertEqual([m for m in msgs if m[0] == 1], [],
                                 "a cancelled stream was answered as if it had finished")
        n = procfs.wait_fds(srv.proc.pid, fds_before)
        self.assertLessEqual(n, fds_before, "descriptors of gone clients are still held")
        self.bystander_check(srv)
        self.assertAlive(srv)
        print(f"\ndisconnects: 8 clients x 2 streams cut 4 ways after their first token; "
              f"{generated} of {16 * max_tokens} requested tokens generated; fds "
              f"{fds_before} -> {n}", file=sys.stderr)


# --------------------------------------------------------------------------
class HalfMessageThenSilence(Case):
    def test_stalled_clients_are_closed_after_the_idle_timeout(self):
        srv = self.start("--idle-timeout", "1")
        c = self.client(srv)
        lim = c.info()["limits"]
        fds_before = procfs.open_fds(srv.proc.pid)

        # an idle client between messages: one request answered, then silence
        idle = self.raw_socket(srv)
        idle.sendall(request("server.info", {}, 1))
        unpacker = harness.unpacker()
        while True:
            unpacker.feed(idle.recv(65536))
            if any(m[0] == 1 for m in unpacker):
                break

        full = request("generate", {"prompt": LONG, "max_tokens": 8}, 5)
        big_prompt = (lim["max_string_bytes"] + 1024)  # over the string limit: skipped
        stalls = {
            "one byte": full[:1],
            "half a request": full[: len(full) // 2],
            "all but the last byte": full[:-1],
            # a string header announcing 4 MiB + 1 KiB, 64 KiB of it: the
            # server answers too_large and skips the rest as it comes
            "inside a skipped oversized string":
                b"\x94\x00\x07\xa8generate\x91\x81\xa6prompt\xdb" +
                struct.pack(">I", big_prompt) + b"a" * 65536,
        }
        socks = {}
        for name, data in stalls.items():
            s = self.raw_socket(srv)
            s.sendall(data)
            socks[name] = s
        # others are served while they stall
        self.bystander_check(srv)
        for name, s in socks.items():
            with self.subTest(stall=name):
                got, closed = harness.read_until_closed(s)
                msgs = harness.messages(got)
                self.assertTrue(closed, "a stalled client was never closed")
                answers = [m for m in msgs if m[0] == 1]
                if name.startswith("inside"):
                    self.assertEqual(len(answers), 1, msgs)
                    self.assertEqual(answers[0][2]["type"], "too_large")
                else:
                    self.assertEqual(answers, [], "half a request was answered")
        # the server logs each close; its stderr is read by another thread,
        # so give the lines a bounded moment to arrive
        harness.poll(lambda: sum("half a message" in line for line in srv.log_lines),
                     lambda n: n >= 3, LOG_GUARD_S)
        self.assertGreaterEqual(sum("half a message" in line for line in srv.log_lines), 3,
                                srv.log())
        # every staller is gone; the idle client is not: it has been silent
        # longer than the stallers (its last byte went first), yet it holds
        # no half message, so it is kept and still works
        n = procfs.wait_fds(srv.proc.pid, fds_before + 1)
        self.assertLessEqual(n, fds_before + 1)
        idle.sendall(request("tokenize", {"text": "Once"}, 2))
        unpacker = harness.unpacker()
        got = None
        while got is None:
            chunk = idle.recv(65536)
            self.assertTrue(chunk, "an idle connection without a half message was closed")
            unpacker.feed(chunk)
            got = next((m for m in unpacker if m[0] == 1), None)
        self.assertIsNone(got[2])
        self.assertEqual(got[3]["tokens"], ref.tok("Once", True))
        self.assertAlive(srv)
        print(f"\nstalls: {len(stalls)} half messages closed after --idle-timeout 1; "
              f"an idle connection kept; fds {fds_before} -> {n}", file=sys.stderr)


# --------------------------------------------------------------------------
class NeverReads(Case):
    MAX_OUTPUT = 64 * 1024

    def test_streams_nobody_reads_are_dropped(self):
        # Over a Unix socket (its kernel buffer is small and fixed, unlike
        # TCP's autotuned one), two clients ask for 16 full-context streams
        # each and never read: once MAX_OUTPUT bytes wait in the server's
        # queue, it drops them.
        sock_path = os.path.join(self.tmp, "s")
        srv = self.start("--max-output", str(self.MAX_OUTPUT), unix_path=sock_path)
        c = self.client(srv)
        max_tokens = N_CTX - len(ref.tok(LONG, True))
        before = c.cache_stats()["generated_tokens"]
        fds_before = procfs.open_fds(srv.proc.pid)
        socks = []
        for _ in range(2):
            s = harness.connect(sock_path, timeout=None)
            self.on_cleanup(s.close)
            for m in range(1, 17):
                s.sendall(request("generate", {"prompt": LONG, "max_tokens": max_tokens,
                                               "temperature": 0, "stream": True}, m))
            socks.append(s)
        self.bystander_check(srv)
        st = harness.wait_idle(c)
        self.assertEqual((st["running"], st["waiting"]), (0, 0))
        generated = st["generated_tokens"] - before
        # dropped, not run to the end: no final answer on either client, and
        # the log names both (16 full-context streams write far more than
        # MAX_OUTPUT plus a socket buffer, whatever the speed)
        read = []
        for s in socks:
            got, closed = harness.read_until_closed(s)
            msgs = harness.messages(got)
            self.assertTrue(closed)
            self.assertEqual([m for m in msgs if m[0] == 1], [])
            read.append(len(got))
        self.assertEqual(sum("output unread; disconnecting" in line for line in srv.log_lines), 2,
                         srv.log())
        n = procfs.wait_fds(srv.proc.pid, fds_before)
        self.assertLessEqual(n, fds_before)
        self.bystander_check(srv)
        print(f"\nnever-reading streams: 2 clients x 16 streams over a Unix socket, "
              f"--max-output {self.MAX_OUTPUT >> 10}K: dropped after {generated} of "
              f"{32 * max_tokens} tokens; they had received {read} bytes", file=sys.stderr)

    def test_big_answers_nobody_reads_do_not_grow_the_server(self):
        # Over TCP: 3 clients pipeline 24 detokenize requests each whose
        # answers are ~1 MB (72 MB in all) and never read. Kernel buffers
        # take a few MB, then the server's queue reaches MAX_OUTPUT and it
        # drops the client. Its peak RSS may grow by the kernel-independent
        # part only: per client one queued answer (one answer is always
        # accepted into an empty queue), MAX_OUTPUT, and the request being
        # read (<= 1 MB here) -- 3 x 4 MiB -- plus 16 MiB of allocator slack.
        srv = self.start("--max-output", str(self.MAX_OUTPUT))
        # (made with the reference server, so this one's peak is still low)
        toks = ref.tok("Once upon a time there was a dog. " * 30000, True)
        answer = len(ref.client().call("detokenize", {"tokens": toks})["text"])
        self.assertGreater(answer, 900_000)
        payload = [request("detokenize", {"tokens": toks}, m) for m in range(1, 25)]
        hwm_before = procfs.proc_status(srv.proc.pid)["VmHWM"] * 1024
        fds_before = procfs.open_fds(srv.proc.pid)

        socks, errors = [], []

        def pump(s):
            try:
                for p in payload:
                    s.sendall(p)
            except (BrokenPipeError, ConnectionResetError):
                pass  # dropped while we were still sending: expected
            except Exception as e:
                errors.append(e)

        threads = []
        for _ in range(3):
            s = self.raw_socket(srv, rcvbuf=4096)
            socks.append(s)
            t = threading.Thread(target=pump, args=(s,))
            t.start()
            threads.append(t)
        for t in threads:
            t.join(HANG_GUARD_S)
        self.assertEqual(errors, [])
        harness.poll(lambda: sum("output unread; disconnecting" in line for line in srv.log_lines),
                     lambda n: n >= 3)
        self.assertEqual(sum("output unread; disconnecting" in line for line in srv.log_lines), 3,
                         srv.log())
        for s in socks:
            _, closed = harness.read_until_closed(s)
            self.assertTrue(closed)
        growth = procfs.proc_status(srv.proc.pid)["VmHWM"] * 1024 - hwm_before
        bound = 3 * (4 << 20) + (16 << 20)
        unread = 3 * 24 * answer
        print(f"\nnever-reading big answers: {unread / 2**20:.0f} MiB of answers unread by 3 "
              f"clients; server peak RSS grew {growth / 2**20:.1f} MiB (bound "
              f"{bound / 2**20:.0f} MiB)", file=sys.stderr)
        if not procfs.SANITIZER:
            self.assertLessEqual(growth, bound)
        n = procfs.wait_fds(srv.proc.pid, fds_before)
        self.assertLessEqual(n, fds_before)
        self.bystander_check(srv)


# --------------------------------------------------------------------------
class InflightCap(Case):
    def read_answers(self, sock, want):
        """Answers ([1, ...]) read from sock until `want` of them arrived."""
        unpacker = harness.unpacker()
        got = []
        while len(got) < want:
            chunk = sock.recv(65536)
            self.assertTrue(chunk, f"closed after {len(got)} answers")
            unpacker.feed(chunk)
            got += [m for m in unpacker if m[0] == 1]
        return got

    def test_requests_in_flight_per_connection_are_capped(self):
        srv = self.start()
        c = self.client(srv)
        max_tokens = N_CTX - len(ref.tok(LONG, True))
        # a round trip first: connect() returns before the server has
        # accepted, and the baseline must include this connection
        c.cache_stats()
        fds_before = procfs.open_fds(srv.proc.pid)
        long_req = {"prompt": LONG, "max_tokens": max_tokens, "temperature": 0}
        # 300 full-context requests at once on one connection: 256 are taken
        # (they wait for the engine), the 44 beyond the cap are refused at once
        s = self.raw_socket(srv)
        s.sendall(b"".join(request("generate", long_req, m) for m in range(1, 301)))
        answers = self.read_answers(s, 44)
        self.assertEqual(sorted(a[1] for a in answers), list(range(257, 301)))
        for a in answers:
            self.assertEqual(a[2]["type"], "overloaded", a)
        # a msgid that is still in flight cannot be reused
        d = self.raw_socket(srv)
        d.sendall(request("generate", long_req, 1) + request("generate", long_req, 1))
        dup = self.read_answers(d, 1)[0]
        self.assertEqual(dup[1], 1)
        self.assertEqual(dup[2]["type"], "invalid_request", dup)
        # (no bystander while they wait: admission is first come, first
        # served, so a bystander would queue behind 256 long requests --
        # docs/security.md, known gaps)
        s.close()
        d.close()
        st = harness.wait_idle(c)
        self.assertEqual((st["running"], st["waiting"]), (0, 0))
        n = procfs.wait_fds(srv.proc.pid, fds_before)
        self.assertLessEqual(n, fds_before)
        self.bystander_check(srv)
        print(f"\nin-flight cap: 300 requests on one connection, 44 refused (overloaded); "
              f"a reused msgid refused; {st['generated_tokens']} tokens generated before "
              f"the client left", file=sys.stderr)


if __name__ == "__main__":
    harness.main()
