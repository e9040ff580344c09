"""Shared plumbing of the hardening tests (tests/hardening/): real `cairn
serve` processes on `--port 0` in temporary directories, a minimal asyncio
msgpack-RPC client for hundreds of connections in one thread, raw sockets
for misbehaving clients, and /proc readings of the server's memory.

Nothing here measures speed: every wait is bounded only as a guard against
a hang (HANG_GUARD_S), never as a performance threshold.
"""
import asyncio
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import unittest

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
import cairn_client  # noqa: E402,F401
from cairn_client.launch import ServerProcess, ServerStartError  # noqa: E402

HANG_GUARD_S = 300   # a call that takes longer than this is a hang, not slowness
STOP_GUARD_S = 120   # a graceful stop longer than this is a hang
N_CTX = 2048

with open(os.path.join(HERE, "..", "data", "text", "stories.txt")) as _f:
    WORDS = _f.read().split()


def parse_args():
    """CAIRN_BIN MODEL from argv (the rest is for unittest)."""
    if len(sys.argv) < 3:
        sys.exit("usage: %s CAIRN_BIN MODEL [unittest args...]" % sys.argv[0])
    binary, model = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    return binary, model


# ---- /proc ---------------------------------------------------------------
# Under `make sanitize` / `make tsan` the server runs with a sanitizer whose own
# shadow memory and quarantine dwarf the budgets: the memory bounds are the
# release build's promise, so they are reported but not asserted there.
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


# ---- servers -------------------------------------------------------------
class ServerCase(unittest.TestCase):
    """Per test: a temporary directory and every server and socket the test
    starts, all ended and removed at the end, whatever happened."""
    BIN = MODEL = None

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="cairn-hard-")
        self._servers, self._closers = [], []
        self.addCleanup(self._cleanup)

    def _cleanup(self):
        for fn in reversed(self._closers):
            try:
                fn()
            except Exception:
                pass
        for s in self._servers:
            s.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def on_cleanup(self, fn):
        self._closers.append(fn)

    def start(self, *extra, binary=None, unix_path=None):
        """A server over the test model with these extra arguments;
        `binary` replaces the cairn executable (a wrapper that sets limits
        and then execs it)."""
        args = ["-m", self.MODEL, "-c", str(N_CTX), *extra]
        srv = ServerProcess(binary or self.BIN, args, start_timeout=HANG_GUARD_S,
                            unix_path=unix_path)
        self._servers.append(srv)
        return srv

    def start_or_refusal(self, *extra, binary=None):
        """(server, None) when it starts, (None, its log) when it exits
        before listening. A refusal must be an orderly exit with a status
        (not a signal) and a message on stderr."""
        try:
            return self.start(*extra, binary=binary), None
        except ServerStartError as e:
            text = str(e)
            m = re.search(r"exited with status (-?\d+)", text)
            self.assertIsNotNone(m, "the server neither started nor exited:\n" + text)
            self.assertGreater(int(m.group(1)), 0, "the server died of a signal:\n" + text)
            return None, text

    def client(self, srv):
        c = srv.client(timeout=HANG_GUARD_S)
        self.on_cleanup(c.close)
        return c

    def raw_socket(self, srv, rcvbuf=None):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(HANG_GUARD_S)
        s.connect((srv.host, srv.port))
        self.on_cleanup(s.close)
        return s

    def assertAlive(self, srv):
        self.assertTrue(srv.alive(), "the server died:\n" + srv.log())

    def wait_idle(self, c):
        """Poll cache.stats (bounded: a hang guard) until nothing runs or
        waits; returns the last stats."""
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            st = c.cache_stats()
            if (st["running"], st["waiting"]) == (0, 0) or time.monotonic() > deadline:
                return st
            time.sleep(0.05)


def request(method, params, msgid):
    return msgpack.packb([0, msgid, method, [params]])


def read_until_closed(sock, limit_s=HANG_GUARD_S):
    """Read everything until the peer closes; (bytes read, messages, closed).
    closed is False when nothing more came for limit_s (the hang guard)."""
    sock.settimeout(limit_s)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    total, msgs = 0, []
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return total, msgs, True
            total += len(chunk)
            unpacker.feed(chunk)
            msgs.extend(unpacker)
    except ConnectionResetError:
        return total, msgs, True
    except socket.timeout:
        return total, msgs, False


# ---- asyncio client --------------------------------------------------------
class RpcError(Exception):
    def __init__(self, err):
        super().__init__(f"{err.get('type')}: {err.get('message')}")
        self.type = err.get("type")


class AsyncConn:
    """One msgpack-RPC connection driven by asyncio: `await call(...)` sends
    a request and returns its result (notifications are counted, then
    dropped). Calls on one connection may overlap."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.next_id = 1
        self.waiting = {}
        self.notifications = 0
        self.task = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def open(cls, host, port):
        r, w = await asyncio.open_connection(host, port)
        return cls(r, w)

    async def _read_loop(self):
        err = ConnectionError("connection closed by the server")
        try:
            while True:
                chunk = await self.reader.read(1 << 16)
                if not chunk:
                    break
                self.unpacker.feed(chunk)
                for m in self.unpacker:
                    if m[0] == 2:
                        self.notifications += 1
                    elif m[0] == 1 and m[1] in self.waiting:
                        fut = self.waiting.pop(m[1])
                        if m[2] is not None:
                            fut.set_exception(RpcError(m[2]))
                        else:
                            fut.set_result(m[3])
        except (ConnectionError, OSError) as e:
            err = e
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(err)
        self.waiting.clear()

    async def call(self, method, params=None, timeout=HANG_GUARD_S):
        msgid = self.next_id
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[msgid] = fut
        self.writer.write(request(method, params or {}, msgid))
        await self.writer.drain()
        return await asyncio.wait_for(fut, timeout)

    async def close(self):
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self.task.cancel()


# ---- the reference ---------------------------------------------------------
class Reference:
    """A fresh server without any cache directory, started on first use and
    killed at exit: what any other server must output for a token history
    (greedy), whatever faults it went through."""
    srv = None
    c = None

    @classmethod
    def client(cls):
        if cls.srv is None:
            import atexit
            cls.srv = ServerProcess(ServerCase.BIN, ["-m", ServerCase.MODEL, "-c", str(N_CTX)],
                                    start_timeout=HANG_GUARD_S)
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
