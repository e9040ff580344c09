"""A real redis-server for the scale-out tests: Debian's, started on a free
loopback port in a directory of the test's own (never the system one),
with RDB snapshots only on request, so a test can restart it with or
without its data, pause it (SIGSTOP: a Redis that answers nothing),
flush it, and read or damage what the replicas wrote.

    r = RedisServer(tmpdir)          # started, answering PING
    r.url                            # "redis://127.0.0.1:PORT" for --shared-cache
    r.db.keys("cairn:p:*")           # a redis-py client (the real PyPI one)
    r.restart(keep_data=True)        # SAVE, SIGKILL, start again from the RDB
    with r.paused(): ...             # SIGSTOP ... SIGCONT
    r.stop()

Nothing here measures speed; every wait is a guard against a hang.
"""
import contextlib
import os
import signal
import subprocess
import time

import redis

from harness import free_port  # noqa: F401  (its callers use redis_server.free_port)

START_GUARD_S = 30


class RedisServer:
    def __init__(self, workdir, port=None):
        self.dir = os.path.join(workdir, "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port = port or free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def start(self):
        self.log = open(os.path.join(self.dir, "redis.log"), "ab")
        # --save "": no snapshots but the ones a test asks for (SAVE);
        # --appendonly no: nothing else on disk
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--dbfilename", "dump.rdb",
             "--daemonize", "no", "--protected-mode", "yes"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.db = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)
        deadline = time.monotonic() + START_GUARD_S
        while True:
            try:
                if self.db.ping():
                    return
            except redis.exceptions.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start (see %s)" % self.log.name)
            time.sleep(0.05)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test left it paused
            self.proc.kill()
            self.proc.wait(timeout=START_GUARD_S)
        self.proc = None
        self.log.close()

    def restart(self, keep_data=True):
        """A restart of Redis itself: with keep_data, from a snapshot taken
        just before (what an operator's RDB persistence gives back)."""
        if keep_data:
            self.db.save()
        else:
            path = os.path.join(self.dir, "dump.rdb")
            if os.path.exists(path):
                os.unlink(path)
        self.stop()
        self.start()

    @contextlib.contextmanager
    def paused(self):
        """A Redis that accepts connections but answers nothing."""
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)
