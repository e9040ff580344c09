#!/usr/bin/env python3
"""An EAGLE-3 checkpoint in the published layout, converted, with what it must compute.

argv: TOOLS_DIR REF_DIR TARGET.gguf OUT_DIR

Writes, for the target (stories260K), a random EAGLE-3 head the way
SafeAILab/EAGLE's eagle3 code saves one (model.safetensors: fc.weight
[dim][3*dim], midlayer.input_layernorm / hidden_norm /
post_attention_layernorm .weight, midlayer.self_attn.{q,k,v}_proj.weight
[.][2*dim] in Hugging Face's rotate-half q/k order, o_proj, midlayer.mlp.*,
norm.weight, lm_head.weight [draft_vocab][dim], d2t int64 offsets and t2d
bool; config.json with draft_vocab_size and the shape), converts it with
tools/eagle_convert.py, and computes in numpy float64, independently of
cairn (target states from tests/ref/llama_ref.py; RoPE over halves on the
unpermuted weights), what the head gives:

  eagle3.gguf         the converted head (draft vocabulary 384 of 512)
  tokens.bin          int32 [T] the sequence
  rows.logits.bin     float32 [T-1][384]: head rows j = 0..T-2 (states of
                      token j, token j+1, position j), causal
  rows.hidden.bin     float32 [T-1][dim]: their pre-norm outputs
  draft.logits.bin    float32 [384]: a draft row reading row T-2's output and
                      token DRAFT_TOKEN at position T-1 over rows 0..T-2 and
                      itself
Refused heads: wrongdim.gguf (another dim), badlayer.gguf (layer 9 of 5),
and the converter must refuse a d2t that maps outside the vocabulary.
"""
import json
import os
import struct
import subprocess
import sys
import types

import numpy as np

tools, ref_dir, target, out = sys.argv[1:5]
sys.path.insert(0, tools)
sys.path.insert(0, ref_dir)
from eagle_convert import target_info, write_eagle3, default_eagle3_layers  # noqa: E402
import llama_ref  # noqa: E402

DRAFT_TOKEN = 300
os.makedirs(out, exist_ok=True)
info = target_info(target)
m = llama_ref.Model(target)
d, nv, L = m.dim, m.n_vocab, m.n_layer
nh, nkv, hd = m.n_head, m.n_kv_head, m.head_dim
ffn = 96
nvd = 384
rng = np.random.default_rng(23)


def mat(n_out, n_in):
    return (rng.standard_normal((n_out, n_in)) * n_in ** -0.5).astype(np.float32)


def norm_w(n):
    return (1 + 0.2 * rng.standard_normal(n)).astype(np.float32)


sd = {
    "fc.weight": mat(d, 3 * d),
    "midlayer.input_layernorm.weight": norm_w(d),
    "midlayer.hidden_norm.weight": norm_w(d),
    "midlayer.self_attn.q_proj.weight": mat(nh * hd, 2 * d),
    "midlayer.self_attn.k_proj.weight": mat(nkv * hd, 2 * d),
    "midlayer.self_attn.v_proj.weight": mat(nkv * hd, 2 * d),
    "midlayer.self_attn.o_proj.weight": mat(d, nh * hd),
    "midlayer.post_attention_layernorm.weight": norm_w(d),
    "midlayer.mlp.gate_proj.weight": mat(ffn, d),
    "midlayer.mlp.up_proj.weight": mat(ffn, d),
    "midlayer.mlp.down_proj.weight": mat(d, ffn),
    "norm.weight": norm_w(d),
    "lm_head.weight": (2.0 * mat(nvd, d)),
}
keep = np.sort(rng.choice(nv, nvd, replace=False))  # the draft vocabulary's target ids
d2t = (keep - np.arange(nvd)).astype(np.int64)
t2d = np.zeros(nv, dtype=bool)
t2d[keep] = True
config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": d,
          "intermediate_size": ffn, "num_attention_heads": nh, "num_key_value_heads": nkv,
          "rms_norm_eps": m.rms_eps, "vocab_size": nv, "draft_vocab_size": nvd,
          "num_hidden_layers": 1}


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if a.dtype == np.int64:
            dt, raw = "I64", a.astype("<i8").tobytes()
        elif a.dtype == np.bool_:
            dt, raw = "BOOL", a.astype(np.uint8).tobytes()
        else:
            dt, raw = "F32", a.astype("<f4").tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


ck = os.path.join(out, "published")
os.makedirs(ck, exist_ok=True)
write_safetensors(os.path.join(ck, "model.safetensors"), dict(sd, d2t=d2t, t2d=t2d))
with open(os.path.join(ck, "config.json"), "w") as f:
    json.dump(config, f)


