#!/usr/bin/env python3
"""KV events through the real `cairn serve --kv-events` (issue 42): what a
router would believe from the stream alone, decoded with vLLM 0.32's own
event classes (tests/support/vllm_kv_events.py), against what the server
says it holds (/metrics: the prefix tree's pages per tier, LMDB's pages).

On the bundled model with a device KV pool of a few dozen pages, a small
host tier and a disk tier, documents are asked until pages move down:
  - every page of the tree's device and host nodes is announced as GPU and
    CPU, and nothing else is: the counts agree once the stream has caught
    up, after the documents went in, after eviction moved them down (CPU
    stores, GPU removals seen), and after a document came back (promotion);
  - STORAGE holds what LMDB holds;
  - every stored run hangs under a page announced before it (a router can
    place it), every removal names a page the memory tier had announced;
  - a replay from sequence 0 rebuilds the same view as the live stream;
  - SIGKILL and a restart on the same cache directory: the new process
    starts with AllBlocksCleared and announces what LMDB kept (a subset of
    what was on disk, every run under a known parent), and a document
    asked again is served from there;
  - a subscriber that connects late without asking for a replay (a
    restarted router) is sent the whole state (AllBlocksCleared, then every
    page, parents first);
  - a tenant's pages (--tenants) are never announced;
  - --kv-events-replay without --kv-events, and an endpoint that is not
    tcp:// or ipc://, are refused with a message.
Skips (77) when pyzmq or msgspec cannot be imported.

usage: test_kv_events.py CAIRN_BIN MODEL [unittest args...]
"""
import json
import os
import subprocess
import sys
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import harness  # noqa: E402
import vllm_kv_events as kv  # noqa: E402
from routers import metrics  # noqa: E402

[CAIRN, MODEL] = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)
if kv.zmq is None or kv.msgspec is None:
    print("skipped: pyzmq and msgspec are needed (scripts/setup.sh --test installs them)")
    sys.exit(77)

GUARD = harness.SHORT_HANG_GUARD_S


def server_pages(port, headers=None):
    m = metrics(port, headers)
    return {"GPU": int(m['cairn_kv_tree_pages{tier="device"}']),
            "CPU": int(m['cairn_kv_tree_pages{tier="host"}']),
            "STORAGE": int(m['cairn_kv_pages_used{tier="disk"}'])}


def ask(port, doc, q, headers=None):
    words = harness.WORDS
    text = " ".join(words[doc * 120:doc * 120 + 120])
    body = {"prompt": f"{text}\nQuestion {q}:", "max_tokens": 2, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=GUARD) as r:
        return json.loads(r.read())["usage"]


