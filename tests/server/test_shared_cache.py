"""The shared cache tier (tier 3): a real Redis under each replica's LMDB.

Replicas here are real `cairn serve` processes with a cache directory of
their own each and `--shared-cache redis://...` to one real redis-server
(tests/support/redis_server.py) on loopback. What is checked:

  - a prefix that only replica A computed (and reused: "seen twice" puts
    it in Redis) is served to replica B from Redis: cached_tokens > 0,
    cached_tokens_by_tier["shared"], the same greedy tokens as a fresh
    server's; a prefix computed once by A and once by B (seen twice in the
    cluster) is shared by B and served to C;
  - the page a shared prefix ends inside (another question's page) is
    found in Redis by its parent: B computes nothing of the document; with
    --shared-write all a reply's partly filled last page is in Redis too:
    the next turn, on B, computes nothing of the history;
  - A's page events: a hello with its addresses, and stored events that
    name every page A put in Redis;
  - a damaged value in Redis is never used: it is deleted and the prefix
    recomputed, with the same output;
  - a Redis that answers nothing (SIGSTOP), that restarts (from its RDB,
    and empty), that is flushed, or that is absent when the replica
    starts: every request is still served, with the right tokens;
  - tenants never see each other's pages through Redis;
  - a persisted session whose replica was SIGKILLed continues on another
    replica with its whole history (its record comes from Redis).

Usage: test_shared_cache.py CAIRN_BIN MODEL
"""
import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, N_CTX, WORDS  # noqa: E402
from redis_server import RedisServer, free_port  # noqa: E402
import cairn_client  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)
harness.configure(CAIRN, MODEL)

P = 16  # the default page size


def doc(i, n=240):
    """A document of n words, different for every i."""
    start = (i * 97) % (len(WORDS) - n)
    return f"Document {i}: " + " ".join(WORDS[start:start + n])


def ref(prompt, n=8):
    return harness.Reference.client().generate(prompt, max_tokens=n, temperature=0).tokens


class SharedCase(harness.ServerCase):
    TMP_PREFIX = "cairn-shared-"

    def setUp(self):
        super().setUp()
        self.redis = RedisServer(self.tmp)
        self.on_cleanup(self.redis.stop)
        self.n_replicas = 0

    def replica(self, *extra, url=None, name=None):
        """A replica with a cache directory of its own on the test's Redis."""
        self.n_replicas += 1
        d = os.path.join(self.tmp, f"replica-{name or self.n_replicas}")
        return self.start("--cache-dir", d, "--shared-cache", url or self.redis.url, *extra,
                          http=True)

    def wait_written(self, c):
        """Until the replica's writer has handed everything to Redis."""
        harness.poll(lambda: c.cache_stats()["shared"],
                     lambda s: s["queued_bytes"] == 0 and s["writes"] >= s["pages_queued"])

    def page_keys(self):
        return sorted(self.redis.db.keys("cairn:p:*"))

    def compute_twice(self, c, prompt):
        """The prefix computed, then reused: that puts it in Redis."""
        first = c.generate(prompt, max_tokens=8, temperature=0)
        second = c.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(first.tokens, second.tokens)
        self.assertGreater(second.usage.cached_tokens, 0)
        self.wait_written(c)
        return first


