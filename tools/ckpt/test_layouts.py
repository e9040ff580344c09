#!/usr/bin/env python3
"""Self-test of the packing and number formats in quantize_hf.py / ckpt_io.py against slow,
literal element-by-element restatements of the published layouts (small random matrices).

    python3 tools/ckpt/test_layouts.py        # exits non-zero on any mismatch

The vectorised writers are checked against loops written the way the formats are described
(AutoAWQ's pack loop with order_map, AutoGPTQ's row-by-row pack with zeros - 1), the E4M3FN
encoder against a brute-force nearest-value search with ties to even, the BF16 rounding against
exact rational arithmetic, the safetensors writer against the safetensors package when it is
installed, and gguf_to_hf.py's gpt-oss experts (when the gguf package is there) against
transformers' reading of them: MXFP4 blocks decoded with byte b holding elements 2b (low nibble)
and 2b+1 (high), gate the even rows of gate_up and up the odd ones, the BF16 form input-major.
"""

import os
import subprocess
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


# E2M1, as transformers' FP4_VALUES lists the 16 codes
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def hf_mxfp4_literal(blocks, scales):
    """transformers' decode of MXFP4 experts: [E, rows, n/32, 16] bytes and [E, rows, n/32]
    E8M0 scales -> float [E, rows, n]; byte b of a block is elements 2b (low nibble), 2b+1."""
    E, rows, nb, _ = blocks.shape
    out = np.zeros((E, rows, nb * 32), dtype=np.float64)
    for e in range(E):
        for r in range(rows):
            for k in range(nb):
                m = 2.0 ** (int(scales[e, r, k]) - 127)
                for b in range(16):
                    q = int(blocks[e, r, k, b])
                    out[e, r, k * 32 + 2 * b] = FP4[q & 15] * m
                    out[e, r, k * 32 + 2 * b + 1] = FP4[q >> 4] * m
    return out


def gguf_mxfp4_literal(raw, rows, n):
    """GGUF's MXFP4 (common.h): 17-byte blocks {e, qs[16]}, element j < 16 the low nibble of
    qs[j], j >= 16 the high nibble of qs[j - 16], times 2^(e - 127) -> float [E, rows, n]."""
    blocks = raw.reshape(-1, rows, n // 32, 17)
    out = np.zeros((blocks.shape[0], rows, n), dtype=np.float64)
    for e in range(blocks.shape[0]):
        for r in range(rows):
            for k in range(n // 32):
                m = 2.0 ** (int(blocks[e, r, k, 0]) - 127)
                for j in range(32):
                    q = int(blocks[e, r, k, 1 + j % 16])
                    out[e, r, k * 32 + j] = FP4[(q & 15) if j < 16 else (q >> 4)] * m
    return out


def check_gptoss_experts():
    """gguf_to_hf.py's gpt-oss experts read back the way transformers reads them."""
    try:
        import gguf_to_hf as g2h
        from gguf import GGUFReader
    except ImportError:
        print("gguf package not installed: gpt-oss expert layout check skipped")
        return
    gen = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gen_synthetic_model.py")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "oss.gguf")
        subprocess.run([sys.executable, gen, "--shape", "tiny", "--type", "F32",
                        "--arch", "gpt-oss", "--layers", "1", "--experts", "3",
                        "--expert-ffn", "64", "--expert-type", "MXFP4", "-o", path],
                       check=True, capture_output=True)
        r = GGUFReader(path)
        t = {x.name: x for x in r.tensors}
        E, dim, eff = 3, 128, 64
        gate = gguf_mxfp4_literal(np.asarray(t["blk.0.ffn_gate_exps.weight"].data), eff, dim)
        up = gguf_mxfp4_literal(np.asarray(t["blk.0.ffn_up_exps.weight"].data), eff, dim)
        down = gguf_mxfp4_literal(np.asarray(t["blk.0.ffn_down_exps.weight"].data), dim, eff)
        check(np.array_equal(gate.astype(np.float32).reshape(-1, dim),
                             g2h.dequantize(np.asarray(t["blk.0.ffn_gate_exps.weight"].data)
                                            .reshape(-1, dim // 32 * 17),
                                            g2h.gguf.GGMLQuantizationType.MXFP4)),
              "gguf MXFP4 restatement agrees with gguf-py")
        bias = {k: np.asarray(t[f"blk.0.ffn_{k}_exps.bias"].data, dtype=np.float32)
                for k in ("gate", "up", "down")}
        bf = lambda a: ckpt_io.bf16_bits_to_f32(ckpt_io.f32_to_bf16_bits(a))  # noqa: E731
        for bf16 in (False, True):
            ex = g2h.gptoss_experts(r, bf16)
            hf = {n: a for parts, _ in ex.values() for n, a in parts}
            pre = "model.layers.0.mlp.experts."
            tag = "gpt-oss " + ("bf16" if bf16 else "mxfp4")
            if bf16:
                gu = ckpt_io.bf16_bits_to_f32(hf[pre + "gate_up_proj"])       # [E, dim, 2 eff]
                dn = ckpt_io.bf16_bits_to_f32(hf[pre + "down_proj"])          # [E, eff, dim]
                check(gu.shape == (E, dim, 2 * eff) and dn.shape == (E, eff, dim), tag + " shapes")
                gu, dn = gu.transpose(0, 2, 1), dn.transpose(0, 2, 1)       # x @ W -> [out, in]
            else:
                gu = hf_mxfp4_literal(hf[pre + "gate_up_proj_blocks"],
                                      hf[pre + "gate_up_proj_scales"])
                dn = hf_mxfp4_literal(hf[pre + "down_proj_blocks"], hf[pre + "down_proj_scales"])
            check(np.array_equal(gu[:, 0::2], gate) and np.array_equal(gu[:, 1::2], up),
                  tag + " gate_up: gate even rows, up odd rows")
            check(np.array_equal(dn, down), tag + " down_proj")
            gub = ckpt_io.bf16_bits_to_f32(hf[pre + "gate_up_proj_bias"])
            check(np.array_equal(gub[:, 0::2], bf(bias["gate"])) and
                  np.array_equal(gub[:, 1::2], bf(bias["up"])), tag + " gate_up_proj_bias")
            check(np.array_equal(ckpt_io.bf16_bits_to_f32(hf[pre + "down_proj_bias"]),
                                 bf(bias["down"])), tag + " down_proj_bias")


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

    check_gptoss_experts()

    n = 1 if not FAILS else 0
    print(f"{'all layout checks passed' if not FAILS else str(len(FAILS)) + ' layout checks failed'}")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