class KvEventsTest(unittest.TestCase):
    def start(self, scratch, extra=(), cache="cache"):
        self.pub = f"tcp://127.0.0.1:{harness.free_port()}"
        self.rep = f"tcp://127.0.0.1:{harness.free_port()}"
        args = ["-m", MODEL, "-c", "512", "--kv-mem", "512K", "--host-mem", "192K",
                "--cache-dir", os.path.join(scratch.name, cache),
                "--kv-events", self.pub, "--kv-events-replay", self.rep, *extra]
        return scratch.start(CAIRN, args, http=True)

    def converged(self, view, port):
        """The view and the server agree (polled: events are asynchronous)."""
        last = harness.poll(lambda: (view.counts(), server_pages(port)),
                            lambda v: v[0] == v[1], guard=GUARD)
        self.assertEqual(last[0], last[1], "the events' view and the server's pages differ")
        self.assertEqual(view.problems, [])
        return last[0]

    def test_view_follows_the_tiers_and_survives_a_restart(self):
        with harness.Scratch() as scratch:
            srv = self.start(scratch)
            view = kv.ReplicaView(self.pub, self.rep)
            scratch.on_close(view.close)
            # one document, asked twice: device pages, a reuse
            ask(srv.http_port, 0, 1)
            self.assertGreater(ask(srv.http_port, 0, 2)["prompt_tokens_details"]["cached_tokens"],
                               0)
            first = self.converged(view, srv.http_port)
            self.assertGreater(first["GPU"], 0)
            self.assertEqual(view.block_sizes, {16})
            # many documents: the device pool overflows into host RAM and disk
            for d in range(1, 7):
                ask(srv.http_port, d, 1)
            moved = self.converged(view, srv.http_port)
            self.assertGreater(view.removed["GPU"], 0, "nothing left the device")
            self.assertGreater(view.stored["CPU"] + view.stored["STORAGE"], 0)
            self.assertGreater(moved["STORAGE"], 0)
            # document 0 again: found below the device, promoted, announced again
            u = ask(srv.http_port, 0, 3)
            self.assertGreater(u["prompt_tokens_details"]["cached_tokens"], 0)
            self.converged(view, srv.http_port)
            # a replay from 0 tells the same story as the live stream
            again = kv.ReplicaView(self.pub, self.rep)
            scratch.on_close(again.close)
            harness.poll(again.snapshot, lambda s: s == view.snapshot(), guard=GUARD)
            self.assertEqual(again.snapshot(), view.snapshot())
            disk_before = view.snapshot()["STORAGE"]
            view.stop = True  # its socket closes with the scratch

            # SIGKILL, restart on the same directory and endpoints
            srv = scratch.track(srv.restart(kill=True))
            after = kv.ReplicaView(self.pub, self.rep)
            scratch.on_close(after.close)
            harness.poll(lambda: after.applied, lambda n: n > 0, guard=GUARD)
            self.assertGreaterEqual(after.cleared, 1,
                                    "a restarted replica starts with AllBlocksCleared")
            held = harness.poll(after.snapshot, lambda s: len(s["STORAGE"]) > 0, guard=GUARD)
            self.assertTrue(held["STORAGE"] <= disk_before | held["STORAGE"])
            self.assertTrue(held["STORAGE"] & disk_before, "nothing of the old disk announced")
            self.assertEqual(held["GPU"] | held["CPU"], set())
            self.assertEqual(after.problems, [])
            u = ask(srv.http_port, 0, 4)
            self.assertGreater(u["prompt_tokens_details"]["cached_tokens"], 0)
            self.converged(after, srv.http_port)
            # a subscriber that connects late and never asks the replay
            # socket (a restarted vllm-router) is sent the whole state
            late = kv.ReplicaView(self.pub)
            scratch.on_close(late.close)
            harness.poll(late.snapshot, lambda s: s == after.snapshot(), guard=GUARD)
            self.assertEqual(late.snapshot(), after.snapshot())
            self.assertEqual(late.problems, [])

    def test_tenants_pages_are_not_announced(self):
        with harness.Scratch() as scratch:
            tenants = os.path.join(scratch.name, "tenants")
            with open(tenants, "w") as f:
                f.write("alice key-a\n")
            os.chmod(tenants, 0o600)
            srv = self.start(scratch, ["--tenants", tenants])
            view = kv.ReplicaView(self.pub, self.rep)
            scratch.on_close(view.close)
            ask(srv.http_port, 0, 1, headers={"Authorization": "Bearer key-a"})
            ask(srv.http_port, 0, 2, headers={"Authorization": "Bearer key-a"})
            auth = {"Authorization": "Bearer key-a"}
            pages = harness.poll(lambda: server_pages(srv.http_port, auth),
                                 lambda p: p["GPU"] > 0, guard=GUARD)
            self.assertGreater(pages["GPU"], 0)
            harness.poll(lambda: metrics(srv.http_port, auth)["cairn_kv_events_published_total"],
                         lambda n: n >= 1, guard=GUARD)
            self.assertEqual(view.counts()["GPU"], 0)
            self.assertEqual(view.counts()["CPU"], 0)

    def test_bad_flags_are_refused(self):
        for args, words in ((["--kv-events-replay", "tcp://127.0.0.1:1"], "--kv-events"),
                            (["--kv-events", "http://127.0.0.1:1"], "tcp://")):
            p = subprocess.run([CAIRN, "serve", "-m", MODEL, "--http-port", "0", *args],
                               capture_output=True, text=True, timeout=GUARD)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(words, p.stderr)


if __name__ == "__main__":
    harness.main()
