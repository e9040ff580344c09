#!/usr/bin/env python3
"""The quantized KV types (`--kv-type q8_0|q4_0|bf16`, kernels/backend.h
"KV types") through a real server on the real model (Qwen2.5-Coder-0.5B,
head_dim 64; the bundled model's head_dim of 8 is no multiple of the blocks'
32, which the server must refuse with a clear error).

usage: test_kv_types.py CAIRN_BIN MODEL CHAT_MODEL [unittest args...]

  - a server with --kv-type q8_0 (and q4_0, bf16) restarts from disk as f16
    does: after SIGTERM the prompt's pages come back from LMDB and the
    output is the cold run's, token for token;
  - a store written with one KV type is never read by another (its pages
    have another namespace), and is still there for the first one after;
  - server.info says which KV type runs.
Greedy throughout; no timing thresholds.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S, STOP_GUARD_S, WORDS  # noqa: E402

CAIRN, MODEL, CHAT_MODEL = harness.take_argv("CAIRN_BIN", "MODEL", "CHAT_MODEL", usage=__doc__)
HAVE_CHAT = os.path.exists(CHAT_MODEL)
harness.configure(CAIRN, CHAT_MODEL)
CTX = 1024
USAGE_TIERS = ("device", "host", "disk", "shared")
PROMPT = " ".join(WORDS[:260])  # about 300 tokens: many whole pages


@unittest.skipUnless(HAVE_CHAT, f"the real model ({CHAT_MODEL}) is absent: scripts/get-model")
class KvTypes(harness.ServerCase):
    TMP_PREFIX = "cairn-kvtypes-"

    def serve(self, kv, cache_dir):
        args = ["-c", str(CTX), "--kv-type", kv]
        if cache_dir:
            args += ["--cache-dir", cache_dir]
        return super().start(*args, model=CHAT_MODEL)

    def gen(self, srv, n=12):
        with srv.client(timeout=HANG_GUARD_S) as c:
            return c.generate(prompt=PROMPT, max_tokens=n, temperature=0)

    def restart(self, srv, kv, cache_dir):
        self.assertEqual(srv.stop(STOP_GUARD_S), 0, srv.log())
        return self.serve(kv, cache_dir)

    def test_quantized_restart_from_disk_and_namespaces(self):
        for kv in ("q8_0", "q4_0", "bf16"):
            with self.subTest(kv=kv):
                cache = os.path.join(self.tmp, "cache-" + kv)
                srv = self.serve(kv, cache)
                with srv.client(timeout=HANG_GUARD_S) as c:
                    self.assertEqual(c.info().get("kv_type"), kv)
                cold = self.gen(srv)
                self.assertEqual(cold.usage.cached_tokens, 0)
                # the same type without any cache: the same tokens
                fresh = self.serve(kv, None)
                self.assertEqual(self.gen(fresh).tokens, cold.tokens)
                fresh.kill()

                srv = self.restart(srv, kv, cache)
                r = self.gen(srv)
                disk = r.usage.cached_tokens_by_tier["disk"]
                self.assertGreaterEqual(disk, 0.8 * r.usage.prompt_tokens, r.raw["usage"])
                self.assertEqual(r.tokens, cold.tokens, "a restart from disk changed the output")

                # f16 over the same store reads none of it ...
                srv = self.restart(srv, "f16", cache)
                r = self.gen(srv)
                self.assertEqual(r.usage.cached_tokens_by_tier, {t: 0 for t in USAGE_TIERS},
                                 r.raw["usage"])
                # ... and the q-type's pages are still there for it
                srv = self.restart(srv, kv, cache)
                r = self.gen(srv)
                self.assertGreaterEqual(r.usage.cached_tokens_by_tier["disk"],
                                        0.8 * r.usage.prompt_tokens, r.raw["usage"])
                self.assertEqual(r.tokens, cold.tokens)
                srv.kill()


class Refusal(harness.ServerCase):
    def test_block_type_on_a_model_it_does_not_fit(self):
        # the bundled model has head_dim 8: q8_0 cannot hold it
        import subprocess
        p = subprocess.run([CAIRN, "serve", "-m", MODEL, "--kv-type", "q8_0", "--port", "0"],
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("does not fit this model", p.stderr)


if __name__ == "__main__":
    harness.main()
