#!/usr/bin/env python3
"""Quantize a BF16 Hugging Face checkpoint folder into AWQ, GPTQ or FP8 on-disk layouts.

    quantize_hf.py SRC_BF16_DIR OUTDIR --method awq|gptq|fp8 [options] [--verify]

ROUND-TO-NEAREST ONLY. There is no calibration data and no torch here, so no AWQ activation-aware
scale search and no GPTQ Hessian error feedback: every group is quantized with plain
round-to-nearest from its min/max (AWQ, GPTQ) or absmax (FP8). The files have exactly the layout
and config.json fields real AutoAWQ / GPTQ / llm-compressor / DeepSeek-style checkpoints have, so
they exercise a reader; their accuracy is RTN accuracy, below that of a calibrated checkpoint.

Quantized: every linear projection model.layers.N.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj},
and a mixture of experts' (mlp.experts.E.*_proj, mlp.shared_expert.*_proj, block_sparse_moe.experts.E.w1/2/3).
Kept as in the source (BF16): embeddings, norms, biases, lm_head, as the real formats keep them.
config.json is copied with a quantization_config added; every other *.json but the safetensors
index (tokenizer.json, tokenizer_config.json, generation_config.json) is copied unchanged.

Layouts (W is the HF weight [out, in]; g the group size; all integers little-endian):

AWQ GEMM (AutoAWQ "gemm" version; readers: AutoAWQ, vLLM awq.py / awq_triton.py):
  qweight int32 [in, out/8]: 4-bit codes of W^T packed along out; nibble k (bits 4k..4k+3) of
      word [i, c] holds column c*8 + AWQ_ORDER[k], AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
      (unpackers use the inverse AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]).
  qzeros  int32 [in/g, out/8]: zero points, packed the same way.
  scales  float16 [in/g, out].        w[o, i] = (q[i, o] - z[i/g, o]) * s[i/g, o]
  Zero point per AutoAWQ's pseudo_quantize_tensor: s = (max - min) / 15, z = clamp(-round(min / s), 0, 15).
  Source: AutoAWQ's pack (order_map [0, 2, 4, 6, 1, 3, 5, 7], qweight_col << (i * bits)) and the
  unpack_awq / reverse_awq_order helpers found with the search tool (LLMQuant packing_utils.py,
  lmdeploy's AWQ kernels), which shift by 0, 4, ..., 28 and then index with AWQ_REVERSE_ORDER.

GPTQ (checkpoint_format "gptq", i.e. GPTQ v1 as AutoGPTQ / GPTQModel write it; readers: vLLM
gptq.py, exllama/exllamav2, AutoGPTQ qlinear_cuda_old. Source: AutoGPTQ's QuantLinear.pack,
row-by-row `qweight[row] |= intweight[j] << (bits * (j - i))` and `zeros -= 1` before packing
qzeros, found with the search tool):
  qweight int32 [in/8, out]: packed along in, sequential nibbles, low bits first:
      word [r, o] = sum_k q[8r + k, o] << 4k (q in the ORIGINAL input order, even with desc_act).
  qzeros  int32 [G, out/8]: packed along out, sequential nibbles, storing zero - 1: the v1
      format's historical offset (AutoGPTQ's pack does `zeros -= 1`; its kernels add 1 back), so a
      symmetric 4-bit checkpoint stores 7 for the zero point 8. Because of that offset v1 cannot
      store a zero point of 0 (it would wrap to 15 and read back as 16), so asymmetric zeros are
      clamped to [1, 15] here.
  scales  float16 [G, out].   g_idx int32 [in]: group of each input channel.
      w[o, i] = (q[i, o] - z[g_idx[i], o]) * s[g_idx[i], o]
  G = in/g, or 1 for group_size -1 (one group over the whole input).
  sym: s = max(|min|, |max|) * 2 / 15, z = 8; asym: s = (max - min) / 15, z = round(-min / s)
  (GPTQ's Quantizer.find_params, with min <= 0 <= max forced as it does; one deviation: for an
  all-non-negative group under sym, find_params keeps min = 0 and so clips at 7 * s, we centre).
  desc_act (act-order): GPTQ quantizes input columns in descending Hessian-diagonal order and
  forms groups in that order; the checkpoint keeps qweight in the original order and records
  g_idx[i] = rank(i) // g. Without activations we order by descending column norm ||W[:, i]||
  (ties: lower index first). Without desc_act g_idx[i] = i // g.

FP8 E4M3FN (--fp8-scheme; w = q * scale; q saturates at +-448, scale = absmax / 448):
  channel (compressed-tensors "float-quantized", llm-compressor FP8_DYNAMIC):
      weight F8_E4M3 [out, in], weight_scale float32 [out, 1] (--scale-dtype bf16 for BF16, as
      llm-compressor saves it when the model is BF16).
  tensor (compressed-tensors, strategy "tensor"): weight F8_E4M3 [out, in], weight_scale [1]
      (vLLM's PerTensorScaleParameter takes one scalar per fused shard; --scalar-scale writes
      shape [] as AutoFP8 did).
  block ("quant_method": "fp8", DeepSeek-V3 / Qwen3-FP8, HF finegrained_fp8):
      weight F8_E4M3 [out, in], weight_scale_inv float32 [ceil(out/128), ceil(in/128)],
      w = q * weight_scale_inv[o/128, i/128] (the name says inverse, the value multiplies).
  Activations: dynamic (per token / per 128-block), so no input_scale tensors. Static schemes
  (compressed-tensors "strategy": "tensor" with "dynamic": false for input_activations, or AutoFP8
  activation_scheme "static") would add input_scale float32 [1] (or []) next to each weight.
  Sources: vLLM compressed_tensors_w8a8_fp8.py (weight / weight_scale per strategy, input_scale
  only for static input schemes), HF transformers finegrained_fp8.py and DeepSeek-V3's
  README_WEIGHTS.md (weight_scale_inv, 128x128 blocks, activation_scheme dynamic).

--verify re-reads the written folder, unpacks every quantized weight with the numpy dequantizers
below and checks the codes, zeros and scales are bit-identical to what was quantized and the
dequantized weights equal the in-memory ones; it also prints the RTN error against the source.
"""

