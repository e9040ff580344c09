#!/usr/bin/env python3
"""The HTTP side of the OpenAI facade with curl and raw sockets: /health,
/metrics (Prometheus text format), error bodies for bad JSON, oversized
bodies and headers, unknown routes and methods, malformed HTTP, keep-alive
and pipelining, the read timeout, a client that disconnects mid-stream, and
bearer-token authentication.

usage: test_http_limits.py CAIRN_BIN MODEL [unittest args...]
"""
import json
import re
import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Server  # noqa: E402
from metrics import parse_metrics  # noqa: E402  (tests/http/metrics.py)

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)

CURL = shutil.which("curl")
TOKEN = "http-test-token-0123456789abcdef"


def curl(url, *args, data=None):
    """(status, headers text, body bytes) of one curl call."""
    cmd = [CURL, "-sS", "-D", "-", "--max-time", str(SHORT_HANG_GUARD_S), url, *args]
    if data is not None:
        cmd += ["--data-binary", "@-"]
    p = subprocess.run(cmd, input=data, capture_output=True, check=True)
    head, _, body = p.stdout.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):  # Expect: 100-continue
        head, _, body = body.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, head.decode(), body


def raw_exchange(server, data):
    """Raw bytes to the HTTP port; (bytes received, closed by the server)."""
    return harness.exchange(server.http_address, data, timeout=SHORT_HANG_GUARD_S)


def error_of(body):
    e = json.loads(body)["error"]
    for k in ("message", "type", "param", "code"):
        assert k in e, (k, e)
    return e


