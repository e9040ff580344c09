#!/usr/bin/env python3
"""A crash keeps what was reused (issue 36), through the real `cairn serve`
on the real instruct model with a real LMDB --cache-dir and a real SIGKILL:

- a ~1.5k-token document is computed (request 1) and reused once (request 2
  shares it); the server writes the reused prefix's pages to LMDB in the
  background (write-behind), which /metrics reports as committed;
- a one-off prompt, never reused, is not written;
- SIGKILL (no SIGTERM write-back), restart on the same --cache-dir: a new
  question about the document finds all of it on disk (its whole pages by
  hash, its last tokens in request 1's page, found by parent), and gives
  the greedy output a fresh server gives; request 1 again finds the
  document and gives exactly the output it gave cold; the one-off prompt is
  computed again (nothing of it was on disk);
- with --no-write-behind the same SIGKILL loses the document (what the
  option costs, and that the first part is the write-behind's doing).

usage: test_write_behind.py CAIRN_BIN [unittest args...]
  runs on CAIRN_CHAT_MODEL (skips, 77, when that file is absent)
"""
import json
import os
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import HANG_GUARD_S  # noqa: E402
from metrics import parse_metrics  # noqa: E402

(CAIRN,) = harness.take_argv("CAIRN_BIN", usage=__doc__)
CHAT_MODEL = os.environ.get("CAIRN_CHAT_MODEL", "")
PAGE = 16  # tokens per page (the default --page-size)

TOPICS = ["scheduler", "page pool", "radix tree", "disk tier", "tokenizer", "sampler",
          "HTTP facade", "session table", "cost model", "copy queue", "router", "grammar"]
VERBS = ["admits", "evicts", "verifies", "batches", "streams", "promotes", "records", "splits"]
THINGS = ["requests", "pages", "prefixes", "tokens", "sessions", "events", "records", "replies"]


def document(n_paragraphs):
    """A deterministic technical text, varied enough not to compress into a
    few tokens (about 60 tokens a paragraph)."""
    out = []
    for i in range(n_paragraphs):
        t, v, w = TOPICS[i % len(TOPICS)], VERBS[(i * 3) % len(VERBS)], THINGS[(i * 5) % len(THINGS)]
        out.append("Section %d. The %s %s %s in order %d; when a step of %d ms ends, it "
                   "checks the %s of queue %d and writes a note to log file %d, unless the "
                   "operator set flag %s-%d to off." % (i + 1, t, v, w, i * 7 % 13, 10 + i,
                                                     THINGS[i % len(THINGS)], i % 5, i,
                                                     t.split()[0], i))
    return "\n".join(out)


DOC = document(26)
Q1 = "\n\nQuestion: What does the scheduler do in section 1?\nAnswer:"
Q2 = "\n\nQuestion: Which flag turns the disk tier off?\nAnswer:"
Q3 = "\n\nQuestion: How often is queue 3 checked?\nAnswer:"
ONE_OFF = ("A one-off note about gardening, never asked twice: tomatoes want sun, "
           "basil wants water, and the compost heap wants patience. ") * 6


def post(srv, path, body):
    req = urllib.request.Request(srv.http_url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=HANG_GUARD_S) as f:
        return json.load(f)


