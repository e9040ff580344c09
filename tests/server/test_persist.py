#!/usr/bin/env python3
"""Integration tests of the persistent prefix cache: `cairn serve` with the
host-RAM and LMDB tiers (`--host-mem`, `--cache-dir`), restarts (SIGTERM and
SIGKILL), persisted sessions and the page namespace. Written against
docs/protocol.md and the contract of the tiered store (store/store.h,
session/session.h).

usage: test_persist.py CAIRN_BIN MODEL [unittest args...]

Every server listens on `--port 0` with its own temporary `--cache-dir`,
and every server a test starts is killed when the test ends, whatever
happened. Everything is greedy (temperature 0), so outputs are exact. The
expected output is always what a fresh server without any cache directory
(the "reference", started once for the module) generates for the same token
history, as a stateless `generate` over the tokens: a cache, a restart or a
tier must never change an output. There are no timing thresholds; waits
only guard against hangs.

Expectations about `cached_tokens` (see tests/server/test_server.py): in
memory the cache reuses KV to the token; what comes back from disk after a
restart is whole pages of page_size P tokens (LMDB is keyed by the chained
hash of whole pages; a partial last page is not stored). After a turn over a
history of h tokens, the KV of at least the first h-1 tokens exists, so the
next request after a restart starting with the history finds
P*floor((h-1)/P) .. P*floor(h/P) tokens.
`usage.cached_tokens_by_tier` says where: {device, host, disk, shared}, summing to
cached_tokens. Right after a restart the in-memory tree is empty, so what a
first request finds comes from disk (matched by page hash).

The cost model of the store may skip a load that it expects to be slower
than recomputing. It starts from priors under which a hit is worth loading
(store/store.h), so the first request after a restart loads; host-RAM
uploads are always far cheaper than recomputing a page. The checks below
rely on exactly that and on nothing about speed.
"""
import os
import shutil
import struct
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, N_CTX, STOP_GUARD_S, WORDS  # noqa: E402
import cairn_client  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)
harness.configure(CAIRN, MODEL)

TIERS = ("device", "host", "disk")
# where usage says cached tokens came from: the tiers, and the shared tier
# (Redis, docs/scale-out.md: always 0 here, without one)
USAGE_TIERS = TIERS + ("shared",)

# The reference server (harness.Reference: no cache dir, no tiers, -c N_CTX):
# its client, tokenize, and the greedy tokens it generates after a history.
ref = harness.Reference.client
tok = harness.Reference.tok
ref_continue = harness.Reference.cont


# --------------------------------------------------------------------------
# GGUF: just enough to find a tensor's bytes, to make "a different model file"
# --------------------------------------------------------------------------
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}


