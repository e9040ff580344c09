#!/usr/bin/env python3
"""Disk faults against a real `cairn serve --cache-dir`: a cache directory
that cannot be used, a disk that fills up while serving, a corrupted LMDB
file, and SIGKILL in the middle of a storm of durable writes.

usage: test_disk_faults.py CAIRN_BIN MODEL [unittest args...]

The promises checked (docs/security.md): the server never crashes on a disk
fault; it either refuses to start with a message or serves without what it
cannot have; a reply to a call on a persisted session (`persist: true`)
means that the session's history is durable, so after a crash it is there
with exactly that history (or, for the one call that was in flight, with the
history that call would have produced); a damaged file never yields wrong
output -- damaged pages are recomputed, damaged session records are dropped.
Greedy everywhere; expected outputs come from a fresh server without any
cache (harness.Reference). No timing thresholds.
"""
import errno
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, STOP_GUARD_S, WORDS, Reference as ref  # noqa: E402
import cairn_client  # noqa: E402

harness.configure(*harness.take_argv("CAIRN_BIN", "MODEL"))

GEN = 8


def doc(i, n=40):
    return f"Story {i}: " + " ".join(WORDS[i * 37:i * 37 + n])


class Case(harness.ServerCase):
    TMP_PREFIX = "cairn-hard-"

    def start_or_refusal(self, *extra, binary=None):
        """(server, None) when it starts, (None, its log) when it exits
        before listening. A refusal must be an orderly exit with a status
        (not a signal) and a message on stderr."""
        try:
            return self.start(*extra, binary=binary), None
        except harness.ServerStartError as e:
            text = str(e)
            m = re.search(r"exited with status (-?\d+)", text)
            self.assertIsNotNone(m, "the server neither started nor exited:\n" + text)
            self.assertGreater(int(m.group(1)), 0, "the server died of a signal:\n" + text)
            return None, text

    def check_serves(self, srv, prompts=(doc(90), doc(91))):
        """A new client gets exactly the reference output."""
        with srv.client(timeout=HANG_GUARD_S) as c:
            for p in prompts:
                want = ref.cont(ref.tok(p, True), GEN)
                self.assertEqual(c.generate(prompt=p, max_tokens=GEN, temperature=0).tokens, want)

    def check_session(self, c, sid, candidates, may_be_gone=False):
        """The session exists with one of the candidate histories (token
        lists) and continues exactly as a fresh server continues that
        history; or, with may_be_gone, it does not exist. Returns the
        history it had plus the continuation (None when gone)."""
        try:
            n = c.session_info(sid)["n_tokens"]
        except cairn_client.NotFound:
            self.assertTrue(may_be_gone, f"session {sid} was lost")
            return None
        hist = next((h for h in candidates if len(h) == n), None)
        self.assertIsNotNone(hist, f"session {sid}: {n} tokens, expected one of "
                                   f"{[len(h) for h in candidates]}")
        r = c.session_generate(sid, max_tokens=GEN, temperature=0)
        self.assertEqual(r.tokens, ref.cont(hist, GEN), f"session {sid}: history differs")
        return hist + r.tokens

    def assertAnswerIsAnError(self, fn, *a, **kw):
        """A call either succeeds or fails with a protocol error (never a
        dropped connection); returns (ok, result or error)."""
        try:
            return True, fn(*a, **kw)
        except cairn_client.CairnError as e:
            return False, e


