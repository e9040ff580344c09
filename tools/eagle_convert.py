#!/usr/bin/env python3
"""Write an EAGLE draft head as a GGUF file that cairn loads with --draft.

Three sources:

  eagle_convert.py --target T.gguf --checkpoint model.safetensors [--config config.json] -o H.gguf
      a published EAGLE / EAGLE-2 head (the authors' state dict: fc.weight,
      fc.bias, layers.0.self_attn.{q,k,v,o}_proj.weight,
      layers.0.post_attention_layernorm.weight, layers.0.mlp.{gate,up,down}_proj
      .weight; an embed_tokens table, if present, is dropped because cairn
      reuses the target's). .safetensors is read with numpy alone;
      pytorch_model.bin needs torch.
  eagle_convert.py --target T.gguf --random -o H.gguf [--seed S]
      a randomly initialised head of the right shape (for tests: speculation
      must be lossless whatever the head predicts).
  tools/eagle_train.py trains one and writes it through write_head() below.
  eagle_convert.py --target T.gguf --checkpoint medusa_lm_head.pt [--config config.json] -o M.gguf
      Medusa heads (the Medusa repo's medusa_lm_head.pt or .safetensors: the
      state dict of its medusa_head ModuleList, keys {i}.{j}.linear.weight /
      .bias for residual block j of head i and {i}.{L}.weight, head i's LM
      head, L = medusa_num_layers; config.json gives medusa_num_heads and
      medusa_num_layers). Found by its keys; --medusa insists on it. Written
      as a "medusa" GGUF (write_medusa() below; model/model.h, "Medusa heads").
  eagle_convert.py --target T.gguf --medusa --random -o M.gguf [--medusa-heads K]
      random Medusa heads (for tests).
  eagle_convert.py --target T.gguf --checkpoint model.safetensors --config config.json -o E3.gguf
      an EAGLE-3 head (SafeAILab/EAGLE's eagle3 layout, as SGLang and vLLM load
      it: fc.weight [3*hidden -> hidden] over the target's low/mid/high hidden
      states, midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}
      .weight, midlayer.self_attn.{q,k,v}_proj.weight over [2*hidden],
      midlayer.self_attn.o_proj.weight, midlayer.mlp.{gate,up,down}_proj.weight,
      norm.weight, lm_head.weight [draft_vocab_size][hidden], d2t (draft id ->
      target id offset) and t2d; config.json gives draft_vocab_size and the
      head shape). Found by its midlayer keys. Written as an "eagle3" GGUF
      (write_eagle3() below); the target layers are
      eagle_aux_hidden_state_layer_ids from the config, else 2, n/2, n-3.

The file (see model/model.h, "EAGLE speculative decoding"):
  general.architecture = "eagle", eagle.embedding_length, eagle.feed_forward_length,
  eagle.attention.head_count, eagle.attention.head_count_kv,
  eagle.attention.layer_norm_rms_epsilon, eagle.target.name
  fc.weight [2*dim -> dim] over [token embedding ; target feature], optional fc.bias,
  blk.0.attn_{q,k,v,output}.weight (optional q/k/v biases), blk.0.ffn_norm.weight,
  blk.0.ffn_{gate,up,down}.weight.
All tensors are written as F32 (heads are small); norms and biases are F32 in any case.

Q/K layout: HF checkpoints rotate the two halves of each head; GGUF llama
targets rotate adjacent pairs, so for a llama target the q/k rows are permuted
the way the GGUF converter permutes the target's own (qwen2 targets use the
halves rotation and need nothing).
"""
import argparse
import json
import re
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.stderr.write("eagle_convert.py: the 'gguf' Python package is needed\n")
    sys.exit(77)