def gguf_tensor_span(data, name):
    """(offset, n_elements, ggml type) of tensor `name` in a GGUF file."""
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return v

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos].decode("utf-8", "replace")

    def value(t):
        if t in _GGUF_SCALARS:
            return take(_GGUF_SCALARS[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"GGUF value type {t}")

    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    pos = 4
    take("I")  # version
    n_tensors, n_kv = take("Q"), take("Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("I"))
    infos = {}
    for _ in range(n_tensors):
        tname = string()
        dims = [take("Q") for _ in range(take("I"))]
        ttype, off = take("I"), take("Q")
        count = 1
        for d in dims:
            count *= d
        infos[tname] = (off, count, ttype)
    align = int(kv.get("general.alignment", 32))
    base = (pos + align - 1) // align * align
    off, count, ttype = infos[name]
    return base + off, count, ttype


def write_perturbed_model(src, dst, tensor="blk.0.attn_k.weight", scale=1.5):
    """Copy `src` to `dst` with one F32 tensor scaled: same file name and
    shape, other weights, so other keys and other KV for every token."""
    with open(src, "rb") as f:
        data = bytearray(f.read())
    off, count, ttype = gguf_tensor_span(bytes(data), tensor)
    if ttype != 0:
        raise unittest.SkipTest(f"{tensor} is not F32 in this model")
    vals = struct.unpack_from(f"<{count}f", data, off)
    struct.pack_into(f"<{count}f", data, off, *[v * scale for v in vals])
    with open(dst + ".tmp", "wb") as f:
        f.write(data)
    os.replace(dst + ".tmp", dst)


def write_model_with_other_vocabulary(src, dst):
    """Copy `src` to `dst` with the text of its last token changed (same
    length, weights untouched): a model whose token ids mean something else,
    as another model's would."""
    with open(src, "rb") as f:
        data = bytearray(f.read())
    key = b"tokenizer.ggml.tokens"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    vtype, etype, n = struct.unpack_from("<IIQ", data, at)
    if (vtype, etype) != (9, 8):
        raise ValueError("tokenizer.ggml.tokens is not an array of strings")
    pos = at + 16
    for _ in range(n - 1):
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]
    length = struct.unpack_from("<Q", data, pos)[0]
    data[pos + 8:pos + 8 + length] = b"~" * length
    with open(dst + ".tmp", "wb") as f:
        f.write(data)
    os.replace(dst + ".tmp", dst)


# --------------------------------------------------------------------------
class PersistCase(harness.ServerCase):
    """Per test: a temporary directory (cache dirs, model copies) and the
    servers and clients started, all killed and closed at the end."""
    TMP_PREFIX = "cairn-persist-"

    def setUp(self):
        super().setUp()
        self.cache_dir = os.path.join(self.tmp, "cache")
        self.P = int(ref().info()["page_size"])

    def start(self, *extra, model=None, cache_dir=True):
        """A server over the model (and this test's cache dir)."""
        return super().start(*(["--cache-dir", self.cache_dir] if cache_dir else []), *extra,
                             model=model)

    def graceful_restart(self, srv, args=None):
        """SIGTERM (must exit 0 after writing back), then start again."""
        new = self.track(srv.restart(args=args, timeout=STOP_GUARD_S))
        self.assertEqual(srv.returncode, 0,
                         "SIGTERM did not end the server with status 0:\n" + srv.log())
        return new

    def crash_restart(self, srv):
        """SIGKILL (nothing written back), then start again."""
        new = self.track(srv.restart(kill=True))
        self.assertEqual(srv.returncode, -9)
        return new

    # -- checks ------------------------------------------------------------
    def check_usage(self, r):
        """The fields every generation result has with tiers on."""
        u = r.usage
        self.assertEqual(sorted(u.cached_tokens_by_tier), sorted(USAGE_TIERS),
                         f"usage.cached_tokens_by_tier missing or incomplete: {r.raw.get('usage')}")
        for t in USAGE_TIERS:
            self.assertGreaterEqual(u.cached_tokens_by_tier[t], 0)
        self.assertEqual(sum(u.cached_tokens_by_tier.values()), u.cached_tokens, r.raw["usage"])
        self.assertLess(u.cached_tokens, u.prompt_tokens)
        return u.cached_tokens_by_tier

    def assertCachedAfterHistory(self, cached, h, what=""):
        P = self.P
        self.assertGreaterEqual(cached, P * ((h - 1) // P), f"{what}: history {h}, page {P}")
        # more when the partial last page is still in tier 0 (a tail)
        self.assertLessEqual(cached, h, f"{what}: history {h}, page {P}")

    def tier_stats(self, c):
        s = c.cache_stats()
        self.assertIn("tiers", s, "cache.stats has no 'tiers'")
        for t in TIERS:
            self.assertIn(t, s["tiers"])
            for k in ("pages", "bytes", "hit_tokens", "miss_tokens", "evicted_pages",
                      "promoted_pages", "load_ops", "store_ops", "load_mean_ms", "store_mean_ms"):
                self.assertIn(k, s["tiers"][t], f"cache.stats tiers.{t}.{k}")
        return s["tiers"]


def doc_prompt(max_tokens):
    """The longest whole-word prefix of the stories with at most max_tokens
    tokens (BOS included)."""
    lo, hi = 1, len(WORDS)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok(" ".join(WORDS[:mid]), True)) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(WORDS[:lo])


# --------------------------------------------------------------------------
class GracefulRestart(PersistCase):
    def test_prefix_served_from_disk_after_sigterm(self):
        prompt = doc_prompt(1200)
        n_prompt = len(tok(prompt, True))
        self.assertGreaterEqual(n_prompt, 1000)
        n_gen = 24
        expected = ref_continue(tok(prompt, True), n_gen)

        srv = self.start()
        c = self.client(srv)
        r1 = c.generate(prompt=prompt, max_tokens=n_gen, temperature=0)
        self.check_usage(r1)
        self.assertEqual(r1.usage.prompt_tokens, n_prompt)
        self.assertEqual(r1.usage.cached_tokens, 0)  # a new cache dir holds nothing
        self.assertEqual(r1.tokens, expected)

        srv = self.graceful_restart(srv)
        c = self.client(srv)
        tiers = self.tier_stats(c)
        # the write-back put the prompt's pages on disk; the tree starts empty
        self.assertGreaterEqual(tiers["disk"]["pages"], n_prompt // self.P)
        self.assertEqual(tiers["device"]["pages"], 0)
        self.assertEqual(tiers["host"]["pages"], 0)

        r2 = c.generate(prompt=prompt, max_tokens=n_gen, temperature=0)
        by_tier = self.check_usage(r2)
        self.assertEqual(r2.usage.prompt_tokens, n_prompt)
        self.assertGreaterEqual(r2.usage.cached_tokens, 0.8 * n_prompt, r2.raw["usage"])
        self.assertGreater(by_tier["disk"], 0, r2.raw["usage"])
        # nothing was in memory: every cached token came from disk
        self.assertEqual(by_tier["disk"], r2.usage.cached_tokens, r2.raw["usage"])
        self.assertEqual(r2.tokens, r1.tokens)
        self.assertEqual(r2.text, r1.text)

        tiers = self.tier_stats(c)
        self.assertGreaterEqual(tiers["disk"]["hit_tokens"], by_tier["disk"])
        self.assertGreaterEqual(tiers["disk"]["load_ops"], 1)
        self.assertGreaterEqual(tiers["disk"]["promoted_pages"], by_tier["disk"] // self.P)

        # the loaded pages joined the tree: the next request finds them in memory
        r3 = c.generate(prompt=prompt, max_tokens=n_gen, temperature=0)
        by_tier3 = self.check_usage(r3)
        self.assertGreaterEqual(r3.usage.cached_tokens, r2.usage.cached_tokens)
        self.assertEqual(by_tier3["disk"], 0, r3.raw["usage"])
        self.assertEqual(r3.tokens, r1.tokens)

        # a different question over the same document after another restart:
        # the shared whole pages come from disk, and the page the shared
        # part ends inside (r1's, found by the page before it): to the token
        srv = self.graceful_restart(srv)
        c = self.client(srv)
        q = prompt + "\nQuestion: who was happy?"
        tq = tok(q, True)
        stored = tok(prompt, True) + r1.tokens
        common = 0
        while common < min(len(tq) - 1, len(stored)) and tq[common] == stored[common]:
            common += 1
        self.assertGreater(common, n_prompt - self.P)
        r4 = c.generate(prompt=q, max_tokens=n_gen, temperature=0)
        by_tier4 = self.check_usage(r4)
        self.assertEqual(r4.usage.cached_tokens, common, r4.raw["usage"])
        self.assertEqual(by_tier4["disk"], r4.usage.cached_tokens, r4.raw["usage"])
        self.assertEqual(r4.tokens, ref_continue(tq, n_gen))
        self.assertEqual(srv.stop(STOP_GUARD_S), 0, srv.log())


# --------------------------------------------------------------------------
class PersistedSessions(PersistCase):
    FIRST = "Once upon a time, there was a girl named Mia. Mia had a little cat. " + \
        " ".join(WORDS[40:120])
    SECOND = " Then Mia said"

    def test_persisted_sessions_survive_sigkill(self):
        P = self.P
        srv = self.start()
        c = self.client(srv)

        # A: a turn generated (its pages computed)
        a = c.session_open(text=self.FIRST, persist=True)
        sid_a = a["session_id"]
        ra = c.session_generate(sid_a, max_tokens=20, temperature=0)
        self.check_usage(ra)
        hist_a = tok(self.FIRST, True) + ra.tokens
        self.assertEqual(a["n_tokens"] + len(ra.tokens), len(hist_a))
        self.assertEqual(c.session_info(sid_a)["n_tokens"], len(hist_a))
        self.assertGreater(len(hist_a), 4 * P)
        # B: only appended to (no KV computed for the appended part)
        first_b = " ".join(WORDS[200:260])
        sid_b = c.session_open(text=first_b, persist=True)["session_id"]
        more_b = " The dog ran to the park."
        n_b = c.session_append(sid_b, text=more_b)["n_tokens"]
        hist_b = tok(first_b, True) + tok(more_b, False)
        self.assertEqual(n_b, len(hist_b))
        # C: a turn, then truncated
        first_c = " ".join(WORDS[300:360])
        sid_c = c.session_open(text=first_c, persist=True)["session_id"]
        rc_ = c.session_generate(sid_c, max_tokens=24, temperature=0)
        hist_c = tok(first_c, True) + rc_.tokens
        keep_c = len(hist_c) - 19
        self.assertEqual(c.session_truncate(sid_c, keep_c), keep_c)
        hist_c = hist_c[:keep_c]
        # D: opened, then closed
        sid_d = c.session_open(text="Tom had a red ball.", persist=True)["session_id"]
        self.assertTrue(c.session_close(sid_d))

        srv = self.crash_restart(srv)  # SIGKILL right after the last reply
        c = self.client(srv)
        self.assertEqual(c.session_info(sid_a)["n_tokens"], len(hist_a))
        self.assertEqual(c.session_info(sid_b)["n_tokens"], len(hist_b))
        self.assertEqual(c.session_info(sid_c)["n_tokens"], len(hist_c))
        with self.assertRaises(cairn_client.NotFound):
            c.session_info(sid_d)

        # A continues exactly as a fresh server given its history, and its
        # history's pages come from disk (they were durable before the reply)
        t2 = tok(self.SECOND, False)
        r2 = c.session_generate(sid_a, text=self.SECOND, max_tokens=20, temperature=0)
        by_tier = self.check_usage(r2)
        self.assertEqual(r2.usage.prompt_tokens, len(hist_a) + len(t2))
        self.assertEqual(r2.tokens, ref_continue(hist_a + t2, 20))
        self.assertCachedAfterHistory(r2.usage.cached_tokens, len(hist_a), "session A")
        # to the token: the reply's partly filled last page was persisted
        # with the session (the history's last token was sampled, not fed)
        self.assertEqual(r2.usage.cached_tokens, len(hist_a) - 1, r2.raw["usage"])
        self.assertEqual(by_tier["disk"], r2.usage.cached_tokens, r2.raw["usage"])
        hist_a += t2 + r2.tokens
        self.assertEqual(c.session_info(sid_a)["n_tokens"], len(hist_a))

        rb = c.session_generate(sid_b, max_tokens=16, temperature=0)
        self.check_usage(rb)
        self.assertEqual(rb.tokens, ref_continue(hist_b, 16))
        hist_b += rb.tokens
        rc2 = c.session_generate(sid_c, max_tokens=16, temperature=0)
        self.check_usage(rc2)
        self.assertEqual(rc2.tokens, ref_continue(hist_c, 16))
        hist_c += rc2.tokens

        # the sessions are still persisted after coming back: crash again
        srv = self.crash_restart(srv)
        c = self.client(srv)
        for sid, hist in ((sid_a, hist_a), (sid_b, hist_b), (sid_c, hist_c)):
            self.assertEqual(c.session_info(sid)["n_tokens"], len(hist))
        r3 = c.session_generate(sid_a, max_tokens=12, temperature=0)
        self.check_usage(r3)
        self.assertEqual(r3.tokens, ref_continue(hist_a, 12))
        self.assertCachedAfterHistory(r3.usage.cached_tokens, len(hist_a), "session A, 2nd crash")
        hist_a += r3.tokens

        # a graceful restart keeps them too, and they stay persisted after it
        srv = self.graceful_restart(srv)
        srv = self.crash_restart(srv)
        c = self.client(srv)
        for sid, hist in ((sid_a, hist_a), (sid_b, hist_b), (sid_c, hist_c)):
            self.assertEqual(c.session_info(sid)["n_tokens"], len(hist))

    def test_open_chat_turn_survives_sigkill(self):
        """A reply's turn is left open (its end-of-generation token is not
        kept); the next messages close it first. That state is part of the
        durable record: after a crash the conversation continues exactly as
        it would have without one."""
        srv = self.start()
        c = self.client(srv)
        msgs = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "Tell me about a cat."}]
        sid = c.session_open(messages=msgs, persist=True)["session_id"]
        c.session_generate(sid, messages=[], max_tokens=12, temperature=0)
        more = [{"role": "user", "content": "And then?"}]
        # what the next turn gives on this server (on a fork: the session
        # itself stays as it is)
        twin = c.session_fork(sid)
        want = c.session_generate(twin, messages=more, max_tokens=12, temperature=0)
        srv = self.crash_restart(srv)
        c = self.client(srv)
        got = c.session_generate(sid, messages=more, max_tokens=12, temperature=0)
        self.assertEqual(got.usage.prompt_tokens, want.usage.prompt_tokens)
        self.assertEqual(got.tokens, want.tokens)

    def test_persist_without_a_cache_dir_is_unsupported(self):
        # docs/protocol.md: persist: true needs serve --cache-dir, else
        # `unsupported` (accepting it would lose the session on a restart
        # the client was promised it survives); the server keeps serving
        srv = self.start(cache_dir=False)
        c = self.client(srv)
        with self.assertRaises(cairn_client.CairnError) as ctx:
            c.session_open(text="Sam had a red ball.", persist=True)
        self.assertEqual(ctx.exception.type, "unsupported")
        self.assertEqual(c.info()["page_size"], self.P)
        sid = c.session_open(text="Sam had a red ball.")["session_id"]
        self.assertEqual(c.session_info(sid)["n_tokens"], len(tok("Sam had a red ball.", True)))


# --------------------------------------------------------------------------
class ManySessionsSmallKV(PersistCase):
    """Tier 0 sized for a few sessions, two dozen sessions with a turn each;
    then every session takes a second turn."""
    N_SESSIONS = 24
    KV_PAGES = 16

    def page_bytes(self):
        # learnt from the reference (bytes / pages of its device tier once it
        # holds something); the test checks below that the pool came out small
        ref_continue(tok("Sue had a kite.", True), 40)
        rt = ref().cache_stats().get("tiers", {}).get("device", {})
        return rt["bytes"] // rt["pages"] if rt.get("pages") else 10240

    def run_sessions(self, *extra, threads=1):
        P = self.P
        srv = self.start("--kv-mem", str(self.KV_PAGES * self.page_bytes()), *extra)
        c = self.client(srv)
        total = c.cache_stats()["device_pages_total"]
        self.assertTrue(4 <= total <= 32, f"device pages {total}: the test wants a small tier 0")

        sessions = []
        for i in range(self.N_SESSIONS):
            # different from the first token on, so no two share a page
            text = f"{['Max', 'Sue', 'Lily', 'Tom', 'Ben', 'Mia'][i % 6]} " + \
                " ".join(WORDS[i * 23:i * 23 + 24])
            sid = c.session_open(text=text)["session_id"]
            r = c.session_generate(sid, max_tokens=16, temperature=0)
            self.check_usage(r)
            hist = tok(text, True) + r.tokens
            self.assertEqual(c.session_info(sid)["n_tokens"], len(hist))
            sessions.append((sid, hist))
        self.assertGreater(sum(len(h) for _, h in sessions) // P, 2 * total)

        turn = " Then they"
        t2 = tok(turn, False)
        # second turns: one after another, or from `threads` connections at
        # once (then tier 0 cannot hold them all: requests wait or are paused
        # and resumed, which must not change a result)
        seconds = [None] * len(sessions)
        if threads == 1:
            for i, (sid, _) in enumerate(sessions):
                seconds[i] = c.session_generate(sid, text=turn, max_tokens=8, temperature=0)
        else:
            conns = [self.client(srv) for _ in range(threads)]

            def worker(k):
                for i in range(k, len(sessions), threads):
                    try:
                        seconds[i] = conns[k].session_generate(sessions[i][0], text=turn,
                                                               max_tokens=8, temperature=0)
                    except Exception as e:  # reported per session below
                        seconds[i] = e

            pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        results = []
        for i, (sid, hist) in enumerate(sessions):
            with self.subTest(session=i):
                r = seconds[i]
                if isinstance(r, Exception):
                    raise r
                by_tier = self.check_usage(r)
                self.assertEqual(r.tokens, ref_continue(hist + t2, 8))
                self.assertEqual(c.session_info(sid)["n_tokens"], len(hist) + len(t2) + 8)
                results.append((len(hist), r, by_tier))
        tiers = self.tier_stats(c)
        self.assertGreater(tiers["device"]["evicted_pages"], 0)
        self.assertLessEqual(tiers["device"]["pages"], total)
        return results, tiers

    def test_history_served_from_host_ram(self):
        # the host tier (256M by default with --cache-dir) holds every page
        # evicted from tier 0; an upload is always cheaper than recomputing
        results, tiers = self.run_sessions()
        for i, (h, r, by_tier) in enumerate(results):
            with self.subTest(session=i):
                self.assertCachedAfterHistory(r.usage.cached_tokens, h, f"session {i}")
                self.assertGreater(by_tier["host"] + by_tier["disk"], 0, r.raw["usage"])
        self.assertGreater(tiers["host"]["promoted_pages"] + tiers["disk"]["promoted_pages"], 0)
        self.assertGreater(tiers["host"]["hit_tokens"] + tiers["disk"]["hit_tokens"], 0)

    def test_history_through_a_tiny_host_tier(self):
        # a host tier as small as tier 0: pages go on down to LMDB
        # (write-back at eviction). Whether a disk page is loaded or
        # recomputed is the cost model's call, which depends on measured
        # speeds, so only correctness and where pages went are checked here.
        results, tiers = self.run_sessions("--host-mem", str(self.KV_PAGES * self.page_bytes()))
        self.assertGreater(tiers["host"]["evicted_pages"], 0)
        self.assertGreater(tiers["disk"]["store_ops"], 0)
        self.assertGreater(tiers["disk"]["pages"], 0)
        for i, (h, r, _) in enumerate(results):
            with self.subTest(session=i):
                self.assertLessEqual(r.usage.cached_tokens, self.P * (h // self.P))


    def test_concurrent_turns_through_a_tiny_host_tier(self):
        results, tiers = self.run_sessions("--host-mem", str(self.KV_PAGES * self.page_bytes()),
                                           threads=6)
        self.assertGreater(tiers["disk"]["store_ops"], 0)

    def test_disk_max_bounds_the_disk_tier(self):
        # a disk tier too small for all the pages: LMDB's own LRU drops the
        # oldest, nothing fails, outputs stay right, the files stay in bounds
        disk_max = 512 * 1024
        results, tiers = self.run_sessions("--host-mem", str(self.KV_PAGES * self.page_bytes()),
                                           "--disk-max", "512K")
        self.assertGreater(tiers["disk"]["evicted_pages"], 0)
        self.assertLessEqual(tiers["disk"]["bytes"], disk_max)
        data_bytes = sum(os.path.getsize(os.path.join(d, f))
                         for d, _, files in os.walk(self.cache_dir) for f in files
                         if "lock" not in f)
        self.assertLessEqual(data_bytes, disk_max)


# --------------------------------------------------------------------------
class GracefulRestartSessions(PersistCase):
    def test_unpersisted_sessions_survive_sigterm(self):
        P = self.P
        # Four sessions come back one after another: by the second, the
        # engine has measured its prefill rate, and on this tiny model the
        # cost model may rightly find a disk round slower than recomputing
        # (seen in CI: the fork found 124 of 128). What is checked here is
        # what the disk holds, so loads are pinned on.
        srv = self.start("--tier-loads", "always")
        c = self.client(srv)
        live = {}  # name -> (session_id, history tokens, tokens whose KV was computed)

        msgs = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "Tell me about a cat named " + " ".join(WORDS[:30])}]
        a = c.session_open(messages=msgs)["session_id"]
        ra = c.session_generate(a, max_tokens=20, temperature=0)
        rendered = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in msgs)
        hist_a = tok(rendered, True) + ra.tokens
        live["a"] = (a, hist_a, len(hist_a))

        first_b = " ".join(WORDS[500:560])
        b = c.session_open(text=first_b)["session_id"]
        rb = c.session_generate(b, max_tokens=16, temperature=0)
        computed_b = len(tok(first_b, True)) + len(rb.tokens)
        c.session_append(b, text=" The end.")
        hist_b = tok(first_b, True) + rb.tokens + tok(" The end.", False)
        live["b"] = (b, hist_b, computed_b)

        f = c.session_fork(a)  # the fork takes a turn of its own
        rf = c.session_generate(f, text=" And the cat", max_tokens=12, temperature=0)
        hist_f = hist_a + tok(" And the cat", False) + rf.tokens
        live["fork"] = (f, hist_f, len(hist_f))

        first_d = " ".join(WORDS[700:760])
        d = c.session_open(text=first_d)["session_id"]
        rd = c.session_generate(d, max_tokens=20, temperature=0)
        hist_d = (tok(first_d, True) + rd.tokens)[:-25]
        self.assertEqual(c.session_truncate(d, len(hist_d)), len(hist_d))
        live["truncated"] = (d, hist_d, len(hist_d))

        e = c.session_open(text="Ben saw a bird.")["session_id"]
        self.assertTrue(c.session_close(e))

        srv = self.graceful_restart(srv)
        c = self.client(srv)
        with self.assertRaises(cairn_client.NotFound):
            c.session_info(e)
        for name, (sid, hist, _) in live.items():
            with self.subTest(session=name):
                self.assertEqual(c.session_info(sid)["n_tokens"], len(hist))
        # "a" runs first: nothing is in memory yet, its history comes from disk
        for name in ("a", "b", "fork", "truncated"):
            sid, hist, computed = live[name]
            with self.subTest(session=name):
                r = c.session_generate(sid, max_tokens=12, temperature=0)
                by_tier = self.check_usage(r)
                self.assertEqual(r.tokens, ref_continue(hist, 12))
                self.assertGreaterEqual(r.usage.cached_tokens, P * ((computed - 1) // P))
                if name == "a":
                    self.assertGreater(by_tier["disk"], 0, r.raw["usage"])
                self.assertEqual(c.session_info(sid)["n_tokens"], len(hist) + 12)

        # a crash now: an unpersisted session may be lost, but never comes
        # back with an older history than the one its last reply reported
        srv = self.crash_restart(srv)
        c = self.client(srv)
        for name, (sid, hist, _) in live.items():
            with self.subTest(session=name, after="SIGKILL"):
                try:
                    n = c.session_info(sid)["n_tokens"]
                except cairn_client.NotFound:
                    continue
                self.assertEqual(n, len(hist) + 12)


# --------------------------------------------------------------------------
class NamespaceChange(PersistCase):
    """Another page size, KV dtype or model file over the same cache dir
    never reads the old entries."""

    def fresh_output(self, prompt, n, *extra, model=None):
        srv = self.start(*extra, model=model, cache_dir=False)
        with srv.client(timeout=HANG_GUARD_S) as c:
            out = c.generate(prompt=prompt, max_tokens=n, temperature=0).tokens
        srv.kill()
        return out

    def test_other_page_size_kv_type_or_model_reads_nothing(self):
        model = os.path.join(self.tmp, "model.gguf")
        shutil.copyfile(MODEL, model)
        prompt = doc_prompt(400)
        n_prompt = len(tok(prompt, True))
        n = 16
        base = ["-m", model, "-c", str(N_CTX), "--cache-dir", self.cache_dir]

        srv = self.start(model=model)
        c = self.client(srv)
        r0 = c.generate(prompt=prompt, max_tokens=n, temperature=0)
        self.assertEqual(r0.tokens, ref_continue(tok(prompt, True), n))

        for extra in (["--page-size", str(2 * self.P)], ["--kv-type", "f32"]):
            with self.subTest(changed=extra):
                srv = self.graceful_restart(srv, args=base + extra)
                c = self.client(srv)
                r = c.generate(prompt=prompt, max_tokens=n, temperature=0)
                self.assertEqual(r.usage.cached_tokens, 0, r.raw["usage"])
                self.assertEqual(r.usage.cached_tokens_by_tier,
                                 {t: 0 for t in USAGE_TIERS}, r.raw["usage"])
                self.assertEqual(r.tokens, self.fresh_output(prompt, n, *extra, model=model))

        # the old entries were only out of sight: the original settings find them
        srv = self.graceful_restart(srv, args=base)
        c = self.client(srv)
        r = c.generate(prompt=prompt, max_tokens=n, temperature=0)
        by_tier = self.check_usage(r)
        self.assertGreaterEqual(by_tier["disk"], 0.8 * n_prompt, r.raw["usage"])
        self.assertEqual(r.tokens, r0.tokens)

        # the same file name with other weights
        self.assertEqual(srv.stop(STOP_GUARD_S), 0, srv.log())
        write_perturbed_model(MODEL, model)
        changed = self.fresh_output(prompt, n, model=model)
        srv = self.start(model=model)
        c = self.client(srv)
        r = c.generate(prompt=prompt, max_tokens=n, temperature=0)
        self.assertEqual(r.usage.cached_tokens, 0, r.raw["usage"])
        self.assertEqual(r.tokens, changed)
        # (the change matters: reusing the old KV would have been wrong)
        self.assertNotEqual(changed, r0.tokens)


class RecordsOfAnotherConfiguration(PersistCase):
    """A persisted session is the user's conversation: a server started once
    with a smaller context or another model must keep its record (skipping
    it, with a warning) and the session comes back, whole, when the server
    is started as it was. Only a damaged record is ever dropped."""

    def sessions(self, c, sids):
        found = {}
        for sid in sids:
            try:
                found[sid] = c.session_info(sid)["n_tokens"]
            except cairn_client.NotFound:
                pass
        return found

    def test_smaller_context_or_other_vocabulary_keeps_the_session(self):
        long_text = doc_prompt(700)
        small_ctx = 512
        srv = self.start()
        c = self.client(srv)
        sid_long = c.session_open(text=long_text, persist=True)["session_id"]
        r = c.session_generate(sid_long, max_tokens=12, temperature=0)
        hist_long = tok(long_text, True) + r.tokens
        self.assertGreater(len(hist_long), small_ctx)
        sid_short = c.session_open(text="Tom had a red ball.", persist=True)["session_id"]
        hist_short = tok("Tom had a red ball.", True)
        everyone = {sid_long: len(hist_long), sid_short: len(hist_short)}
        self.assertEqual(self.sessions(c, everyone), everyone)
        full_args = srv.args

        # a smaller -c: the long session is skipped, not deleted
        small = [a if a != str(N_CTX) else str(small_ctx) for a in full_args]
        self.assertNotEqual(small, full_args)
        srv = self.graceful_restart(srv, args=small)
        c = self.client(srv)
        self.assertEqual(self.sessions(c, everyone), {sid_short: len(hist_short)})
        self.assertIn("kept on disk but not loaded", srv.log())
        # ... and does not come back by being written over at a stop
        srv = self.graceful_restart(srv, args=full_args)
        c = self.client(srv)
        self.assertEqual(self.sessions(c, everyone), everyone)
        r2 = c.session_generate(sid_long, max_tokens=10, temperature=0)
        self.assertEqual(r2.tokens, ref_continue(hist_long, 10))
        hist_long += r2.tokens
        everyone[sid_long] = len(hist_long)

        # another vocabulary: both are skipped, through a SIGKILL too
        other = os.path.join(self.tmp, "other-vocab.gguf")
        write_model_with_other_vocabulary(MODEL, other)
        other_args = [a if a != MODEL else other for a in full_args]
        self.assertNotEqual(other_args, full_args)
        srv = self.graceful_restart(srv, args=other_args)
        c = self.client(srv)
        self.assertEqual(self.sessions(c, everyone), {})
        self.assertIn("another vocabulary", srv.log())
        srv = self.crash_restart(srv)
        srv = self.graceful_restart(srv, args=full_args)
        c = self.client(srv)
        self.assertEqual(self.sessions(c, everyone), everyone)
        r3 = c.session_generate(sid_short, max_tokens=8, temperature=0)
        self.assertEqual(r3.tokens, ref_continue(hist_short, 8))

    def test_damaged_record_is_dropped(self):
        """The one case a record goes: its checksum fails."""
        srv = self.start()
        c = self.client(srv)
        sid = c.session_open(text="Tom had a red ball.", persist=True)["session_id"]
        srv.kill()
        # flip the record's last byte with LMDB's own tools (lmdb-utils)
        if not shutil.which("mdb_dump") or not shutil.which("mdb_load"):
            self.skipTest("mdb_dump/mdb_load (lmdb-utils) not installed")
        dump = subprocess.run(["mdb_dump", "-s", "records", self.cache_dir], check=True,
                              capture_output=True, text=True).stdout.splitlines()
        key = " " + ("73" + sid.lower())
        at = dump.index(key)
        value = dump[at + 1]
        dump[at + 1] = value[:-2] + "%02x" % (int(value[-2:], 16) ^ 0xFF)
        subprocess.run(["mdb_load", "-s", "records", self.cache_dir], check=True,
                       input="\n".join(dump) + "\n", text=True)
        srv = self.track(srv.restart())
        c = self.client(srv)
        self.assertEqual(self.sessions(c, [sid]), {})
        self.assertIn("is damaged", srv.log())


if __name__ == "__main__":
    harness.main()
