#!/usr/bin/env python3
"""CLI contract tests for the `cairn` executable (real binary, real model).

usage: test_cli.py CAIRN_BIN MODEL REF_SCRIPT TEXT_FILE [unittest args...]
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import harness  # noqa: E402
from harness import HANG_GUARD_S  # noqa: E402

CAIRN, MODEL, REF, TEXT = harness.take_argv("CAIRN_BIN", "MODEL", "REF_SCRIPT", "TEXT_FILE",
                                            usage=__doc__)

GREEDY_IDS = [432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
              410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394]
GREEDY_TEXT = (", there was a little girl named Lily. She loved to play outside in the park. "
               "One day, she saw")


def cairn(*args, stdin=None):
    return subprocess.run([CAIRN, *args], input=stdin, capture_output=True, timeout=HANG_GUARD_S)


class Run(unittest.TestCase):
    def test_greedy_continuation_text_and_ids(self):
        r = cairn("run", "-m", MODEL, "-p", "Once upon a time", "-n", "32", "--temp", "0", "-v")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        # only the continuation on stdout: no prompt echo, no diagnostics
        self.assertEqual(r.stdout.decode(), GREEDY_TEXT + "\n")
        ids = [int(x) for x in re.findall(r"\[(\d+)\]", r.stderr.decode())]
        self.assertEqual(ids, GREEDY_IDS)

    def test_f32_kv_and_small_pages_same_output(self):
        r = cairn("run", "-m", MODEL, "-p", "Once upon a time", "-n", "32", "--temp", "0",
                  "--kv-type", "f32", "--page-size", "5", "-b", "3", "-t", "1")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(r.stdout.decode(), GREEDY_TEXT + "\n")

    def test_seed_reproducible(self):
        args = ("run", "-m", MODEL, "-p", "The cat", "-n", "40", "--temp", "0.9", "--seed", "7")
        a, b = cairn(*args), cairn(*args)
        self.assertEqual(a.returncode, 0, a.stderr.decode())
        self.assertEqual(a.stdout, b.stdout)
        self.assertTrue(len(a.stdout.strip()) > 0)

    def test_missing_prompt_and_bad_values(self):
        self.assertEqual(cairn("run", "-m", MODEL).returncode, 2)
        self.assertEqual(cairn("run", "-m", MODEL, "-p", "x", "--temp", "abc").returncode, 2)
        self.assertEqual(cairn("run", "-m", MODEL, "-p", "x", "--kv-type", "q9").returncode, 2)

    def test_missing_and_corrupt_model(self):
        r = cairn("run", "-m", "/nonexistent.gguf", "-p", "hi")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("nonexistent", r.stderr.decode())
        with open(MODEL, "rb") as f:
            data = f.read()
        with tempfile.NamedTemporaryFile(suffix=".gguf") as t:
            t.write(data[: len(data) // 3])
            t.flush()
            r = cairn("run", "-m", t.name, "-p", "hi")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("cannot load model", r.stderr.decode())
            self.assertEqual(r.stdout, b"")


class Tokenize(unittest.TestCase):
    def test_ids(self):
        r = cairn("tokenize", "-m", MODEL, stdin=b"Once upon a time")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(r.stdout.decode().strip(), "1 403 407 261 378")
        r = cairn("tokenize", "-m", MODEL, "--no-bos", stdin=b"Once upon a time")
        self.assertEqual(r.stdout.decode().strip(), "403 407 261 378")

    def test_special_tokens_only_when_asked(self):
        plain = cairn("tokenize", "-m", MODEL, "--no-bos", stdin=b"<s>hi").stdout.split()
        special = cairn("tokenize", "-m", MODEL, "--no-bos", "--parse-special",
                        stdin=b"<s>hi").stdout.split()
        self.assertNotIn(b"1", plain)
        self.assertEqual(special[0], b"1")

    def test_added_marker_tokens_only_when_asked(self):
        # Phi-3's file types </s> (id 2) as an added token, not a control one;
        # plain text must still not produce it (docs/security.md).
        phi3 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizer",
                            "ggml-vocab-phi-3.gguf")
        plain = cairn("tokenize", "-m", phi3, "--no-bos", stdin=b"ok</s><|user|>x")
        self.assertEqual(plain.returncode, 0, plain.stderr.decode())
        ids = plain.stdout.split()
        self.assertNotIn(b"2", ids)
        self.assertNotIn(b"32010", ids)
        special = cairn("tokenize", "-m", phi3, "--no-bos", "--parse-special",
                        stdin=b"ok</s><|user|>x").stdout.split()
        self.assertEqual(special[1:3], [b"2", b"32010"])


class Help(unittest.TestCase):
    def test_help_everywhere(self):
        for cmd in ([], ["run"], ["tokenize"], ["perplexity"], ["bench"]):
            r = cairn(*cmd, "--help")
            self.assertEqual(r.returncode, 0, cmd)
            self.assertIn(b"usage", r.stdout)
        self.assertEqual(cairn("frobnicate").returncode, 2)


def bench_json(*args):
    r = cairn("bench", "-m", MODEL, *args, "--json")
    return r, (json.loads(r.stdout.decode().strip().splitlines()[-1]) if r.returncode == 0 else None)


def gguf_reader():
    try:
        import gguf
    except ImportError:
        raise unittest.SkipTest("the 'gguf' Python package is needed (scripts/setup.sh --test)")
    return gguf.GGUFReader(MODEL)


class Bench(unittest.TestCase):
    """`cairn bench -d`: context before the measured tests, and what one
    decode step reads counted against the measured read bandwidth."""

    def test_depth_bytes_per_token_and_bandwidth(self):
        r, j = bench_json("-p", "16", "-n", "8", "-d", "32", "-r", "1")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual((j["depth"], j["n_prompt"], j["n_gen"]), (32, 16, 8))
        self.assertGreater(j["pp"], 0)
        self.assertGreater(j["tg"], 0)

        # The weights one token reads: every tensor of the file but the
        # embedding table, of which one row (the file has its own output
        # head, so the table is not read whole).
        reader = gguf_reader()
        sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
        self.assertIn("output.weight", sizes)
        embd = sizes["token_embd.weight"]
        n_vocab = [int(t.shape[1]) for t in reader.tensors if t.name == "token_embd.weight"][0]
        self.assertEqual(n_vocab, j["n_vocab"])
        non_embd = sum(sizes.values()) - embd
        self.assertEqual(j["weight_bytes_per_token"], non_embd + embd // n_vocab)

        # K and V of every layer at the tg run's mean context: the token at
        # index 32 + i sees 33 + i keys, i = 0..7, a mean of 36.5; F16 KV.
        arch = "llama"
        n_kv_head = int(reader.fields[arch + ".attention.head_count_kv"].parts[-1][0])
        n_head = int(reader.fields[arch + ".attention.head_count"].parts[-1][0])
        head_dim = j["n_params_dim"] // n_head
        self.assertEqual(j["kv_mean_ctx"], 36.5)
        self.assertEqual(j["kv_bytes_per_token"], j["n_layer"] * 2 * n_kv_head * head_dim * 2 * 36.5)
        bpt = j["bytes_per_token"]
        self.assertEqual(bpt, j["weight_bytes_per_token"] + j["kv_bytes_per_token"])
        # The rule in one line: more than the non-embedding weights, less
        # than the whole file plus the KV.
        self.assertGreater(bpt, non_embd)
        self.assertLess(bpt, j["model_bytes"] + j["kv_bytes_per_token"])

        self.assertAlmostEqual(j["tg_gbps"], bpt * j["tg"] / 1e9, delta=j["tg_gbps"] * 1e-4)
        self.assertGreater(j["read_bw_gbps"], 0)
        self.assertGreaterEqual(j["read_bw_buffer_bytes"], 1 << 30)
        self.assertAlmostEqual(j["bw_fraction"], j["tg_gbps"] / j["read_bw_gbps"],
                               delta=j["bw_fraction"] * 1e-4)

    def test_table_names_the_depth(self):
        r = cairn("bench", "-m", MODEL, "-p", "16", "-n", "8", "-d", "32", "-r", "1",
                  "--no-bandwidth")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        out = r.stdout.decode()
        self.assertIn(" pp16 @ d32 ", out)
        self.assertIn(" tg8 @ d32 ", out)
        self.assertIn("read bandwidth: not measured (--no-bandwidth)", out)
        r, j = bench_json("-p", "16", "-n", "8", "-r", "1", "--no-bandwidth")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(j["depth"], 0)
        self.assertIsNone(j["read_bw_gbps"])
        self.assertIsNone(j["bw_fraction"])
        self.assertEqual(j["kv_mean_ctx"], 4.5)

    def test_depth_up_to_the_trained_context(self):
        n_ctx = int(gguf_reader().fields["llama.context_length"].parts[-1][0])
        # depth + the longest test exactly fills the trained context: runs
        r, j = bench_json("-p", "16", "-n", "8", "-d", str(n_ctx - 16), "-r", "1",
                          "--no-bandwidth")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(j["depth"], n_ctx - 16)
        # one position more: refused with the reason, not a crash
        r = cairn("bench", "-m", MODEL, "-p", "16", "-n", "8", "-d", str(n_ctx - 15), "-r", "1",
                  "--json")
        self.assertEqual(r.returncode, 1, r.stderr.decode())
        self.assertIn("more than the model's trained context of %d" % n_ctx, r.stderr.decode())
        self.assertEqual(r.stdout, b"")
        self.assertEqual(cairn("bench", "-m", MODEL, "-d", "-1").returncode, 2)


class Perplexity(unittest.TestCase):
    def test_matches_numpy_reference(self):
        """cairn's PPL equals the llama-perplexity formula applied to the
        independent numpy reference's logits on the same tokens."""
        ctx = 128
        r = cairn("perplexity", "-m", MODEL, "-f", TEXT, "-c", str(ctx), "--kv-type", "f32")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        last = r.stdout.decode().strip().splitlines()[-1]
        m = re.fullmatch(r"PPL = ([0-9.]+)", last)
        self.assertIsNotNone(m, last)
        ppl = float(m.group(1))

        with open(TEXT, "rb") as f:
            toks = [int(x) for x in cairn("tokenize", "-m", MODEL, stdin=f.read()).stdout.split()]
        n_chunk = len(toks) // ctx
        self.assertGreaterEqual(n_chunk, 2)
        first = ctx // 2
        nll, count = 0.0, 0
        with tempfile.TemporaryDirectory() as d:
            for c in range(n_chunk):
                chunk = toks[c * ctx:(c + 1) * ctx]
                chunk[0] = 1  # BOS
                out = os.path.join(d, "l.f32")
                subprocess.run([sys.executable, REF, MODEL, "--tokens",
                                ",".join(map(str, chunk)), "--out", out], check=True)
                logits = np.fromfile(out, dtype=np.float32).reshape(ctx, -1).astype(np.float64)
                for j in range(first, ctx - 1):
                    row = logits[j]
                    lse = row.max() + math.log(np.exp(row - row.max()).sum())
                    nll += lse - row[chunk[j + 1]]
                    count += 1
        want = math.exp(nll / count)
        self.assertAlmostEqual(ppl, want, delta=want * 2e-4 + 1e-4)

    def test_too_short(self):
        r = cairn("perplexity", "-m", MODEL, "-f", TEXT, "-c", "4096")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("need at least", r.stderr.decode())


if __name__ == "__main__":
    harness.main()