def target_info(path):
    """Hyper-parameters of the target GGUF that the head must match."""
    r = gguf.GGUFReader(path)
    f = r.fields

    def get(key, default=None):
        if key not in f:
            return default
        fld = f[key]
        v = fld.parts[fld.data[0]]
        if fld.types[0] == gguf.GGUFValueType.STRING:
            return bytes(v).decode("utf-8")
        return v.tolist()[0]

    arch = get("general.architecture")
    dim = get(arch + ".embedding_length")
    n_head = get(arch + ".attention.head_count")
    info = dict(
        arch=arch,
        name=get("general.name", "target"),
        dim=dim,
        n_layer=get(arch + ".block_count"),
        n_head=n_head,
        n_kv_head=get(arch + ".attention.head_count_kv", n_head),
        ffn=get(arch + ".feed_forward_length"),
        eps=get(arch + ".attention.layer_norm_rms_epsilon", 1e-5),
        rope_base=get(arch + ".rope.freq_base", 10000.0),
        n_rot=get(arch + ".rope.dimension_count", dim // n_head),
    )
    for t in r.tensors:
        if t.name == "token_embd.weight":
            info["n_vocab"] = int(t.shape[1])
    return info


def write_head(path, info, tensors, ffn, n_head=None, n_kv_head=None, eps=None):
    """tensors: name -> float array in row-major [n_out][n_in] (vectors 1-D)."""
    n_head = n_head or info["n_head"]
    n_kv_head = n_kv_head or info["n_kv_head"]
    w = gguf.GGUFWriter(path, "eagle")
    w.add_name("eagle head for " + str(info["name"]))
    w.add_uint32("eagle.embedding_length", info["dim"])
    w.add_uint32("eagle.feed_forward_length", ffn)
    w.add_uint32("eagle.attention.head_count", n_head)
    w.add_uint32("eagle.attention.head_count_kv", n_kv_head)
    w.add_float32("eagle.attention.layer_norm_rms_epsilon", float(eps if eps else info["eps"]))
    w.add_string("eagle.target.name", str(info["name"]))
    w.add_string("eagle.target.architecture", str(info["arch"]))
    for name, arr in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_head(info, seed):
    rng = np.random.default_rng(seed)
    d, ffn = info["dim"], info["ffn"]
    hd = d // info["n_head"]
    qd, kvd = info["n_head"] * hd, info["n_kv_head"] * hd

    def mat(n_out, n_in):
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * n_in ** -0.5

    return {
        "fc.weight": mat(d, 2 * d),
        "fc.bias": 0.1 * rng.standard_normal(d, dtype=np.float32),
        "blk.0.attn_q.weight": mat(qd, d),
        "blk.0.attn_k.weight": mat(kvd, d),
        "blk.0.attn_v.weight": mat(kvd, d),
        "blk.0.attn_output.weight": mat(d, qd),
        "blk.0.ffn_norm.weight": 1 + 0.1 * rng.standard_normal(d, dtype=np.float32),
        "blk.0.ffn_gate.weight": mat(ffn, d),
        "blk.0.ffn_up.weight": mat(ffn, d),
        "blk.0.ffn_down.weight": mat(d, ffn),
    }, ffn


# ---- published checkpoints --------------------------------------------------

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
_ST_INTS = {"I64": np.int64, "I32": np.int32, "BOOL": np.bool_, "U8": np.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            dt = meta["dtype"]
            a, b = meta["data_offsets"]
            f.seek(base + a)
            raw = f.read(b - a)
            if dt == "BF16":
                u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
                arr = u.view(np.float32)
            elif dt in _ST_DTYPES:
                arr = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[dt]).newbyteorder("<"))
            elif dt in _ST_INTS:  # index maps (EAGLE-3's d2t, t2d) stay integers
                arr = np.frombuffer(raw, dtype=np.dtype(_ST_INTS[dt]).newbyteorder("<"))
                out[name] = arr.astype(np.int64).reshape(meta["shape"])
                continue
            else:
                raise SystemExit("eagle_convert.py: tensor %s has dtype %s" % (name, dt))
            out[name] = arr.astype(np.float32).reshape(meta["shape"])
    return out


def read_checkpoint(path):
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    try:
        import torch
    except ImportError:
        raise SystemExit("eagle_convert.py: reading %s needs torch (or use .safetensors)" % path)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    return {k: (v.long().numpy() if not v.is_floating_point() else v.float().numpy())
            for k, v in sd.items()}


