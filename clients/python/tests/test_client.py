#!/usr/bin/env python3
"""Unit tests of the client's plumbing against a scripted fake server (no
model, no cairn binary): msgid dispatch with out-of-order responses, many
threads on one connection, streams, error mapping, and connection loss; and
of the launcher (cairn_client.launch) against a fake `cairn serve` script:
the "listening" line's addresses, the complete log after a stop, restarts.

usage: test_client.py   (run from anywhere; it finds the package itself)
"""
import os
import socket
import sys
import tempfile
import threading
import unittest

import msgpack

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cairn_client  # noqa: E402
from cairn_client.launch import (Listening, ServerProcess, ServerStartError,  # noqa: E402
                                 parse_listening)


class FakeServer:
    """Answers on a listening socket, one thread per connection.
    `echo` answers {"echo": params}, but answers a request only after the
    next request on the connection has arrived when params has "hold": so
    responses come out of order. `generate` streams len(prompt) deltas (one
    per character) and then a result. `fail` answers an error map. `drop`
    closes the connection without answering."""

    def __init__(self, unix_path=None):
        if unix_path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(unix_path)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = self.sock.getsockname()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        unpacker = msgpack.Unpacker(raw=False)
        held = []
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                unpacker.feed(data)
                for _, msgid, method, params in unpacker:
                    p = params[0] if params else {}
                    out = []
                    if method == "echo":
                        if p.get("hold"):
                            held.append(msgid)
                            continue
                        out.append([1, msgid, None, {"echo": p}])
                    elif method == "generate":
                        for i, ch in enumerate(p["prompt"]):
                            out.append([2, "gen.delta", [{"request": msgid, "text": ch,
                                                           "tokens": [i], "extra": 1}]])
                        out.append([1, msgid, None, {
                            "text": p["prompt"], "tokens": list(range(len(p["prompt"]))),
                            "finish_reason": "length", "new_field": True,
                            "usage": {"prompt_tokens": 3, "cached_tokens": 1,
                                      "completion_tokens": len(p["prompt"])}}])
                    elif method == "fail":
                        out.append([1, msgid, {"code": -6, "type": "not_found",
                                               "message": "no such session"}, None])
                    elif method == "drop":
                        conn.close()
                        return
                    else:
                        out.append([2, "something.else", [{}]])  # ignored by clients
                        out.append([1, msgid, {"code": -1, "type": "invalid_request",
                                               "message": "unknown method"}, None])
                    for h in held:  # release held requests after a later one
                        out.append([1, h, None, {"echo": {"held": h}}])
                    held = []
                    conn.sendall(b"".join(msgpack.packb(m) for m in out))
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.sock.close()


class ClientTests(unittest.TestCase):
    def setUp(self):
        self.server = FakeServer()
        self.client = cairn_client.Client(*self.server.address, timeout=30)

    def tearDown(self):
        self.client.close()
        self.server.close()

    def test_call_and_out_of_order_responses(self):
        first = self.client.call_async("echo", {"hold": True})
        second = self.client.call_async("echo", {"x": 2})
        self.assertEqual(second.result(30), {"echo": {"x": 2}})
        self.assertEqual(first.result(30), {"echo": {"held": first.msgid}})
        self.assertNotEqual(first.msgid, second.msgid)

    def test_many_threads_one_connection(self):
        results = {}

        def worker(i):
            results[i] = self.client.call("echo", {"i": i, "pad": "x" * (i * 997)})

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(16):
            self.assertEqual(results[i]["echo"]["i"], i)
            self.assertEqual(len(results[i]["echo"]["pad"]), i * 997)

    def test_stream_yields_deltas_then_result(self):
        s = self.client.generate("abc", stream=True, max_tokens=3)
        items = list(s)
        self.assertEqual([d.text for d in items[:-1]], ["a", "b", "c"])
        self.assertIsInstance(items[-1], cairn_client.GenerationResult)
        self.assertEqual(items[-1].text, "abc")
        self.assertEqual(items[-1].usage.cached_tokens, 1)
        self.assertTrue(items[-1].raw["new_field"])
        self.assertIs(s.result, items[-1])
        r = self.client.generate("hello")
        self.assertEqual((r.text, r.finish_reason, r.usage.completion_tokens), ("hello", "length", 5))

    def test_error_types(self):
        with self.assertRaises(cairn_client.NotFound) as cm:
            self.client.call("fail")
        self.assertEqual((cm.exception.code, cm.exception.type), (-6, "not_found"))
        with self.assertRaises(cairn_client.InvalidRequest):
            self.client.call("nope")
        # the connection is still usable after errors
        self.assertEqual(self.client.call("echo", {"a": 1}), {"echo": {"a": 1}})

    def test_connection_loss_fails_pending_calls(self):
        held = self.client.call_async("echo", {"hold": True})
        with self.assertRaises(cairn_client.CairnConnectionError):
            self.client.call("drop")
        with self.assertRaises(cairn_client.CairnConnectionError):
            held.result(30)
        with self.assertRaises(cairn_client.CairnConnectionError):
            self.client.call("echo")

    def test_argument_checks(self):
        with self.assertRaises(ValueError):
            self.client.generate()
        with self.assertRaises(ValueError):
            self.client.session_append("0" * 32, text="a", tokens=[1])