class SharedTier(SharedCase):
    def test_replica_b_serves_what_only_a_computed(self):
        a, b = self.replica(), self.replica()
        ca, cb = self.client(a), self.client(b)
        prompt = doc(1)
        n = len(ca.tokenize(prompt, add_bos=True))
        ra = self.compute_twice(ca, prompt)
        self.assertEqual(ra.tokens, ref(prompt))
        self.assertGreaterEqual(len(self.page_keys()), (n - 1) // P)

        rb = cb.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(rb.tokens, ra.tokens)
        tiers = rb.usage.cached_tokens_by_tier
        self.assertEqual(sum(tiers.values()), rb.usage.cached_tokens)
        self.assertGreaterEqual(tiers["shared"], P * ((n - 1) // P), rb.raw["usage"])
        st = cb.cache_stats()["shared"]
        self.assertTrue(st["up"])
        self.assertGreaterEqual(st["hits"], (n - 1) // P)
        # B keeps what it got: the next request is served from B's own memory
        rb2 = cb.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(rb2.tokens, ra.tokens)
        self.assertEqual(rb2.usage.cached_tokens_by_tier["shared"], 0)
        self.assertGreater(rb2.usage.cached_tokens_by_tier["device"], 0)
        # a prompt seen once is not shared
        once = doc(2)
        ca.generate(once, max_tokens=4, temperature=0)
        self.wait_written(ca)
        r_once = cb.generate(once, max_tokens=4, temperature=0)
        self.assertEqual(r_once.usage.cached_tokens_by_tier["shared"], 0)

    def test_partial_page_by_parent(self):
        """B gets the whole pages A shared and, through the parent's list of
        children in Redis, the page that holds the document's last tokens
        (A's page of another question): nothing of the document is computed
        again, and the answer is a fresh server's."""
        a, b = self.replica(), self.replica()
        ca, cb = self.client(a), self.client(b)
        document = doc(6)
        q1, q2 = document + " Question one: why?", document + " Question two: how?"
        t1, t2 = ca.tokenize(q1, add_bos=True), ca.tokenize(q2, add_bos=True)
        n_common = next(i for i in range(min(len(t1), len(t2))) if t1[i] != t2[i])
        self.assertNotEqual(n_common % P, 0, "the document should end inside a page")
        self.compute_twice(ca, q1)
        self.assertTrue(self.redis.db.keys("cairn:c:*"), "no page was listed under its parent")
        rb = cb.generate(q2, max_tokens=8, temperature=0)
        self.assertEqual(rb.tokens, ref(q2))
        tiers = rb.usage.cached_tokens_by_tier
        self.assertEqual(sum(tiers.values()), rb.usage.cached_tokens)
        self.assertGreaterEqual(rb.usage.cached_tokens, n_common, rb.raw["usage"])
        self.assertEqual(tiers["shared"], rb.usage.cached_tokens, rb.raw["usage"])

    def test_conversation_moves_to_the_token(self):
        """With --shared-write all, a reply's partly filled last page goes to
        Redis as soon as it is kept: the next turn, resent whole to another
        replica, computes nothing of the history."""
        a, b = self.replica("--shared-write", "all"), self.replica("--shared-write", "all")
        ca, cb = self.client(a), self.client(b)
        first = doc(8, 200)
        r1 = ca.generate(first, max_tokens=13, temperature=0)
        self.wait_written(ca)
        second = first + r1.text + " Then what?"
        # what A holds: the prompt and the reply but its last token (never fed)
        held = ca.tokenize(first, add_bos=True) + r1.tokens[:-1]
        t2 = cb.tokenize(second, add_bos=True)
        common = 0
        while common < min(len(held), len(t2) - 1) and held[common] == t2[common]:
            common += 1
        self.assertNotEqual(common % P, 0, "the history should end inside a page")
        self.assertGreater(common, P * (len(held) // P), "... inside A's last, partly filled one")
        rb = cb.generate(second, max_tokens=8, temperature=0)
        self.assertEqual(rb.tokens, ref(second))
        self.assertEqual(rb.usage.cached_tokens, common, rb.raw["usage"])
        self.assertEqual(rb.usage.cached_tokens_by_tier["shared"], common, rb.raw["usage"])
        # a kept tail is no page anyone routes to: never in A's page events
        stored = set()
        for e in self.redis.db.xrange("cairn:events"):
            if e[1].get(b"op") == b"stored":
                h = e[1][b"h"]
                stored.update(h[i:i + 16].hex() for i in range(0, len(h), 16))
        for key in self.redis.db.keys("cairn:p:*"):
            value = self.redis.db.get(key)
            tokens = struct.unpack_from("<%di" % P, value, 48)
            if tokens[-1] < 0:
                self.assertNotIn(key.decode().rsplit(":", 1)[1], stored)

    def test_page_events(self):
        a = self.replica("--replica-id", "replica-a")
        ca = self.client(a)
        self.compute_twice(ca, doc(3))
        events = [e[1] for e in self.redis.db.xrange("cairn:events")]
        mine = [e for e in events if e[b"r"] == b"replica-a"]
        hello = [e for e in mine if e[b"op"] == b"hello"]
        self.assertEqual(len(hello), 1, events)
        self.assertEqual(hello[0][b"http"].decode(), f"{a.http_host}:{a.http_port}")
        self.assertEqual(hello[0][b"rpc"].decode(), f"{a.host}:{a.port}")
        self.assertEqual(hello[0][b"ps"], str(P).encode())
        ns = hello[0][b"ns"].decode()
        stored = set()
        for e in mine:
            if e[b"op"] == b"stored":
                self.assertEqual(e[b"ns"].decode(), ns)
                h = e[b"h"]
                self.assertEqual(len(h) % 16, 0)
                stored.update(h[i:i + 16].hex() for i in range(0, len(h), 16))
        keys = [k.decode() for k in self.page_keys()]
        self.assertTrue(keys)
        for k in keys:
            _, kind, kns, kh = k.split(":")
            self.assertEqual((kind, kns), ("p", ns))
            self.assertIn(kh, stored, "a page in Redis that no stored event named")
            # pages expire (volatile-lru evicts them first), records never
            self.assertGreater(self.redis.db.ttl(k), 24 * 3600)
        a.stop()
        last = [e[1] for e in self.redis.db.xrange("cairn:events")][-1]
        self.assertEqual((last[b"r"], last[b"op"]), (b"replica-a", b"bye"))

    def test_a_damaged_value_is_deleted_and_recomputed(self):
        a = self.replica()
        ca = self.client(a)
        prompt = doc(4)
        ra = self.compute_twice(ca, prompt)
        keys = self.page_keys()
        victim = keys[len(keys) // 2]
        good = self.redis.db.get(victim)
        value = bytearray(good)
        value[-1] ^= 0x40  # one bit of the KV payload: only the checksum can tell
        self.redis.db.set(victim, bytes(value))
        header = struct.unpack_from("<4sHH", value, 0)
        self.assertEqual(header, (b"CKVP", 1, 48))

        b = self.replica()
        cb = self.client(b)
        rb = cb.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(rb.tokens, ra.tokens)
        st = cb.cache_stats()["shared"]
        self.assertEqual(st["corrupt"], 1, st)
        # the pages before the damaged one still came from Redis
        self.assertGreater(rb.usage.cached_tokens_by_tier["shared"], 0)
        # the damaged value is gone: deleted, then (B computed the page, and
        # A had looked it up before: a prefix seen twice) written again as
        # it should be, byte for byte what A computed
        now = harness.poll(lambda: self.redis.db.get(victim), lambda v: v == good)
        self.assertEqual(now, good)


    def test_the_second_replica_to_compute_a_prefix_shares_it(self):
        """A computes a document once (not shared: seen once), B is asked
        for it too (its lookup finds A's marker: seen twice in the
        cluster) and shares what it computes; C then finds it in Redis."""
        a, b, c = self.replica(), self.replica(), self.replica()
        ca, cb, cc = self.client(a), self.client(b), self.client(c)
        prompt = doc(5)
        n = len(ca.tokenize(prompt, add_bos=True))
        ra = ca.generate(prompt, max_tokens=8, temperature=0)
        self.wait_written(ca)
        self.assertEqual(self.page_keys(), [])
        rb = cb.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(rb.tokens, ra.tokens)
        self.assertEqual(rb.usage.cached_tokens, 0)
        self.wait_written(cb)
        self.assertGreaterEqual(len(self.page_keys()), (n - 1) // P)
        rc = cc.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(rc.tokens, ra.tokens)
        self.assertGreaterEqual(rc.usage.cached_tokens_by_tier["shared"], P * ((n - 1) // P))


class SharedTierFailures(SharedCase):
    def check_serves(self, c, i):
        prompt = doc(i, 120)
        r = c.generate(prompt, max_tokens=6, temperature=0)
        self.assertEqual(r.tokens, ref(prompt, 6))
        return r

    def test_redis_that_answers_nothing(self):
        a = self.replica("--shared-timeout", "200")
        ca = self.client(a)
        self.compute_twice(ca, doc(10))
        with self.redis.paused():
            for i in range(11, 14):
                self.check_serves(ca, i)  # misses ask Redis, time out, serve anyway
            # a replica started while Redis is away starts, and serves
            b = self.replica("--shared-timeout", "200")
            cb = self.client(b)
            self.check_serves(cb, 14)
            self.assertFalse(cb.cache_stats()["shared"]["up"])
        self.assertGreaterEqual(ca.cache_stats()["shared"]["outages"], 1)
        # Redis answers again: the replicas reconnect after their back-off
        # (at most 30 s) and hand over what waited; a new replica finds the
        # pages A shared before the pause
        ca.generate(doc(10), max_tokens=2, temperature=0)  # reused again: queued again
        harness.poll(lambda: ca.cache_stats()["shared"], lambda st: st["up"], every=0.5)
        self.wait_written(ca)
        rc = self.client(self.replica()).generate(doc(10), max_tokens=8, temperature=0)
        self.assertEqual(rc.tokens, ref(doc(10)))
        self.assertGreater(rc.usage.cached_tokens_by_tier["shared"], 0)

    def test_redis_restart_flush_and_absence(self):
        a = self.replica()
        ca = self.client(a)
        prompt = doc(20)
        ra = self.compute_twice(ca, prompt)
        n_keys = len(self.page_keys())
        self.redis.restart(keep_data=True)  # its RDB brings the pages back
        self.assertEqual(len(self.page_keys()), n_keys)
        self.check_serves(ca, 21)
        b = self.replica()
        rb = self.client(b).generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(rb.tokens, ra.tokens)
        self.assertGreater(rb.usage.cached_tokens_by_tier["shared"], 0)

        self.redis.db.flushall()
        cc = self.client(self.replica())
        rc = cc.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(rc.tokens, ra.tokens)
        self.assertEqual(rc.usage.cached_tokens, 0)
        self.check_serves(ca, 22)

        self.redis.restart(keep_data=False)  # empty
        self.check_serves(ca, 23)
        self.check_serves(cc, 24)

        # no Redis at all at that address: the replica starts and serves
        dead = f"redis://127.0.0.1:{free_port()}"
        cd = self.client(self.replica(url=dead))
        self.check_serves(cd, 25)
        self.assertFalse(cd.cache_stats()["shared"]["up"])

    def test_bad_urls_are_refused_at_start(self):
        for url, why in (("http://127.0.0.1:6379", "redis://"), ("redis://:99999", "host"),
                         ("redis://127.0.0.1:99999", "port"), ("unix://", "socket path")):
            with self.subTest(url=url):
                with self.assertRaises(harness.ServerStartError) as cm:
                    self.replica(url=url)
                self.assertIn(why, str(cm.exception))
        with self.assertRaises(harness.ServerStartError) as cm:
            self.start("--shared-cache", self.redis.url)  # no --cache-dir
        self.assertIn("--cache-dir", str(cm.exception))


class SharedTenants(SharedCase):
    def test_tenants_never_see_each_other(self):
        tenants = os.path.join(self.tmp, "tenants")
        with open(tenants, "w") as f:
            f.write("alice aaaaaaaaaaaaaaaaaaaaaaaa\nbob bbbbbbbbbbbbbbbbbbbbbbbb\n")
        os.chmod(tenants, 0o600)
        a = self.replica("--tenants", tenants)
        b = self.replica("--tenants", tenants)
        alice_a = a.client(auth_token="aaaaaaaaaaaaaaaaaaaaaaaa")
        self.on_cleanup(alice_a.close)
        prompt = doc(30)
        ra = self.compute_twice(alice_a, prompt)
        bob_b = b.client(auth_token="bbbbbbbbbbbbbbbbbbbbbbbb")
        self.on_cleanup(bob_b.close)
        rb = bob_b.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(rb.tokens, ra.tokens)
        self.assertEqual(rb.usage.cached_tokens, 0, "bob was served alice's pages")
        alice_b = b.client(auth_token="aaaaaaaaaaaaaaaaaaaaaaaa")
        self.on_cleanup(alice_b.close)
        r = alice_b.generate(prompt, max_tokens=8, temperature=0)
        self.assertEqual(r.tokens, ra.tokens)
        self.assertGreater(r.usage.cached_tokens_by_tier["shared"], 0)


class SharedSessions(SharedCase):
    def test_a_persisted_session_moves_when_its_replica_dies(self):
        a, b = self.replica(), self.replica()
        ca, cb = self.client(a), self.client(b)
        first = doc(40, 150)
        sid = ca.session_open(text=first, persist=True)["session_id"]
        r1 = ca.session_generate(sid, max_tokens=10, temperature=0)
        r2 = ca.session_generate(sid, text=" Then the", max_tokens=10, temperature=0)
        hist = (harness.Reference.tok(first, True) + r1.tokens +
                harness.Reference.tok(" Then the", False) + r2.tokens)
        self.assertEqual(ca.session_info(sid)["n_tokens"], len(hist))
        self.wait_written(ca)
        records = self.redis.db.keys("cairn:r:*")
        self.assertEqual(len(records), 1)
        self.assertEqual(self.redis.db.ttl(records[0]), -1)  # no expiry
        # an unknown id is still unknown everywhere
        with self.assertRaises(cairn_client.NotFound):
            cb.session_info("0123456789abcdef0123456789abcdef")
        a.kill()
        self.assertEqual(cb.session_info(sid)["n_tokens"], len(hist))
        r3 = cb.session_generate(sid, max_tokens=10, temperature=0)
        self.assertEqual(r3.tokens, harness.Reference.cont(hist, 10))
        self.assertGreater(r3.usage.cached_tokens_by_tier["shared"], 0, r3.raw["usage"])
        # closing it on B removes its record from Redis too
        self.assertTrue(cb.session_close(sid))
        c = self.client(self.replica())
        with self.assertRaises(cairn_client.NotFound):
            c.session_info(sid)


if __name__ == "__main__":
    harness.main()