# --------------------------------------------------------------------------
class UnusableCacheDir(Case):
    """A cache directory that cannot be created or written: the server
    refuses to start, exit status 1 and one line `cairn serve: cannot ...:
    <reason>` (docs/security.md, "Disk faults"), never a crash; and a store
    that was there is not destroyed by the failed attempt."""

    def check_start(self, cache_dir, what, reason):
        srv, log = self.start_or_refusal("--cache-dir", cache_dir)
        if srv is not None:
            self.fail(f"{what}: served with an unusable cache dir:\n" + srv.log())
        self.assertRegex(log, r"exited with status 1\b", f"{what}: {log}")
        lines = [l for l in log.splitlines() if "cairn serve:" in l]
        self.assertTrue(lines, f"{what}: refused without saying why:\n{log}")
        self.assertRegex(lines[0], r"cairn serve: cannot .*: " + re.escape(reason), what)
        return "refused: " + lines[0]

    def test_cache_dir_is_a_file_or_under_one(self):
        f = os.path.join(self.tmp, "a-file")
        with open(f, "w") as fh:
            fh.write("not a directory\n")
        for path, what in ((f, "a regular file"), (os.path.join(f, "cache"), "under a file")):
            with self.subTest(cache_dir=what):
                print(f"\ncache dir {what}: {self.check_start(path, what, 'Not a directory')}",
                      file=sys.stderr)
        with open(f) as fh:
            self.assertEqual(fh.read(), "not a directory\n", "the file was touched")

    def make_read_only(self, path):
        """Make `path` unwritable, also for root when possible: the
        immutable attribute (chattr +i) works for root; chmod does not.
        Returns an undo function, or skips. self.read_only_error is the
        error then expected: EPERM for an immutable file, EACCES for chmod."""
        if subprocess.run(["chattr", "+i", path], capture_output=True).returncode == 0:
            self.read_only_error = os.strerror(errno.EPERM)
            self.on_cleanup(lambda: subprocess.run(["chattr", "-i", path], capture_output=True))
            return lambda: subprocess.run(["chattr", "-i", path], check=True, capture_output=True)
        if os.geteuid() != 0:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            os.chmod(path, 0o500 if os.path.isdir(path) else 0o400)
            self.read_only_error = os.strerror(errno.EACCES)
            self.on_cleanup(lambda: os.chmod(path, mode))
            return lambda: os.chmod(path, mode)
        self.skipTest("running as root without chattr +i: nothing is read-only to root")

    def test_read_only_cache_dir(self):
        empty = os.path.join(self.tmp, "empty")
        os.mkdir(empty)
        undo = self.make_read_only(empty)
        try:
            open(os.path.join(empty, "probe"), "w").close()
            self.skipTest("could not make a directory read-only here")
        except OSError:
            pass
        print(f"\nread-only empty cache dir: {self.check_start(empty, 'read-only', self.read_only_error)}",
              file=sys.stderr)
        undo()

        # an existing store whose files cannot be written: the persisted
        # session in it must survive the failed start
        cache = os.path.join(self.tmp, "cache")
        srv = self.start("--cache-dir", cache)
        c = self.client(srv)
        text = doc(3)
        sid = c.session_open(text=text, persist=True)["session_id"]
        r = c.session_generate(sid, max_tokens=GEN, temperature=0)
        hist = ref.tok(text, True) + r.tokens
        self.assertEqual(srv.stop(STOP_GUARD_S), 0, srv.log())
        undo_files = [self.make_read_only(os.path.join(cache, f)) for f in sorted(os.listdir(cache))]
        undo_dir = self.make_read_only(cache)
        print(f"read-only store: {self.check_start(cache, 'read-only store', self.read_only_error)}", file=sys.stderr)
        undo_dir()
        for u in undo_files:
            u()
        srv = self.start("--cache-dir", cache)
        self.check_session(self.client(srv), sid, [hist])


# --------------------------------------------------------------------------
LIMIT_WRAPPER = """#!{python}
# Runs cairn with its file size limited to {limit} bytes, as a full disk:
# writes past it fail with EFBIG (SIGXFSZ ignored, so the process is not
# killed by it, as it is not by ENOSPC).
import os, resource, signal, sys
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
os.execv({binary!r}, [{binary!r}] + sys.argv[1:])
"""


