#!/usr/bin/env python3
"""Access control of `cairn serve` (docs/protocol.md, "Access control"),
through the real binary and model: tokens, tenants, refusing to listen on a
public address without a token, the Unix socket's mode.

usage: test_access.py CAIRN_BIN MODEL [unittest args...]

Each class starts its own server (`--port 0`, a Unix socket in a temporary
directory) and stops it after its last test. Raw-socket checks read until the
server closes the connection, so "closed after the answer" is observed, not
timed; waits only guard against hangs.
"""
import os
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, STORIES, Server, request  # noqa: E402
import cairn_client  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)

TOKEN = "s3cret-token-for-the-access-test-0123456789"
ALICE_TOKEN = "alice-token-7b1e0f54c9a2d3e8f6a1"
BOB_TOKEN = "bob-token-0c2d9a7e5b3f1a4c8e6d"


def write_secret(directory, name, text, mode=0o600):
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)  # whatever the umask did
    return path


def exchange_until_closed(address, data):
    """Send raw bytes and read until the server closes the connection (or
    the hang guard fires); return (responses, closed)."""
    got, closed = harness.exchange(address, data)
    return harness.responses(harness.messages(got)), closed


def run_serve(args, timeout=HANG_GUARD_S):
    """`cairn serve ARGS`, expected to exit on its own (refusing to start)."""
    return subprocess.run([CAIRN, "serve", *args], capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


class Checks(harness.TestCase):
    def assertUnauthorizedAndClosed(self, address, data, msgid=7):
        responses, closed = exchange_until_closed(address, data)
        self.assertEqual(len(responses), 1, responses)
        r = responses[0]
        self.assertEqual(r[1], msgid, r)
        self.assertIsNone(r[3], r)
        self.assertEqual(r[2]["type"], "unauthorized", r)
        self.assertEqual(r[2]["code"], -13, r)
        self.assertTrue(closed, "the connection stayed open after 'unauthorized'")


# --------------------------------------------------------------------------
class NoToken(Checks):
    """Without credentials everything works as before; `auth` is accepted
    (any token) and answers tenant nil."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_scratch("cairn-access-")
        cls.sock_path = cls.tmp.path("cairn.sock")
        cls.server = cls.tmp.start(CAIRN, ["-m", MODEL], unix_path=cls.sock_path)

    def test_requests_without_auth(self):
        with self.server.client(timeout=HANG_GUARD_S) as c:
            self.assertIn("model", c.info())
            r = c.generate("Once upon a time", max_tokens=4, temperature=0)
            self.assertEqual(len(r.tokens), 4)
        self.assertIn("no authentication", "\n".join(self.server.log_lines))

    def test_auth_is_accepted_and_ignored(self):
        with self.server.client(timeout=HANG_GUARD_S, auth_token="anything at all") as c:
            self.assertIsNone(c.tenant)
            self.assertIsNone(c.auth("another"))
            self.assertIn("model", c.info())

    def test_socket_mode(self):
        st = os.stat(self.sock_path)
        self.assertTrue(stat.S_ISSOCK(st.st_mode))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)


# --------------------------------------------------------------------------
class SharedToken(Checks):
    """--auth-token-file on every interface (0.0.0.0, reached through
    127.0.0.1) and a Unix socket: nothing before `auth`, a wrong token is
    refused and the connection closed, the right one opens everything."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_scratch("cairn-access-")
        cls.sock_path = cls.tmp.path("cairn.sock")
        cls.token_file = write_secret(cls.tmp.name, "token", TOKEN + "\n# ignored\n")
        cls.server = cls.tmp.start(
            CAIRN, ["-m", MODEL, "--host", "0.0.0.0", "--auth-token-file", cls.token_file,
                    "--idle-timeout", "30"],
            unix_path=cls.sock_path)
        cls.addr = cls.server.address

    def tearDown(self):
        self.assertAlive(self.server)

    def test_listening_line_says_token(self):
        self.assertIn("token required", "\n".join(self.server.log_lines))

    def test_nothing_before_auth(self):
        for method, params in (("server.info", {}), ("generate", {"prompt": "Once"}),
                               ("tokenize", {"text": "hello"}), ("cache.stats", {}),
                               ("session.open", {"text": "hi"}), ("no.such.method", {})):
            with self.subTest(method=method):
                self.assertUnauthorizedAndClosed(self.addr, request(method, params))

    def test_requests_after_a_refused_one_are_not_run(self):
        # Pipelined: the first is refused, the connection closes, the
        # second (even a correct auth) is never answered.
        data = request("server.info", msgid=1) + request("auth", {"token": TOKEN}, msgid=2)
        self.assertUnauthorizedAndClosed(self.addr, data, msgid=1)

    def test_wrong_token(self):
        for bad in ("", "nope", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "x" * 300):
            with self.subTest(token=bad[:20]):
                self.assertUnauthorizedAndClosed(self.addr, request("auth", {"token": bad}))
        # a token that is not a string, and a missing one, are refused too
        for params in ({"token": 12345}, {}):
            responses, closed = exchange_until_closed(self.addr, request("auth", params))
            self.assertEqual(len(responses), 1, responses)
            self.assertIsNotNone(responses[0][2])
            self.assertTrue(closed)

    def test_oversized_message_before_auth(self):
        # Before auth, a message may be only a few KiB; the error closes it.
        data = request("auth", {"token": "x" * 20000})
        responses, closed = exchange_until_closed(self.addr, data)
        self.assertTrue(closed)
        for r in responses:
            self.assertIsNotNone(r[2])

    def test_client_with_wrong_token(self):
        with self.assertRaises(cairn_client.Unauthorized):
            self.server.client(timeout=HANG_GUARD_S, auth_token="wrong")
        c = self.server.client(timeout=HANG_GUARD_S)
        try:
            with self.assertRaises(cairn_client.Unauthorized):
                c.info()
            # the server closed the connection after answering
            with self.assertRaises(cairn_client.CairnConnectionError):
                c.info()
        finally:
            c.close()

    def test_right_token(self):
        with self.server.client(timeout=HANG_GUARD_S, auth_token=TOKEN) as c:
            self.assertIsNone(c.tenant)  # a shared token has no tenant
            self.assertIn("model", c.info())
            r = c.generate("Once upon a time", max_tokens=4, temperature=0)
            self.assertEqual(len(r.tokens), 4)
            sid = c.session_open(text="Lily had a ball.")["session_id"]
            self.assertTrue(c.session_close(sid))
            self.assertIsNone(c.auth(TOKEN))  # again: fine
            with self.assertRaises(cairn_client.Unauthorized):
                c.auth("wrong")
            with self.assertRaises(cairn_client.CairnConnectionError):
                c.info()

    def test_unix_socket_needs_auth_too(self):
        self.assertUnauthorizedAndClosed(self.sock_path, request("server.info"))
        with self.server.client(timeout=HANG_GUARD_S, unix=True, auth_token=TOKEN) as u:
            self.assertIn("model", u.info())
        st = os.stat(self.sock_path)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)

    def test_token_in_the_same_packet_as_requests(self):
        # auth and a request pipelined in one write: both answered in order.
        data = request("auth", {"token": TOKEN}, msgid=1) + request("tokenize",
                                                                    {"text": "hi"}, msgid=2)
        s = harness.connect(self.addr)
        try:
            s.sendall(data)
            unpacker = harness.unpacker()
            got = {}
            while len(got) < 2:
                chunk = s.recv(65536)
                self.assertTrue(chunk, "closed early")
                unpacker.feed(chunk)
                for m in unpacker:
                    got[m[1]] = m
            self.assertIsNone(got[1][2])
            self.assertEqual(got[1][3], {"tenant": None})
            self.assertIsNone(got[2][2])
            self.assertIn("tokens", got[2][3])
        finally:
            s.close()


