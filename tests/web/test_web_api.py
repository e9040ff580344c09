#!/usr/bin/env python3
"""What the page's server side promises (docs/web.md), without a browser, on
the bundled model: `/` and its files without a token, /web/info, /web/state
behind the API's token with the API's own 401, same origin only (403), the
activity series and reused prefixes, a tenant never seeing another's
sessions or activity, and --no-web.

usage: test_web_api.py CAIRN_BIN MODEL [unittest args...]
"""
import json
import os
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)
TOKEN = "web-api-token-0123456789"


def http(url, token=None, body=None, headers=None, method=None):
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = "Bearer " + token
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=SHORT_HANG_GUARD_S) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def chat(url, token, key, text="Once upon a time"):
    prompt = "Once upon a time there was a little girl who liked to play. " * 3
    status, _, body = http(url + "/v1/chat/completions", token,
                           {"messages": [{"role": "system", "content": prompt},
                                         {"role": "user", "content": text}],
                            "max_tokens": 4, "session_id": key})
    assert status == 200, body
    return json.loads(body)


class WebApi(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        scratch = cls.class_scratch("cairn-webapi-")
        cls.srv = scratch.start(CAIRN, ["-m", MODEL, "--auth-token", TOKEN], http=True,
                                start_timeout=SHORT_HANG_GUARD_S)
        cls.url = cls.srv.http_url
        tenants = scratch.path("tenants")
        with open(tenants, "w") as f:
            f.write("alice alice-token-0123456789\nbob bob-token-0123456789\n")
        os.chmod(tenants, 0o600)
        cls.multi = scratch.start(CAIRN, ["-m", MODEL, "--tenants", tenants], http=True,
                                  start_timeout=SHORT_HANG_GUARD_S)
        cls.noweb = scratch.start(CAIRN, ["-m", MODEL, "--auth-token", TOKEN, "--no-web"],
                                  http=True, start_timeout=SHORT_HANG_GUARD_S)

    def test_files_without_token(self):
        for path, ctype in (("/", "text/html"), ("/index.html", "text/html"),
                            ("/app.js", "text/javascript"), ("/md.js", "text/javascript"),
                            ("/app.css", "text/css")):
            status, headers, body = http(self.url + path)
            self.assertEqual(status, 200, path)
            self.assertTrue(headers["Content-Type"].startswith(ctype), headers)
            self.assertIn("frame-ancestors 'none'", headers["Content-Security-Policy"])
            self.assertIn("connect-src 'self'", headers["Content-Security-Policy"])
            self.assertTrue(body)
        status, _, body = http(self.url + "/")
        self.assertIn(b"/app.js", body)
        # the page's files reference nothing off this server
        for path in ("/", "/app.js", "/md.js", "/app.css"):
            body = http(self.url + path)[2].decode()
            self.assertNotIn("//cdn", body)
            self.assertNotIn("https://", body.replace("https?://", ""))
        status, _, body = http(self.url + "/web/info")
        self.assertEqual((status, json.loads(body)), (200, {"auth_required": True,
                                                            "tenants": False}))
        self.assertEqual(http(self.url + "/", method="POST", body={})[0], 405)

    def test_state_needs_the_api_token(self):
        for tok in (None, "wrong-token-000000"):
            s1, _, b1 = http(self.url + "/web/state", tok)
            s2, _, b2 = http(self.url + "/v1/models", tok)
            self.assertEqual((s1, s2), (401, 401))
            self.assertEqual(json.loads(b1), json.loads(b2))

    def test_same_origin_only(self):
        status, _, _ = http(self.url + "/web/state", TOKEN,
                            headers={"Origin": "http://evil.example"})
        self.assertEqual(status, 403)
        host = "%s:%d" % self.srv.http_address
        status, headers, _ = http(self.url + "/web/state", TOKEN,
                                  headers={"Origin": "http://" + host})
        self.assertEqual(status, 200)
        self.assertNotIn("Access-Control-Allow-Origin", headers)

    def test_state(self):
        chat(self.url, TOKEN, "state-a")
        r = chat(self.url, TOKEN, "state-a")
        self.assertGreater(r["usage"]["prompt_tokens_details"]["cached_tokens"], 16)
        status, _, body = http(self.url + "/web/state", TOKEN)
        self.assertEqual(status, 200)
        st = json.loads(body)
        self.assertEqual([t["name"] for t in st["tiers"]], ["device", "host", "disk", "shared"])
        dev = st["tiers"][0]
        self.assertGreater(dev["pages"], 0)
        self.assertGreater(dev["capacity_pages"], dev["free_pages"] - 1)
        pts = st["series"]["points"]
        self.assertEqual(len(pts), 60)
        self.assertGreaterEqual(sum(p["device"] for p in pts),
                                r["usage"]["prompt_tokens_details"]["cached_tokens"])
        self.assertGreater(sum(p["computed"] for p in pts), 0)
        names = {s["name"]: s for s in st["sessions"]}
        self.assertIn("state-a", names)
        self.assertGreater(names["state-a"]["tokens"], 0)
        self.assertGreater(names["state-a"]["last_turn"]["cached_by_tier"]["device"], 0)
        self.assertTrue(st["prefixes"])
        self.assertGreaterEqual(st["prefixes"][0]["uses"], 1)
        self.assertIn("totals", st)

    def test_tenants_apart(self):
        a, b = "alice-token-0123456789", "bob-token-0123456789"
        chat(self.multi.http_url, a, "alice-secret-conversation")
        chat(self.multi.http_url, a, "alice-secret-conversation")
        info = json.loads(http(self.multi.http_url + "/web/info")[2])
        self.assertEqual(info, {"auth_required": True, "tenants": True})
        sa = json.loads(http(self.multi.http_url + "/web/state", a)[2])
        sb = json.loads(http(self.multi.http_url + "/web/state", b)[2])
        self.assertIn("alice-secret-conversation", [s["name"] for s in sa["sessions"]])
        self.assertEqual(sb["sessions"], [])
        self.assertEqual(sb["prefixes"], [])
        self.assertEqual(sum(p["requests"] for p in sb["series"]["points"]), 0)
        self.assertGreater(sum(p["requests"] for p in sa["series"]["points"]), 0)
        self.assertNotIn("totals", sb)  # server-wide counters would mix tenants
        self.assertNotIn(b"alice", http(self.multi.http_url + "/web/state", b)[2])

    def test_no_web(self):
        for path in ("/", "/app.js", "/web/state", "/web/info"):
            self.assertEqual(http(self.noweb.http_url + path, TOKEN)[0], 404, path)
        self.assertEqual(http(self.noweb.http_url + "/")[0], 401)  # no page: a token first
        self.assertEqual(http(self.noweb.http_url + "/v1/models", TOKEN)[0], 200)


if __name__ == "__main__":
    harness.main()
