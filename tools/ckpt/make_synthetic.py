#!/usr/bin/env python3
"""Write tiny Hugging Face checkpoint folders for reader edge cases, good and deliberately broken.

    make_synthetic.py OUTDIR [--tokenizer-from HF_DIR] [--seed N]

Every model is Qwen2-shaped (Qwen2ForCausalLM: q/k/v biases, GQA) with 2 layers, hidden 64,
4 heads of 16, 2 KV heads, intermediate 256, random weights (normal, std 0.05 for linears and
embeddings, norms around 1). The tokenizer files are copied from --tokenizer-from (a folder made
by gguf_to_hf.py; vocab_size then follows its tokenizer) or, by default, a tiny byte-level BPE
stand-in (256 byte tokens, a few merges, <|endoftext|>/<|im_start|>/<|im_end|>; 264 embedding
rows). Same seed, same bytes.

OUTDIR/<name>/ (see OUTDIR/MANIFEST.json):
  bf16                 BF16, tied embeddings (no lm_head.weight), one model.safetensors
  bf16-shards3         BF16, untied (lm_head.weight), 3 shards + model.safetensors.index.json
  gptq-actorder-asym   GPTQ 4-bit, group 32, desc_act (g_idx permuted), asymmetric zeros
  gptq-g32             GPTQ 4-bit, group 32, symmetric
  gptq-gall            GPTQ 4-bit, group_size -1 (one group: scales [1, out]), symmetric
  awq-g64              AWQ GEMM 4-bit, group 64
  ct-int4-g32          compressed-tensors pack-quantized (llm-compressor W4A16), group 32, symmetric
  ct-int4-actorder-asym  the same, asymmetric zero points, act-order (weight_g_idx)
  fp8-tensor           compressed-tensors FP8, per-tensor weight_scale [1]
  fp8-tensor-scalar    the same with weight_scale shape [] (AutoFP8 style)
  fp8-channel          compressed-tensors FP8, per-channel weight_scale [out, 1] float32
  fp8-block            "fp8" block-wise, weight_scale_inv [ceil(out/128), ceil(in/128)] (partial
                       128x128 blocks, since every dimension here is below or not a multiple of 128)
OUTDIR/ref/<name>.dequant.safetensors: float32 [out, in] dequantized linear weights of each
quantized folder (same names as the BF16 weights), for bit-exact comparison of a reader's
dequantizer; kept outside the folders so no loader globs them.

OUTDIR/bad/<name>/: copies of bf16 with one defect each (OUTDIR/bad/MANIFEST.json says which);
a reader must reject each with an error, never crash or read out of bounds.
"""

import argparse
import json
import os
import shutil
import struct
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_io  # noqa: E402
import quantize_hf as qh  # noqa: E402

DIM, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 256
HEAD_DIM = DIM // HEADS

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