@unittest.skipIf(CURL is None, "curl is not installed (scripts/setup.sh --test installs it)")
class Limits(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", MODEL, "--http-max-body", "64K", "--http-timeout", "1"],
                            http=True, start_timeout=SHORT_HANG_GUARD_S)
        cls.url = cls.server.http_url

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_health(self):
        status, head, body = curl(self.url + "/health")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body), {"status": "ok"})
        self.assertIn("application/json", head)

    def test_metrics(self):
        curl(self.url + "/v1/completions", data=json.dumps(
            {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).encode())
        status, head, body = curl(self.url + "/metrics")
        self.assertEqual(status, 200)
        self.assertIn("text/plain; version=0.0.4", head)
        text = body.decode()
        values, types = parse_metrics(text)
        # every sample belongs to a family with HELP and TYPE
        for key in values:
            name = key.split("{")[0]
            family = next((f for f in types if name == f or
                           (types[f] == "histogram" and name in
                            (f + "_bucket", f + "_sum", f + "_count"))), None)
            self.assertIsNotNone(family, key)
            self.assertIn(f"# HELP {family} ", text)
        for gauge in ("cairn_requests_running", "cairn_requests_waiting", "cairn_sessions"):
            self.assertEqual(types[gauge], "gauge")
        self.assertGreaterEqual(values["cairn_generation_tokens_total"], 8)
        self.assertGreaterEqual(values["cairn_prompt_tokens_total"], 4)
        for tier in ("device", "host", "disk"):
            self.assertIn(f'cairn_prefix_cache_hit_tokens_total{{tier="{tier}"}}', values)
            self.assertIn(f'cairn_kv_pages_used{{tier="{tier}"}}', values)
        for hist in ("cairn_time_to_first_token_seconds", "cairn_inter_token_latency_seconds"):
            self.assertEqual(types[hist], "histogram")
            buckets = [(k, v) for k, v in values.items() if k.startswith(hist + "_bucket{")]
            counts = [v for _, v in buckets]
            self.assertEqual(counts, sorted(counts), "buckets are cumulative")
            self.assertEqual(buckets[-1][0], hist + '_bucket{le="+Inf"}')
            self.assertEqual(counts[-1], values[hist + "_count"])
            self.assertGreater(values[hist + "_count"], 0)
        self.assertGreaterEqual(values["cairn_time_to_first_token_seconds_count"], 1)
        # 8 tokens: 7 gaps at least
        self.assertGreaterEqual(values["cairn_inter_token_latency_seconds_count"], 7)

    def test_bad_json(self):
        for body in (b"{not json", b"[1, 2]", b"", b'{"a": 1, "a": 2}', b"\xff\xfe"):
            with self.subTest(body=body):
                status, _, out = curl(self.url + "/v1/chat/completions", data=body)
                self.assertEqual(status, 400)
                self.assertEqual(error_of(out)["type"], "invalid_request_error")

    def test_oversized_body(self):
        big = json.dumps({"prompt": "a " * 40000}).encode()
        status, head, out = curl(self.url + "/v1/completions", data=big)
        self.assertEqual(status, 413)
        error_of(out)
        self.assertIn("Connection: close", head)
        # chunked: no Content-Length, refused once the limit is passed
        status, _, out = curl(self.url + "/v1/completions", "-H",
                              "Transfer-Encoding: chunked", data=big)
        self.assertEqual(status, 413)
        # still serving
        self.assertEqual(curl(self.url + "/health")[0], 200)

    def test_oversized_headers(self):
        req = (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")
        got, closed = raw_exchange(self.server, req)
        self.assertTrue(got.startswith(b"HTTP/1.1 431 "), got[:100])
        self.assertTrue(closed)

    def test_routes_and_methods(self):
        status, _, out = curl(self.url + "/v2/nothing")
        self.assertEqual(status, 404)
        error_of(out)
        status, head, out = curl(self.url + "/v1/chat/completions")  # GET
        self.assertEqual(status, 405)
        self.assertIn("Allow: POST", head)
        status, _, _ = curl(self.url + "/health", "-X", "DELETE")
        self.assertEqual(status, 405)

    def test_head_wherever_get(self):
        """HEAD answers every GET route with GET's status and headers (the
        body's Content-Length included) and no body: what probes and
        `curl -I` send. Routes that only POST say so in Allow."""
        for path in ("/health", "/v1/models", "/v1/models/stories260K", "/metrics"):
            with self.subTest(path=path):
                g_status, g_head, g_body = curl(self.url + path)
                # the whole of what comes back, up to the server's close
                got, closed = raw_exchange(self.server, b"HEAD " + path.encode() +
                                           b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                self.assertTrue(closed)
                h_head, sep, h_body = got.partition(b"\r\n\r\n")
                self.assertEqual(sep, b"\r\n\r\n", got)
                self.assertEqual(int(h_head.split()[1]), g_status)
                self.assertEqual(h_body, b"")
                length = re.search(rb"Content-Length: (\d+)", h_head)
                self.assertIsNotNone(length, h_head)
                if path != "/metrics":  # its counters move between the two calls
                    self.assertEqual(int(length.group(1)), len(g_body))
        status, head, _ = curl(self.url + "/v1/completions", "-I")
        self.assertEqual(status, 405)
        self.assertIn("Allow: POST", head)
        # a HEAD on a keep-alive connection leaves it usable
        got, _ = raw_exchange(self.server, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                           b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                           b"Connection: close\r\n\r\n")
        self.assertEqual(got.count(b"HTTP/1.1 200 OK"), 2, got)
        self.assertEqual(got.count(b'{"status":"ok"}'), 1, got)

    def test_no_cors_unless_configured(self):
        status, head, _ = curl(self.url + "/v1/models", "-H", "Origin: http://app.example")
        self.assertEqual(status, 200)
        self.assertNotIn("Access-Control-Allow-Origin", head)
        status, head, _ = curl(self.url + "/v1/chat/completions", "-X", "OPTIONS",
                               "-H", "Origin: http://app.example",
                               "-H", "Access-Control-Request-Method: POST")
        self.assertEqual(status, 200)
        self.assertIn("Allow: POST", head)
        self.assertNotIn("Access-Control", head)

    def test_malformed_http(self):
        got, closed = raw_exchange(self.server, b"GARBAGE\x00\x01 / HTTP/9\r\n\r\n")
        self.assertTrue(got.startswith(b"HTTP/1.1 400 "), got[:100])
        self.assertTrue(closed)

    def test_keep_alive_and_pipelining(self):
        one = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        body = json.dumps({"prompt": "Once", "max_tokens": 3, "temperature": 0}).encode()
        two = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
               % len(body) + body)
        last = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        got, closed = raw_exchange(self.server, one + two + one + last)
        self.assertTrue(closed)
        self.assertEqual(got.count(b"HTTP/1.1 200 OK"), 4, got)
        self.assertIn(b"text_completion", got)
        self.assertTrue(got.rstrip().endswith(b"}"))

    def test_read_timeout(self):
        # half a request, then silence: 408 after --http-timeout (1 s)
        got, closed = raw_exchange(self.server, b"POST /v1/completions HTTP/1.1\r\nHo")
        self.assertTrue(got.startswith(b"HTTP/1.1 408 "), got[:100])
        self.assertTrue(closed)
        # an idle keep-alive connection is closed without an answer
        got, closed = raw_exchange(self.server, b"")
        self.assertEqual(got, b"")
        self.assertTrue(closed)

    def test_disconnect_mid_stream_cancels(self):
        for n in (1, 4):
            with self.subTest(n=n):
                self.disconnect_mid_stream(n)

    def disconnect_mid_stream(self, n):
        body = json.dumps({"messages": [{"role": "user", "content": "A long story"}], "n": n,
                           "max_tokens": 2000, "temperature": 0, "stream": True}).encode()
        s = harness.connect(self.server.http_address, timeout=SHORT_HANG_GUARD_S)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                  b"\r\n" % len(body) + body)
        got = b""
        while b"data: " not in got:
            got += s.recv(4096)
        s.close()
        # the request (every choice of it) is cancelled: nothing keeps running
        deadline = time.monotonic() + SHORT_HANG_GUARD_S
        while True:
            values = parse_metrics(curl(self.url + "/metrics")[2].decode())[0]
            if values["cairn_requests_running"] == 0 and values["cairn_requests_waiting"] == 0:
                break
            self.assertLess(time.monotonic(), deadline, "the request kept running")
            time.sleep(0.05)
        self.assertEqual(curl(self.url + "/health")[0], 200)


@unittest.skipIf(CURL is None, "curl is not installed (scripts/setup.sh --test installs it)")
class Auth(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", MODEL, "--auth-token", TOKEN], http=True,
                            start_timeout=SHORT_HANG_GUARD_S)
        cls.url = cls.server.http_url

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_bearer_token(self):
        body = json.dumps({"prompt": "Once", "max_tokens": 2}).encode()
        for headers in ([], ["-H", "Authorization: Bearer wrong-token"],
                        ["-H", "Authorization: Basic " + TOKEN],
                        ["-H", "Authorization: Bearer " + TOKEN[:-1]]):
            with self.subTest(headers=headers):
                status, head, out = curl(self.url + "/v1/completions", *headers, data=body)
                self.assertEqual(status, 401)
                self.assertIn("WWW-Authenticate: Bearer", head)
                error_of(out)
                self.assertEqual(curl(self.url + "/v1/models", *headers)[0], 401)
                self.assertEqual(curl(self.url + "/metrics", *headers)[0], 401)
        ok = ["-H", "Authorization: Bearer " + TOKEN]
        self.assertEqual(curl(self.url + "/v1/completions", *ok, data=body)[0], 200)
        self.assertEqual(curl(self.url + "/v1/models", *ok)[0], 200)
        self.assertEqual(curl(self.url + "/metrics", *ok)[0], 200)
        # health is for load balancers: no token needed
        self.assertEqual(curl(self.url + "/health")[0], 200)

    def test_openai_client_with_token(self):
        import openai
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=TOKEN, max_retries=0)
        r = client.completions.create(model="m", prompt="Once", max_tokens=2)
        self.assertEqual(r.usage.completion_tokens, 2)
        bad = openai.OpenAI(base_url=self.url + "/v1", api_key="nope", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.completions.create(model="m", prompt="Once", max_tokens=2)


@unittest.skipIf(CURL is None, "curl is not installed (scripts/setup.sh --test installs it)")
class Cors(unittest.TestCase):
    """--cors-origin: a browser page of an allowed origin may call the API.
    The preflight (OPTIONS, no credentials) is answered; every reply to an
    allowed origin, errors and streams included, names it; other origins
    get no CORS header (the browser then refuses to show them the reply)."""
    ORIGIN = "http://app.example:3000"

    @classmethod
    def setUpClass(cls):
        cls.server = Server(CAIRN, ["-m", MODEL, "--auth-token", TOKEN, "--cors-origin",
                                    "http://other.example, " + cls.ORIGIN], http=True,
                            start_timeout=SHORT_HANG_GUARD_S)
        cls.url = cls.server.http_url

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_preflight_without_credentials(self):
        status, head, body = curl(self.url + "/v1/chat/completions", "-X", "OPTIONS",
                                  "-H", "Origin: " + self.ORIGIN,
                                  "-H", "Access-Control-Request-Method: POST",
                                  "-H", "Access-Control-Request-Headers: authorization, "
                                        "content-type, x-session-id")
        self.assertEqual(status, 200, head)
        self.assertEqual(body, b"")
        self.assertIn("Access-Control-Allow-Origin: " + self.ORIGIN, head)
        self.assertIn("Access-Control-Allow-Methods: POST", head)
        self.assertIn("Access-Control-Allow-Headers: authorization, content-type, x-session-id",
                      head)
        self.assertIn("Vary: Origin", head)

    def test_replies_name_the_allowed_origin_only(self):
        ok = ["-H", "Authorization: Bearer " + TOKEN]
        body = json.dumps({"prompt": "Once", "max_tokens": 2, "stream": True}).encode()
        for origin, allowed in ((self.ORIGIN, True), ("http://other.example", True),
                                ("http://evil.example", False), ("http://app.example", False)):
            with self.subTest(origin=origin):
                for args, data, want in ((ok, None, 200), ([], None, 401), (ok, body, 200)):
                    url = self.url + ("/v1/completions" if data else "/v1/models")
                    status, head, _ = curl(url, *args, "-H", "Origin: " + origin, data=data)
                    self.assertEqual(status, want)
                    if allowed:
                        self.assertIn("Access-Control-Allow-Origin: " + origin, head)
                    else:
                        self.assertNotIn("Access-Control-Allow-Origin", head)
        # a header value cannot smuggle a line into the reply
        got, _ = raw_exchange(self.server, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                           b"Origin: " + self.ORIGIN.encode() + b"\r\n"
                                           b"Connection: close\r\n\r\n")
        self.assertIn(b"Access-Control-Allow-Origin: " + self.ORIGIN.encode() + b"\r\n", got)


class PublicBind(unittest.TestCase):
    def test_refuses_public_http_without_token(self):
        p = subprocess.run([CAIRN, "serve", "-m", MODEL, "--port", "0", "--http-port", "0",
                            "--http-host", "0.0.0.0"], capture_output=True, text=True,
                           timeout=SHORT_HANG_GUARD_S)
        self.assertEqual(p.returncode, 2)
        self.assertIn("refusing to listen on 0.0.0.0", p.stderr)


if __name__ == "__main__":
    harness.main()