class DiskFull(Case):
    def fill_up(self, start_server, cache, what, make_room=lambda: None):
        """Sessions (persisted) and one-shot requests until the disk is
        full and well past it; then SIGKILL, make_room() (the operator frees
        space) and a restart."""
        srv = start_server()
        c = self.client(srv)
        acked = {}      # sid -> history of the last successful reply
        attempted = {}  # sid -> history the failed call would have produced
        failures, calls = [], 0
        for i in range(40):
            text = doc(i)
            ok, res = self.assertAnswerIsAnError(c.session_open, text=text, persist=True)
            calls += 1
            if not ok:
                failures.append((res.type, res.message))
                continue
            sid = res["session_id"]
            acked[sid] = ref.tok(text, True)
            for turn in range(2):
                add = ref.tok(" Then they", False) if turn else []
                want = ref.cont(acked[sid] + add, GEN)
                ok, r = self.assertAnswerIsAnError(c.session_generate, sid,
                                                   tokens=add or None, max_tokens=GEN,
                                                   temperature=0)
                calls += 1
                if ok:
                    self.assertEqual(r.tokens, want)
                    acked[sid] = acked[sid] + add + r.tokens
                else:
                    failures.append((r.type, r.message))
                    attempted[sid] = acked[sid] + add + want
                    break
            # whatever the disk does, plain requests are served exactly
            p = doc(100 + i)
            self.assertEqual(c.generate(prompt=p, max_tokens=GEN, temperature=0).tokens,
                             ref.cont(ref.tok(p, True), GEN))
            calls += 1
        self.assertAlive(srv)
        st = c.cache_stats()["tiers"]["disk"]
        self.assertGreater(len(failures), 0, f"{what}: the disk never filled up: {st}")
        # docs/security.md: a call that cannot be made durable is answered
        # `internal` "the session could not be made durable", and the log
        # says "disk tier: transaction failed: <reason>"
        self.assertEqual(set(failures),
                         {("internal", "the session could not be made durable")}, failures)
        warned = [l for l in srv.log_lines if "disk tier: transaction failed: " in l]
        self.assertTrue(warned, f"{what}: the server did not report the full disk:\n" + srv.log())
        srv.kill()

        make_room()
        srv = self.start("--cache-dir", cache)
        c = self.client(srv)
        kept = 0
        for sid, hist in acked.items():
            cands = [hist] + ([attempted[sid]] if sid in attempted else [])
            if self.check_session(c, sid, cands) is not None:
                kept += 1
        self.check_serves(srv)
        print(f"\n{what}: {calls} calls, {len(failures)} refused ({sorted(set(t for t, _ in failures))}), "
              f"{kept}/{len(acked)} acknowledged persisted sessions intact after SIGKILL; "
              f"reported: {warned[0] if warned else None}", file=sys.stderr)

    def test_file_size_limit_as_a_full_disk(self):
        cache = os.path.join(self.tmp, "cache")
        wrapper = os.path.join(self.tmp, "cairn-limited")
        with open(wrapper, "w") as f:
            f.write(LIMIT_WRAPPER.format(python=sys.executable, limit=256 * 1024,
                                         binary=os.path.abspath(self.BIN)))
        os.chmod(wrapper, 0o755)
        self.fill_up(lambda: self.start("--cache-dir", cache, "--kv-mem", "256K",
                                        "--host-mem", "256K", binary=wrapper),
                     cache, "disk full (RLIMIT_FSIZE 256K)")

    def test_tiny_tmpfs(self):
        mnt = os.path.join(self.tmp, "mnt")
        os.mkdir(mnt)
        if os.geteuid() != 0 or subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", mnt],
                capture_output=True).returncode != 0:
            self.skipTest("cannot mount a tmpfs here")
        self.on_cleanup(lambda: subprocess.run(["umount", "-l", mnt], capture_output=True))
        cache = os.path.join(mnt, "cache")
        self.fill_up(lambda: self.start("--cache-dir", cache, "--kv-mem", "256K",
                                        "--host-mem", "256K"),
                     cache, "disk full (tmpfs 320K)",
                     make_room=lambda: subprocess.run(["mount", "-o", "remount,size=64m", mnt],
                                                      check=True))


