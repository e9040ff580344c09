#!/usr/bin/env python3
"""Same request, same tokens: a greedy request gives the same tokens alone
or among 16 concurrent ones, with its prefix computed now or taken from
tier 0, from part of a page, from host RAM, or from disk after a restart, with any
--prefill-chunk and with 1 or 2 threads. Run on the bundled model, on a
synthetic Gemma 3 with sliding-window layers (InvarianceWindow), on a
synthetic mixture of experts (InvarianceExperts) and, when
it is present (scripts/get-model), on the real quantized one; the real-model
class is skipped with a message otherwise.

usage: test_invariance.py CAIRN_BIN MODEL [REAL_MODEL] [unittest args...]
(ctest runs the bundled model's class as server_invariance and the real
model's as server_invariance_real, labelled realmodel: the sanitizer runs
leave it out.)

There are no timing thresholds; waits only guard against hangs.
"""
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import STORIES  # noqa: E402

CAIRN, MODEL = harness.take_argv("CAIRN_BIN", "MODEL", usage=__doc__)
REAL = sys.argv.pop(1) if len(sys.argv) > 1 and sys.argv[1].endswith(".gguf") else ""
harness.configure(CAIRN, MODEL)
GEN = 16


def prompts(n):
    """n prompts that share prefixes in several ways: a common document
    with different questions (some pages shared, then part of a page), and
    unrelated short ones."""
    doc = " ".join(STORIES.split()[:150])
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(doc + f"\nQuestion {i}: what happened to {harness.WORDS[40 + i]}?\nAnswer:")
        else:
            out.append(" ".join(harness.WORDS[300 + 13 * i:300 + 13 * i + 9 + i]))
    return out


class Invariance(harness.ServerCase):
    TMP_PREFIX = "cairn-inv-"
    MODEL_PATH = MODEL
    SMALL_KV = "400K"  # ~40 pages of the bundled model: less than 16 prompts need

    def serve(self, *extra):
        return self.start(*extra, model=self.MODEL_PATH)

    def greedy(self, c, p):
        r = c.generate(prompt=p, max_tokens=GEN, temperature=0)
        return r.tokens

    def alone(self, ps, *extra):
        """Each prompt on a fresh server of its own: nothing cached, nothing
        else in the batch."""
        out = []
        for p in ps:
            srv = self.serve(*extra)
            out.append(self.greedy(self.client(srv), p))
            srv.stop()
        return out

    def replay(self, c, ps, want, tier, what):
        """Each prompt once more, one by one, against `want`; how many of
        their cached tokens `tier` served."""
        served = 0
        for i, p in enumerate(ps):
            r = c.generate(prompt=p, max_tokens=GEN, temperature=0)
            self.assertEqual(r.tokens, want[i], f"prompt {i}: {what} != alone")
            served += r.usage.cached_tokens_by_tier.get(tier, 0)
        return served

    def concurrent(self, srv, ps):
        out = [None] * len(ps)
        clients = [self.client(srv) for _ in ps]
        go = threading.Barrier(len(ps))

        def one(i):
            go.wait()
            out[i] = self.greedy(clients[i], ps[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def test_batch_cache_tiers_chunks_threads(self):
        ps = prompts(16)
        want = self.alone(ps)
        # 16 at once on one server: batched, waiting for shared prefixes,
        # partial pages copied from one another
        cache_dir = os.path.join(self.tmp, "cache")
        srv = self.serve("--cache-dir", cache_dir, "--tier-loads", "always")
        got = self.concurrent(srv, ps)
        for i in range(len(ps)):
            self.assertEqual(got[i], want[i], f"prompt {i}: concurrent != alone")
        # again, one by one: every prefix now from tier 0 (and tails)
        c = self.client(srv)
        for i, p in enumerate(ps):
            self.assertEqual(self.greedy(c, p), want[i], f"prompt {i}: from tier 0 != alone")
        srv.stop()
        # a tier 0 too small for all of them: the second pass finds the
        # first pass's prefixes in host RAM
        srv = self.serve("--kv-mem", self.SMALL_KV, "--host-mem", "256M", "--cache-dir",
                         os.path.join(self.tmp, "host"), "--tier-loads", "always")
        c = self.client(srv)
        from_host = sum(self.replay(c, ps, want, "host", f"pass {k}") for k in range(2))
        self.assertGreater(from_host, 0, "no prefix came from host RAM: the check means nothing")
        srv.stop()
        srv = self.serve("--cache-dir", cache_dir, "--tier-loads", "always")
        # after a restart the tree is empty: prefixes come from disk
        from_disk = self.replay(self.client(srv), ps, want, "disk", "from disk")
        self.assertGreater(from_disk, 0, "no prefix came from disk: the check means nothing")
        srv.stop()
        # chunk sizes and thread counts
        for extra in (["--prefill-chunk", "16"], ["--prefill-chunk", "64"],
                      ["--prefill-chunk", "512"], ["-t", "1"], ["-t", "2"]):
            srv = self.serve(*extra)
            got = self.concurrent(srv, ps[:8])
            for i in range(8):
                self.assertEqual(got[i], want[i], f"prompt {i} with {extra} != alone")
            srv.stop()


class InvarianceWindow(Invariance):
    """The same on a model with sliding-window layers (MODEL is then a
    synthetic Gemma 3 whose window is far shorter than the shared document):
    ctest's server_invariance_window-gemma3."""
    SMALL_KV = "1000K"  # ~40 pages of it (24 KiB a page), as the bundled model has


class InvarianceExperts(Invariance):
    """The same on a mixture of experts (MODEL a synthetic qwen3moe or
    gpt-oss, 8 experts of which 2 run per token): a token's experts and
    their order of summation never depend on the batch. ctest's
    server_invariance_experts-qwen3moe and server_invariance_gptoss (whose
    attention sinks, alternating windows and MXFP4 experts ride along)."""
    SMALL_KV = "1300K"  # ~40 pages of it (32 KiB a page)


@unittest.skipUnless(REAL and os.path.exists(REAL),
                     "the real model is not here (scripts/get-model fetches it)")
class InvarianceRealModel(Invariance):
    MODEL_PATH = REAL
    SMALL_KV = "4M"  # ~20 pages of Qwen2.5-0.5B (192 KiB a page)


if __name__ == "__main__":
    if "InvarianceRealModel" in sys.argv[1:] and not (REAL and os.path.exists(REAL)):
        print("skipped: the real model is not here (scripts/get-model fetches it)")
        sys.exit(77)  # ctest's SKIP_RETURN_CODE
    harness.main()
