#!/usr/bin/env python3
"""Stored responses' lifecycle (issue 36; docs/openai.md, "Stored responses"):
a Responses API deployment never wedges the server.

usage: test_responses_lifecycle.py CAIRN_BIN MODEL [unittest args...]

Every POST /v1/responses with store: true keeps a response (a session of the
engine). They used to count toward --max-sessions and never go, so after
--max-sessions calls every Responses call and every chat with session_id got
503, and with --cache-dir it stayed so after a restart. Checked here, on the
real `cairn serve`:

- ManyStored: CAIRN_RESPONSES_CALLS (default 10000) stored responses, many
  at once, on a server with --max-sessions 64, --max-responses a tenth of
  that (1000) and
  --cache-dir: every call answers 200; the newest chains continue with their
  history served from the cache; the oldest responses are gone (404 with
  OpenAI's message); the user's sessions made before them (a chat
  session_id, a persisted native session) are all still there; new chat
  sessions open; and the same after a graceful restart and after a SIGKILL.
- Expiry: with --responses-ttl a response expires (GET and
  previous_response_id: 404, OpenAI's message and code) and the user's
  sessions do not; the creation time is on disk, so a response made before
  a SIGKILL expires after the restart too.
- PushedOut: at --max-responses the least recently continued goes first;
  responses never count toward --max-sessions, and a full --max-sessions
  503 names the option.

MODEL is the bundled model in the `server` entry (10000 calls in seconds);
the `_realmodel` entry runs the same on CAIRN_CHAT_MODEL (the real instruct
model) with CAIRN_RESPONSES_CALLS set lower, since each call there is a
forward pass of 0.5B parameters.
"""
import http.client
import json
import os
import re
import sys
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import SHORT_HANG_GUARD_S, Scratch  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)
if not os.path.exists(MODEL):
    print(f"skipped: the model {MODEL} is absent; scripts/get-model fetches the real one")
    sys.exit(77)