# --------------------------------------------------------------------------
class Corruption(Case):
    """A store written by a graceful stop (cached pages of a document, two
    persisted sessions), then damaged in different ways between runs. Each
    time the server must start, serve exactly the reference output for the
    document, and give back each session with its exact history or not at
    all (a dropped record is a loss the damage caused; a wrong history
    would be a lie)."""

    def build_store(self, cache):
        srv = self.start("--cache-dir", cache)
        c = self.client(srv)
        self.doc = doc(5, 160)
        self.doc_out = c.generate(prompt=self.doc, max_tokens=GEN, temperature=0).tokens
        self.assertEqual(self.doc_out, ref.cont(ref.tok(self.doc, True), GEN))
        self.sessions = {}
        for i in (6, 7):
            text = doc(i, 60)
            sid = c.session_open(text=text, persist=True)["session_id"]
            r = c.session_generate(sid, max_tokens=GEN, temperature=0)
            self.sessions[sid] = ref.tok(text, True) + r.tokens
        self.assertEqual(srv.stop(STOP_GUARD_S), 0, srv.log())

    def record_offsets(self, data, sid, hist):
        """Offsets in data.mdb of the token arrays of live-looking copies of
        the session's record: LMDB keeps a leaf node's value right after its
        key ('s' + 16 id bytes); the value is a header ("CSR1", version,
        ..., checksum: 40 bytes; version 4 adds the vocabulary and note_len:
        52) then the history as little-endian int32."""
        key = b"s" + bytes.fromhex(sid)
        body = b"".join(t.to_bytes(4, "little") for t in hist)
        out, at = [], data.find(key)
        while at >= 0:
            v = at + len(key)
            hdr = 52 if int.from_bytes(data[v + 4:v + 8], "little") >= 4 else 40
            if data[v:v + 4] == b"CSR1" and data[v + hdr:v + hdr + len(body)] == body:
                out.append(v + hdr)
            at = data.find(key, at + 1)
        return out

    def damage(self, path, how, seed):
        with open(path, "rb") as f:
            data = bytearray(f.read())
        rng = random.Random(seed)
        page = 4096
        if how == "meta pages overwritten":
            data[:2 * page] = bytes(rng.randrange(256) for _ in range(2 * page))
        elif how == "truncated to a third":
            del data[len(data) // 3:]
        elif how == "emptied":
            data = bytearray()
        elif how == "random bytes":
            data = bytearray(rng.randbytes(len(data)))
        elif how.startswith("64 bytes flipped"):
            for _ in range(64):
                i = rng.randrange(2 * page, len(data))
                data[i] ^= 1 << rng.randrange(8)
        elif how.startswith("1 page zeroed"):
            n = len(data) // page
            p = rng.randrange(2, n)
            data[p * page:(p + 1) * page] = bytes(page)
        elif how == "a session record's last token changed":
            sid, hist = next(iter(self.sessions.items()))
            offs = self.record_offsets(bytes(data), sid, hist)
            self.assertTrue(offs, "the record was not found in data.mdb")
            # another valid token that changes what follows
            last = len(hist) - 1
            for t in range(3, 500):
                if t != hist[last] and ref.cont(hist[:last] + [t], GEN) != ref.cont(hist, GEN):
                    break
            for o in offs:
                data[o + 4 * last:o + 4 * last + 4] = t.to_bytes(4, "little")
        else:
            raise AssertionError(how)
        with open(path, "wb") as f:
            f.write(data)

    def test_damaged_store(self):
        pristine = os.path.join(self.tmp, "pristine")
        self.build_store(pristine)
        trials = ["meta pages overwritten", "truncated to a third", "emptied", "random bytes",
                  "a session record's last token changed"]
        # More trials by hand: CAIRN_FLIP_TRIALS=60 (the damage lands in
        # LMDB's own pages in only some of them)
        trials += [f"64 bytes flipped (seed {k})"
                   for k in range(int(os.environ.get("CAIRN_FLIP_TRIALS", "6")))]
        trials += [f"1 page zeroed (seed {k})" for k in range(4)]
        outcome = {}
        for k, how in enumerate(trials):
            with self.subTest(damage=how):
                cache = os.path.join(self.tmp, f"cache{k}")
                shutil.copytree(pristine, cache)
                self.damage(os.path.join(cache, "data.mdb"), how, seed=k)
                srv, log = self.start_or_refusal("--cache-dir", cache)
                self.assertIsNotNone(srv, f"did not start over a damaged store:\n{log}")
                c = self.client(srv)
                r = c.generate(prompt=self.doc, max_tokens=GEN, temperature=0)
                self.assertEqual(r.tokens, self.doc_out)
                kept, refused = 0, []
                for sid, hist in self.sessions.items():
                    try:
                        if self.check_session(c, sid, [hist], may_be_gone=True) is not None:
                            kept += 1
                    except cairn_client.CairnError as e:
                        # a store LMDB can no longer write to: the session's
                        # next durable write is refused (an answer, not wrong
                        # output); reported in the figures
                        refused.append(e.type)
                        warned = [l for l in srv.log_lines if ": warn:" in l or ": error:" in l]
                        self.assertTrue(warned, "a durable write failed silently:\n" + srv.log())
                        refused.append(warned[-1])
                self.check_serves(srv)
                self.assertAlive(srv)
                self.assertEqual(srv.stop(STOP_GUARD_S), 0, srv.log())
                outcome[how] = (f"{r.usage.cached_tokens} doc tokens reused, {kept}/2 sessions "
                                "kept" + (f", refused {refused}" if refused else "") + (", reset" if any("starting it empty" in l
                                                          for l in srv.log_lines) else ""))
                shutil.rmtree(cache, ignore_errors=True)
        print("\ncorruption: " + "; ".join(f"{k}: {v}" for k, v in outcome.items()),
              file=sys.stderr)


# --------------------------------------------------------------------------
class KillDuringWriteStorm(Case):
    """Eight connections change their persisted sessions as fast as they
    can (generate, append, truncate, fork, close and reopen) while the
    server is SIGKILLed, twice. After each restart, every session is exactly
    as its last acknowledged reply left it -- or, for the one call in flight
    at the kill, as that call would have left it; sessions whose close was
    acknowledged are gone."""
    WORKERS = 8
    CALLS_BEFORE_KILL = 150

    def storm(self, srv, state, stop_after):
        lock = threading.Lock()
        done = {"calls": 0}
        errors = []

        def worker(w):
            rng = random.Random(w * 1000 + done.get("round", 0))
            c = srv.client(timeout=HANG_GUARD_S)
            mine = [sid for sid, st in state.items() if st["owner"] == w and not st["closed"]]
            try:
                while True:
                    if not mine or rng.random() < 0.08:
                        text = doc(rng.randrange(200), rng.randrange(8, 30))
                        st = {"owner": w, "hist": ref.tok(text, True), "closed": False,
                              "pending": None}
                        r = c.session_open(text=text, persist=True)
                        with lock:
                            state[r["session_id"]] = st
                        mine.append(r["session_id"])
                        continue
                    sid = rng.choice(mine)
                    st = state[sid]
                    op = rng.random()
                    h = st["hist"]
                    if op < 0.5 and len(h) < 1500:
                        add = ref.tok(rng.choice([" Then", " The dog", " She said"]), False) \
                            if rng.random() < 0.5 else []
                        st["pending"] = ("generate", add)
                        r = c.session_generate(sid, tokens=add or None, max_tokens=GEN,
                                               temperature=0)
                        st["hist"] = h + add + r.tokens
                    elif op < 0.7 and len(h) < 1500:
                        add = ref.tok(" and a cat", False)
                        st["pending"] = ("append", add)
                        c.session_append(sid, tokens=add)
                        st["hist"] = h + add
                    elif op < 0.85 and len(h) > 4:
                        n = len(h) - rng.randrange(1, 4)
                        st["pending"] = ("truncate", n)
                        c.session_truncate(sid, n)
                        st["hist"] = h[:n]
                    elif op < 0.93:
                        st["pending"] = ("fork", None)
                        child = c.session_fork(sid)
                        with lock:
                            state[child] = {"owner": w, "hist": list(h), "closed": False,
                                            "pending": None}
                        mine.append(child)
                    else:
                        st["pending"] = ("close", None)
                        c.session_close(sid)
                        st["closed"] = True
                        mine.remove(sid)
                    st["pending"] = None
                    with lock:
                        done["calls"] += 1
            except cairn_client.CairnConnectionError:
                pass  # the kill
            except Exception as e:
                errors.append((w, repr(e)))
            finally:
                c.close()

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(self.WORKERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + HANG_GUARD_S
        while done["calls"] < stop_after and not errors and time.monotonic() < deadline:
            time.sleep(0.01)
        srv.kill()  # SIGKILL while the workers are mid-call
        for t in threads:
            t.join(HANG_GUARD_S)
        self.assertEqual(errors, [])
        return done["calls"]

    def verify(self, srv, state):
        c = self.client(srv)
        stats = {"intact": 0, "in-flight applied": 0, "gone (closed)": 0}
        for sid, st in list(state.items()):
            with self.subTest(session=sid):
                pend = st["pending"]
                if st["closed"]:
                    with self.assertRaises(cairn_client.NotFound):
                        c.session_info(sid)
                    stats["gone (closed)"] += 1
                    del state[sid]
                    continue
                cands = [st["hist"]]
                if pend and pend[0] == "generate":
                    base = st["hist"] + pend[1]
                    cands.append(base + ref.cont(base, GEN))
                elif pend and pend[0] == "append":
                    cands.append(st["hist"] + pend[1])
                elif pend and pend[0] == "truncate":
                    cands.append(st["hist"][:pend[1]])
                got = self.check_session(c, sid, cands,
                                         may_be_gone=bool(pend and pend[0] == "close"))
                if got is None:
                    del state[sid]
                    continue
                stats["intact" if len(got) - GEN == len(st["hist"]) else
                      "in-flight applied"] += 1
                st["hist"], st["pending"] = got, None
        self.check_serves(srv)
        return stats

    def test_sigkill_during_write_storm(self):
        cache = os.path.join(self.tmp, "cache")
        srv = self.start("--cache-dir", cache, "--kv-mem", "2M", "--host-mem", "1M")
        state = {}
        report = []
        for cycle in range(2):
            calls = self.storm(srv, state, self.CALLS_BEFORE_KILL)
            srv = self.start("--cache-dir", cache, "--kv-mem", "2M", "--host-mem", "1M")
            n_sessions = len(state)
            stats = self.verify(srv, state)
            report.append(f"cycle {cycle + 1}: {calls} acknowledged calls, {n_sessions} "
                          f"sessions checked: {stats}")
        self.assertEqual(srv.stop(STOP_GUARD_S), 0, srv.log())
        print("\nSIGKILL during write storm: " + "; ".join(report), file=sys.stderr)


if __name__ == "__main__":
    harness.main()