class UnixSocketTest(unittest.TestCase):
    def test_unix_connect(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.sock")
            server = FakeServer(unix_path=path)
            try:
                for c in (cairn_client.Client(unix_path=path, timeout=30),
                          cairn_client.Client.connect("unix:" + path, timeout=30)):
                    with c:
                        self.assertEqual(c.call("echo", {"u": 1}), {"echo": {"u": 1}})
            finally:
                server.close()


# A stand-in for `cairn serve`: reports the listeners it was asked for on one
# "listening" line (binding the Unix socket for real); on SIGTERM it exits 0
# and its last line, "stopped", comes from a child that outlives it (so it
# is in the log only if stop() waits for the end of the pipe, not just for
# the process); with --fail it exits 3 before listening.
FAKE_SERVE = """#!{python}
import os, signal, socket, sys, time
args = sys.argv[1:]
assert args[0] == "serve", args
if "--fail" in args:
    print("cairn serve: cannot start", file=sys.stderr, flush=True)
    sys.exit(3)
where = []
if "--port" in args:
    where.append("tcp 127.0.0.1:4242")
if "--unix" in args:
    path = args[args.index("--unix") + 1]
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen()
    where.append("unix " + path)
if "--http-port" in args:
    where.append("http 0.0.0.0:4343")


def stop(*_):
    print("cairn: info: shutting down", file=sys.stderr, flush=True)
    if os.fork() == 0:
        time.sleep(0.2)
        print("cairn: stopped", file=sys.stderr, flush=True)
        os._exit(0)
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
print("cairn: listening on " + ", ".join(where) + " (no authentication)", file=sys.stderr,
      flush=True)
while True:
    time.sleep(1)
"""


class LaunchTest(unittest.TestCase):
    def test_parse_listening(self):
        cases = {
            "cairn: listening on tcp 127.0.0.1:41837 (no authentication)":
                Listening(("127.0.0.1", 41837), None, None),
            "cairn: listening on tcp 127.0.0.1:1, unix /tmp/a b/s.sock, http 127.0.0.1:2 "
            "(token required)": Listening(("127.0.0.1", 1), "/tmp/a b/s.sock", ("127.0.0.1", 2)),
            "cairn: listening on tcp 0.0.0.0:5, http 0.0.0.0:6 (2 tenants)":
                Listening(("127.0.0.1", 5), None, ("127.0.0.1", 6)),
            "cairn: listening on unix /run/c.sock, http 127.0.0.1:7 (no authentication)":
                Listening(None, "/run/c.sock", ("127.0.0.1", 7)),
            "cairn: listening on tcp [::1]:8 (no authentication)":
                Listening(("::1", 8), None, None),
            "listening on port 9": Listening(("127.0.0.1", 9), None, None),
        }
        for line, want in cases.items():
            with self.subTest(line=line):
                self.assertEqual(parse_listening(line), want)
        self.assertIsNone(parse_listening("cairn: info: service: llama, KV 4128 pages"))

    def test_server_process(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "cairn")
            with open(fake, "w") as f:
                f.write(FAKE_SERVE.format(python=sys.executable))
            os.chmod(fake, 0o755)
            sock = os.path.join(d, "s.sock")

            class Sub(ServerProcess):
                pass

            srv = Sub(fake, ["-m", "x.gguf"], unix_path=sock, http=True, start_timeout=30)
            try:
                self.assertEqual(srv.cmd, [fake, "serve", "-m", "x.gguf", "--port", "0",
                                           "--unix", sock, "--http-port", "0"])
                self.assertEqual((srv.host, srv.port), ("127.0.0.1", 4242))
                self.assertEqual((srv.http_host, srv.http_port), ("127.0.0.1", 4343))
                self.assertEqual(srv.http_url, "http://127.0.0.1:4343")
                self.assertEqual(srv.listening.unix, sock)
                self.assertTrue(srv.alive())
                os.unlink(sock)  # (the fake does not remove it when it stops)
                again = srv.restart(timeout=30)
            finally:
                srv.kill()
            try:
                # the old one was stopped, and its log is complete
                self.assertEqual(srv.returncode, 0)
                self.assertEqual(srv.log_lines[-1], "cairn: stopped")
                self.assertEqual(srv.log(2), "cairn: info: shutting down\ncairn: stopped")
                self.assertIsInstance(again, Sub)
                self.assertEqual(again.cmd, srv.cmd)
                self.assertEqual(again.stop(30), 0)
                self.assertEqual(again.log_lines[-1], "cairn: stopped")
            finally:
                again.kill()
            # only a TCP listener: no HTTP address
            with ServerProcess(fake, [], start_timeout=30) as tcp_only:
                self.assertIsNone(tcp_only.http_port)
                with self.assertRaises(ServerStartError):
                    tcp_only.http_url
            with self.assertRaisesRegex(ServerStartError, "exited with status 3"):
                ServerProcess(fake, ["--fail"], start_timeout=30)


if __name__ == "__main__":
    unittest.main(verbosity=2)