def complete(srv, prompt, n):
    r = post(srv, "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0})
    return r["choices"][0]["text"], r["usage"]["prompt_tokens_details"]["cached_tokens"]


def tokens(srv, text):
    return post(srv, "/tokenize", {"content": text})["tokens"]


def metrics(srv):
    with urllib.request.urlopen(srv.http_url + "/metrics", timeout=HANG_GUARD_S) as f:
        return parse_metrics(f.read().decode())[0]


class WriteBehind(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(CHAT_MODEL):
            raise unittest.SkipTest("CAIRN_CHAT_MODEL (%s) is absent; scripts/get-model "
                                    "fetches it" % (CHAT_MODEL or "unset"))

    def start(self, scratch, *extra, cache_dir="kv"):
        return scratch.start(CAIRN, ["-m", CHAT_MODEL, "-c", "2048", "--kv-mem", "128M",
                                     "--cache-dir", scratch.path(cache_dir), *extra], http=True)

    def shared_pages(self, srv):
        """Whole pages the two document requests share."""
        a, b = tokens(srv, DOC + Q1), tokens(srv, DOC + Q2)
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        self.assertGreaterEqual(n, 1400, "the document should be ~1.5k tokens")
        return n, n // PAGE

    def test_reused_prefix_survives_sigkill(self):
        with harness.Scratch() as scratch:
            srv = self.start(scratch)
            n_doc, doc_pages = self.shared_pages(srv)
            cold, cached = complete(srv, DOC + Q1, 24)
            self.assertEqual(cached, 0)
            _, cached = complete(srv, DOC + Q2, 4)  # the reuse
            self.assertGreaterEqual(cached, doc_pages * PAGE)

            # Wait for the write-behind to commit the document's pages.
            def done(m):
                pages = m.get("cairn_kv_write_behind_pages_total", 0)
                return (pages >= doc_pages and m.get("cairn_kv_write_behind_waiting", 1) == 0
                        and pages == m.get("cairn_kv_write_behind_queued_pages_total"))
            m = harness.poll(lambda: metrics(srv), done, guard=120)
            self.assertTrue(done(m), "the reused document was not written behind: %s" %
                            {k: v for k, v in m.items() if "behind" in k or "disk" in k})
            written = m["cairn_kv_write_behind_pages_total"]
            # the reused prefix, and the page of request 1 that request 2's
            # match ended in (the document's last tokens, found again by its
            # parent after a restart), not request 1's rest
            self.assertEqual(written, doc_pages + (1 if n_doc % PAGE else 0))
            on_disk = m['cairn_kv_pages_used{tier="disk"}']
            self.assertEqual(on_disk, written)

            # A prompt used once is not written.
            _, cached = complete(srv, ONE_OFF, 4)
            self.assertEqual(cached, 0)
            m = metrics(srv)
            self.assertEqual(m["cairn_kv_write_behind_queued_pages_total"], written)
            self.assertEqual(m['cairn_kv_pages_used{tier="disk"}'], on_disk)

            srv = scratch.track(srv.restart(kill=True))
            _, cached = complete(srv, ONE_OFF, 4)
            self.assertEqual(cached, 0, "a one-off prompt came back from disk")
            # A new question: the document's whole pages by hash, its last
            # tokens from request 1's page found by its parent. Nothing of
            # the document is computed again.
            q3, cached = complete(srv, DOC + Q3, 24)
            self.assertGreaterEqual(cached, n_doc, "the document's last page was not found")
            again, cached = complete(srv, DOC + Q1, 24)
            self.assertGreaterEqual(cached, n_doc,
                                    "the reused document did not come back from disk")
            self.assertEqual(again, cold, "output after a restart from disk pages differs")
            fresh = self.start(scratch, cache_dir="kv-fresh")
            q3_cold, cached = complete(fresh, DOC + Q3, 24)
            self.assertEqual(cached, 0)
            self.assertEqual(q3, q3_cold, "rows found by parent gave other tokens")

    def test_no_write_behind_loses_it(self):
        with harness.Scratch() as scratch:
            srv = self.start(scratch, "--no-write-behind")
            complete(srv, DOC + Q1, 1)
            _, cached = complete(srv, DOC + Q2, 1)
            self.assertGreater(cached, 0)
            m = metrics(srv)
            self.assertEqual(m.get("cairn_kv_write_behind_queued_pages_total", 0), 0)
            srv = scratch.track(srv.restart(kill=True))
            _, cached = complete(srv, DOC + Q1, 1)
            self.assertEqual(cached, 0)


if __name__ == "__main__":
    harness.main()
