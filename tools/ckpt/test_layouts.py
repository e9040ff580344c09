#!/usr/bin/env python3
"""Self-test of the packing and number formats in quantize_hf.py / ckpt_io.py against slow,
literal element-by-element restatements of the published layouts (small random matrices).

    python3 tools/ckpt/test_layouts.py        # exits non-zero on any mismatch

The vectorised writers are checked against loops written the way the formats are described
(AutoAWQ's pack loop with order_map, AutoGPTQ's row-by-row pack with zeros - 1), the E4M3FN
encoder against a brute-force nearest-value search with ties to even, the BF16 rounding against
exact rational arithmetic, and the safetensors writer against the safetensors package when it is
installed.
"""

import os
import sys
import tempfile
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_io  # noqa: E402
import quantize_hf as qh  # noqa: E402

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL", what)


def awq_literal(c, out_f, in_f, g):
    q, z, s = c["q"], c["z"], c["s"]           # q [in, out], z [in/g, out]
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    qw = np.zeros((in_f, out_f // 8), dtype=np.uint32)
    qz = np.zeros((in_f // g, out_f // 8), dtype=np.uint32)
    for col in range(out_f // 8):
        for i in range(8):
            qw[:, col] |= q[:, col * 8 + order_map[i]].astype(np.uint32) << (i * 4)
            qz[:, col] |= z[:, col * 8 + order_map[i]].astype(np.uint32) << (i * 4)
    w = np.zeros((out_f, in_f), dtype=np.float32)
    for o in range(out_f):
        for i in range(in_f):
            w[o, i] = (float(q[i, o]) - float(z[i // g, o])) * float(s[i // g, o])
    return qw.view(np.int32), qz.view(np.int32), w


def gptq_literal(c, out_f, in_f):
    q, z, s, gi = c["q"], c["z"], c["s"], c["g_idx"]
    qw = np.zeros((in_f // 8, out_f), dtype=np.uint32)
    row, i = 0, 0
    while row < qw.shape[0]:
        for j in range(i, i + 8):
            qw[row] |= q[j].astype(np.uint32) << (4 * (j - i))
        i += 8
        row += 1
    zm1 = (z.astype(np.int64) - 1).astype(np.uint32)
    qz = np.zeros((z.shape[0], out_f // 8), dtype=np.uint32)
    col, i = 0, 0
    while col < qz.shape[1]:
        for j in range(i, i + 8):
            qz[:, col] |= zm1[:, j] << (4 * (j - i))
        i += 8
        col += 1
    w = np.zeros((out_f, in_f), dtype=np.float32)
    for o in range(out_f):
        for k in range(in_f):
            w[o, k] = (float(q[k, o]) - float(z[gi[k], o])) * float(s[gi[k], o])
    return qw.view(np.int32), qz.view(np.int32), w


def bf16_exact(x):
    """nearest BF16 to float32 x, ties to even, by rational arithmetic"""
    fx = Fraction(float(x))
    if fx == 0:
        return 0.0
    m, e = np.frexp(abs(float(x)))       # |x| = m * 2^e, m in [0.5, 1)
    q = Fraction(2) ** (int(e) - 8)      # BF16 keeps 8 significant bits
    n = abs(fx) / q
    r = int(n)
    frac = n - r
    if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and r % 2 == 1):
        r += 1
    v = float(r * q)
    return -v if x < 0 else v


def e4m3_brute(v):
    a = min(abs(float(v)), 448.0)
    vals = ckpt_io.E4M3_POS[:127].astype(np.float64)
    d = np.abs(vals - a)
    best = np.flatnonzero(d == d.min())
    code = int(best[0]) if len(best) == 1 else int([b for b in best if b % 2 == 0][0])
    if np.signbit(v):
        code |= 0x80
    return code


def main():
    rng = np.random.default_rng(1)
    out_f, in_f = 24, 64
    w = (rng.standard_normal((out_f, in_f)) * 0.05).astype(np.float32)
    w[3, :16] = 0.0                                  # an all-zero group
    w[5, 16:32] = np.abs(w[5, 16:32])                # a group with min > 0

    for g in (16, 32):
        c = qh.quant_awq(w, g)
        ts = {n: a for n, _, _, a in qh.tensors_of(type("A", (), {"method": "awq"}), "x", c)}
        lw, lz, ld = awq_literal(c, out_f, in_f, g)
        check(np.array_equal(ts["x.qweight"], lw), f"awq g{g} qweight")
        check(np.array_equal(ts["x.qzeros"], lz), f"awq g{g} qzeros")
        check(np.array_equal(qh.dequant_awq(c), ld), f"awq g{g} dequant")
        check(ts["x.qweight"].shape == (in_f, out_f // 8) and ts["x.scales"].shape == (in_f // g, out_f),
              f"awq g{g} shapes")

    for g, sym, act in ((16, True, False), (32, False, True), (-1, True, True), (-1, False, False)):
        c = qh.quant_gptq(w, g, sym, act)
        ts = {n: a for n, _, _, a in qh.tensors_of(type("A", (), {"method": "gptq"}), "x", c)}
        lw, lz, ld = gptq_literal(c, out_f, in_f)
        tag = f"gptq g{g} sym={sym} act={act}"
        check(np.array_equal(ts["x.qweight"], lw), tag + " qweight")
        check(np.array_equal(ts["x.qzeros"], lz), tag + " qzeros")
        check(np.array_equal(qh.dequant_gptq(c), ld), tag + " dequant")
        gs = in_f if g == -1 else g
        check(ts["x.scales"].shape == (in_f // gs, out_f) and ts["x.g_idx"].shape == (in_f,), tag + " shapes")
        if sym:
            check(np.all(ts["x.qzeros"].view(np.uint32) == 0x77777777), tag + " sym zeros stored as 7")
        if act and g != -1:
            norms = np.linalg.norm(w.astype(np.float64), axis=0)
            order = np.argsort(-norms, kind="stable")
            check(np.array_equal(c["g_idx"][order], np.arange(in_f) // gs), tag + " g_idx by rank")
            check(not np.array_equal(c["g_idx"], np.arange(in_f) // gs), tag + " g_idx permuted")
        # groups must bound the error: |w - dq| <= s/2 inside the clamp range
        err = np.abs(qh.dequant_gptq(c) - w)
        s = c["s"].astype(np.float32)[c["g_idx"]].T
        # (s is rounded to F16, so the top of the range, x/s = 7.5, may round past the clamp:
        # allow 7.5 * 2^-11 relative slack there)
        check(np.all(err <= s * (0.5 + 7.5 * 2.0 ** -11) + 1e-9) or not sym, tag + " error bound")

    # E4M3FN
    check(ckpt_io.E4M3_POS[0x7E] == 448 and ckpt_io.E4M3_POS[0x08] == 2.0 ** -6
          and ckpt_io.E4M3_POS[0x01] == 2.0 ** -9 and np.isnan(ckpt_io.E4M3_POS[0x7F]), "e4m3 table")
    vals = ckpt_io.E4M3_POS[:127].astype(np.float64)
    mids = (vals[:-1] + vals[1:]) / 2                   # exact ties
    xs = np.concatenate([rng.standard_normal(3000) * 50, rng.standard_normal(1000) * 0.01,
                         mids, -mids, vals, [500.0, -1e6, 0.0, -0.0, 1e-9]]).astype(np.float32)
    got = ckpt_io.f32_to_e4m3(xs)
    want = np.array([e4m3_brute(v) for v in xs], dtype=np.uint8)
    check(np.array_equal(got, want), f"e4m3 encode ({int(np.sum(got != want))} differ)")
    finite = np.arange(256, dtype=np.uint8)[(np.arange(256) & 0x7F) != 0x7F]
    check(np.array_equal(ckpt_io.f32_to_e4m3(ckpt_io.e4m3_to_f32(finite)), finite),
          "e4m3 round trip of all finite codes")

    # BF16
    xs = np.concatenate([rng.standard_normal(2000).astype(np.float32),
                         (1 + np.arange(1, 300) * 2.0 ** -9).astype(np.float32)])
    got = ckpt_io.bf16_bits_to_f32(ckpt_io.f32_to_bf16_bits(xs))
    want = np.array([bf16_exact(x) for x in xs], dtype=np.float32)
    check(np.array_equal(got, want), "bf16 rounding")

    # safetensors writer vs the safetensors package
    try:
        from safetensors import safe_open
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "t.safetensors")
            ckpt_io.write_safetensors(p, [("a", "F32", (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)),
                                          ("b", "BF16", (5,), np.arange(5, dtype=np.uint16)),
                                          ("c", "I32", (3,), np.array([1, -2, 3], dtype=np.int32))])
            with safe_open(p, "numpy") as f:
                check(sorted(f.keys()) == ["a", "b", "c"], "safetensors keys")
                check(np.array_equal(f.get_tensor("a"), np.arange(6, dtype=np.float32).reshape(2, 3)), "st a")
                check(np.array_equal(f.get_tensor("c"), [1, -2, 3]), "st c")
                check(f.get_slice("b").get_dtype() == "BF16" and f.metadata() == {"format": "pt"}, "st b")
    except ImportError:
        print("safetensors package not installed: writer cross-check skipped")

    n = 1 if not FAILS else 0
    print(f"{'all layout checks passed' if not FAILS else str(len(FAILS)) + ' layout checks failed'}")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
