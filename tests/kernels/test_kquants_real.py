#!/usr/bin/env python3
"""cairn's dequantizers against gguf-py's (an independent implementation).

usage: test_kquants_real.py KQUANTS_DEQUANT [MODEL]

1. Random blocks of Q5_0, Q4_K, Q5_K and Q6_K (random bytes, with the fp16
   scale fields set to finite values) must dequantize to the same floats.
2. When MODEL (the real Q4_K_M GGUF, CAIRN_CHAT_MODEL) exists: a few rows of
   each of its Q5_0, Q8_0, Q4_K and Q6_K tensors likewise.
The two implementations order a few float operations differently, so values
are compared with a tolerance of a few ulp of the largest term in an element
(scale * code and min), not bitwise.

Exits 77 (skipped) when numpy or gguf is missing; part 2 is skipped, with a
message, when the model file is absent.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(77)

T = gguf.GGMLQuantizationType
# (block elements, block bytes, byte offsets of fp16 fields)
LAYOUT = {
    T.Q5_0: (32, 22, [0]),
    T.Q8_0: (32, 34, [0]),
    T.Q4_K: (256, 144, [0, 2]),
    T.Q5_K: (256, 176, [0, 2]),
    T.Q6_K: (256, 210, [208]),
}


def cairn_dequant(tool, qtype, rows, n):
    """rows: uint8 array [n_rows, row_bytes] -> float32 [n_rows, n]."""
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        np.ascontiguousarray(rows, dtype=np.uint8).tofile(src)
        subprocess.run([tool, str(int(qtype)), str(n), src, dst], check=True)
        return np.fromfile(dst, dtype="<f4").reshape(rows.shape[0], n)


def compare(tool, qtype, rows, n, what):
    want = dequantize(rows, qtype).reshape(rows.shape[0], n).astype(np.float64)
    got = cairn_dequant(tool, qtype, rows, n).astype(np.float64)
    # per element: a few ulp of the block's largest magnitude (the terms
    # that are rounded are at most that large)
    blk = LAYOUT[qtype][0]
    scale = np.abs(want).reshape(rows.shape[0], n // blk, blk).max(axis=2, keepdims=True)
    scale = np.broadcast_to(scale, (rows.shape[0], n // blk, blk)).reshape(rows.shape[0], n)
    tol = 4 * np.finfo(np.float32).eps * (scale + np.abs(want)) + 1e-30
    bad = np.abs(got - want) > tol
    if bad.any():
        i = np.argwhere(bad)[0]
        print(f"FAIL {what}: element {tuple(i)} cairn {got[tuple(i)]!r} gguf {want[tuple(i)]!r}"
              f" ({bad.sum()} of {bad.size} differ)")
        return False
    print(f"ok   {what}: {rows.shape[0]} rows x {n}")
    return True


def random_rows(rng, qtype, n_rows, n):
    blk, bs, halves = LAYOUT[qtype]
    rows = rng.integers(0, 256, size=(n_rows, n // blk, bs), dtype=np.uint8)
    for off in halves:
        h = rng.uniform(-1.5, 1.5, size=(n_rows, n // blk)).astype(np.float16)
        rows[:, :, off:off + 2] = h.view(np.uint8).reshape(n_rows, n // blk, 2)
    return rows.reshape(n_rows, n // blk * bs)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    tool = sys.argv[1]
    model = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("CAIRN_CHAT_MODEL", "")
    ok = True
    rng = np.random.default_rng(12345)
    for qtype in (T.Q5_0, T.Q4_K, T.Q5_K, T.Q6_K):
        ok &= compare(tool, qtype, random_rows(rng, qtype, 16, 1024), 1024,
                      f"random {qtype.name}")

    if not model or not os.path.exists(model):
        print(f"skip real-model part: model {model!r} is absent (scripts/get-model fetches it)")
    else:
        reader = gguf.GGUFReader(model)
        seen = {}
        for t in reader.tensors:
            if t.tensor_type not in (T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K):
                continue
            if seen.get(t.tensor_type, 0) >= 3:
                continue
            seen[t.tensor_type] = seen.get(t.tensor_type, 0) + 1
            n = int(t.shape[0])  # elements per row (GGUF lists the row length first)
            data = np.asarray(t.data)
            n_rows = data.shape[0]
            pick = sorted(set([0, 1, n_rows // 2, n_rows - 1] +
                              list(rng.integers(0, n_rows, size=4))))
            ok &= compare(tool, t.tensor_type, data[pick], n, f"{t.name} ({t.tensor_type.name})")
        missing = {T.Q5_0, T.Q4_K, T.Q6_K} - set(seen)
        if missing:
            print(f"FAIL: the model has no tensors of {sorted(m.name for m in missing)}")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
