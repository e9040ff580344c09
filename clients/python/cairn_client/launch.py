"""Start a local `cairn serve` process and wait until it listens.

Used by the integration tests, the benchmark and the examples; handy for
notebooks too:

    with ServerProcess("build/cairn", ["-m", "models/stories260K.gguf"]) as srv:
        with srv.client() as c:
            print(c.info())

The server is asked for a free TCP port (`--port 0`) and/or a Unix socket
(`--unix PATH`); it prints a line containing "listening" with its address to
stderr when ready. stderr is drained by a thread (so the server never blocks
on a full pipe) and kept in `log_lines` for diagnostics.

Restarts (for the disk tier: `--cache-dir` survives the process):

    srv = ServerProcess("build/cairn", ["-m", MODEL, "--cache-dir", d])
    ...
    srv = srv.restart()             # SIGTERM (graceful: writes back), start again
    srv = srv.restart(kill=True)    # SIGKILL (a crash), start again
    srv = srv.restart(args=[...])   # start again with other arguments

`restart` returns a new ServerProcess with the same binary, listeners and
(unless given) arguments; the old object keeps the exit status in
`returncode`.
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
from typing import List, Optional, Sequence

from .client import Client

_TCP_ADDR = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}|localhost|\[[0-9A-Fa-f:]+\]):(\d{1,5})\b")
_TCP_PORT_WORD = re.compile(r"\bport\s+(\d{1,5})\b")


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
    """`binary serve ARGS --port 0 [--unix PATH]`, started on construction.

    tcp: also listen on TCP (port chosen by the server); unix_path: also
    listen on that Unix socket. `start_timeout` bounds the wait for the
    "listening" line (a guard against a hung start, not a performance check).
    """

    def __init__(self, binary: str, args: Sequence[str] = (), *, tcp: bool = True,
                 unix_path: Optional[str] = None, start_timeout: float = 120.0,
                 env: Optional[dict] = None):
        self.binary = binary
        self.args = list(args)
        self.tcp = tcp
        self.start_timeout = start_timeout
        self.env = env
        self.unix_path = unix_path
        self.host = "127.0.0.1"
        self.port: Optional[int] = None
        self.log_lines: List[str] = []
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        cmd = [binary, "serve", *args]
        if tcp:
            cmd += ["--port", "0"]
        if unix_path:
            cmd += ["--unix", unix_path]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env,
                                     preexec_fn=_die_with_parent if os.name == "posix" else None)
        threading.Thread(target=self._drain, daemon=True).start()
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
            if "listening" not in line.lower():
                continue
            seen_listening = True
            if tcp and self.port is None:
                m = _TCP_ADDR.search(line)
                if m:
                    self.host = m.group(1).strip("[]")
                    if self.host == "0.0.0.0":
                        self.host = "127.0.0.1"
                    self.port = int(m.group(2))
                else:
                    m = _TCP_PORT_WORD.search(line)
                    if m:
                        self.port = int(m.group(1))

    def log(self) -> str:
        return "\n".join(self.log_lines[-60:])

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
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL at once (a crash: nothing is written back); returns the
        exit status (-9, or the status it had already exited with)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        return self.proc.returncode

    def restart(self, args: Optional[Sequence[str]] = None, *, kill: bool = False,
                timeout: float = 30.0) -> "ServerProcess":
        """End this server (SIGTERM and wait up to `timeout` s, or SIGKILL
        with kill=True) and start a new one with the same binary, listeners,
        environment and — unless `args` is given — arguments. Returns the new
        ServerProcess; this one keeps its exit status in `returncode`. A new
        TCP port is chosen when the old one was `--port 0`."""
        if kill:
            self.kill()
        else:
            self.stop(timeout)
        return ServerProcess(self.binary, self.args if args is None else args, tcp=self.tcp,
                             unix_path=self.unix_path, start_timeout=self.start_timeout,
                             env=self.env)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