class TokenOnCommandLine(Checks):
    def test_auth_token_option(self):
        with Server(CAIRN, ["-m", MODEL, "--auth-token", TOKEN]) as srv:
            self.assertUnauthorizedAndClosed(srv.address, request("server.info"))
            with srv.client(timeout=HANG_GUARD_S, auth_token=TOKEN) as c:
                self.assertIn("model", c.info())
            # the token is no longer in the process's command line
            cmdline_path = f"/proc/{srv.proc.pid}/cmdline"
            if os.path.exists(cmdline_path):
                with open(cmdline_path, "rb") as f:
                    self.assertNotIn(TOKEN.encode(), f.read())


# --------------------------------------------------------------------------
class RefuseToStart(unittest.TestCase):
    """Configurations that must not start: these exit before loading the
    model or binding anything."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="cairn-access-")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def assertRefused(self, args, words):
        r = run_serve(args)
        err = r.stderr.decode("utf-8", "replace")
        self.assertEqual(r.returncode, 2, err)
        self.assertNotIn("listening", err)
        for w in words:
            self.assertIn(w, err)
        return err

    def test_public_bind_without_token(self):
        for host in ("0.0.0.0", "::", "192.0.2.1"):
            with self.subTest(host=host):
                self.assertRefused(["-m", MODEL, "--host", host, "--port", "0"],
                                   ["refusing", host, "--auth-token"])

    def test_loopback_variants_are_fine_without_token(self):
        # 127.0.0.2 is loopback too: it starts (and is stopped at once).
        with Server(CAIRN, ["-m", MODEL, "--host", "127.0.0.2"]) as srv:
            self.assertTrue(srv.alive())

    def test_loose_token_file(self):
        path = write_secret(self.tmp.name, "loose", TOKEN, mode=0o644)
        self.assertRefused(["-m", MODEL, "--host", "0.0.0.0", "--port", "0",
                            "--auth-token-file", path], ["chmod 600"])

    def test_bad_token_files(self):
        empty = write_secret(self.tmp.name, "empty", "\n")
        self.assertRefused(["-m", MODEL, "--port", "0", "--auth-token-file", empty], ["token"])
        self.assertRefused(["-m", MODEL, "--port", "0", "--auth-token-file",
                            os.path.join(self.tmp.name, "missing")], ["missing"])

    def test_conflicting_options(self):
        tenants = write_secret(self.tmp.name, "tenants-ok", "a " + ALICE_TOKEN + "\n")
        self.assertRefused(["-m", MODEL, "--port", "0", "--auth-token", TOKEN,
                            "--tenants", tenants], ["only one"])

    def test_bad_tenants_files(self):
        cases = {
            "dup-name": ("alice " + ALICE_TOKEN + "\nalice " + BOB_TOKEN + "\n", "twice"),
            "dup-token": ("alice " + ALICE_TOKEN + "\nbob " + ALICE_TOKEN + "\n", "same token"),
            "three-fields": ("alice " + ALICE_TOKEN + " extra\n", "line 1"),
            "bad-name": ("# comment\n\nal/ice " + ALICE_TOKEN + "\n", "line 3"),
            "none": ("# only a comment\n\n", "no tenants"),
        }
        for name, (text, word) in cases.items():
            with self.subTest(name=name):
                path = write_secret(self.tmp.name, name, text)
                self.assertRefused(["-m", MODEL, "--port", "0", "--tenants", path], [word])


# --------------------------------------------------------------------------
class Tenants(Checks):
    """--tenants: each token is a tenant; sessions and cached prefixes stay
    inside their tenant."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.class_scratch("cairn-access-")
        cls.sock_path = cls.tmp.path("cairn.sock")
        cls.tenants_file = write_secret(
            cls.tmp.name, "tenants",
            "# name token\nalice " + ALICE_TOKEN + "\n\n  bob\t" + BOB_TOKEN + "  \r\n")
        cls.server = cls.tmp.start(CAIRN, ["-m", MODEL, "--tenants", cls.tenants_file],
                                   unix_path=cls.sock_path)
        cls.a = cls.tmp.client(cls.server, timeout=HANG_GUARD_S, auth_token=ALICE_TOKEN)
        cls.b = cls.tmp.client(cls.server, timeout=HANG_GUARD_S, auth_token=BOB_TOKEN)
        info = cls.a.info()
        cls.P = int(info["page_size"])
        cls.n_ctx = int(info["model"]["n_ctx"])

    def tearDown(self):
        self.assertAlive(self.server)

    def test_auth_names_the_tenant(self):
        self.assertEqual(self.a.tenant, "alice")
        self.assertEqual(self.b.tenant, "bob")
        self.assertIn("2 tenants", "\n".join(self.server.log_lines))
        with self.server.client(timeout=HANG_GUARD_S, unix=True, auth_token=BOB_TOKEN) as u:
            self.assertEqual(u.tenant, "bob")
        self.assertUnauthorizedAndClosed(self.server.address, request("auth", {"token": "alice"}))

    def test_cannot_switch_tenant_on_a_connection(self):
        with self.server.client(timeout=HANG_GUARD_S, auth_token=ALICE_TOKEN) as c:
            with self.assertRaises(cairn_client.InvalidRequest):
                c.auth(BOB_TOKEN)
            self.assertEqual(c.auth(ALICE_TOKEN), "alice")
            self.assertIn("model", c.info())  # still open, still alice

    def test_sessions_belong_to_their_tenant(self):
        sid = self.a.session_open(text="Lily and Tom went to the park")["session_id"]
        n = self.a.session_info(sid)["n_tokens"]
        calls = [
            lambda: self.b.session_info(sid),
            lambda: self.b.session_generate(sid, max_tokens=2, temperature=0),
            lambda: self.b.session_append(sid, text=" and"),
            lambda: self.b.session_fork(sid),
            lambda: self.b.session_truncate(sid, 1),
            lambda: self.b.session_close(sid),
        ]
        for i, call in enumerate(calls):
            with self.subTest(call=i):
                with self.assertRaises(cairn_client.NotFound):
                    call()
        # none of that touched it
        self.assertEqual(self.a.session_info(sid)["n_tokens"], n)
        # another connection of the same tenant sees it
        with self.server.client(timeout=HANG_GUARD_S, auth_token=ALICE_TOKEN) as a2:
            self.assertEqual(a2.session_info(sid)["n_tokens"], n)
        # a fork stays with the tenant
        child = self.a.session_fork(sid)
        with self.assertRaises(cairn_client.NotFound):
            self.b.session_info(child)
        self.assertTrue(self.a.session_close(child))
        self.assertTrue(self.a.session_close(sid))
        with self.assertRaises(cairn_client.NotFound):
            self.a.session_info(sid)

    def test_prefix_cache_stays_inside_a_tenant(self):
        prompt = STORIES[1000:1800]
        n_prompt = len(self.a.tokenize(prompt))
        self.assertGreater(n_prompt, 3 * self.P)
        self.assertLess(n_prompt + 8, self.n_ctx)
        first = self.a.generate(prompt, max_tokens=2, temperature=0)
        self.assertEqual(first.usage.cached_tokens, 0)
        again = self.a.generate(prompt, max_tokens=2, temperature=0)
        self.assertGreaterEqual(again.usage.cached_tokens, self.P * ((n_prompt - 1) // self.P))
        other = self.b.generate(prompt, max_tokens=2, temperature=0)
        self.assertEqual(other.usage.cached_tokens, 0)
        # same model, same prompt: same output, whoever asks
        self.assertEqual(other.tokens, first.tokens)
        # and bob's own repeat is cached within bob
        other_again = self.b.generate(prompt, max_tokens=2, temperature=0)
        self.assertGreater(other_again.usage.cached_tokens, 0)
        # a session's history is a prefix like any other
        sid = self.b.session_open(text=prompt)["session_id"]
        try:
            r = self.b.session_generate(sid, max_tokens=2, temperature=0)
            self.assertGreater(r.usage.cached_tokens, 0)
        finally:
            self.b.session_close(sid)


# --------------------------------------------------------------------------
class TenantIdAcrossRestarts(unittest.TestCase):
    """The tenant id is a function of the tenant's name, so a tenant finds
    its prefixes on disk after a restart — and another tenant still does not."""

    def test_restart(self):
        with tempfile.TemporaryDirectory(prefix="cairn-access-") as tmp:
            tenants = write_secret(tmp, "tenants", f"alice {ALICE_TOKEN}\nbob {BOB_TOKEN}\n")
            cache = os.path.join(tmp, "cache")
            args = ["-m", MODEL, "--tenants", tenants, "--cache-dir", cache,
                    "--tier-loads", "always"]
            prompt = STORIES[2000:2600]
            srv = Server(CAIRN, args)
            try:
                with srv.client(timeout=HANG_GUARD_S, auth_token=ALICE_TOKEN) as a:
                    P = int(a.info()["page_size"])
                    self.assertEqual(a.generate(prompt, max_tokens=1, temperature=0)
                                     .usage.cached_tokens, 0)
                srv = srv.restart()  # SIGTERM writes every page back
                with srv.client(timeout=HANG_GUARD_S, auth_token=BOB_TOKEN) as b:
                    self.assertEqual(b.generate(prompt, max_tokens=1, temperature=0)
                                     .usage.cached_tokens, 0)
                with srv.client(timeout=HANG_GUARD_S, auth_token=ALICE_TOKEN) as a:
                    r = a.generate(prompt, max_tokens=1, temperature=0)
                    self.assertGreaterEqual(r.usage.cached_tokens, P)
            finally:
                srv.stop()


if __name__ == "__main__":
    harness.main()
