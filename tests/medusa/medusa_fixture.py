#!/usr/bin/env python3
"""Medusa checkpoints in the published layout, converted, with the logits they must give.

argv: TOOLS_DIR TARGET.gguf OUT_DIR

Writes, for the target (stories260K: dim 64, vocabulary 512), what the Medusa
authors' code saves: the state dict of its medusa_head ModuleList (keys
{i}.{j}.linear.weight / .bias for residual block j of head i, {i}.{L}.weight
for head i's LM head, L = medusa_num_layers) as medusa_lm_head.safetensors
(and as medusa_lm_head.pt when torch is installed) beside a config.json with
medusa_num_heads and medusa_num_layers, then converts each with
tools/eagle_convert.py:

  own/         3 heads of 1 block, each with its own LM head; one tensor F16
               and one BF16, as checkpoints saved in half precision have them
  shared/      2 heads of 2 blocks and no LM heads: the target's is used
               (the converter finds the layout by its keys, no --medusa)
  own.pt.gguf  own/ through medusa_lm_head.pt (torch only)

and the files the C test reads (float32, little-endian):
  features.bin          [N][dim] features (rms 1, like an output-normed state)
  own.logits.bin        [N][3][vocab] what the published heads compute, in numpy
  shared.logits.bin     [N][2][vocab]
Also heads cairn must refuse: wrongdim.gguf (dim 32), missing.gguf (a bias
gone), and checks that the converter refuses a checkpoint whose shapes do
not fit the target. numpy + gguf only (torch optional).
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import gguf

tools, target, out = sys.argv[1:4]
sys.path.insert(0, tools)
from eagle_convert import target_info, write_medusa  # noqa: E402

os.makedirs(out, exist_ok=True)
info = target_info(target)
d, nv = info["dim"], info["n_vocab"]
rng = np.random.default_rng(11)
N = 4


def target_lm_head():
    r = gguf.GGUFReader(target)
    t = {t.name: t for t in r.tensors}
    x = t["output.weight"] if "output.weight" in t else t["token_embd.weight"]
    a = gguf.quants.dequantize(x.data, x.tensor_type)
    return np.array(a, dtype=np.float32).reshape(nv, d)


def bf16(a):
    """Round to bfloat16 (the stored value) and the raw bytes."""
    u = np.asarray(a, np.float32).view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return (u.astype(np.uint32) << 16).view(np.float32), u.tobytes()


def write_safetensors(path, tensors):
    """tensors: name -> (dtype name, shape, raw bytes)."""
    header, off = {}, 0
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, raw in tensors.values():
            f.write(raw)


def make_heads(n_heads, n_layers, own_lm):
    """Weights as the published code holds them, plus how each is stored."""
    sd, store = {}, {}
    for i in range(n_heads):
        for j in range(n_layers):
            sd["%d.%d.linear.weight" % (i, j)] = (rng.standard_normal((d, d)) * d ** -0.5
                                                  ).astype(np.float32)
            sd["%d.%d.linear.bias" % (i, j)] = (0.2 * rng.standard_normal(d)).astype(np.float32)
        if own_lm:
            sd["%d.%d.weight" % (i, n_layers)] = (rng.standard_normal((nv, d)) * d ** -0.5
                                                  ).astype(np.float32)
    for k in sd:
        store[k] = "F32"
    return sd, store


def save(dirname, sd, store, n_heads, n_layers):
    path = os.path.join(out, dirname)
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for k, v in sd.items():
        if store[k] == "F16":
            v16 = v.astype("<f2")
            sd[k] = v16.astype(np.float32)  # the value the checkpoint holds
            tensors[k] = ("F16", v.shape, v16.tobytes())
        elif store[k] == "BF16":
            sd[k], raw = bf16(v)
            tensors[k] = ("BF16", v.shape, raw)
        else:
            tensors[k] = ("F32", v.shape, v.astype("<f4").tobytes())
    write_safetensors(os.path.join(path, "medusa_lm_head.safetensors"), tensors)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"medusa_num_heads": n_heads, "medusa_num_layers": n_layers,
                   "base_model_name_or_path": "stories260K"}, f)
    return path


def reference(sd, n_heads, n_layers, feats, lm):
    """The published forward: x + silu(linear(x)) per block, then the LM head."""
    outs = np.zeros((len(feats), n_heads, nv), np.float32)
    for n, f in enumerate(feats.astype(np.float64)):
        for i in range(n_heads):
            x = f.copy()
            for j in range(n_layers):
                y = sd["%d.%d.linear.weight" % (i, j)] @ x + sd["%d.%d.linear.bias" % (i, j)]
                x = x + y / (1 + np.exp(-y))
            w = sd.get("%d.%d.weight" % (i, n_layers))
            outs[n, i] = (w if w is not None else lm) @ x
    return outs


def convert(src, dst, *extra, expect_fail=None):
    cmd = [sys.executable, os.path.join(tools, "eagle_convert.py"), "--target", target,
           "--checkpoint", src, "-o", dst, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if expect_fail is None:
        if r.returncode != 0:
            sys.exit("conversion of %s failed: %s" % (src, r.stderr))
    else:
        if r.returncode == 0 or expect_fail not in r.stderr:
            sys.exit("the converter took %s (rc %d, %r); it must say %r"
                     % (src, r.returncode, r.stderr, expect_fail))


feats = rng.standard_normal((N, d)).astype(np.float32)
feats /= np.sqrt((feats ** 2).mean(-1, keepdims=True))
feats.astype("<f4").tofile(os.path.join(out, "features.bin"))
lm = target_lm_head().astype(np.float64)

# 3 heads with LM heads, stored partly in half precision
sd, store = make_heads(3, 1, True)
store["1.0.linear.weight"] = "F16"
store["2.1.weight"] = "BF16"
own = save("own", sd, store, 3, 1)
reference(sd, 3, 1, feats, lm).astype("<f4").tofile(os.path.join(out, "own.logits.bin"))
convert(os.path.join(own, "medusa_lm_head.safetensors"), os.path.join(out, "own.gguf"),
        "--config", os.path.join(own, "config.json"), "--medusa")
try:
    import torch
    torch.save({k: torch.from_numpy(v.copy()).half() if store[k] == "F16" else
                torch.from_numpy(v.copy()) for k, v in sd.items()},
               os.path.join(own, "medusa_lm_head.pt"))
    convert(os.path.join(own, "medusa_lm_head.pt"), os.path.join(out, "own.pt.gguf"),
            "--config", os.path.join(own, "config.json"))
except ImportError:
    pass

# 2 heads of 2 blocks reading the target's LM head; the layout found by keys
sd2, store2 = make_heads(2, 2, False)
shared = save("shared", sd2, store2, 2, 2)
reference(sd2, 2, 2, feats, lm).astype("<f4").tofile(os.path.join(out, "shared.logits.bin"))
convert(os.path.join(shared, "medusa_lm_head.safetensors"), os.path.join(out, "shared.gguf"),
        "--config", os.path.join(shared, "config.json"))

# the converter refuses heads that do not fit the target
bad = dict(sd2)
bad["0.0.linear.weight"] = np.zeros((d // 2, d // 2), np.float32)
bad_dir = save("badshape", bad, {k: "F32" for k in bad}, 2, 2)
convert(os.path.join(bad_dir, "medusa_lm_head.safetensors"), os.path.join(out, "bad.gguf"),
        "--config", os.path.join(bad_dir, "config.json"), expect_fail="the target needs")
gone = {k: v for k, v in sd2.items() if k != "1.1.linear.bias"}
gone_dir = save("gone", gone, {k: "F32" for k in gone}, 2, 2)
convert(os.path.join(gone_dir, "medusa_lm_head.safetensors"), os.path.join(out, "gone.gguf"),
        "--config", os.path.join(gone_dir, "config.json"), expect_fail="lacks residual block 1")

# cairn-format heads the loader must refuse
small = dict(info, dim=32)
write_medusa(os.path.join(out, "wrongdim.gguf"), small,
             [{"res": [(np.zeros((32, 32), np.float32), np.zeros(32, np.float32))],
               "output": None}], 1)
heads = [{"res": [(sd2["%d.%d.linear.weight" % (i, j)], sd2["%d.%d.linear.bias" % (i, j)])
                  for j in range(2)], "output": None} for i in range(2)]
write_medusa(os.path.join(out, "complete.gguf"), info, heads, 2)
heads[1]["res"] = heads[1]["res"][:1]  # medusa.1.res.1.* missing
write_medusa(os.path.join(out, "missing.gguf"), info, heads, 2)
