#!/usr/bin/env python3
"""`cairn route` in front of three real `cairn serve` replicas and a real
redis-server (docs/scale-out.md, "The router").

usage: test_route.py CAIRN_BIN MODEL [unittest args...]

Everything is real: redis-server on a free loopback port (--save ''
--appendonly no), three replicas of the bundled model (one thread each,
`--shared-cache` on that Redis: they publish hello/stored/removed events
and keep persisted sessions' records there), and the router, which finds
the replicas from their hello events and builds its index from the stream.

Checks, in order (the last one kills a replica):
  0. what the router cannot decode reaches a replica unchanged (its error);
  1. a RAG workload (documents x questions, shuffled, three clients at
     once) computes each document once in all: the replicas' computed
     prompt tokens (prompt_tokens - cached_tokens) are <= 1.1 x the floor;
  2. a session's turns stay on its replica, even a turn whose prompt is
     cached elsewhere (HTTP session_id, and native session.* calls);
  3. a restarted router rebuilds its index from the stream: each document
     goes back to the replica that holds it;
  4. SIGKILL of a replica under load: no request hangs, only requests in
     flight on it fail, requests after the router noticed all succeed, and
     its sessions continue on another replica (a persisted native session
     with the same history, loaded from the shared tier);
and, with --tenants, that a tenant's prompts are hashed under its own seed
(never predicted cached for another), and the router's request deadlines.
Waits are guards against hangs, never performance thresholds.
"""
import concurrent.futures
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import STORIES  # noqa: E402
import cairn_client  # noqa: E402
from redis_server import RedisServer, free_port  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)

GUARD_S = 60           # one request or one wait longer than this is a hang
PAGE = 16              # the replicas' page size (serve's default)
PREFIX = "cairn:"


# ---- Redis: tests/support/redis_server.py, and the redis-py client -----------
def start_redis(scratch):
    """A redis-server of the test's own on a free loopback port, no
    persistence; stopped with the scratch directory. Returns (port, client)."""
    r = RedisServer(scratch.name)
    scratch.on_close(r.stop)
    return r.port, r.db


def stream_tail(redis):
    """The id of the stream's last entry ("0-0" when empty)."""
    last = redis.xrevrange(PREFIX + "events", count=1)
    return last[0][0].decode() if last else "0-0"


def stored_by(redis, replica_id, after="0-0"):
    """The page hashes the stream's entries after `after` say `replica_id`
    holds (stored and not removed since)."""
    held = set()
    for _, f in redis.xrange(PREFIX + "events", min="(" + after):
        if f.get(b"r", b"").decode() != replica_id or b"h" not in f:
            continue
        hashes = {f[b"h"][i:i + 16] for i in range(0, len(f[b"h"]), 16)}
        held = held | hashes if f[b"op"] == b"stored" else held - hashes
    return held



