"""Start a real `cairn serve` with the OpenAI HTTP facade for the tests in
this folder, and a few raw-HTTP helpers (for what a polite client such as
`openai` or curl never sends)."""
import os
import re
import socket
import subprocess
import tempfile
import time

HANG_GUARD_S = 120  # only guards against hangs; nothing is timed


class Server:
    """`cairn serve --port 0 --http-port 0 ...`; .port is the HTTP port."""

    def __init__(self, binary, model, *extra):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [binary, "serve", "-m", model, "--port", "0", "--http-port", "0", *extra],
            stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        deadline = time.monotonic() + HANG_GUARD_S
        self.port = None
        while time.monotonic() < deadline:
            self.log.seek(0)
            m = re.search(r"listening on .*http [\d.]+:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.port is None:
            self.stop()
            self.log.seek(0)
            raise RuntimeError("cairn serve did not start:\n" + self.log.read())
        self.base = f"http://127.0.0.1:{self.port}"

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(HANG_GUARD_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def raw_exchange(port, data, read_until_close=True):
    """Send raw bytes; read until the server closes (or the guard fires).
    Returns (bytes received, closed by the server)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
    got, closed = b"", False
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                closed = True
                break
            except socket.timeout:
                break
            if not chunk:
                closed = True
                break
            got += chunk
            if not read_until_close:
                break
    finally:
        s.close()
    return got, closed


def parse_metrics(text):
    """Prometheus text format -> {name{labels}: value}, {name: type}."""
    values, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values, types