CALLS = int(os.environ.get("CAIRN_RESPONSES_CALLS", "10000"))
WORKERS = 16
CHAIN = 5  # a worker starts a new chain after this many turns
# kept: a tenth of the calls, so that most are pushed out, and enough that
# every worker's last response is among the newest
MAX_RESPONSES = max(CALLS // 10, 8 * WORKERS)


class Http:
    """One keep-alive HTTP connection (the server answers one request at a
    time per connection; concurrency is connections)."""

    def __init__(self, server):
        u = urllib.parse.urlparse(server.http_url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=SHORT_HANG_GUARD_S)

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, data, {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        return r.status, json.loads(r.read() or b"null")

    def create(self, text, previous=None, **kw):
        body = dict(model="m", input=text, max_output_tokens=1, temperature=0, **kw)
        if previous:
            body["previous_response_id"] = previous
        return self.call("POST", "/v1/responses", body)

    def get(self, rid):
        return self.call("GET", "/v1/responses/" + rid)

    def chat(self, session_id, text):
        return self.call("POST", "/v1/chat/completions",
                         dict(model="m", messages=[{"role": "user", "content": text}],
                              max_tokens=1, temperature=0, session_id=session_id))

    def close(self):
        self.conn.close()


class Base(unittest.TestCase):
    def http(self, server):
        h = Http(server)
        self.addCleanup(h.close)
        return h

    def assertOk(self, got, what=""):
        status, body = got
        self.assertEqual(status, 200, f"{what}: {body}")
        return body

    def assertGone(self, got, rid, previous=False):
        """404 as OpenAI answers it, naming the id."""
        status, body = got
        self.assertEqual(status, 404, body)
        err = body["error"]
        self.assertEqual(err["type"], "invalid_request_error")
        self.assertIn(f"with id '{rid}' not found", err["message"])
        self.assertIn("--responses-ttl", err["message"])
        if previous:
            self.assertEqual((err["param"], err["code"]),
                             ("previous_response_id", "previous_response_not_found"))

    def continues(self, h, prev):
        """previous_response_id on prev works, its history from the cache."""
        r = self.assertOk(h.create("And then?", previous=prev["id"]), prev["id"])
        history = prev["usage"]["input_tokens"] + prev["usage"]["output_tokens"]
        self.assertGreater(r["usage"]["input_tokens"], history)
        # all of the history but the previous reply's last token (sampled,
        # never fed back) is served from the cache (memory, or disk after a
        # restart: whole pages, so up to a page less)
        self.assertGreaterEqual(r["usage"]["input_tokens_details"]["cached_tokens"],
                                history - 1 - 16)
        return r


class ManyStored(Base):
    def test_many_stored_responses(self):
        with Scratch("cairn-resp-many-") as scratch:
            args = ["-m", MODEL, "--max-sessions", "64", "--max-responses", str(MAX_RESPONSES),
                    "--cache-dir", scratch.path("kv"), "--tier-loads", "always"]
            srv = scratch.start(CAIRN, args, http=True, tcp=True,
                                start_timeout=SHORT_HANG_GUARD_S)
            h = self.http(srv)
            # the user's sessions, made before any response: a chat session
            # (named, HTTP) and a persisted native one
            self.assertOk(h.chat("early-user", "Hello, I am the first user."))
            with srv.client() as c:
                native = c.session_open(text="A user's own session.", persist=True)["session_id"]
            first = self.assertOk(h.create("The very first stored response."))

            t0 = time.monotonic()
            heads = self.fire(srv, CALLS)
            print(f"{CALLS} stored responses, {WORKERS} at once: {time.monotonic() - t0:.1f} s",
                  file=sys.stderr)
            self.assertEqual(len(heads), WORKERS)

            def check(srv, heads, when):
                h = self.http(srv)
                with self.subTest(when=when):
                    # the oldest is gone, said as OpenAI says it
                    self.assertGone(h.get(first["id"]), first["id"])
                    self.assertGone(h.create("x", previous=first["id"]), first["id"],
                                    previous=True)
                    # the newest chains continue, from the cache. A restart
                    # puts the stored responses back in order of creation,
                    # which records keep to the second: the continuations
                    # made here are a second younger than the rest, so the
                    # next restart's pushing out cannot take one of them
                    # for an older response of the same second.
                    time.sleep(1.1)
                    nxt = [self.continues(h, head) for head in heads]
                    for head in heads:
                        self.assertEqual(self.assertOk(h.get(head["id"]))["id"], head["id"])
                    # the user's sessions are all there
                    self.assertOk(h.chat("early-user", "Still here?"), "early-user")
                    with srv.client() as c:
                        self.assertGreater(c.session_info(native)["n_tokens"], 0)
                    # and sessions can still be opened: 503 is gone
                    for i in range(8):
                        self.assertOk(h.chat(f"{when}-user-{i}", "Hi."), when)
                    # counted apart: the open sessions are the user's, and
                    # the web page lists those, not thousands of responses
                    with srv.client() as c:
                        st = c.cache_stats()
                    self.assertLessEqual(st["sessions"], 64)
                    self.assertGreaterEqual(st["stored_responses"], WORKERS)
                    self.assertLessEqual(st["stored_responses"], MAX_RESPONSES)
                    status, state = h.call("GET", "/web/state")
                    self.assertEqual(status, 200, state)
                    names = [x["name"] for x in state["sessions"]]
                    self.assertIn("early-user", names)
                    self.assertEqual(len(names), st["sessions"])
                    self.assertEqual(state["totals"]["sessions"], st["sessions"])
                    return nxt

            heads = check(srv, heads, "after the calls")
            srv = scratch.track(srv.restart())  # SIGTERM: graceful
            restored = [ln for ln in srv.log_lines if "stored responses)" in ln]
            self.assertTrue(restored, srv.log())
            print(restored[-1].strip(), file=sys.stderr)
            # what was pushed out was deleted from disk as it went: at most
            # --max-responses come back, and none had to be dropped at start
            kept = int(re.search(r"\((\d+) of them stored responses\)", restored[-1]).group(1))
            self.assertGreaterEqual(kept, WORKERS)
            self.assertLessEqual(kept, MAX_RESPONSES)
            self.assertFalse([ln for ln in srv.log_lines if "beyond max_responses" in ln])
            heads = check(srv, heads, "after a graceful restart")
            srv = scratch.track(srv.restart(kill=True))
            check(srv, heads, "after a SIGKILL")
            self.assertTrue(srv.alive())

    def fire(self, srv, n):
        """n stored responses from WORKERS connections at once, each in
        chains of CHAIN turns; all must answer 200. Each worker's last
        response."""
        heads, failures, lock = [None] * WORKERS, [], threading.Lock()

        def work(w):
            h = Http(srv)
            try:
                prev = None
                for k in range(w, n, WORKERS):
                    status, body = h.create(f"Say {k % 7}.",
                                            previous=prev["id"] if prev and k // WORKERS % CHAIN
                                            else None)
                    if status != 200:
                        with lock:
                            failures.append((k, status, body))
                        return
                    prev = body
                heads[w] = prev
            finally:
                h.close()

        threads = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(failures[:3], [])
        return heads


class Expiry(Base):
    def test_expired_responses_are_gone_user_sessions_stay(self):
        with Scratch("cairn-resp-ttl-") as scratch:
            kv = scratch.path("kv")
            srv = scratch.start(CAIRN, ["-m", MODEL, "--cache-dir", kv, "--responses-ttl", "2"],
                                http=True, tcp=True, start_timeout=SHORT_HANG_GUARD_S)
            h = self.http(srv)
            r = self.assertOk(h.create("A response that will expire."))
            self.assertOk(h.get(r["id"]))
            self.assertOk(h.chat("user-chat", "A user's conversation."))
            with srv.client() as c:
                native = c.session_open(text="A user's session.", persist=True)["session_id"]
                plain = c.session_open(text="Not persisted.")["session_id"]
            time.sleep(2.5)
            self.assertGone(h.get(r["id"]), r["id"])
            self.assertGone(h.create("More.", previous=r["id"]), r["id"], previous=True)
            self.assertGone(h.call("DELETE", "/v1/responses/" + r["id"]), r["id"])
            # the user's sessions never expire
            with srv.client() as c:
                self.assertGreater(c.session_info(native)["n_tokens"], 0)
                self.assertGreater(c.session_info(plain)["n_tokens"], 0)
            got = self.assertOk(h.chat("user-chat", "A user's conversation, more."))
            self.assertGreater(got["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
            h.close()
            # the deadline is on disk, fixed when the response was made: a
            # restart under another --responses-ttl neither shortens it (a
            # user's record is never deleted for how the server started) nor
            # stretches it
            srv = scratch.track(srv.restart(
                ["-m", MODEL, "--cache-dir", kv, "--responses-ttl", "1h"], kill=True))
            h = self.http(srv)
            old = self.assertOk(h.create("Made under a TTL of an hour."))
            h.close()
            srv = scratch.track(srv.restart(
                ["-m", MODEL, "--cache-dir", kv, "--responses-ttl", "1"], kill=True))
            h = self.http(srv)
            short = self.assertOk(h.create("Made under a TTL of a second."))
            h.close()
            time.sleep(1.5)
            srv = scratch.track(srv.restart(
                ["-m", MODEL, "--cache-dir", kv, "--responses-ttl", "1h"], kill=True))
            h = self.http(srv)
            self.assertOk(h.get(old["id"]))  # its hour is not over, whatever the TTL now
            self.assertGone(h.get(short["id"]), short["id"])  # its second is
            self.assertTrue(any("expired" in ln for ln in srv.log_lines), srv.log())
            h.close()
            with srv.client() as c:
                self.assertGreater(c.session_info(native)["n_tokens"], 0)


class PushedOut(Base):
    def test_least_recently_continued_goes_first(self):
        with Scratch("cairn-resp-lru-") as scratch:
            srv = scratch.start(CAIRN, ["-m", MODEL, "--max-responses", "4",
                                        "--max-sessions", "3"],
                                http=True, tcp=True, start_timeout=SHORT_HANG_GUARD_S)
            h = self.http(srv)
            r = [self.assertOk(h.create(f"Response {i}.")) for i in range(4)]
            # continuing r[0] makes it the most recently continued: the new
            # one pushes out r[1], the least recently continued
            self.assertOk(h.create("Go on.", previous=r[0]["id"]))
            self.assertGone(h.get(r[1]["id"]), r[1]["id"])
            for x in (r[0], r[2], r[3]):
                self.assertOk(h.get(x["id"]))
            # the user's sessions fill --max-sessions; responses go on, and
            # never push a user's session out
            with srv.client() as c:
                mine = [c.session_open(text=f"Session {i}.")["session_id"] for i in range(2)]
                self.assertOk(h.chat("named", "A named one."))
                status, body = h.chat("one-too-many", "No room.")
                self.assertEqual(status, 503, body)
                self.assertIn("--max-sessions", body["error"]["message"])
                for i in range(20):
                    self.assertOk(h.create(f"More {i}."))
                for sid in mine:
                    self.assertGreater(c.session_info(sid)["n_tokens"], 0)
            self.assertOk(h.chat("named", "A named one, again."))
            # the newest four stayed
            last = [self.assertOk(h.create(f"Last {i}.")) for i in range(4)]
            for x in last:
                self.assertOk(h.get(x["id"]))


if __name__ == "__main__":
    harness.main()
