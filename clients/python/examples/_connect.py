"""Shared by the examples: connect to a running server, or start one."""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))  # run from a checkout without installing

from cairn_client import Client  # noqa: E402
from cairn_client.launch import ServerProcess  # noqa: E402


def parser(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--addr", default=os.environ.get("CAIRN_ADDR", "127.0.0.1:7077"),
                    help="server address, host:port or unix:/path (default $CAIRN_ADDR "
                         "or 127.0.0.1:7077)")
    ap.add_argument("--spawn", metavar="CAIRN_BIN",
                    help="start `CAIRN_BIN serve` for the example instead of connecting")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K.gguf"),
                    help="model for --spawn")
    return ap


class Connection:
    """Context manager giving a Client, starting a server first with --spawn."""

    def __init__(self, args):
        self.args = args
        self.server = None

    def __enter__(self):
        if self.args.spawn:
            self.server = ServerProcess(self.args.spawn, ["-m", self.args.model])
            self.client = self.server.client()
        else:
            self.client = Client.connect(self.args.addr, timeout=300)
        return self.client

    def __exit__(self, *exc):
        self.client.close()
        if self.server:
            self.server.stop()