# ---- the router process --------------------------------------------------------
class Router:
    def __init__(self, args):
        self.args = args
        self.proc = subprocess.Popen([CAIRN, "route", *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                if "listening" in line:
                    words = line.split()
                    self.http_port = int(words[words.index("http") + 1].rsplit(":", 1)[1])
                    self.rpc_port = int(words[words.index("msgpack") + 1].rsplit(":", 1)[1])
                    ready.set()
            ready.set()
        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(GUARD_S) or self.proc.poll() is not None:
            raise RuntimeError("router did not start:\n" + "".join(self.lines))

    def log(self):
        return "".join(self.lines[-40:])

    def stop_cleanly(self, test):
        """SIGTERM: exit 0 with no sanitizer report (in a sanitizer build)."""
        rc = self.stop()
        log = "".join(self.lines)
        test.assertEqual(rc, 0, log[-4000:])
        test.assertNotIn("runtime error", log)
        test.assertNotIn("Sanitizer", log)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(GUARD_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class Http:
    """One keep-alive connection to the router."""

    def __init__(self, port):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=GUARD_S)

    def request(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        try:
            self.conn.request(method, path, data, {"Content-Type": "application/json"})
            r = self.conn.getresponse()
            text = r.read()
        except (http.client.HTTPException, OSError):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=GUARD_S)
            raise
        return r.status, text

    def json(self, method, path, body=None):
        status, text = self.request(method, path, body)
        return status, json.loads(text) if text else None

    def close(self):
        self.conn.close()


def metrics(port):
    c = Http(port)
    try:
        _, text = c.request("GET", "/router/metrics")
    finally:
        c.close()
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def routed(port):
    """requests routed so far, by replica id"""
    out = {}
    for k, v in metrics(port).items():
        if k.startswith("cairn_router_requests_total{"):
            out[k.split('"')[1]] = v
    return out


def wait_for(what, fn, guard=GUARD_S):
    end = time.time() + guard
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


class RouterTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = cls.class_scratch("cairn-route-test-", graceful=False)
        cls.redis_port, cls.redis = start_redis(cls.scratch)
        cls.redis_url = "redis://127.0.0.1:%d" % cls.redis_port
        cls.replicas = []
        for i in range(3):
            # the shared tier sits under the disk tier: a persisted session's
            # record reaches Redis, so another replica can take the session over
            srv = cls.scratch.start(CAIRN, ["-m", MODEL, "-c", "2048", "-t", "1",
                                            "--cache-dir", cls.scratch.path("c%d" % i),
                                            "--shared-cache", cls.redis_url], http=True)
            cls.replicas.append(srv)
        # a replica's id is its HTTP address (serve's default --replica-id)
        cls.ids = ["127.0.0.1:%d" % srv.http_port for srv in cls.replicas]
        cls.router = cls.start_router()

    @classmethod
    def start_router(cls):
        r = Router(["-m", MODEL, "--http-port", "0", "--port", "0", "--shared-cache", cls.redis_url,
                    "--health-interval", "0.2"])
        cls.scratch.on_close(r.stop)
        wait_for("3 replicas up", lambda: metrics(r.http_port).get("cairn_router_replicas_up") == 3)
        return r

    # ---- helpers --------------------------------------------------------------
    def tokens(self, text, bos):
        c = Http(self.router.http_port)
        try:
            status, out = c.json("POST", "/tokenize", {"content": text, "add_special": bos})
        finally:
            c.close()
        self.assertEqual(status, 200, out)
        return out["tokens"]

    def documents(self, n, first_word, words=170):
        """n documents of `words` words of the stories (wrapping around),
        each headed by its own title so that none shares a page with another."""
        ws = STORIES.split()
        docs = []
        for i in range(n):
            start = first_word + i * words
            body = [ws[(start + k) % len(ws)] for k in range(words)]
            docs.append(self.tokens("Document %d of %d. " % (start, n) + " ".join(body), True))
        return docs

    def complete(self, client, prompt, max_tokens=4):
        status, out = client.json("POST", "/v1/completions",
                                  {"prompt": prompt, "max_tokens": max_tokens,
                                   "temperature": 0})
        self.assertEqual(status, 200, out)
        return out["usage"]

    def one_routed(self, before, after):
        grew = [k for k in after if after[k] != before.get(k, 0)]
        self.assertEqual(len(grew), 1, (before, after))
        self.assertEqual(after[grew[0]] - before.get(grew[0], 0), 1, (before, after))
        return grew[0]

    # ---- 0. what the router cannot decode goes through unchanged ---------------------
    def test_0_undecodable_requests_reach_a_replica(self):
        port = self.router.http_port
        c = Http(port)
        self.addCleanup(c.close)
        before = metrics(port)
        status, text = c.request("POST", "/v1/chat/completions", None)  # no body at all
        self.assertEqual(status, 400, text)
        status, out = c.json("POST", "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "hi"}],
                              "temperature": 7})
        self.assertEqual(status, 400, out)
        self.assertIn("temperature", out["error"]["message"])  # the replica's own words
        status, out = c.json("GET", "/v1/models")
        self.assertEqual(status, 200, out)
        self.assertEqual(out["data"][0]["object"], "model")
        after = metrics(port)
        self.assertEqual(after["cairn_router_undecodable_total"] -
                         before["cairn_router_undecodable_total"], 2)
        self.assertEqual(after["cairn_router_http_requests_total"] -
                         before["cairn_router_http_requests_total"], 3)
        # the same connection goes on (keep-alive through errors)
        self.complete(c, self.tokens("Once upon a time", True))

    # ---- 1. RAG: each document computed once ---------------------------------------
    def test_1_rag_each_document_once(self):
        docs = self.documents(6, 0)
        questions = [self.tokens(" Question %d: who was in the story, and why?" % q, False)
                     for q in range(3)]
        work = [(d, q) for d in range(len(docs)) for q in range(len(questions))]
        random.Random(20).shuffle(work)
        local = threading.local()

        def run(item):
            if not hasattr(local, "c"):
                local.c = Http(self.router.http_port)
            d, q = item
            u = self.complete(local.c, docs[d] + questions[q])
            return u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"]

        before = routed(self.router.http_port)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            computed = sum(pool.map(run, work))
        after = routed(self.router.http_port)
        floor = sum(len(d) for d in docs) + sum(len(questions[q]) for _, q in work)
        self.assertLessEqual(computed, 1.1 * floor, (computed, floor))
        # and the documents were spread, not all sent to one replica
        used = [k for k in after if after[k] > before.get(k, 0)]
        self.assertGreaterEqual(len(used), 2, (before, after))
        m = metrics(self.router.http_port)
        self.assertGreater(m["cairn_router_index_entries"], 0)
        # every request is off the books once answered: no load left behind
        for name in ("cairn_router_inflight", "cairn_router_queued_prefill_tokens",
                     "cairn_router_queued_decode_tokens"):
            for k, v in m.items():
                if k.startswith(name + "{"):
                    self.assertEqual(v, 0, k)

    # ---- 2. sessions stick ---------------------------------------------------------
    def test_2_session_turns_stay_on_their_replica(self):
        port = self.router.http_port
        c = Http(port)
        self.addCleanup(c.close)
        # a document cached on some replica X
        doc = self.documents(1, 3000)[0]
        prompt = doc + self.tokens(" The end.", False)  # /tokenize is routed too: first
        before = routed(port)
        self.complete(c, prompt)
        x = self.one_routed(before, routed(port))
        # a conversation that starts elsewhere than X...
        for attempt in range(6):
            key = "conv-%d" % attempt
            before = routed(port)
            status, out = c.json("POST", "/v1/completions",
                                 {"prompt": "Once upon a time, a cat named %s" % key,
                                  "max_tokens": 4, "temperature": 0, "session_id": key})
            self.assertEqual(status, 200, out)
            home = self.one_routed(before, routed(port))
            if home != x:
                break
        self.assertNotEqual(home, x, "every conversation started on the document's replica")
        # ...keeps its replica for turns whose prompt is cached on X
        for turn in range(3):
            prompt = doc + self.tokens(" Turn %d." % turn, False)
            before = routed(port)
            status, out = c.json("POST", "/v1/completions",
                                 {"prompt": prompt,
                                  "max_tokens": 4, "temperature": 0, "session_id": key})
            self.assertEqual(status, 200, out)
            self.assertEqual(self.one_routed(before, routed(port)), home)
        # stored responses: a chain of previous_response_id, each on the replica
        # that holds the one before (another replica answers 404), streamed too
        status, out = c.json("POST", "/v1/responses", {"input": "Once upon a time",
                                                        "max_output_tokens": 4})
        self.assertEqual(status, 200, out)
        rid = out["id"]
        for turn in range(3):
            stream = turn == 1
            status, text = c.request("POST", "/v1/responses",
                                     {"input": "and then", "previous_response_id": rid,
                                      "max_output_tokens": 4, "stream": stream})
            self.assertEqual(status, 200, text)
            rid = (json.loads(text)["id"] if not stream else
                   re.search(rb'"id":"(resp_[0-9a-f]{32})"', text).group(1).decode())
        status, out = c.json("GET", "/v1/responses/" + rid)
        self.assertEqual(status, 200, out)
        # native sessions: session.open, then every session.* call on its replica
        cl = cairn_client.Client("127.0.0.1", self.router.rpc_port, timeout=GUARD_S)
        self.addCleanup(cl.close)
        before = routed(port)
        sid = cl.session_open(text="Once upon a time there was a red ball.")["session_id"]
        owner = self.one_routed(before, routed(port))
        n = 0
        for turn in range(3):
            before = routed(port)
            g = cl.session_generate(sid, text=" The ball", max_tokens=4, temperature=0)
            self.assertEqual(self.one_routed(before, routed(port)), owner)
            self.assertGreater(g.usage.cached_tokens, n)  # the history is there
            n = g.usage.prompt_tokens - 1
        before = routed(port)
        fork = cl.session_fork(sid)
        self.assertEqual(self.one_routed(before, routed(port)), owner)
        before = routed(port)
        self.assertEqual(cl.session_info(fork)["n_tokens"], cl.session_info(sid)["n_tokens"])
        after = routed(port)
        self.assertEqual(after[owner] - before[owner], 2)

    # ---- 3. the index is rebuilt from the stream after a restart --------------------
    def test_3_router_restart_rebuilds_index(self):
        cls = type(self)
        docs = self.documents(3, 6000)
        c = Http(self.router.http_port)
        homes = []
        since = stream_tail(self.redis)
        for d in docs:
            prompt = d + self.tokens(" What happened?", False)
            before = routed(self.router.http_port)
            self.complete(c, prompt)
            home = self.one_routed(before, routed(self.router.http_port))
            homes.append(home)
        c.close()
        # what the replicas published: their hello, and (their writer thread
        # is asynchronous: waited for) the pages of each document
        ops = [fields for _, fields in self.redis.xrange(PREFIX + "events")]
        self.assertEqual(sorted(o[b"r"].decode() for o in ops if o[b"op"] == b"hello"),
                         sorted(self.ids))
        for home in set(homes):
            pages = sum((len(d) - 1) // PAGE for d, h in zip(docs, homes) if h == home)
            wait_for("the pages of its documents announced",
                     lambda: len(stored_by(self.redis, home, since)) >= pages)
        self.router.stop_cleanly(self)
        cls.router = self.start_router()
        n_entries = self.redis.xlen(PREFIX + "events")
        wait_for("the stream read", lambda: metrics(self.router.http_port).get(
            "cairn_router_events_total", 0) >= n_entries)
        c = Http(self.router.http_port)
        self.addCleanup(c.close)
        question = self.tokens(" Who was there?", False)
        for d, home in zip(docs, homes):
            before = routed(self.router.http_port)
            u = self.complete(c, d + question)
            self.assertEqual(self.one_routed(before, routed(self.router.http_port)), home)
            self.assertGreaterEqual(u["prompt_tokens_details"]["cached_tokens"],
                                    (len(d) - 1) // PAGE * PAGE)

    # ---- 3b. Redis loses the stream (FLUSHALL): the index is rebuilt --------------------
    def test_3b_stream_reset(self):
        port = self.router.http_port
        before = metrics(port)
        self.assertGreater(before["cairn_router_index_entries"], 0)
        c = Http(port)
        self.addCleanup(c.close)
        doc = self.documents(1, 500)[0]
        self.assertTrue(self.redis.flushall())
        # a replica writes behind the flush at once: the new stream's ids are
        # above the router's again, and the reset must be noticed all the same
        self.complete(c, doc + self.tokens(" Again.", False))
        wait_for("the reset noticed", lambda: metrics(port).get(
            "cairn_router_stream_resets_total", 0) > before["cairn_router_stream_resets_total"])
        m = metrics(port)
        self.assertEqual(m["cairn_router_replicas_up"], 3)  # the replicas are still known
        # routing goes on, and the index is rebuilt from the new stream: it
        # holds what that stream says the replicas hold, and nothing from before
        self.complete(c, doc + self.tokens(" Again.", False))

        def index_is_the_stream():
            held = set()
            for rid in self.ids:
                held |= stored_by(self.redis, rid)
            return len(held) > 0 and metrics(port)["cairn_router_index_entries"] == len(held)
        wait_for("the index rebuilt from the new stream", index_is_the_stream)
        self.assertLess(metrics(port)["cairn_router_index_entries"],
                        before["cairn_router_index_entries"])

    # ---- 3c. a replica that hangs (SIGSTOP): its requests end with an error ----------
    def test_3c_hung_replica(self):
        port = self.router.http_port
        cl = cairn_client.Client("127.0.0.1", self.router.rpc_port, timeout=GUARD_S)
        self.addCleanup(cl.close)
        before = routed(port)
        sid = cl.session_open(text="Once upon a time there was a sleepy owl.")["session_id"]
        hung = self.one_routed(before, routed(port))
        # a session key whose first turn lands on the replica about to hang
        # (placement is per key; with 3 replicas 64 keys all missing it is
        # about (2/3)^64: a routing bug, not bad luck)
        key = None
        hc = Http(port)
        self.addCleanup(hc.close)
        for attempt in range(64):
            k = "owl-%d" % attempt
            before = routed(port)
            status, out = hc.json("POST", "/v1/completions",
                                  {"prompt": "An owl named %s slept" % k, "max_tokens": 2,
                                   "session_id": k})
            self.assertEqual(status, 200, out)
            if self.one_routed(before, routed(port)) == hung:
                key = k
                break
        self.assertIsNotNone(key, "no session key was placed on the replica %s" % hung)
        srv = self.replicas[self.ids.index(hung)]
        outcome = {}

        def http_stream():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=GUARD_S)
            body = {"prompt": "An owl named %s slept" % key, "max_tokens": 1500,
                    "ignore_eos": True, "stream": True, "session_id": key}
            conn.request("POST", "/v1/completions", json.dumps(body),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            first = r.fp.readline()
            outcome["http_started"] = first.startswith(b"data:")
            try:
                rest = r.read()
                outcome["http"] = b'"replica_failed"' in rest or b"[DONE]" not in rest
            except (http.client.HTTPException, OSError):
                outcome["http"] = True  # cut short: an incomplete answer
            conn.close()

        t = threading.Thread(target=http_stream, daemon=True)
        t.start()
        wait_for("the stream started", lambda: "http_started" in outcome)
        stream = cl.stream("session.generate", {"session_id": sid, "text": " The owl",
                                                "max_tokens": 1500, "ignore_eos": True,
                                                "stream": True})
        next(iter(stream))  # a first delta: it runs on the replica
        srv.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: srv.proc.poll() is None and srv.proc.send_signal(signal.SIGCONT))
        with self.assertRaises(cairn_client.client.InternalError):
            stream.wait()
        t.join(GUARD_S)
        self.assertFalse(t.is_alive(), "the HTTP stream hung")
        self.assertTrue(outcome["http"], outcome)
        self.assertEqual(metrics(port)["cairn_router_replicas_up"], 2)
        srv.proc.send_signal(signal.SIGCONT)
        wait_for("the replica back", lambda: metrics(port)["cairn_router_replicas_up"] == 3)

    # ---- 4. SIGKILL of a replica under load -----------------------------------------
    def test_4_sigkill_replica_under_load(self):
        port = self.router.http_port
        cl = cairn_client.Client("127.0.0.1", self.router.rpc_port, timeout=GUARD_S)
        self.addCleanup(cl.close)
        before = routed(port)
        sid = cl.session_open(text="Once upon a time there was a small boat.",
                              persist=True)["session_id"]
        victim = self.one_routed(before, routed(port))
        cl.session_generate(sid, text=" The boat", max_tokens=4, temperature=0)
        history = cl.session_info(sid)["n_tokens"]
        # an HTTP conversation on the victim too (a key whose first turn lands there)
        hc = Http(port)
        self.addCleanup(hc.close)
        key = None
        for attempt in range(64):  # as in test_3c: 64 misses would be a routing bug
            before = routed(port)
            k = "boat-%d" % attempt
            status, out = hc.json("POST", "/v1/completions",
                                  {"prompt": "A boat named %s sailed" % k, "max_tokens": 4,
                                   "temperature": 0, "session_id": k})
            self.assertEqual(status, 200, out)
            if self.one_routed(before, routed(port)) == victim:
                key = k
                break
        self.assertIsNotNone(key, "no session key was placed on the replica %s" % victim)
        docs = self.documents(6, 9000, words=60)
        moves = metrics(port)["cairn_router_session_moves_total"]
        results, lock = [], threading.Lock()
        stop = threading.Event()
        killed_at = []

        def load(i):
            c = Http(port)
            rnd = random.Random(i)
            while not stop.is_set():
                d = docs[rnd.randrange(len(docs))]
                t0 = time.time()
                try:
                    status, text = c.request("POST", "/v1/completions",
                                             {"prompt": d, "max_tokens": 24, "temperature": 0,
                                              "stream": rnd.random() < 0.5})
                    ok = status == 200 and b'"error"' not in text
                except (http.client.HTTPException, OSError):
                    ok = False
                with lock:
                    results.append((t0, time.time(), ok))
            c.close()

        threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(3)]
        for t in threads:
            t.start()
        wait_for("load running", lambda: len(results) >= 6)
        srv = self.replicas[self.ids.index(victim)]
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(GUARD_S)
        killed_at.append(time.time())
        wait_for("the router noticing", lambda: metrics(port).get("cairn_router_replicas_up") == 2)
        noticed = time.time()
        wait_for("load after the kill", lambda: sum(1 for r in results if r[0] > noticed) >= 9)
        stop.set()
        for t in threads:
            t.join(GUARD_S)
            self.assertFalse(t.is_alive(), "a request hung")
        failed = [r for r in results if not r[2]]
        # only requests running when it died may fail: at most one per client
        self.assertLessEqual(len(failed), len(threads), failed)
        for t0, t1, ok in failed:
            self.assertLessEqual(t0, killed_at[0])
        self.assertTrue(all(ok for t0, _, ok in results if t0 > noticed))
        # its sessions continue elsewhere
        status, out = hc.json("POST", "/v1/completions",
                              {"prompt": "A boat named %s sailed far away" % key,
                               "max_tokens": 4, "temperature": 0, "session_id": key})
        self.assertEqual(status, 200, out)
        # the persisted session: its record comes from the shared tier, so
        # it goes on with the same history on the replica it moved to
        self.assertEqual(cl.session_info(sid)["n_tokens"], history)
        g = cl.session_generate(sid, text=" It", max_tokens=4, temperature=0)
        self.assertGreater(g.usage.prompt_tokens, history)
        moved = metrics(port)["cairn_router_session_moves_total"] - moves
        self.assertGreaterEqual(moved, 2)
        # the client's connection to the router serves on
        self.assertTrue(cl.generate("Once upon a time", max_tokens=4, temperature=0).text)
        # the failed requests are off the books too
        m = metrics(port)
        for k, v in m.items():
            if k.split("{")[0] in ("cairn_router_inflight", "cairn_router_queued_prefill_tokens",
                                   "cairn_router_queued_decode_tokens"):
                self.assertEqual(v, 0, k)
        self.router.stop_cleanly(self)


class TenantRouterTest(harness.TestCase):
    """With --tenants the router hashes a request's prompt under its tenant's
    seed, as the replicas do (their events find the same hashes): one
    tenant's document is never predicted cached for another. Replicas given
    with --replica, their events read too."""
    ALICE, BOB = "alice-token-5e0c1d2b3a49f8e7", "bob-token-96a8b7c6d5e4f3a2b1"

    @classmethod
    def setUpClass(cls):
        cls.scratch = cls.class_scratch("cairn-route-tenants-", graceful=False)
        tenants = cls.scratch.path("tenants")
        fd = os.open(tenants, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("alice %s\nbob %s\n" % (cls.ALICE, cls.BOB))
        cls.redis_port, cls.redis = start_redis(cls.scratch)
        url = "redis://127.0.0.1:%d" % cls.redis_port
        cls.replicas = [cls.scratch.start(CAIRN, ["-m", MODEL, "-c", "2048", "-t", "1",
                                                  "--tenants", tenants, "--shared-cache", url,
                                                  "--cache-dir", cls.scratch.path("c%d" % i)],
                                          http=True)
                        for i in range(2)]
        cls.router_args = ["-m", MODEL, "--http-port", "0", "--port", "0", "--tenants", tenants,
                           "--shared-cache", url, "--health-interval", "0.2"]
        for srv in cls.replicas:
            cls.router_args += ["--replica",
                                "http=127.0.0.1:%d,rpc=127.0.0.1:%d" % (srv.http_port, srv.port)]
        cls.start_router()

    @classmethod
    def start_router(cls):
        cls.router = Router(cls.router_args)
        cls.scratch.on_close(cls.router.stop)
        wait_for("2 replicas up",
                 lambda: metrics(cls.router.http_port).get("cairn_router_replicas_up") == 2)

    def post(self, token, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.router.http_port, timeout=GUARD_S)
        try:
            conn.request("POST", "/v1/completions", json.dumps(body),
                         {"Content-Type": "application/json",
                          "Authorization": "Bearer " + token})
            r = conn.getresponse()
            return r.status, json.loads(r.read())
        finally:
            conn.close()

    def predicted(self):
        return sum(v for k, v in metrics(self.router.http_port).items()
                   if k.startswith("cairn_router_cached_tokens_predicted_total{"))

    def test_tenants_do_not_share_predictions(self):
        ws = STORIES.split()
        doc = "A tale for one tenant. " + " ".join(ws[:150])
        status, out = self.post(self.ALICE, {"prompt": doc + " First.", "max_tokens": 2})
        self.assertEqual(status, 200, out)
        n_doc = out["usage"]["prompt_tokens"]
        p0 = self.predicted()
        status, out = self.post(self.ALICE, {"prompt": doc + " Second.", "max_tokens": 2})
        self.assertEqual(status, 200, out)
        self.assertGreater(out["usage"]["prompt_tokens_details"]["cached_tokens"], n_doc // 2)
        p1 = self.predicted()
        self.assertGreaterEqual(p1 - p0, (n_doc - PAGE) // PAGE * PAGE - PAGE)
        # bob's request for the same text: nothing predicted, nothing cached
        status, out = self.post(self.BOB, {"prompt": doc + " Third.", "max_tokens": 2})
        self.assertEqual(status, 200, out)
        self.assertEqual(self.predicted(), p1)
        self.assertLess(out["usage"]["prompt_tokens_details"]["cached_tokens"], PAGE)
        # msgpack: auth goes to one replica, and opens every later connection
        cl = cairn_client.Client("127.0.0.1", self.router.rpc_port, timeout=GUARD_S)
        self.addCleanup(cl.close)
        self.assertEqual(cl.auth(self.BOB), "bob")
        for i in range(4):  # cold prompts spread over both replicas
            self.assertTrue(cl.generate("Once upon a time %d" % i, max_tokens=2).tokens)
        before = self.predicted()
        g = cl.generate(doc + " Fourth.", max_tokens=2, temperature=0)
        self.assertGreater(self.predicted(), before)  # bob's own request above, predicted
        self.assertGreater(g.usage.cached_tokens, n_doc // 2)
        other = cairn_client.Client("127.0.0.1", self.router.rpc_port, timeout=GUARD_S)
        self.addCleanup(other.close)
        with self.assertRaises(cairn_client.client.Unauthorized):
            other.generate("no token", max_tokens=2)

    def test_z_stops_cleanly(self):
        self.router.stop_cleanly(self)

    def routed_to(self, token, prompt):
        before = routed(self.router.http_port)
        status, out = self.post(token, {"prompt": prompt, "max_tokens": 2})
        self.assertEqual(status, 200, out)
        after = routed(self.router.http_port)
        grew = [k for k in after if after[k] != before.get(k, 0)]
        self.assertEqual(len(grew), 1, (before, after))
        return grew[0], out["usage"]

    def test_events_carry_tenant_hashes(self):
        """After a restart the router knows only what the replicas published:
        alice's pages (hashed under alice's seed by the replica) are found
        for alice's next request, never for bob's."""
        ws = STORIES.split()
        doc = "Alice's own document. " + " ".join(ws[300:450])
        since = stream_tail(self.redis)
        home, usage = self.routed_to(self.ALICE, doc + " One.")
        n_doc = usage["prompt_tokens"]
        wait_for("alice's pages announced",
                 lambda: len(stored_by(self.redis, home, since)) >= (n_doc - 1) // PAGE)
        self.router.stop_cleanly(self)
        type(self).start_router()
        n = self.redis.xlen(PREFIX + "events")
        wait_for("the stream read", lambda: metrics(self.router.http_port).get(
            "cairn_router_events_total", 0) >= n)
        p0 = self.predicted()
        again, usage = self.routed_to(self.ALICE, doc + " Two.")
        self.assertEqual(again, home)
        self.assertGreaterEqual(self.predicted() - p0, (n_doc - PAGE) // PAGE * PAGE - PAGE)
        self.assertGreater(usage["prompt_tokens_details"]["cached_tokens"], n_doc // 2)
        p1 = self.predicted()
        self.routed_to(self.BOB, doc + " Three.")
        self.assertEqual(self.predicted(), p1)

    def test_deadlines(self):
        """Half a request is not held forever: HTTP answers 408 and closes, a
        msgpack connection with half a message is closed. On a router of its
        own with short deadlines: the class's router keeps the defaults (30 s,
        60 s), so that a loaded machine cannot make them fire on a whole
        request; here only half requests are sent, and a slow machine only
        makes the deadlines fire later."""
        router = Router(self.router_args + ["--http-timeout", "0.5", "--idle-timeout", "0.5"])
        self.addCleanup(router.stop)
        got, closed = harness.exchange(("127.0.0.1", router.http_port),
                                       b"POST /v1/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n{")
        self.assertTrue(closed)
        self.assertTrue(got.startswith(b"HTTP/1.1 408"), got)
        got, closed = harness.exchange(("127.0.0.1", router.rpc_port), b"\x94\x00\x01")
        self.assertTrue(closed)
        self.assertEqual(got, b"")


if __name__ == "__main__":
    harness.main()
