#!/usr/bin/env python3
"""tools/eagle_convert.py reads a published-style EAGLE checkpoint correctly.

argv: TOOLS_DIR HEAD.gguf SCRATCH_DIR

Takes the shipped head's tensors, writes them the way the EAGLE authors' code
saves a head for a Hugging Face llama (model.safetensors with HF names,
q/k rows in HF's rotate-half order, one tensor in F16 and an embed_tokens
table the converter must drop), converts that back with eagle_convert.py
--checkpoint, and checks every tensor comes back as it was: names, shapes,
values, and the q/k row permutation (a wrong permutation would silently
break RoPE). numpy + gguf only.
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import gguf

tools, head_path, scratch = sys.argv[1:4]
sys.path.insert(0, tools)
from eagle_convert import target_info  # noqa: E402

r = gguf.GGUFReader(head_path)
orig = {t.name: np.array(t.data, dtype=np.float32) for t in r.tensors}
f = r.fields


def meta(key):
    return int(f[key].parts[f[key].data[0]][0])


n_head = meta("eagle.attention.head_count")
n_kv = meta("eagle.attention.head_count_kv")


def unpermute(w, n):
    """inverse of the GGUF converter's permutation: pairs -> halves."""
    return (w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


hf = {
    "fc.weight": orig["fc.weight"],
    "fc.bias": orig["fc.bias"],
    "layers.0.self_attn.q_proj.weight": unpermute(orig["blk.0.attn_q.weight"], n_head),
    "layers.0.self_attn.k_proj.weight": unpermute(orig["blk.0.attn_k.weight"], n_kv),
    "layers.0.self_attn.v_proj.weight": orig["blk.0.attn_v.weight"],
    "layers.0.self_attn.o_proj.weight": orig["blk.0.attn_output.weight"],
    "layers.0.post_attention_layernorm.weight": orig["blk.0.ffn_norm.weight"],
    "layers.0.mlp.gate_proj.weight": orig["blk.0.ffn_gate.weight"],
    "layers.0.mlp.up_proj.weight": orig["blk.0.ffn_up.weight"].astype(np.float16),
    "layers.0.mlp.down_proj.weight": orig["blk.0.ffn_down.weight"],
    "embed_tokens.weight": np.zeros((8, orig["fc.bias"].shape[0]), np.float32),
}
header, blobs, off = {}, [], 0
for name, a in hf.items():
    b = np.ascontiguousarray(a).tobytes()
    header[name] = {"dtype": "F16" if a.dtype == np.float16 else "F32", "shape": list(a.shape),
                    "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
hj = json.dumps(header).encode()
st = os.path.join(scratch, "eagle_hf_head.safetensors")
with open(st, "wb") as fp:
    fp.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
cfg = os.path.join(scratch, "eagle_hf_config.json")
json.dump({"num_attention_heads": n_head, "num_key_value_heads": n_kv, "rms_norm_eps": 1e-5},
          open(cfg, "w"))
out = os.path.join(scratch, "eagle_converted.gguf")
target = os.environ["CAIRN_MODEL"]
subprocess.run([sys.executable, os.path.join(tools, "eagle_convert.py"), "--target", target,
                "--checkpoint", st, "--config", cfg, "-o", out], check=True)

conv = {t.name: np.array(t.data, dtype=np.float32) for t in gguf.GGUFReader(out).tensors}
failed = 0
if set(conv) != set(orig):
    print("FAIL: tensor names differ:", sorted(set(conv) ^ set(orig)))
    failed += 1
for name in sorted(set(conv) & set(orig)):
    tol = 1e-3 if name == "blk.0.ffn_up.weight" else 0.0  # went through F16
    if conv[name].shape != orig[name].shape or np.abs(conv[name] - orig[name]).max() > tol * (
            1 + np.abs(orig[name]).max()):
        print("FAIL: %s differs after the round trip" % name)
        failed += 1
# a permutation that is its own inverse would pass trivially: make sure it is not
if np.array_equal(hf["layers.0.self_attn.q_proj.weight"], orig["blk.0.attn_q.weight"]):
    print("FAIL: the q permutation is the identity here, the test proves nothing")
    failed += 1
info = target_info(target)
if info["dim"] != orig["fc.bias"].shape[0]:
    failed += 1
print("eagle convert: %d failed" % failed)
sys.exit(1 if failed else 0)