def convert(src, cfg, dst, expect_fail=None):
    r = subprocess.run([sys.executable, os.path.join(tools, "eagle_convert.py"), "--target",
                        target, "--checkpoint", src, "--config", cfg, "-o", dst],
                       capture_output=True, text=True)
    if expect_fail is None and r.returncode != 0:
        sys.exit("conversion failed: " + r.stderr)
    if expect_fail is not None and (r.returncode == 0 or expect_fail not in r.stderr):
        sys.exit("the converter took %s (%r); it must say %r" % (src, r.stderr, expect_fail))


convert(os.path.join(ck, "model.safetensors"), os.path.join(ck, "config.json"),
        os.path.join(out, "eagle3.gguf"))

# ---- the reference --------------------------------------------------------------
tokens = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
          338, 401, 396, 267]
T = len(tokens)
np.asarray(tokens, dtype="<i4").tofile(os.path.join(out, "tokens.bin"))
states = {}
llama_ref.forward(m, tokens, states)
layers = default_eagle3_layers(L)
S = np.concatenate([states[l] for l in layers], axis=1)  # [T][3*dim], low to high
W = {k: v.astype(np.float64) for k, v in sd.items()}
halves = types.SimpleNamespace(n_rot=m.n_rot, rope_base=m.rope_base, rope_freqs=None,
                               rope_scale=m.rope_scale, neox=True)


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + m.rms_eps) * w


def head_rows(h, toks, pos, visible):
    """h [R][dim] row inputs, toks [R], pos [R]; visible(r) -> the rows of the
    growing K/V list row r attends to. K/V of earlier calls in `kv`."""
    a = np.concatenate([rms(m.tok_embd[np.asarray(toks)], W["midlayer.input_layernorm.weight"]),
                        rms(h, W["midlayer.hidden_norm.weight"])], axis=1)
    R = len(toks)
    q = (a @ W["midlayer.self_attn.q_proj.weight"].T).reshape(R, nh, hd)
    k = (a @ W["midlayer.self_attn.k_proj.weight"].T).reshape(R, nkv, hd)
    v = (a @ W["midlayer.self_attn.v_proj.weight"].T).reshape(R, nkv, hd)
    q = llama_ref.rope(q, np.asarray(pos, np.float64), halves)
    k = llama_ref.rope(k, np.asarray(pos, np.float64), halves)
    kv["k"].extend(k)
    kv["v"].extend(v)
    K, V = np.stack(kv["k"]), np.stack(kv["v"])
    att = np.zeros((R, nh, hd))
    for r in range(R):
        vis = visible(r)
        for hh in range(nh):
            g = hh // (nh // nkv)
            sc = K[vis, g] @ q[r, hh] / np.sqrt(hd)
            p = np.exp(sc - sc.max())
            p /= p.sum()
            att[r, hh] = p @ V[vis, g]
    x = h + att.reshape(R, nh * hd) @ W["midlayer.self_attn.o_proj.weight"].T
    f = rms(x, W["midlayer.post_attention_layernorm.weight"])
    g = f @ W["midlayer.mlp.gate_proj.weight"].T
    x = x + (g / (1 + np.exp(-g)) * (f @ W["midlayer.mlp.up_proj.weight"].T)) @ \
        W["midlayer.mlp.down_proj.weight"].T
    return x, rms(x, W["norm.weight"]) @ W["lm_head.weight"].T


kv = {"k": [], "v": []}
h0 = S[:T - 1] @ W["fc.weight"].T
x_rows, lg_rows = head_rows(h0, tokens[1:], list(range(T - 1)), lambda r: list(range(r + 1)))
lg_rows.astype("<f4").tofile(os.path.join(out, "rows.logits.bin"))
x_rows.astype("<f4").tofile(os.path.join(out, "rows.hidden.bin"))
_, lg_draft = head_rows(x_rows[T - 2:T - 1], [DRAFT_TOKEN], [T - 1], lambda r: list(range(T)))
lg_draft[0].astype("<f4").tofile(os.path.join(out, "draft.logits.bin"))

# ---- heads to refuse -----------------------------------------------------------------
bad_d2t = d2t.copy()
bad_d2t[-1] = nv  # past the vocabulary
write_safetensors(os.path.join(ck, "bad.safetensors"), dict(sd, d2t=bad_d2t, t2d=t2d))
convert(os.path.join(ck, "bad.safetensors"), os.path.join(ck, "config.json"),
        os.path.join(out, "bad.gguf"), expect_fail="outside the target's vocabulary")
t, dd, f_, nh_, nkv_, eps, lay = __import__("eagle_convert").convert_eagle3(info, sd | {"d2t": d2t},
                                                                             config)
write_eagle3(os.path.join(out, "badlayer.gguf"), info, t, dd, f_, nh_, nkv_, eps, [2, 3, 9])
small = dict(info, dim=32)
write_eagle3(os.path.join(out, "wrongdim.gguf"), small,
             {k: (v[:32, :96] if k == "fc.weight" else v) for k, v in t.items()}, dd, f_, nh_, nkv_,
             eps, lay)
