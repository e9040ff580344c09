"""Start a local `cairn serve` process and wait until it listens.

Used by the integration tests, the benchmark and the examples; handy for
notebooks too:

    with ServerProcess("build/cairn", ["-m", "models/stories260K.gguf"]) as srv:
        with srv.client() as c:
            print(c.info())

The server is asked for a free TCP port (`--port 0`), a Unix socket
(`--unix PATH`) and/or, with http=True, a free port for the OpenAI-compatible
HTTP API (`--http-port 0`); when ready it prints one line containing
"listening" with its addresses to stderr:

    cairn: listening on tcp 127.0.0.1:41837, unix /tmp/s, http 127.0.0.1:40505 (no authentication)

`parse_listening` reads such a line. stderr is drained by a thread (so the
server never blocks on a full pipe) and kept in `log_lines` for diagnostics;
once `stop` or `kill` returns, `log_lines` holds all the process wrote.

Restarts (for the disk tier: `--cache-dir` survives the process):

    srv = ServerProcess("build/cairn", ["-m", MODEL, "--cache-dir", d])
    ...
    srv = srv.restart()             # SIGTERM (graceful: writes back), start again
    srv = srv.restart(kill=True)    # SIGKILL (a crash), start again
    srv = srv.restart(args=[...])   # start again with other arguments

`restart` returns a new ServerProcess (of the same class) with the same
binary, listeners and (unless given) arguments; the old object keeps the exit
status in `returncode`.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import stat
import subprocess
import threading
import time
from typing import List, NamedTuple, Optional, Sequence, Tuple

from .client import Client

_ADDR = r"(\d{1,3}(?:\.\d{1,3}){3}|localhost|\[[0-9A-Fa-f:]+\]):(\d{1,5})\b"
_ANY_ADDR = re.compile(_ADDR)
_TCP_ADDR = re.compile(r"\btcp\s+" + _ADDR)
_HTTP_ADDR = re.compile(r"\bhttp\s+" + _ADDR)
_UNIX_PATH = re.compile(r"\bunix\s+(\S.*?)(?=, http\s| \(|\s*$)")
_TCP_PORT_WORD = re.compile(r"\bport\s+(\d{1,5})\b")
_LOG_EOF_S = 10.0  # after the process has ended, its last stderr lines arrive within this


class Listening(NamedTuple):
    """The addresses of a "listening" line: (host, port) pairs, a path, or
    None for a listener the server does not have. A wildcard host
    (0.0.0.0) is given as 127.0.0.1, the address to connect to."""
    tcp: Optional[Tuple[str, int]]
    unix: Optional[str]
    http: Optional[Tuple[str, int]]


def _host(text: str) -> str:
    host = text.strip("[]")
    return "127.0.0.1" if host == "0.0.0.0" else host


def parse_listening(line: str) -> Optional[Listening]:
    """The addresses in `cairn serve`'s "listening" line, or None when the
    line is not that line. The msgpack TCP listener is the address after
    "tcp" (else the first address that is not the HTTP one, else "port N")."""
    if "listening" not in line.lower():
        return None
    m = _HTTP_ADDR.search(line)
    http = (_host(m.group(1)), int(m.group(2))) if m else None
    rest = line[:m.start()] + line[m.end():] if m else line
    m = _TCP_ADDR.search(rest) or _ANY_ADDR.search(rest)
    if m:
        tcp: Optional[Tuple[str, int]] = (_host(m.group(1)), int(m.group(2)))
    else:
        m = _TCP_PORT_WORD.search(rest)
        tcp = ("127.0.0.1", int(m.group(1))) if m else None
    m = _UNIX_PATH.search(line)
    return Listening(tcp, m.group(1) if m else None, http)


class ServerStartError(RuntimeError):
    pass


def _die_with_parent() -> None:
    # Runs in the child before exec: on Linux, ask for SIGTERM when the
    # parent dies, so a test runner that kills this process (ctest timeout)
    # does not leave a server behind. Best effort elsewhere.
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:
        pass


class ServerProcess:
    """`binary serve ARGS --port 0 [--unix PATH] [--http-port 0]`, started on
    construction.

    tcp: also listen on TCP (port chosen by the server); unix_path: also
    listen on that Unix socket; http: also serve the HTTP API (port chosen
    by the server). `start_timeout` bounds the wait for the "listening" line
    (a guard against a hung start, not a performance check). After the
    start, `listening` holds the parsed line; `host`/`port`,
    `http_host`/`http_port` (and `http_url`) and `unix_path` the addresses.
    """

    def __init__(self, binary: str, args: Sequence[str] = (), *, tcp: bool = True,
                 unix_path: Optional[str] = None, start_timeout: float = 120.0,
                 env: Optional[dict] = None, http: bool = False):
        self.binary = binary
        self.args = list(args)
        self.tcp = tcp
        self.http = http
        self.start_timeout = start_timeout
        self.env = env
        self._unix_arg = unix_path
        self.unix_path = unix_path
        self.host = "127.0.0.1"
        self.port: Optional[int] = None
        self.http_host = "127.0.0.1"
        self.http_port: Optional[int] = None
        self.listening: Optional[Listening] = None
        self.log_lines: List[str] = []
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        cmd = [binary, "serve", *args]
        if tcp:
            cmd += ["--port", "0"]
        if unix_path:
            cmd += ["--unix", unix_path]
        if http:
            cmd += ["--http-port", "0"]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env,
                                     preexec_fn=_die_with_parent if os.name == "posix" else None)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        try:
            self._wait_listening(tcp, start_timeout)
        except BaseException:
            self.stop()
            raise

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.log_lines.append(line)
            self._lines.put(line)
        self.proc.stderr.close()
        self._lines.put(None)

    def _unix_ready(self) -> bool:
        try:
            return stat.S_ISSOCK(os.stat(self.unix_path).st_mode)  # type: ignore[arg-type]
        except OSError:
            return False

    def _wait_listening(self, tcp: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        seen_listening = False
        while True:
            if seen_listening and (not tcp or self.port is not None) and \
                    (not self.http or self.http_port is not None) and \
                    (not self.unix_path or self._unix_ready()):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerStartError("server did not report listening in time:\n" + self.log())
            try:
                line = self._lines.get(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait()
                raise ServerStartError(f"server exited with status {self.proc.returncode} "
                                       f"before listening:\n{self.log()}")
            found = parse_listening(line)
            if found is None:
                continue
            seen_listening = True
            self.listening = found
            if tcp and self.port is None and found.tcp:
                self.host, self.port = found.tcp
            if self.http_port is None and found.http:
                self.http_host, self.http_port = found.http
            if self.unix_path is None and found.unix:
                self.unix_path = found.unix

    def log(self, last: Optional[int] = 60) -> str:
        """The server's stderr so far: its last `last` lines (None: all)."""
        return "\n".join(self.log_lines if last is None else self.log_lines[-last:])

    @property
    def http_url(self) -> str:
        """http://HOST:PORT of the HTTP API (the server must have one)."""
        if self.http_port is None:
            raise ServerStartError("the server has no HTTP listener")
        host = f"[{self.http_host}]" if ":" in self.http_host else self.http_host
        return f"http://{host}:{self.http_port}"

    def _log_complete(self, timeout: float) -> None:
        # The process has ended: wait (bounded) for the reader to see EOF, so
        # that log_lines holds everything it wrote.
        self._reader.join(timeout)

    def client(self, timeout: Optional[float] = 300.0, unix: bool = False,
               auth_token: Optional[str] = None) -> Client:
        """A connected Client (TCP, or the Unix socket with unix=True); with
        auth_token it has authenticated already."""
        if unix:
            return Client(unix_path=self.unix_path, timeout=timeout, auth_token=auth_token)
        if self.port is None:
            raise ServerStartError("the server has no TCP listener")
        return Client(self.host, self.port, timeout=timeout, auth_token=auth_token)

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> Optional[int]:
        """The exit status once the process has ended (negative: killed by
        that signal), else None."""
        return self.proc.poll()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_complete(_LOG_EOF_S)
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL at once (a crash: nothing is written back); returns the
        exit status (-9, or the status it had already exited with)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log_complete(_LOG_EOF_S)
        return self.proc.returncode

    def restart(self, args: Optional[Sequence[str]] = None, *, kill: bool = False,
                timeout: float = 30.0) -> "ServerProcess":
        """End this server (SIGTERM and wait up to `timeout` s, or SIGKILL
        with kill=True) and start a new one of the same class with the same
        binary, listeners, environment and — unless `args` is given —
        arguments. Returns the new server; this one keeps its exit status in
        `returncode`. New ports are chosen for the `--port 0` and
        `--http-port 0` listeners."""
        if kill:
            self.kill()
        else:
            self.stop(timeout)
        return type(self)(self.binary, self.args if args is None else args, tcp=self.tcp,
                          unix_path=self._unix_arg, start_timeout=self.start_timeout,
                          env=self.env, http=self.http)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