import argparse
import glob
import json
import os
import re
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_io  # noqa: E402

# the dense projections, and a mixture of experts' (Qwen2/3-MoE experts.E and shared_expert,
# Mixtral block_sparse_moe.experts.E.w1/w2/w3) as the real AWQ / GPTQ / FP8 MoE checkpoints
# quantize them; routers (mlp.gate, shared_expert_gate, block_sparse_moe.gate) stay as they are
LINEAR_RE = re.compile(r"^model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|"
                       r"mlp\.(experts\.\d+\.|shared_expert\.)?(gate|up|down)_proj|"
                       r"block_sparse_moe\.experts\.\d+\.w[123])\.weight$")

AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])
AWQ_REVERSE_ORDER = np.argsort(AWQ_ORDER)          # [0, 4, 1, 5, 2, 6, 3, 7]
SHIFTS = (np.arange(8, dtype=np.uint32) * 4)


# ---- 4-bit packing ----

def pack_last(q, order=None):
    """q uint8 [..., n] (n % 8 == 0, values < 16) -> int32 [..., n/8]; nibble k of word c holds
    q[..., c*8 + order[k]] (order = identity when None)."""
    s = q.reshape(*q.shape[:-1], q.shape[-1] // 8, 8).astype(np.uint32)
    if order is not None:
        s = s[..., order]
    return np.bitwise_or.reduce(s << SHIFTS, axis=-1).view(np.int32)


def unpack_last(w, order=None):
    """inverse of pack_last"""
    u = w.view(np.uint32)
    s = ((u[..., None] >> SHIFTS) & 0xF).astype(np.uint8)
    if order is not None:
        s = s[..., np.argsort(order)]
    return s.reshape(*w.shape[:-1], w.shape[-1] * 8)


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


# ---- AWQ ----

def quant_awq(w, g):
    """w float32 [out, in] -> dict of codes q [in, out], z [in/g, out], s float16 [in/g, out]."""
    out_f, in_f = w.shape
    if in_f % g or out_f % 8:
        raise ValueError(f"AWQ needs in % group == 0 and out % 8 == 0, got {w.shape} g={g}")
    wg = w.T.reshape(in_f // g, g, out_f)                     # [G, g, out]
    mx, mn = wg.max(axis=1), wg.min(axis=1)                  # [G, out]
    s = f16(np.maximum(mx - mn, 1e-5) / 15.0)
    sf = s.astype(np.float32)
    z = np.clip(-np.round(mn / sf), 0, 15)
    q = np.clip(np.round(wg / sf[:, None, :]) + z[:, None, :], 0, 15)
    return {"q": q.reshape(in_f, out_f).astype(np.uint8), "z": z.astype(np.uint8), "s": s, "g": g}


def awq_tensors(prefix, c):
    return [(prefix + ".qweight", "I32", None, pack_last(c["q"], AWQ_ORDER)),
            (prefix + ".qzeros", "I32", None, pack_last(c["z"], AWQ_ORDER)),
            (prefix + ".scales", "F16", None, c["s"])]


def unpack_awq(t, prefix):
    qw, qz, s = t[prefix + ".qweight"][2], t[prefix + ".qzeros"][2], t[prefix + ".scales"][2]
    q, z = unpack_last(qw, AWQ_ORDER), unpack_last(qz, AWQ_ORDER)
    return {"q": q, "z": z, "s": np.array(s), "g": q.shape[0] // z.shape[0]}


def dequant_awq(c):
    """-> float32 [out, in]"""
    g = c["g"]
    z = np.repeat(c["z"], g, axis=0).astype(np.float32)
    s = np.repeat(c["s"], g, axis=0).astype(np.float32)
    return ((c["q"].astype(np.float32) - z) * s).T


# ---- GPTQ ----

def quant_gptq(w, g, sym, desc_act):
    """w float32 [out, in] -> codes q [in, out] (original input order), z [G, out] (true zero
    points, 1..15), s float16 [G, out], g_idx int32 [in]."""
    out_f, in_f = w.shape
    gs = in_f if g == -1 else g
    if in_f % gs or in_f % 8 or out_f % 8:
        raise ValueError(f"GPTQ needs in % group == 0, in and out % 8 == 0, got {w.shape} g={g}")
    if desc_act:
        norms = np.sqrt(np.sum(w.astype(np.float64) ** 2, axis=0))
        perm = np.argsort(-norms, kind="stable")              # quantization order
    else:
        perm = np.arange(in_f)
    rank = np.empty(in_f, dtype=np.int64)
    rank[perm] = np.arange(in_f)
    g_idx = (rank // gs).astype(np.int32)
    wp = w.T[perm].reshape(in_f // gs, gs, out_f)             # groups in quantization order
    mx = np.maximum(wp.max(axis=1), 0.0)
    mn = np.minimum(wp.min(axis=1), 0.0)
    if sym:
        # GPTQ's find_params leaves min at 0 for an all-non-negative group, which then clips
        # everything above 7 * s; we always centre the range (same result when min < 0).
        mx = np.maximum(np.abs(mn), mx)
        mn = -mx
    both0 = (mn == 0) & (mx == 0)
    mn, mx = np.where(both0, -1.0, mn), np.where(both0, 1.0, mx)
    s = f16((mx - mn) / 15.0)
    sf = s.astype(np.float32)
    if sym:
        z = np.full(sf.shape, 8.0, dtype=np.float32)
    else:
        z = np.clip(np.round(-mn / sf), 1, 15)               # 1..15: see the v1 note above
    q = np.clip(np.round(wp / sf[:, None, :]) + z[:, None, :], 0, 15).reshape(in_f, out_f)
    qo = np.empty_like(q)
    qo[perm] = q                                              # back to the original input order
    return {"q": qo.astype(np.uint8), "z": z.astype(np.uint8), "s": s, "g_idx": g_idx}


def gptq_tensors(prefix, c):
    qw = pack_last(np.ascontiguousarray(c["q"].T)).T          # pack along in: [in/8, out]
    return [(prefix + ".qweight", "I32", None, np.ascontiguousarray(qw)),
            (prefix + ".qzeros", "I32", None, pack_last(c["z"] - 1)),
            (prefix + ".scales", "F16", None, c["s"]),
            (prefix + ".g_idx", "I32", None, c["g_idx"])]


def ct_int4_tensors(prefix, c, shape):
    """compressed-tensors pack-quantized (llm-compressor W4A16): weight_packed I32 [out, in/8]
    (nibble k of word [o, j] holds input 8j + k, stored as the unsigned code q, i.e. the signed
    value + 8), weight_scale [out, G] (F16 here: the model's dtype; llm-compressor writes BF16
    for a BF16 model), weight_zero_point I32 [out/8, G] packed along out (signed zero + 8 = z),
    only when asymmetric, weight_g_idx I32 [in] with act-order, weight_shape I64 [2].
    Layout from compressed_tensors/compressors/pack_quantized (pack_to_int32: value + offset,
    sequential nibbles low first; zero points with packed_dim=0)."""
    ts = [(prefix + ".weight_packed", "I32", None, pack_last(np.ascontiguousarray(c["q"].T))),
          (prefix + ".weight_scale", "F16", None, np.ascontiguousarray(c["s"].T)),
          (prefix + ".weight_shape", "I64", None, np.array(shape, dtype=np.int64))]
    if not c["sym"]:
        zt = np.ascontiguousarray(c["z"].T)                   # [out, G]
        ts.append((prefix + ".weight_zero_point", "I32", None,
                   np.ascontiguousarray(pack_last(np.ascontiguousarray(zt.T)).T)))
    if c["actorder"]:
        ts.append((prefix + ".weight_g_idx", "I32", None, c["g_idx"]))
    return ts


def unpack_ct_int4(t, prefix):
    q = np.ascontiguousarray(unpack_last(t[prefix + ".weight_packed"][2]).T)   # [in, out]
    s = np.ascontiguousarray(np.array(t[prefix + ".weight_scale"][2]).T)       # [G, out]
    if prefix + ".weight_zero_point" in t:
        zp = np.array(t[prefix + ".weight_zero_point"][2])                    # [out/8, G]
        z = unpack_last(np.ascontiguousarray(zp.T))                           # [G, out]
    else:
        z = np.full(s.shape, 8, dtype=np.uint8)
    in_f = q.shape[0]
    gs = in_f // s.shape[0] if s.shape[0] > 1 else in_f
    gi = (np.array(t[prefix + ".weight_g_idx"][2]) if prefix + ".weight_g_idx" in t
          else (np.arange(in_f) // gs).astype(np.int32))
    return {"q": q, "z": z, "s": s, "g_idx": gi}


def unpack_gptq(t, prefix):
    qw, qz = t[prefix + ".qweight"][2], t[prefix + ".qzeros"][2]
    q = np.ascontiguousarray(unpack_last(np.ascontiguousarray(qw.T)).T)      # [in, out]
    z = ((unpack_last(qz).astype(np.int32) + 1) & 0xF).astype(np.uint8)      # v1: stored + 1
    return {"q": q, "z": z, "s": np.array(t[prefix + ".scales"][2]),
            "g_idx": np.array(t[prefix + ".g_idx"][2])}


def dequant_gptq(c):
    gi = c["g_idx"]
    z = c["z"][gi].astype(np.float32)
    s = c["s"][gi].astype(np.float32)
    return ((c["q"].astype(np.float32) - z) * s).T


# ---- FP8 ----

def quant_fp8(w, scheme, scale_dtype, block=128):
    out_f, in_f = w.shape
    if scheme == "channel":
        amax = np.abs(w).max(axis=1, keepdims=True)          # [out, 1]
    elif scheme == "tensor":
        amax = np.abs(w).max().reshape(1, 1)
    elif scheme == "block":
        bo, bi = -(-out_f // block), -(-in_f // block)
        pad = np.zeros((bo * block, bi * block), dtype=np.float32)
        pad[:out_f, :in_f] = np.abs(w)
        amax = pad.reshape(bo, block, bi, block).max(axis=(1, 3))  # [bo, bi]
    s = np.where(amax > 0, amax / ckpt_io.E4M3_MAX, 1.0).astype(np.float32)
    if scale_dtype == "bf16":
        s = ckpt_io.bf16_bits_to_f32(ckpt_io.f32_to_bf16_bits(s))
    sf = expand_fp8_scale(s, scheme, w.shape, block)
    q = ckpt_io.f32_to_e4m3(w / sf)
    return {"q": q, "s": s, "scheme": scheme, "block": block}


def expand_fp8_scale(s, scheme, shape, block=128):
    out_f, in_f = shape
    if scheme == "block":
        return np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:out_f, :in_f]
    return np.broadcast_to(s.reshape(-1, 1) if scheme == "channel" else s.reshape(1, 1), shape)


def fp8_tensors(prefix, c, scale_dtype, scalar_scale):
    s = c["s"]
    if c["scheme"] == "tensor":
        s = s.reshape(()) if scalar_scale else s.reshape(1)
    if scale_dtype == "bf16":
        sd, sa = "BF16", ckpt_io.f32_to_bf16_bits(s)
    else:
        sd, sa = "F32", s.astype(np.float32)
    name = ".weight_scale_inv" if c["scheme"] == "block" else ".weight_scale"
    return [(prefix + ".weight", "F8_E4M3", None, c["q"]), (prefix + name, sd, None, sa)]


def unpack_fp8(t, prefix, scheme):
    q = np.array(t[prefix + ".weight"][2])
    key = prefix + (".weight_scale_inv" if scheme == "block" else ".weight_scale")
    dt, shape, s = t[key]
    s = ckpt_io.bf16_bits_to_f32(s) if dt == "BF16" else np.array(s, dtype=np.float32)
    if scheme == "tensor":
        s = s.reshape(1, 1)
    return {"q": q, "s": s, "scheme": scheme, "block": 128}


def dequant_fp8(c):
    return ckpt_io.e4m3_to_f32(c["q"]) * expand_fp8_scale(c["s"], c["scheme"], c["q"].shape, c["block"])


# ---- configs ----

def quant_config(a):
    if a.method == "ct-int4":
        wargs = {"actorder": "group" if a.desc_act else None, "block_structure": None,
                 "dynamic": False, "group_size": None if a.group_size == -1 else a.group_size,
                 "num_bits": 4, "observer": "minmax", "observer_kwargs": {},
                 "strategy": "channel" if a.group_size == -1 else "group",
                 "symmetric": a.sym, "type": "int"}
        return {"config_groups": {"group_0": {"input_activations": None,
                                              "output_activations": None,
                                              "targets": ["Linear"], "weights": wargs}},
                "format": "pack-quantized", "ignore": ["lm_head"], "kv_cache_scheme": None,
                "quant_method": "compressed-tensors", "quantization_status": "compressed"}
    if a.method == "awq":
        return {"bits": 4, "group_size": a.group_size, "modules_to_not_convert": None,
                "quant_method": "awq", "version": "gemm", "zero_point": True}
    if a.method == "gptq":
        return {"bits": 4, "checkpoint_format": "gptq", "damp_percent": 0.01,
                "desc_act": a.desc_act, "group_size": a.group_size, "model_file_base_name": None,
                "model_name_or_path": None, "quant_method": "gptq", "static_groups": False,
                "sym": a.sym, "true_sequential": True}
    if a.fp8_scheme == "block":
        return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128]}
    wargs = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None,
             "num_bits": 8, "observer": "minmax", "observer_kwargs": {},
             "strategy": a.fp8_scheme, "symmetric": True, "type": "float"}
    iargs = {"actorder": None, "block_structure": None, "dynamic": True, "group_size": None,
             "num_bits": 8, "observer": None, "observer_kwargs": {}, "strategy": "token",
             "symmetric": True, "type": "float"}
    return {"config_groups": {"group_0": {"input_activations": iargs, "output_activations": None,
                                          "targets": ["Linear"], "weights": wargs}},
            "format": "float-quantized", "ignore": ["lm_head"], "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed"}


def quantize_one(a, w):
    if a.method == "awq":
        return quant_awq(w, a.group_size)
    if a.method in ("gptq", "ct-int4"):
        c = quant_gptq(w, a.group_size, a.sym, a.desc_act)
        c["sym"], c["actorder"] = a.sym, a.desc_act
        return c
    return quant_fp8(w, a.fp8_scheme, a.scale_dtype)


def tensors_of(a, prefix, c):
    if a.method == "awq":
        ts = awq_tensors(prefix, c)
    elif a.method == "gptq":
        ts = gptq_tensors(prefix, c)
    elif a.method == "ct-int4":
        ts = ct_int4_tensors(prefix, c, [c["q"].shape[1], c["q"].shape[0]])
    else:
        ts = fp8_tensors(prefix, c, a.scale_dtype, a.scalar_scale)
    dts = {"I32": np.int32, "F16": np.float16, "I64": np.int64}
    out = []
    for n, d, _, arr in ts:
        if d in dts:
            arr = arr.astype(dts[d], copy=False)
        out.append((n, d, arr.shape, np.ascontiguousarray(arr)))
    return out


def unpack_of(a, t, prefix):
    if a.method == "awq":
        return unpack_awq(t, prefix)
    if a.method == "gptq":
        return unpack_gptq(t, prefix)
    if a.method == "ct-int4":
        return unpack_ct_int4(t, prefix)
    return unpack_fp8(t, prefix, a.fp8_scheme)


def dequant_of(a, c):
    return {"awq": dequant_awq, "gptq": dequant_gptq, "ct-int4": dequant_gptq,
            "fp8": dequant_fp8}[a.method](c)


def same_bits(x, y):
    x, y = np.asarray(x), np.asarray(y)
    return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()


def quantize_folder(a, src=None):
    """src: optional {name: (dtype, shape, array)} already in memory (make_synthetic uses it)."""
    t0 = time.time()
    if src is None:
        src = ckpt_io.read_folder(a.src)
    with open(os.path.join(a.src, "config.json")) as f:
        cfg = json.load(f)
    out, codes, nq = [], {}, 0
    for name, (dt, shape, arr) in src.items():
        if LINEAR_RE.match(name):
            if dt != "BF16":
                raise SystemExit(f"{name}: source dtype {dt}, want BF16")
            w = ckpt_io.bf16_bits_to_f32(arr)
            c = quantize_one(a, w)
            prefix = name[: -len(".weight")]
            out += tensors_of(a, prefix, c)
            if a.verify:
                codes[prefix] = c
            nq += 1
        else:
            out.append((name, dt, shape, np.asarray(arr)))
    if nq == 0:
        raise SystemExit("no linear weights found")
    cfg["quantization_config"] = quant_config(a)
    ckpt_io.write_folder(a.outdir, out, a.shards)
    ckpt_io.write_json(os.path.join(a.outdir, "config.json"), cfg)
    for fn in glob.glob(os.path.join(a.src, "*.json")):
        b = os.path.basename(fn)
        if b not in ("config.json", "model.safetensors.index.json"):
            shutil.copyfile(fn, os.path.join(a.outdir, b))
    t1 = time.time()
    print(f"{a.outdir}: {nq} linear weights quantized ({a.method}), {t1 - t0:.1f}s")
    if a.verify:
        verify(a, src, codes)
        print(f"verify {time.time() - t1:.1f}s")


def verify(a, src, codes):
    t = ckpt_io.read_folder(a.outdir)
    num = den = 0.0
    for prefix, c in codes.items():
        r = unpack_of(a, t, prefix)
        for k in ("q", "z", "s", "g_idx"):
            if k in c and not same_bits(c[k], r[k]):
                raise SystemExit(f"verify: {prefix} {k} differs after write/read")
        d = dequant_of(a, r)
        if not same_bits(d.astype(np.float32), dequant_of(a, c).astype(np.float32)):
            raise SystemExit(f"verify: {prefix} dequantized weight differs")
        w = ckpt_io.bf16_bits_to_f32(src[prefix + ".weight"][2])
        num += float(np.sum((d.astype(np.float64) - w) ** 2))
        den += float(np.sum(w.astype(np.float64) ** 2))
    for name, (dt, shape, arr) in src.items():
        if not LINEAR_RE.match(name):
            if name not in t or not same_bits(t[name][2], arr):
                raise SystemExit(f"verify: unquantized {name} not copied bit-exact")
    print(f"verify: {len(codes)} weights bit-exact after write/read; RTN relative RMS error "
          f"{np.sqrt(num / den):.4f}")


def parse(argv=None):
    """The options of a quantize_hf.py command line (main's), as quantize_folder takes them."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("outdir")
    ap.add_argument("--method", required=True, choices=["awq", "gptq", "ct-int4", "fp8"])
    ap.add_argument("--group-size", type=int, default=128, help="AWQ/GPTQ group size (GPTQ: -1 = one group)")
    ap.add_argument("--sym", dest="sym", action="store_true", default=True, help="GPTQ symmetric (default)")
    ap.add_argument("--asym", dest="sym", action="store_false", help="GPTQ asymmetric zero points")
    ap.add_argument("--desc-act", action="store_true", help="GPTQ act-order (column-norm order, see above)")
    ap.add_argument("--fp8-scheme", choices=["channel", "tensor", "block"], default="channel")
    ap.add_argument("--scale-dtype", choices=["f32", "bf16"], default="f32", help="FP8 scale dtype")
    ap.add_argument("--scalar-scale", action="store_true", help="FP8 tensor: weight_scale shape [] not [1]")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--verify", action="store_true")
    a = ap.parse_args(argv)
    if a.method == "awq" and a.group_size <= 0:
        ap.error("AWQ needs a positive group size")
    return a


def main(argv=None):
    quantize_folder(parse(argv))


if __name__ == "__main__":
    main()