def permute_qk(w, n_head):
    """HF halves rotation -> adjacent pairs, row permutation per head."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def convert(info, sd, config):
    def pick(*names):
        for n in names:
            for prefix in ("", "model.", "ea_layer."):
                if prefix + n in sd:
                    return sd[prefix + n]
        return None

    n_head = config.get("num_attention_heads", info["n_head"])
    n_kv = config.get("num_key_value_heads", n_head)
    fc = pick("fc.weight")
    if fc is None:
        raise SystemExit("eagle_convert.py: no fc.weight in the checkpoint; keys: %s"
                         % ", ".join(sorted(sd)[:20]))
    L = "layers.0."
    out = {"fc.weight": fc}
    b = pick("fc.bias")
    if b is not None:
        out["fc.bias"] = b
    q, k = pick(L + "self_attn.q_proj.weight"), pick(L + "self_attn.k_proj.weight")
    qb, kb = pick(L + "self_attn.q_proj.bias"), pick(L + "self_attn.k_proj.bias")
    if info["arch"] == "llama":
        q, k = permute_qk(q, n_head), permute_qk(k, n_kv)
        if qb is not None:
            qb = permute_qk(qb, n_head)
        if kb is not None:
            kb = permute_qk(kb, n_kv)
    out["blk.0.attn_q.weight"] = q
    out["blk.0.attn_k.weight"] = k
    out["blk.0.attn_v.weight"] = pick(L + "self_attn.v_proj.weight")
    out["blk.0.attn_output.weight"] = pick(L + "self_attn.o_proj.weight")
    for name, arr in (("blk.0.attn_q.bias", qb), ("blk.0.attn_k.bias", kb),
                      ("blk.0.attn_v.bias", pick(L + "self_attn.v_proj.bias"))):
        if arr is not None:
            out[name] = arr
    out["blk.0.ffn_norm.weight"] = pick(L + "post_attention_layernorm.weight")
    out["blk.0.ffn_gate.weight"] = pick(L + "mlp.gate_proj.weight")
    out["blk.0.ffn_up.weight"] = pick(L + "mlp.up_proj.weight")
    out["blk.0.ffn_down.weight"] = pick(L + "mlp.down_proj.weight")
    missing = [n for n, a in out.items() if a is None]
    if missing:
        raise SystemExit("eagle_convert.py: checkpoint lacks " + ", ".join(missing))
    if fc.shape != (info["dim"], 2 * info["dim"]):
        raise SystemExit("eagle_convert.py: fc.weight is %s, the target needs [%d, %d]"
                         % (fc.shape, info["dim"], 2 * info["dim"]))
    ffn = out["blk.0.ffn_gate.weight"].shape[0]
    return out, ffn, n_head, n_kv, config.get("rms_norm_eps")


# ---- Medusa ---------------------------------------------------------------------

_MEDUSA_KEY = re.compile(r"^(?:medusa_head\.)?(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def is_medusa(sd):
    """Whether a state dict has the Medusa head layout (every key matches)."""
    return bool(sd) and all(_MEDUSA_KEY.match(k) for k in sd)


def write_medusa(path, info, heads, n_layers):
    """heads: per head, a dict with "res" = [(W [dim][dim], b [dim]) per block]
    and optionally "output" = [n_vocab][dim] (absent: the target's LM head)."""
    w = gguf.GGUFWriter(path, "medusa")
    w.add_name("medusa heads for " + str(info["name"]))
    w.add_uint32("medusa.head_count", len(heads))
    w.add_uint32("medusa.layer_count", n_layers)
    w.add_uint32("medusa.embedding_length", info["dim"])
    w.add_uint32("medusa.vocab_size", info["n_vocab"])
    w.add_string("medusa.target.name", str(info["name"]))
    w.add_string("medusa.target.architecture", str(info["arch"]))
    for i, h in enumerate(heads):
        for j, (wt, b) in enumerate(h["res"]):
            w.add_tensor("medusa.%d.res.%d.weight" % (i, j), np.ascontiguousarray(wt, np.float32))
            w.add_tensor("medusa.%d.res.%d.bias" % (i, j), np.ascontiguousarray(b, np.float32))
        if h.get("output") is not None:
            w.add_tensor("medusa.%d.output.weight" % i,
                         np.ascontiguousarray(h["output"], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def convert_medusa(info, sd, config):
    """The published layout -> the heads write_medusa() takes."""
    found = {}
    for k, v in sd.items():
        m = _MEDUSA_KEY.match(k)
        if not m:
            raise SystemExit("eagle_convert.py: %s is not a Medusa head key" % k)
        found[(int(m.group(1)), int(m.group(2)), m.group(3))] = v
    n_heads = config.get("medusa_num_heads", 1 + max(i for i, _, _ in found))
    # the LM head sits after the residual blocks: index medusa_num_layers
    lm = [j for _, j, kind in found if kind == "weight"]
    n_layers = config.get("medusa_num_layers",
                          max(lm) if lm else 1 + max(j for _, j, _ in found))
    d, nv = info["dim"], info["n_vocab"]
    heads = []
    for i in range(n_heads):
        res = []
        for j in range(n_layers):
            wt, b = found.get((i, j, "linear.weight")), found.get((i, j, "linear.bias"))
            if wt is None or b is None:
                raise SystemExit("eagle_convert.py: Medusa head %d lacks residual block %d "
                                 "(%d.%d.linear.weight/.bias)" % (i, j, i, j))
            if wt.shape != (d, d) or b.shape != (d,):
                raise SystemExit("eagle_convert.py: %d.%d.linear is %s, the target needs [%d, %d]"
                                 % (i, j, wt.shape, d, d))
            res.append((wt, b))
        out = found.get((i, n_layers, "weight"))
        if out is not None and out.shape != (nv, d):
            raise SystemExit("eagle_convert.py: %d.%d.weight is %s, the target needs [%d, %d]"
                             % (i, n_layers, out.shape, nv, d))
        heads.append({"res": res, "output": out})
    extra = sorted(k for k in found if k[0] >= n_heads or k[1] > n_layers)
    if extra:
        raise SystemExit("eagle_convert.py: keys past %d heads of %d blocks: %s"
                         % (n_heads, n_layers, extra[:4]))
    return heads, n_layers


def random_medusa(info, n_heads, n_layers, seed, own_lm_head=True):
    rng = np.random.default_rng(seed)
    d, nv = info["dim"], info["n_vocab"]
    heads = []
    for _ in range(n_heads):
        res = [(rng.standard_normal((d, d), dtype=np.float32) * d ** -0.5,
                0.1 * rng.standard_normal(d, dtype=np.float32)) for _ in range(n_layers)]
        out = rng.standard_normal((nv, d), dtype=np.float32) * d ** -0.5 if own_lm_head else None
        heads.append({"res": res, "output": out})
    return heads


# ---- EAGLE-3 ----------------------------------------------------------------------

def is_eagle3(sd):
    return any(k.startswith("midlayer.") for k in sd)


def default_eagle3_layers(n_layer):
    """The target layers whose input states EAGLE-3 fuses: low, mid, high."""
    return [2, n_layer // 2, n_layer - 3]


def write_eagle3(path, info, tensors, d2t, ffn, n_head, n_kv_head, eps, layers):
    """tensors: cairn names -> float arrays [n_out][n_in]; d2t [draft_vocab]
    (target id = draft id + d2t[draft id])."""
    w = gguf.GGUFWriter(path, "eagle3")
    w.add_name("eagle3 head for " + str(info["name"]))
    w.add_uint32("eagle3.embedding_length", info["dim"])
    w.add_uint32("eagle3.feed_forward_length", ffn)
    w.add_uint32("eagle3.attention.head_count", n_head)
    w.add_uint32("eagle3.attention.head_count_kv", n_kv_head)
    w.add_float32("eagle3.attention.layer_norm_rms_epsilon", float(eps))
    w.add_uint32("eagle3.vocab_size", int(len(d2t)))
    w.add_array("eagle3.target_layers", [int(x) for x in layers])
    w.add_string("eagle3.target.name", str(info["name"]))
    w.add_string("eagle3.target.architecture", str(info["arch"]))
    for name, arr in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.add_tensor("d2t", np.ascontiguousarray(d2t, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def convert_eagle3(info, sd, config):
    d, nv = info["dim"], info["n_vocab"]
    n_head = config.get("num_attention_heads", info["n_head"])
    n_kv = config.get("num_key_value_heads", n_head)
    names = {
        "fc.weight": "fc.weight",
        "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
        "midlayer.hidden_norm.weight": "blk.0.hidden_norm.weight",
        "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
        "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
        "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
        "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
        "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
        "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
        "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
        "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
        "norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    out = {}
    for src, dst in names.items():
        if src not in sd:
            raise SystemExit("eagle_convert.py: the EAGLE-3 checkpoint lacks " + src)
        out[dst] = sd[src]
    if info["arch"] == "llama":  # HF halves rotation -> the GGUF target's pairs
        out["blk.0.attn_q.weight"] = permute_qk(out["blk.0.attn_q.weight"], n_head)
        out["blk.0.attn_k.weight"] = permute_qk(out["blk.0.attn_k.weight"], n_kv)
    draft_vocab = config.get("draft_vocab_size", out["output.weight"].shape[0])
    if "d2t" in sd:
        d2t = np.asarray(sd["d2t"], dtype=np.int64)
    elif draft_vocab == nv:
        d2t = np.zeros(nv, dtype=np.int64)  # the full vocabulary: draft id = target id
    else:
        raise SystemExit("eagle_convert.py: a reduced draft vocabulary needs d2t")
    hd = d // n_head
    want = {
        "fc.weight": (d, 3 * d), "blk.0.attn_q.weight": (n_head * hd, 2 * d),
        "blk.0.attn_k.weight": (n_kv * hd, 2 * d), "blk.0.attn_v.weight": (n_kv * hd, 2 * d),
        "blk.0.attn_output.weight": (d, n_head * hd), "output.weight": (draft_vocab, d),
    }
    for name, shape in want.items():
        if tuple(out[name].shape) != shape:
            raise SystemExit("eagle_convert.py: %s is %s, the target needs %s"
                             % (name, tuple(out[name].shape), shape))
    tgt = np.arange(len(d2t)) + d2t
    if d2t.shape != (draft_vocab,) or tgt.min() < 0 or tgt.max() >= nv:
        raise SystemExit("eagle_convert.py: d2t maps draft ids outside the target's vocabulary")
    ffn = out["blk.0.ffn_gate.weight"].shape[0]
    eagle = config.get("eagle_config", {})
    layers = (eagle.get("eagle_aux_hidden_state_layer_ids")
              or config.get("eagle_aux_hidden_state_layer_ids")
              or default_eagle3_layers(info["n_layer"]))
    return out, d2t, ffn, n_head, n_kv, config.get("rms_norm_eps", info["eps"]), layers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="the target model GGUF")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--checkpoint", help="EAGLE head state dict (.safetensors or .bin)")
    ap.add_argument("--config", help="the head's config.json (head counts, eps)")
    ap.add_argument("--random", action="store_true", help="random weights (tests)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--medusa", action="store_true",
                    help="Medusa heads (found by the checkpoint's keys without it)")
    ap.add_argument("--medusa-heads", type=int, default=3, help="with --random")
    ap.add_argument("--medusa-layers", type=int, default=1, help="with --random")
    a = ap.parse_args()
    info = target_info(a.target)
    if a.medusa and a.random:
        write_medusa(a.output, info, random_medusa(info, a.medusa_heads, a.medusa_layers, a.seed),
                     a.medusa_layers)
        print("%s: random Medusa heads for %s" % (a.output, info["name"]), file=sys.stderr)
        return
    if a.checkpoint:
        sd = read_checkpoint(a.checkpoint)
        if is_eagle3(sd):
            config = json.load(open(a.config)) if a.config else {}
            t, d2t, ffn, nh, nkv, eps, layers = convert_eagle3(info, sd, config)
            write_eagle3(a.output, info, t, d2t, ffn, nh, nkv, eps, layers)
            print("%s: EAGLE-3 head for %s (dim %d, draft vocabulary %d, layers %s)"
                  % (a.output, info["name"], info["dim"], len(d2t), layers), file=sys.stderr)
            return
        if a.medusa or is_medusa(sd):
            config = json.load(open(a.config)) if a.config else {}
            heads, n_layers = convert_medusa(info, sd, config)
            write_medusa(a.output, info, heads, n_layers)
            print("%s: %d Medusa heads of %d blocks for %s (dim %d)"
                  % (a.output, len(heads), n_layers, info["name"], info["dim"]), file=sys.stderr)
            return
    if a.random:
        tensors, ffn = random_head(info, a.seed)
        write_head(a.output, info, tensors, ffn)
    elif a.checkpoint:
        config = json.load(open(a.config)) if a.config else {}
        tensors, ffn, nh, nkv, eps = convert(info, sd, config)
        write_head(a.output, info, tensors, ffn, nh, nkv, eps)
    else:
        ap.error("give --checkpoint or --random")
    print("%s: EAGLE head for %s (dim %d)" % (a.output, info["name"], info["dim"]), file=sys.stderr)


if __name__ == "__main__":
    main()
