#!/usr/bin/env python3
"""Bounded load test of `cairn serve`: hundreds of concurrent clients over
loopback, each a multi-turn session (open, 2-3 greedy turns, info, close),
every fourth also a one-shot generate, against a server whose tier 0 is far
too small for all of them (requests wait, are paused and resumed; pages move
down to host RAM and LMDB).

usage: test_load.py CAIRN_BIN MODEL [unittest args...]

Checks (no timing thresholds):
  * every request is answered, without an error, with exactly the greedy
    output a fresh unloaded server gives for the same token history;
  * the server's peak RSS (VmHWM, read from /proc at the end) is within
        kv_mem + host_mem + disk_max + model file
        + PER_CONN_ALLOWANCE x clients + FIXED_OVERHEAD
    (256 KiB per connection: its 64 KiB read buffer, at most 4 x that kept
    after a large message, responses in flight; 32 MiB fixed: code, libc,
    thread stacks, the model's scratch and logits buffers). The LMDB map is
    file-backed and counts in RSS when touched, so disk_max is part of it;
  * once every client has gone, the server holds no more file descriptors
    than it did before the load (connections are all released) and nothing
    runs or waits.

Environment (to run it longer or wider by hand; the defaults keep it
around a minute on 2 cores):
  CAIRN_LOAD_CLIENTS   concurrent clients (default 256)
  CAIRN_LOAD_ROUNDS    rounds: every client connects, plays its session and
                       disconnects, then the next round starts (default 3)
  CAIRN_LOAD_SECONDS   keep starting new rounds until this many seconds have
                       passed (default 0: just CAIRN_LOAD_ROUNDS)
"""
import asyncio
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, WORDS, request  # noqa: E402
import procfs  # noqa: E402  (tests/hardening/procfs.py)

harness.configure(*harness.take_argv("CAIRN_BIN", "MODEL"))

CLIENTS = int(os.environ.get("CAIRN_LOAD_CLIENTS", "256"))
ROUNDS = int(os.environ.get("CAIRN_LOAD_ROUNDS", "3"))
SECONDS = float(os.environ.get("CAIRN_LOAD_SECONDS", "0"))
N_TEMPLATES = 48          # distinct conversations; client i plays number i % 48
GEN = 8                   # tokens per turn
TURN_TEXTS = [None, " Then they", " The end came when"]  # turn k appends this first
PAGE_BYTES_GUESS = 10240  # replaced by the measured value
KV_PAGES = 96             # tier 0: a few sessions' worth, for hundreds of clients
HOST_PAGES = 64
DISK_MAX = 8 << 20
PER_CONN_ALLOWANCE = 256 << 10
FIXED_OVERHEAD = 32 << 20
CONNECT_AT_ONCE = 64      # under the listen backlog (128): no SYN retries


class RpcError(Exception):
    def __init__(self, err):
        super().__init__(f"{err.get('type')}: {err.get('message')}")
        self.type = err.get("type")


