"""The plumbing the Python integration tests share: real `cairn serve`
processes (started on free ports, waited for, stopped, killed, their stderr
kept), temporary directories that end everything started in them, raw
sockets for what a polite client never sends, msgpack-RPC framing, the
command line and the guards.

A test finds this module through its own path:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "support"))
    import harness  # noqa: E402

Importing it also puts clients/python on sys.path, so `import cairn_client`
works after it. The server process itself is cairn_client.launch's
ServerProcess (the client library's launcher; parsing the "listening" line
lives there, once); `Server` only gives it the tests' guards.

Nothing here measures speed: every bound is a guard against a hang, never
a performance threshold.
"""
import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TESTDATA = os.path.join(ROOT, "tests", "data")
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
import cairn_client  # noqa: E402,F401
from cairn_client.launch import (Listening, ServerProcess, ServerStartError,  # noqa: E402,F401
                                 parse_listening)

# ---- guards ----------------------------------------------------------------
HANG_GUARD_S = 300        # a call or a wait longer than this is a hang, not slowness
STOP_GUARD_S = 120        # a graceful stop (write-back, fsync) longer than this is a hang
# The hang guard of the tests whose whole ctest TIMEOUT is 300 s or less
# (tests/http, tests/eagle, tests/grammar, tests/chat): a hung call there
# fails with its own message before ctest kills the test.
SHORT_HANG_GUARD_S = 120
LOG_GUARD_S = 30          # a line the server wrote reaches Server.log_lines (a thread reads it)

N_CTX = 2048              # the context the tests that fix one use (the bundled model's default)

with open(os.path.join(TESTDATA, "text", "stories.txt")) as _f:
    STORIES = _f.read()   # tests/data/text/stories.txt: prompts and documents
WORDS = STORIES.split()


# ---- the command line ------------------------------------------------------
class _ExceptLoader(unittest.TestLoader):
    """A TestLoader that leaves out the tests CAIRN_TEST_EXCEPT names."""

    def __init__(self, patterns):
        super().__init__()
        self.except_patterns = patterns

    def getTestCaseNames(self, testCaseClass):
        import fnmatch
        cls = testCaseClass.__name__

        def left_out(name):
            return any(fnmatch.fnmatchcase(n, p) for p in self.except_patterns
                       for n in (cls, cls + "." + name, name))
        return [n for n in super().getTestCaseNames(testCaseClass) if not left_out(n)]


def main(**kwargs):
    """unittest.main for the test files, with skips made visible to ctest:
    a failure exits 1; otherwise, when any test was skipped, the skipped
    tests and their reasons are printed and the process exits 77, which
    ctest reports as "not run" (SKIP_RETURN_CODE, tests/CMakeLists.txt),
    never as a pass.

    CAIRN_TEST_EXCEPT=PATTERNS (space-separated fnmatch patterns, matched
    against the class name, Class.method and the method name) leaves tests
    out, for a ctest entry that runs the rest of a file while an entry of
    its own (labelled realmodel) runs that part; a test left out is not a
    skip. The C tests read the same variable (kt_select_tests, support.h)."""
    kwargs.setdefault("verbosity", 2)
    except_patterns = os.environ.get("CAIRN_TEST_EXCEPT", "").split()
    if except_patterns and "testLoader" not in kwargs:
        print("CAIRN_TEST_EXCEPT=%s: the tests that match run in another ctest entry"
              % " ".join(except_patterns))
        kwargs["testLoader"] = _ExceptLoader(except_patterns)
    prog = unittest.main(exit=False, **kwargs)
    result = prog.result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped:
        print("\nSKIPPED (%d of %d; ctest reports this test as not run):"
              % (len(result.skipped), result.testsRun))
        for test, reason in result.skipped:
            print("  %s: %s" % (test.id(), reason))
        sys.stdout.flush()
        sys.exit(77)
    if result.testsRun == 0:
        print("no test ran")
        sys.exit(1)
    sys.exit(0)


def take_argv(*names, usage=None):
    """The first len(names) command-line arguments (CAIRN_BIN, MODEL, ...),
    removed from sys.argv so that the rest goes to unittest (a test case to
    run, -k PATTERN, ...). Exits with `usage` (default: one made of the
    names) when they are missing."""
    n = len(names)
    if len(sys.argv) < n + 1:
        sys.exit(usage or "usage: %s %s [unittest args...]" % (sys.argv[0], " ".join(names)))
    values = sys.argv[1:n + 1]
    del sys.argv[1:n + 1]
    return values


def configure(binary, model):
    """The cairn executable and model ServerCase and Reference start."""
    ServerCase.BIN, ServerCase.MODEL = binary, model