def bytes_to_unicode():
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_standin_tokenizer(d):
    """-> embedding rows. Writes tokenizer.json / tokenizer_config.json / generation_config.json."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    merges = ["Ġ t", "h e", "Ġt he", "i n"]
    for m in merges:
        vocab[m.replace(" ", "")] = len(vocab)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for i, s in enumerate(specials)]
    import gguf_to_hf as g2h
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
          "normalizer": {"type": "NFC"},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              {"type": "Split", "pattern": {"Regex": g2h.QWEN2_REGEX}, "behavior": "Isolated",
               "invert": False}, bl]},
          "post_processor": bl, "decoder": bl,
          "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                    "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                    "ignore_merges": False, "vocab": vocab, "merges": merges}}
    ckpt_io.write_json(os.path.join(d, "tokenizer.json"), tj)
    eot, ims, ime = (a["id"] for a in added)
    ckpt_io.write_json(os.path.join(d, "tokenizer_config.json"), {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized",
                                                                  "rstrip", "single_word", "special")}
                                 for a in added},
        "additional_special_tokens": ["<|im_start|>"], "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHATML, "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": 256, "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer"})
    ckpt_io.write_json(os.path.join(d, "generation_config.json"), {
        "bos_token_id": eot, "pad_token_id": eot, "eos_token_id": [ime, eot], "do_sample": True,
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05})
    rows = len(vocab) + len(specials)
    return (rows + 7) // 8 * 8, eot, ime


def config(vocab, tied, bos, eos):
    return {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": bos,
            "eos_token_id": eos, "hidden_act": "silu", "hidden_size": DIM, "initializer_range": 0.02,
            "intermediate_size": FFN, "max_position_embeddings": 256, "max_window_layers": LAYERS,
            "model_type": "qwen2", "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
            "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-06, "rope_scaling": None,
            "rope_theta": 1000000.0, "sliding_window": 256, "tie_word_embeddings": tied,
            "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
            "use_sliding_window": False, "vocab_size": vocab}


def random_weights(rng, vocab, tied):
    def bf(shape, std, mean=0.0):
        a = (rng.standard_normal(shape) * std + mean).astype(np.float32)
        b = ckpt_io.f32_to_bf16_bits(a)
        return ("BF16", tuple(shape), b)
    t = {"model.embed_tokens.weight": bf((vocab, DIM), 0.05)}
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = bf((DIM,), 0.1, 1.0)
        t[p + "post_attention_layernorm.weight"] = bf((DIM,), 0.1, 1.0)
        for n, o in (("q", DIM), ("k", kv), ("v", kv)):
            t[p + f"self_attn.{n}_proj.weight"] = bf((o, DIM), 0.05)
            t[p + f"self_attn.{n}_proj.bias"] = bf((o,), 0.1)
        t[p + "self_attn.o_proj.weight"] = bf((DIM, DIM), 0.05)
        t[p + "mlp.gate_proj.weight"] = bf((FFN, DIM), 0.05)
        t[p + "mlp.up_proj.weight"] = bf((FFN, DIM), 0.05)
        t[p + "mlp.down_proj.weight"] = bf((DIM, FFN), 0.05)
    t["model.norm.weight"] = bf((DIM,), 0.1, 1.0)
    if not tied:
        t["lm_head.weight"] = bf((vocab, DIM), 0.05)
    return t


def as_list(t):
    return [(n, d, s, a) for n, (d, s, a) in t.items()]


def copy_tok(src, dst):
    for fn in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, fn)):
            shutil.copyfile(os.path.join(src, fn), os.path.join(dst, fn))


def write_bf16(d, t, cfg, tokdir, shards=1):
    os.makedirs(d, exist_ok=True)
    ckpt_io.write_folder(d, as_list(t), shards)
    ckpt_io.write_json(os.path.join(d, "config.json"), cfg)
    copy_tok(tokdir, d)


QUANT = [
    ("gptq-actorder-asym", dict(method="gptq", group_size=32, sym=False, desc_act=True)),
    ("gptq-g32", dict(method="gptq", group_size=32, sym=True, desc_act=False)),
    ("gptq-gall", dict(method="gptq", group_size=-1, sym=True, desc_act=False)),
    ("awq-g64", dict(method="awq", group_size=64)),
    ("ct-int4-g32", dict(method="ct-int4", group_size=32, sym=True, desc_act=False)),
    ("ct-int4-actorder-asym", dict(method="ct-int4", group_size=32, sym=False, desc_act=True)),
    ("fp8-tensor", dict(method="fp8", fp8_scheme="tensor")),
    ("fp8-tensor-scalar", dict(method="fp8", fp8_scheme="tensor", scalar_scale=True)),
    ("fp8-channel", dict(method="fp8", fp8_scheme="channel")),
    ("fp8-block", dict(method="fp8", fp8_scheme="block")),
]


def write_ref(out, name, a):
    """dequantized linears of folder `name` as F32 safetensors under OUTDIR/ref/"""
    t = ckpt_io.read_folder(os.path.join(out, name))
    ts = []
    for n in sorted(t):
        for suf in (".qweight", ".weight_scale", ".weight_scale_inv"):
            if n.endswith(suf):
                prefix = n[: -len(suf)]
                w = qh.dequant_of(a, qh.unpack_of(a, t, prefix)).astype(np.float32)
                ts.append((prefix + ".weight", "F32", w.shape, np.ascontiguousarray(w)))
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    ckpt_io.write_safetensors(os.path.join(out, "ref", name + ".dequant.safetensors"), ts)


def st_bytes(path):
    with open(path, "rb") as f:
        return bytearray(f.read())


def rewrite_header(path, fn):
    """apply fn to the parsed header dict and write the file back with the same tensor bytes"""
    b = st_bytes(path)
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    fn(h)
    hj = json.dumps(h, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + bytes(b[8 + n:]))


def make_bad(out):
    good = os.path.join(out, "bf16")
    bad = os.path.join(out, "bad")
    man = {}

    def clone(name, desc, src=good):
        d = os.path.join(bad, name)
        if os.path.exists(d):
            shutil.rmtree(d)
        shutil.copytree(src, d)
        man[name] = desc
        return d

    d = clone("truncated-header", "model.safetensors ends inside the header JSON")
    p = os.path.join(d, "model.safetensors")
    b = st_bytes(p)
    with open(p, "wb") as f:
        f.write(b[:8 + 40])

    d = clone("header-len-past-eof", "the 8-byte header length is larger than the whole file")
    p = os.path.join(d, "model.safetensors")
    b = st_bytes(p)
    b[:8] = struct.pack("<Q", len(b) + 1000)
    with open(p, "wb") as f:
        f.write(b)

    d = clone("header-len-huge", "the header length is 2^63 + 8 (overflows signed arithmetic)")
    p = os.path.join(d, "model.safetensors")
    b = st_bytes(p)
    b[:8] = struct.pack("<Q", (1 << 63) + 8)
    with open(p, "wb") as f:
        f.write(b)

    def past_end(h):
        end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
        h["model.norm.weight"]["data_offsets"] = [end - 2 * DIM + 64, end + 64]
    d = clone("offsets-out-of-range", "model.norm.weight's data_offsets end past the data")
    rewrite_header(os.path.join(d, "model.safetensors"), past_end)

    def overlap(h):
        a = h["model.layers.0.input_layernorm.weight"]["data_offsets"]
        h["model.layers.0.post_attention_layernorm.weight"]["data_offsets"] = [a[0] + 2, a[1] + 2]
    d = clone("offsets-overlap", "two tensors' data_offsets overlap (post_attention_layernorm "
              "starts 2 bytes into input_layernorm, layer 0)")
    rewrite_header(os.path.join(d, "model.safetensors"), overlap)

    def reversed_offs(h):
        a = h["model.norm.weight"]["data_offsets"]
        h["model.norm.weight"]["data_offsets"] = [a[1], a[0]]
    d = clone("offsets-reversed", "model.norm.weight has begin > end")
    rewrite_header(os.path.join(d, "model.safetensors"), reversed_offs)

    def size_mismatch(h):
        a = h["model.norm.weight"]
        a["shape"] = [DIM * 2]
    d = clone("size-mismatch", "model.norm.weight shape [128] but data_offsets hold 64 BF16 values")
    rewrite_header(os.path.join(d, "model.safetensors"), size_mismatch)

    def shape_mismatch(h):
        a = h["model.layers.1.self_attn.q_proj.weight"]
        a["shape"] = [DIM // 2, DIM * 2]              # same byte count, wrong shape
    d = clone("shape-mismatch", "layer 1 q_proj.weight shape [32, 128]; config.json implies [64, 64] "
              "(byte count consistent)")
    rewrite_header(os.path.join(d, "model.safetensors"), shape_mismatch)

    def dtype_mismatch(h):
        a = h["model.layers.0.mlp.up_proj.weight"]
        a["dtype"] = "F16"                            # same size, but the checkpoint is BF16
    d = clone("dtype-mismatch", "layer 0 up_proj.weight is F16 while config.json torch_dtype is "
              "bfloat16 and every other tensor BF16 (a reader may accept F16; it must not read it as BF16)")
    rewrite_header(os.path.join(d, "model.safetensors"), dtype_mismatch)

    def dtype_unknown(h):
        h["model.layers.0.mlp.up_proj.weight"]["dtype"] = "Q4_K"
    d = clone("dtype-unknown", "layer 0 up_proj.weight has dtype \"Q4_K\", not a safetensors dtype")
    rewrite_header(os.path.join(d, "model.safetensors"), dtype_unknown)

    d = clone("header-not-json", "header bytes are not valid JSON")
    p = os.path.join(d, "model.safetensors")
    b = st_bytes(p)
    b[8] = ord("[")
    b[9] = ord("{")
    with open(p, "wb") as f:
        f.write(b)

    d = clone("missing-tensor", "model.layers.1.mlp.down_proj.weight is absent (the file is "
              "otherwise valid)")
    p = os.path.join(d, "model.safetensors")
    t = ckpt_io.read_safetensors(p)
    ts = [(n, dt, s, np.array(a)) for n, (dt, s, a) in t.items() if n != "model.layers.1.mlp.down_proj.weight"]
    ckpt_io.write_safetensors(p, ts)

    d = clone("unknown-quant-method", "config.json quantization_config.quant_method is \"made-up-q3\"",
              src=os.path.join(out, "gptq-g32"))
    cp = os.path.join(d, "config.json")
    cfg = json.load(open(cp))
    cfg["quantization_config"]["quant_method"] = "made-up-q3"
    ckpt_io.write_json(cp, cfg)

    d = clone("gptq-bits-3", "GPTQ config says bits 3 but the tensors are packed 4-bit",
              src=os.path.join(out, "gptq-g32"))
    cp = os.path.join(d, "config.json")
    cfg = json.load(open(cp))
    cfg["quantization_config"]["bits"] = 3
    ckpt_io.write_json(cp, cfg)

    d = clone("missing-shard", "the index names a shard file that does not exist",
              src=os.path.join(out, "bf16-shards3"))
    os.remove(os.path.join(d, "model-00002-of-00003.safetensors"))

    d = clone("index-wrong-shard", "the index maps model.norm.weight to a shard that does not hold it",
              src=os.path.join(out, "bf16-shards3"))
    ip = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(ip))
    cur = idx["weight_map"]["model.norm.weight"]
    idx["weight_map"]["model.norm.weight"] = next(v for v in sorted(set(idx["weight_map"].values())) if v != cur)
    ckpt_io.write_json(ip, idx)

    d = clone("no-config", "config.json is missing")
    os.remove(os.path.join(d, "config.json"))

    d = clone("empty-file", "model.safetensors is empty (0 bytes)")
    open(os.path.join(d, "model.safetensors"), "wb").close()

    ckpt_io.write_json(os.path.join(bad, "MANIFEST.json"), man)
    return man


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--tokenizer-from")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    out = a.outdir
    os.makedirs(out, exist_ok=True)
    tokdir = os.path.join(out, ".tok")
    os.makedirs(tokdir, exist_ok=True)
    if a.tokenizer_from:
        copy_tok(a.tokenizer_from, tokdir)
        src_cfg = json.load(open(os.path.join(a.tokenizer_from, "config.json")))
        vocab, bos, eos = src_cfg["vocab_size"], src_cfg.get("bos_token_id"), src_cfg.get("eos_token_id")
    else:
        vocab, bos, eos = write_standin_tokenizer(tokdir)
    rng = np.random.default_rng(a.seed)
    base = random_weights(rng, vocab, tied=True)
    manifest = {}
    write_bf16(os.path.join(out, "bf16"), base, config(vocab, True, bos, eos), tokdir)
    manifest["bf16"] = "BF16, tied embeddings, one file"
    untied = dict(base)
    untied["lm_head.weight"] = random_weights(rng, vocab, tied=False)["lm_head.weight"]
    write_bf16(os.path.join(out, "bf16-shards3"), untied, config(vocab, False, bos, eos), tokdir, shards=3)
    manifest["bf16-shards3"] = "BF16, untied lm_head, 3 shards with index"
    for name, opts in QUANT:
        args = dict(src=os.path.join(out, "bf16"), outdir=os.path.join(out, name), group_size=128,
                    sym=True, desc_act=False, fp8_scheme="channel", scale_dtype="f32",
                    scalar_scale=False, shards=1, verify=True)
        args.update(opts)
        ns = types.SimpleNamespace(**args)
        qh.quantize_folder(ns)
        write_ref(out, name, ns)
        manifest[name] = {"quantization_config": json.load(open(os.path.join(out, name, "config.json")))
                          ["quantization_config"], "reference": f"ref/{name}.dequant.safetensors"}
    shutil.rmtree(tokdir)
    ckpt_io.write_json(os.path.join(out, "MANIFEST.json"), manifest)
    man = make_bad(out)
    print(f"{out}: {len(manifest)} good folders, {len(man)} bad ones")


if __name__ == "__main__":
    main()