class AsyncConn:
    """One msgpack-RPC connection driven by asyncio (hundreds of them in one
    thread): `await call(...)` sends a request and returns its result
    (notifications are counted, then dropped). Calls on one connection may
    overlap."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.unpacker = harness.unpacker()
        self.next_id = 1
        self.waiting = {}
        self.notifications = 0
        self.task = asyncio.ensure_future(self._read_loop())

    @classmethod
    async def open(cls, host, port):
        r, w = await asyncio.open_connection(host, port)
        return cls(r, w)

    async def _read_loop(self):
        err = ConnectionError("connection closed by the server")
        try:
            while True:
                chunk = await self.reader.read(1 << 16)
                if not chunk:
                    break
                self.unpacker.feed(chunk)
                for m in self.unpacker:
                    if m[0] == 2:
                        self.notifications += 1
                    elif m[0] == 1 and m[1] in self.waiting:
                        fut = self.waiting.pop(m[1])
                        if m[2] is not None:
                            fut.set_exception(RpcError(m[2]))
                        else:
                            fut.set_result(m[3])
        except (ConnectionError, OSError) as e:
            err = e
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(err)
        self.waiting.clear()

    async def call(self, method, params=None, timeout=HANG_GUARD_S):
        msgid = self.next_id
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[msgid] = fut
        self.writer.write(request(method, params or {}, msgid))
        await self.writer.drain()
        return await asyncio.wait_for(fut, timeout)

    async def close(self):
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self.task.cancel()


def template_text(t):
    names = ["Max", "Sue", "Lily", "Tom", "Ben", "Mia", "Zoe", "Sam"]
    # different lengths (22..37 words), different from the first words on
    return f"{names[t % 8]} and {names[(t * 3 + 1) % 8]} " + \
        " ".join(WORDS[t * 17:t * 17 + 22 + t % 16])


class Load(harness.ServerCase):
    TMP_PREFIX = "cairn-hard-"

    def expected_scripts(self):
        """Per template: (opening tokens, [(appended tokens, greedy output)]
        per turn, the one-shot output), from a fresh server that does one
        request at a time with the default (large) KV pool."""
        ref = self.start()
        c = self.client(ref)
        scripts = []
        for t in range(N_TEMPLATES):
            text = template_text(t)
            hist = c.tokenize(text, add_bos=True)
            opening = list(hist)
            turns = []
            for k in range(len(TURN_TEXTS)):
                add = c.tokenize(TURN_TEXTS[k], add_bos=False) if TURN_TEXTS[k] else []
                hist += add
                out = c.generate(tokens=hist, max_tokens=GEN, temperature=0).tokens
                turns.append((add, out))
                hist += out
            one_shot = c.generate(prompt=text, max_tokens=GEN, temperature=0).tokens
            scripts.append((opening, turns, one_shot))
        page_bytes = c.cache_stats()["tiers"]["device"]
        pb = page_bytes["bytes"] // page_bytes["pages"] if page_bytes["pages"] else PAGE_BYTES_GUESS
        ref.kill()
        return scripts, pb

    async def one_client(self, i, conn, scripts, failures, counts):
        opening, turns, one_shot = scripts[i % N_TEMPLATES]
        n_turns = 2 + (i % 2)  # 2 or 3 turns
        try:
            s = await conn.call("session.open", {"tokens": opening})
            counts["requests"] += 1
            sid, n = s["session_id"], len(opening)
            if s["n_tokens"] != n:
                failures.append((i, "open", s))
            for k in range(n_turns):
                add, want = turns[k]
                params = {"session_id": sid, "max_tokens": GEN, "temperature": 0,
                          "stream": (i + k) % 5 == 0}
                if add:
                    params["tokens"] = add
                r = await conn.call("session.generate", params)
                counts["requests"] += 1
                counts["generated"] += len(r["tokens"])
                if r["tokens"] != want:
                    failures.append((i, f"turn {k}", r["tokens"], want))
                n += len(add) + len(want)
            info = await conn.call("session.info", {"session_id": sid})
            counts["requests"] += 1
            if info["n_tokens"] != n:
                failures.append((i, "info", info["n_tokens"], n))
            if i % 4 == 0:
                r = await conn.call("generate", {"tokens": opening, "max_tokens": GEN,
                                                 "temperature": 0})
                counts["requests"] += 1
                if r["tokens"] != one_shot:
                    failures.append((i, "one-shot", r["tokens"], one_shot))
            closed = await conn.call("session.close", {"session_id": sid})
            counts["requests"] += 1
            if closed.get("closed") is not True:
                failures.append((i, "close", closed))
        except Exception as e:  # every request must be answered without error
            failures.append((i, "error", repr(e)))

    async def run_round(self, srv, scripts, failures, counts):
        sem = asyncio.Semaphore(CONNECT_AT_ONCE)

        async def connect():
            async with sem:
                return await AsyncConn.open(srv.host, srv.port)

        conns = await asyncio.gather(*[connect() for _ in range(CLIENTS)])
        counts["connections"] += len(conns)
        # every client is connected before the first request: they all
        # arrive together
        await asyncio.wait_for(
            asyncio.gather(*[self.one_client(i, c, scripts, failures, counts)
                             for i, c in enumerate(conns)]), HANG_GUARD_S * 2)
        counts["notifications"] += sum(c.notifications for c in conns)
        await asyncio.gather(*[c.close() for c in conns])

    def test_hundreds_of_concurrent_sessions(self):
        scripts, page_bytes = self.expected_scripts()
        kv, host = KV_PAGES * page_bytes, HOST_PAGES * page_bytes
        srv = self.start("--kv-mem", str(kv), "--host-mem", str(host),
                         "--cache-dir", os.path.join(self.tmp, "cache"),
                         "--disk-max", str(DISK_MAX))
        c = self.client(srv)
        total = c.cache_stats()["device_pages_total"]
        self.assertLessEqual(total, KV_PAGES + 1, "tier 0 is not as small as asked")
        fds_before = procfs.open_fds(srv.proc.pid)
        rss_start = procfs.proc_status(srv.proc.pid)["VmRSS"] * 1024

        failures = []
        counts = {"requests": 0, "generated": 0, "connections": 0, "notifications": 0,
                  "rounds": 0}
        t0 = time.monotonic()
        while True:
            asyncio.run(self.run_round(srv, scripts, failures, counts))
            counts["rounds"] += 1
            self.assertAlive(srv)
            if failures or (counts["rounds"] >= ROUNDS and time.monotonic() - t0 >= SECONDS):
                break
        elapsed = time.monotonic() - t0

        st = harness.wait_idle(c)
        tiers = st["tiers"]
        status = procfs.proc_status(srv.proc.pid)
        hwm = status["VmHWM"] * 1024
        model_bytes = os.path.getsize(self.MODEL)
        bound = kv + host + DISK_MAX + model_bytes + PER_CONN_ALLOWANCE * CLIENTS + FIXED_OVERHEAD
        print(f"\nload: {CLIENTS} concurrent clients x {counts['rounds']} round(s) in "
              f"{elapsed:.1f} s: {counts['connections']} connections, {counts['requests']} "
              f"requests answered, {counts['generated']} tokens generated, "
              f"{counts['notifications']} stream notifications; tier 0 {total} pages; "
              f"evicted {st['evicted_pages']} pages (tier 0), {tiers['host']['evicted_pages']} "
              f"(host); disk store ops {tiers['disk']['store_ops']}; paused {st['paused']}; "
              f"RSS {rss_start / 2**20:.1f} MiB idle at start, peak {hwm / 2**20:.1f} MiB (bound {bound / 2**20:.1f} MiB = kv {kv / 2**20:.2f}"
              f" + host {host / 2**20:.2f} + disk {DISK_MAX / 2**20:.0f} + model "
              f"{model_bytes / 2**20:.2f} + {CLIENTS} x {PER_CONN_ALLOWANCE >> 10} KiB + "
              f"{FIXED_OVERHEAD >> 20} MiB); threads {status.get('Threads')}",
              file=sys.stderr)

        self.assertEqual(failures[:10], [], f"{len(failures)} failures")
        self.assertGreater(st["evicted_pages"], 0, "the load never overflowed tier 0")
        self.assertEqual((st["running"], st["waiting"]), (0, 0))
        self.assertEqual(st["sessions"], 0, "closed sessions are still counted")
        if not procfs.SANITIZER:
            self.assertLessEqual(hwm, bound)
        # connections are released: the fd count comes back (closes are
        # asynchronous, so poll; the bound is a hang guard)
        procfs.wait_fds(srv.proc.pid, fds_before)
        self.assertLessEqual(procfs.open_fds(srv.proc.pid), fds_before)
        # and it still serves
        opening, _, one_shot = scripts[0]
        self.assertEqual(c.generate(tokens=opening, max_tokens=GEN, temperature=0).tokens,
                         one_shot)
        self.assertEqual(srv.stop(harness.STOP_GUARD_S), 0, srv.log())


if __name__ == "__main__":
    harness.main()