def cairn_run(binary, model, prompt, n=32, chat=False, env=None):
    """`cairn run` greedy: its stdout (the generated text); a failure raises
    with the end of its stderr."""
    args = [binary, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0"]
    if chat:
        args.append("--chat")
    r = subprocess.run(args, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        raise AssertionError(f"cairn run -m {model} failed:\n{r.stderr[-2000:]}")
    return r.stdout


# ---- servers ---------------------------------------------------------------
class Server(ServerProcess):
    """`cairn serve ARGS` on `--port 0` (tcp=True), a Unix socket
    (unix_path=...) and/or `--http-port 0` (http=True), started on
    construction and waited for up to start_timeout (default HANG_GUARD_S).

    From cairn_client.launch.ServerProcess: .host/.port (msgpack TCP),
    .unix_path, .http_host/.http_port/.http_url, .listening (the parsed
    "listening" line), .proc, .log_lines and .log() (stderr), .alive(),
    .returncode, .client(), .kill(), .restart(). Here stop() and restart()
    wait up to STOP_GUARD_S for a graceful exit and client() is guarded by
    HANG_GUARD_S."""

    def __init__(self, binary, args=(), *, start_timeout=HANG_GUARD_S, **kw):
        super().__init__(binary, args, start_timeout=start_timeout, **kw)

    @property
    def address(self):
        """(host, port) of the msgpack TCP listener."""
        return (self.host, self.port)

    @property
    def http_address(self):
        """(host, port) of the HTTP listener."""
        return (self.http_host, self.http_port)

    def client(self, timeout=HANG_GUARD_S, unix=False, auth_token=None):
        return super().client(timeout=timeout, unix=unix, auth_token=auth_token)

    def stop(self, timeout=STOP_GUARD_S):
        """SIGTERM; SIGKILL after `timeout` s. Returns the exit status."""
        return super().stop(timeout)

    def restart(self, args=None, *, kill=False, timeout=STOP_GUARD_S):
        return super().restart(args, kill=kill, timeout=timeout)


class Scratch:
    """A temporary directory and what is started for it: servers, clients,
    sockets, anything with a closer. close() runs the closers (last first),
    ends every server -- SIGKILL, or with graceful=True SIGTERM (stop) -- and
    removes the directory. `.name` is the directory, as with
    tempfile.TemporaryDirectory. Also a context manager."""

    def __init__(self, prefix="cairn-test-", graceful=False):
        self.name = tempfile.mkdtemp(prefix=prefix)
        self.graceful = graceful
        self._servers, self._closers = [], []

    def path(self, *names):
        return os.path.join(self.name, *names)

    def on_close(self, fn):
        self._closers.append(fn)
        return fn

    def track(self, srv):
        """Ends `srv` (a Server started elsewhere, e.g. by restart) at close."""
        self._servers.append(srv)
        return srv

    def start(self, binary, args=(), **kw):
        """A Server (keyword arguments as Server's), ended at close."""
        return self.track(Server(binary, args, **kw))

    def client(self, srv, **kw):
        """srv.client(**kw), closed at close."""
        c = srv.client(**kw)
        self.on_close(c.close)
        return c

    def close(self):
        for fn in reversed(self._closers):
            try:
                fn()
            except Exception:
                pass
        for srv in self._servers:
            if self.graceful:
                srv.stop()
            else:
                srv.kill()
        shutil.rmtree(self.name, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TestCase(unittest.TestCase):
    """unittest.TestCase with the server checks the tests share."""

    @classmethod
    def class_scratch(cls, prefix="cairn-test-", graceful=True):
        """A Scratch for the whole class, closed after the class (also when
        setUpClass fails); its servers are stopped with SIGTERM."""
        scratch = Scratch(prefix, graceful=graceful)
        cls.addClassCleanup(scratch.close)
        return scratch

    def assertAlive(self, srv):
        self.assertTrue(srv.alive(), "the server died:\n" + srv.log())


class ServerCase(TestCase):
    """Per test: a temporary directory (self.tmp, its path) and every
    server, client and socket the test starts, all ended and removed at the
    end, whatever happened. BIN and MODEL are set by configure()."""
    BIN = MODEL = None
    TMP_PREFIX = "cairn-test-"

    def setUp(self):
        self.scratch = Scratch(self.TMP_PREFIX)
        self.tmp = self.scratch.name
        self.addCleanup(self.scratch.close)

    def on_cleanup(self, fn):
        self.scratch.on_close(fn)

    def track(self, srv):
        return self.scratch.track(srv)

    def start(self, *extra, model=None, binary=None, **kw):
        """A server over the model (default MODEL) with `-c N_CTX` and these
        extra arguments; `binary` replaces the cairn executable (a wrapper
        that sets limits and then execs it). Keyword arguments as Server's."""
        args = ["-m", model or self.MODEL, "-c", str(N_CTX), *extra]
        return self.scratch.start(binary or self.BIN, args, **kw)

    def client(self, srv):
        return self.scratch.client(srv, timeout=HANG_GUARD_S)

    def raw_socket(self, srv, rcvbuf=None):
        """A raw TCP connection to srv (guarded by HANG_GUARD_S), closed at the end."""
        s = connect(srv.address, rcvbuf=rcvbuf)
        self.on_cleanup(s.close)
        return s


class Reference:
    """A fresh server without any cache directory (`-m MODEL -c N_CTX`),
    started on first use and killed at exit: what any other server must
    output for a token history (greedy), whatever it went through."""
    srv = None
    c = None

    @classmethod
    def client(cls):
        if cls.srv is None:
            cls.srv = Server(ServerCase.BIN, ["-m", ServerCase.MODEL, "-c", str(N_CTX)])
            atexit.register(cls.srv.kill)
            cls.c = cls.srv.client(timeout=HANG_GUARD_S)
        return cls.c

    @classmethod
    def tok(cls, text, bos):
        return cls.client().tokenize(text, add_bos=bos)

    @classmethod
    def cont(cls, history, n):
        """Greedy tokens a fresh server generates after `history`."""
        return cls.client().generate(tokens=list(history), max_tokens=n, temperature=0).tokens


# ---- waiting ---------------------------------------------------------------
def free_port():
    """A TCP port on 127.0.0.1 nobody listens on now (for the servers and
    sockets that must be told a port before they start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(read, done, guard=HANG_GUARD_S, every=0.05):
    """read() until done(value) or `guard` seconds have passed (a hang
    guard); returns the last value, for the caller to check."""
    deadline = time.monotonic() + guard
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(every)


def wait_idle(c, guard=HANG_GUARD_S):
    """cache.stats through client c until nothing runs or waits (bounded
    by the guard); returns the last stats."""
    return poll(c.cache_stats, lambda st: (st["running"], st["waiting"]) == (0, 0), guard)


# ---- raw sockets -----------------------------------------------------------
def connect(address, timeout=HANG_GUARD_S, rcvbuf=None):
    """A connected stream socket: address is (host, port) or a Unix socket
    path. timeout guards every later call on it (None: blocking); rcvbuf
    sets SO_RCVBUF before connecting."""
    if isinstance(address, str):
        family = socket.AF_UNIX
    else:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect(address)
    except BaseException:
        s.close()
        raise
    return s


def send_raw(sock, data, half_close=False):
    """sendall(data), then with half_close shut our sending side (for input
    that is a prefix of a message, which a server may rightly wait on until
    the stream ends). A server that closes before all is sent is not an
    error here: what it answered is read next."""
    try:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _chunks(sock):
    # What the peer sends, until it closes (a reset counts as closing);
    # socket.timeout goes to the caller.
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return
        if not chunk:
            return
        yield chunk


def read_until_closed(sock, limit_s=HANG_GUARD_S):
    """Everything until the peer closes: (bytes, closed). closed is False
    when nothing more came for limit_s (the hang guard)."""
    sock.settimeout(limit_s)
    got = bytearray()
    try:
        for chunk in _chunks(sock):
            got += chunk
    except socket.timeout:
        return bytes(got), False
    return bytes(got), True


def exchange(address, data, timeout=HANG_GUARD_S, half_close=False):
    """Send raw bytes on a new connection and read until the server closes
    it (or the guard fires). Returns (bytes received, closed by the server)."""
    s = connect(address, timeout=timeout)
    try:
        send_raw(s, data, half_close)
        return read_until_closed(s, timeout)
    finally:
        s.close()


def exchange_until_response(address, data, timeout=HANG_GUARD_S, half_close=False):
    """Send raw bytes on a new connection; read msgpack messages until a
    response ([1, ...]) arrives or the server closes. Returns (messages,
    closed). Silence for `timeout` s raises socket.timeout (a hang)."""
    s = connect(address, timeout=timeout)
    msgs, closed = [], False
    up = unpacker()
    try:
        send_raw(s, data, half_close)
        for chunk in _chunks(s):
            up.feed(chunk)
            msgs.extend(up)
            if responses(msgs):
                break
        else:
            closed = True
    finally:
        s.close()
    return msgs, closed


# ---- msgpack-RPC framing ---------------------------------------------------
def pack_request(method, params, msgid=7):
    """[0, msgid, method, params] as msgpack, params as given (the protocol
    wants an array holding one map; tests of malformed input pass anything)."""
    import msgpack
    return msgpack.packb([0, msgid, method, params])


def request(method, params=None, msgid=7):
    """A well-formed request: params is the map of named parameters."""
    return pack_request(method, [params or {}], msgid)


def unpacker():
    """A msgpack.Unpacker for what the server sends (feed, then iterate)."""
    import msgpack
    return msgpack.Unpacker(raw=False, strict_map_key=False)


def messages(data):
    """The complete msgpack messages in `data` (bytes)."""
    up = unpacker()
    up.feed(data)
    return list(up)


def is_response(m):
    return isinstance(m, list) and bool(m) and m[0] == 1


def responses(msgs):
    """The responses ([1, msgid, error, result]) among msgs."""
    return [m for m in msgs if is_response(m)]
