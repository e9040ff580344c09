#!/usr/bin/env python3
"""SIGTERM drains the server (docs/protocol.md, docs/openai.md): it stops
accepting, refuses new requests on open connections, lets running requests
finish up to --drain-timeout, then ends them the way a cancel does (an HTTP
stream gets its last chunk and [DONE], a native call its result), and exits
0. A second signal stops it at once.

usage: test_drain.py CAIRN_BIN MODEL [unittest args...]

Generations are long on purpose (1,500+ tokens with ignore_eos: seconds
on the bundled model), so each is certainly running when the signal comes;
nothing here depends on how long they take.
"""
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, N_CTX, STOP_GUARD_S  # noqa: E402
import cairn_client  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)
harness.configure(CAIRN, MODEL)


class SseStream:
    """A streaming /v1/completions on its own HTTP connection, read on a
    thread: .first (an Event: a chunk came), .chunks, .done ([DONE] seen)."""

    def __init__(self, port, max_tokens):
        self.first, self.finished = threading.Event(), threading.Event()
        self.chunks, self.done, self.error = [], False, None
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_GUARD_S)
        body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        self.conn.request("POST", "/v1/completions", json.dumps(body),
                          {"Content-Type": "application/json"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            r = self.conn.getresponse()
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    self.done = True
                    break
                self.chunks.append(json.loads(line[6:]))
                self.first.set()
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.error = e
        finally:
            self.first.set()
            self.finished.set()

    def usage(self):
        return next((c["usage"] for c in self.chunks if c.get("usage")), None)

    def finish_reasons(self):
        return [c["choices"][0]["finish_reason"] for c in self.chunks
                if c.get("choices") and c["choices"][0].get("finish_reason")]


def wait_until(cond, timeout, what):
    """Poll cond() until it holds; fail with `what` after `timeout` s."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(what)
        time.sleep(0.02)


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except OSError:
        return True


class Drain(harness.ServerCase):
    def start_server(self, *extra):
        return self.start(*extra, http=True)

    def test_running_requests_finish_new_ones_are_refused(self):
        srv = self.start_server("--drain-timeout", "120")
        native = srv.client(timeout=HANG_GUARD_S)
        gen = native.generate(prompt="Once upon a time", max_tokens=1500, ignore_eos=True,
                              temperature=0, stream=True)
        sse = SseStream(srv.http_port, 1500)
        self.assertTrue(sse.first.wait(HANG_GUARD_S), "no first chunk")
        first_delta = next(iter(gen))
        self.assertIsInstance(first_delta, cairn_client.Delta)

        srv.proc.send_signal(signal.SIGTERM)
        # the listeners close; the open connection gets refusals
        wait_until(lambda: refused(srv.port) and refused(srv.http_port), HANG_GUARD_S,
                           "the listeners did not close on SIGTERM")
        with self.assertRaises(cairn_client.Overloaded) as cm:
            native.generate(prompt="Tom", max_tokens=2)
        self.assertIn("shutting down", str(cm.exception))

        # both running generations end whole
        result = gen.wait()
        self.assertEqual(len(result.tokens), 1500)
        self.assertTrue(sse.finished.wait(HANG_GUARD_S))
        self.assertIsNone(sse.error)
        self.assertTrue(sse.done, "the stream did not end with [DONE]")
        self.assertEqual(sse.usage()["completion_tokens"], 1500)
        self.assertEqual(sse.finish_reasons(), ["length"])
        self.assertEqual(srv.proc.wait(STOP_GUARD_S), 0, srv.log())
        native.close()
        sse.conn.close()

    def test_drain_timeout_ends_streams_cleanly(self):
        # The requests must still be running when the drain timeout ends
        # them. With --drain-timeout 0.2 and 2,030 tokens that held only while
        # decoding was slower than ~10,000 tokens/s. Now the timeout is the
        # smallest there is (1 ms: the requests are ended at the drain's
        # second tick, 50 ms after SIGTERM is handled) and the generations are
        # 16,368 tokens long (-c 16384), so they end cancelled unless the
        # whole context decodes in those 50 ms.
        n_ctx = 16384
        srv = self.start_server("--drain-timeout", "0.001", "-c", str(n_ctx))
        self.assertEqual(srv.client(timeout=HANG_GUARD_S).info()["model"]["n_ctx"], n_ctx)
        native = srv.client(timeout=HANG_GUARD_S)
        gen = native.generate(prompt="Once upon a time", max_tokens=n_ctx - 16, ignore_eos=True,
                              temperature=0, stream=True)
        sse = SseStream(srv.http_port, n_ctx - 16)
        self.assertTrue(sse.first.wait(HANG_GUARD_S))
        next(iter(gen))
        srv.proc.send_signal(signal.SIGTERM)
        self.assertTrue(sse.finished.wait(HANG_GUARD_S))
        self.assertIsNone(sse.error)
        self.assertTrue(sse.done, "the stream was cut instead of ended")
        # (OpenAI's finish reasons: a cancelled request reads "stop"; with
        # ignore_eos nothing else could stop it short of max_tokens)
        self.assertEqual(sse.finish_reasons(), ["stop"], sse.chunks[-3:])
        self.assertLess(sse.usage()["completion_tokens"], n_ctx - 16)
        result = gen.wait()
        self.assertEqual(result.finish_reason, "cancelled")
        self.assertLess(len(result.tokens), n_ctx - 16)
        self.assertEqual(srv.proc.wait(STOP_GUARD_S), 0, srv.log())
        self.assertIn("ending their requests", srv.log())
        native.close()
        sse.conn.close()

    def test_idle_server_stops_at_once_and_second_signal_forces(self):
        srv = self.start_server()
        srv.client(timeout=HANG_GUARD_S).close()
        srv.proc.send_signal(signal.SIGTERM)
        self.assertEqual(srv.proc.wait(STOP_GUARD_S), 0)

        srv = self.start_server("--drain-timeout", "600")
        native = srv.client(timeout=HANG_GUARD_S)
        gen = native.generate(prompt="Once", max_tokens=N_CTX - 16, ignore_eos=True,
                              temperature=0, stream=True)
        next(iter(gen))
        srv.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: refused(srv.port), HANG_GUARD_S, "no drain")
        srv.proc.send_signal(signal.SIGTERM)
        self.assertEqual(srv.proc.wait(STOP_GUARD_S), 0, srv.log())
        native.close()


if __name__ == "__main__":
    harness.main()
