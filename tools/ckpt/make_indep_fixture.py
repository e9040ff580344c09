#!/usr/bin/env python3
"""Write tests/data/ckpt/indep: tiny AWQ / GPTQ / compressed-tensors folders whose quantized
tensors were packed by code the project did not write, with the dequantized values as those
packages' own readers give them.

    python3 tools/ckpt/make_indep_fixture.py tests/data/ckpt/indep   # in a venv with vllm

Run once (the output is committed; the tests never import torch, vLLM or compressed-tensors).
Needs torch, vllm (>= 0.16, CPU build is enough) and compressed-tensors (0.13.0 was used).

Who wrote what (tests/data/ckpt/indep/PROVENANCE.md has the versions and checksums):
  awq-g32      qweight and qzeros packed by vLLM's awq_pack
               (vllm/model_executor/layers/quantization/utils/quant_utils.py, AutoAWQ's
               interleave [0, 2, 4, 6, 1, 3, 5, 7]); the reference is the output of vLLM's AWQ
               dequantization kernel (awq_triton.awq_dequantize_triton, the Triton kernel run on
               the CPU by Triton's interpreter), which must equal (q - z) * s rounded to F16.
  gptq-actorder-asym-g32
               qweight packed by vLLM's gptq_pack (pack_rows), act-order g_idx; qzeros packed by
               vLLM's pack_cols from z - 1 (the GPTQ v1 "zero minus one" offset is applied here:
               vLLM's packers have no v1 zero writer, so that one convention is this script's).
  ct-int4-actorder-asym-g32
               weight_packed / weight_zero_point / weight_shape written by compressed-tensors'
               PackedQuantizationCompressor.compress_weight (the llm-compressor writer) from the
               float weight, its scales, zero points and g_idx; the reference is
               compressed-tensors' own unpack_from_int32 + dequantize in float32.
The rest of each folder (config, stand-in tokenizer, BF16 embeddings/norms/biases) comes from
tools/ckpt (make_synthetic.py, quantize_hf.quant_config): that part is not what is checked.
The reference file ref/<name>.dequant.safetensors holds float32 [out, in] per linear weight.
"""
import hashlib
import json
import os
import sys
import types

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_io  # noqa: E402
import make_synthetic as ms  # noqa: E402
import quantize_hf as qh  # noqa: E402

DIM, HEADS, KV_HEADS, FFN, G = 32, 2, 1, 128, 32  # cairn takes groups of 32k
G_AWQ = 32  # the smallest group vLLM's AWQ kernel takes
HEAD_DIM = DIM // HEADS


def vllm_awq_dequant():
    """vLLM's AWQ dequantization kernel with the real Triton (vLLM's CPU build swaps Triton for
    a placeholder; the kernel source is taken unchanged, only its import line differs)."""
    import vllm.model_executor.layers.quantization.awq_triton as m
    src = open(m.__file__).read()
    line = "from vllm.triton_utils import tl, triton"
    assert line in src
    src = src.replace(line, "import triton\nimport triton.language as tl")
    mod = types.ModuleType("awq_triton_interpreted")
    mod.__file__ = m.__file__
    exec(compile(src, m.__file__, "exec"), mod.__dict__)
    return mod.awq_dequantize_triton


def linears():
    kv = KV_HEADS * HEAD_DIM
    return [("self_attn.q_proj", DIM, DIM), ("self_attn.k_proj", kv, DIM),
            ("self_attn.v_proj", kv, DIM), ("self_attn.o_proj", DIM, DIM),
            ("mlp.gate_proj", FFN, DIM), ("mlp.up_proj", FFN, DIM), ("mlp.down_proj", DIM, FFN)]


def base_tensors(rng, vocab):
    def bf(shape, std, mean=0.0):
        a = (rng.standard_normal(shape) * std + mean).astype(np.float32)
        return (ckpt_io.f32_to_bf16_bits(a), "BF16", tuple(shape))
    kv = KV_HEADS * HEAD_DIM
    p = "model.layers.0."
    t = {"model.embed_tokens.weight": bf((vocab, DIM), 0.05),
         p + "input_layernorm.weight": bf((DIM,), 0.1, 1.0),
         p + "post_attention_layernorm.weight": bf((DIM,), 0.1, 1.0),
         p + "self_attn.q_proj.bias": bf((DIM,), 0.1),
         p + "self_attn.k_proj.bias": bf((kv,), 0.1),
         p + "self_attn.v_proj.bias": bf((kv,), 0.1),
         "model.norm.weight": bf((DIM,), 0.1, 1.0)}
    return [(n, d, s, a) for n, (a, d, s) in t.items()]


def t_np(x):
    return np.ascontiguousarray(x.detach().cpu().numpy())


def awq_layer(gen, out_f, in_f, deq):
    from vllm.model_executor.layers.quantization.utils.quant_utils import awq_pack
    q = torch.randint(0, 16, (in_f, out_f), generator=gen, dtype=torch.int32)
    z = torch.randint(0, 16, (in_f // G_AWQ, out_f), generator=gen, dtype=torch.int32)
    s = (torch.rand((in_f // G_AWQ, out_f), generator=gen) * 0.02 + 0.001).half()
    qw = awq_pack(q, 4, in_f, out_f)
    qz = awq_pack(z, 4, in_f // G_AWQ, out_f)
    w = deq(qw, s, qz)                                          # F16 [in, out]
    exact = (q - z.repeat_interleave(G_AWQ, 0)).float() * s.float().repeat_interleave(G_AWQ, 0)
    assert torch.equal(w, exact.half()), "vLLM's AWQ dequantization disagrees with (q - z) * s"
    tensors = {"qweight": ("I32", t_np(qw)), "qzeros": ("I32", t_np(qz)),
               "scales": ("F16", t_np(s))}
    return tensors, t_np(exact.T.contiguous())                  # reference [out, in]


def gptq_layer(gen, out_f, in_f):
    from vllm.model_executor.layers.quantization.utils.quant_utils import gptq_pack, pack_cols
    n_g = in_f // G
    q = torch.randint(0, 16, (in_f, out_f), generator=gen, dtype=torch.int32)
    z = torch.randint(1, 16, (n_g, out_f), generator=gen, dtype=torch.int32)  # v1: z >= 1
    s = (torch.rand((n_g, out_f), generator=gen) * 0.02 + 0.001).half()
    g_idx = (torch.randperm(in_f, generator=gen) // G).to(torch.int32)       # act-order groups
    qw = gptq_pack(q, 4, in_f, out_f)
    qz = pack_cols(z - 1, 4, n_g, out_f)
    gi = g_idx.long()
    exact = (q - z[gi]).float() * s.float()[gi]
    tensors = {"qweight": ("I32", t_np(qw)), "qzeros": ("I32", t_np(qz)),
               "scales": ("F16", t_np(s)), "g_idx": ("I32", t_np(g_idx))}
    return tensors, t_np(exact.T.contiguous())


def ct_layer(gen, out_f, in_f):
    from compressed_tensors.compressors.quantized_compressors.pack_quantized import (
        PackedQuantizationCompressor, unpack_from_int32)
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group",
                            group_size=G, actorder="group")
    n_g = in_f // G
    w = (torch.randn((out_f, in_f), generator=gen) * 0.05)
    g_idx = (torch.randperm(in_f, generator=gen) // G).to(torch.int32)
    s = (torch.rand((out_f, n_g), generator=gen) * 0.02 + 0.001).half()
    zp = torch.randint(-8, 8, (out_f, n_g), generator=gen, dtype=torch.int8)
    comp = PackedQuantizationCompressor(config=None)
    d = comp.compress_weight(weight=w.half(), scale=s, quantization_args=args, zero_point=zp,
                             g_idx=g_idx)
    q = unpack_from_int32(d["weight_packed"], 4, torch.Size((out_f, in_f)))
    z = unpack_from_int32(d["weight_zero_point"], 4, torch.Size((out_f, n_g)), packed_dim=0)
    assert torch.equal(z, zp)
    ref = dequantize(x_q=q, scale=s.float(), zero_point=z, g_idx=g_idx)     # float32 [out, in]
    gi = g_idx.long()
    assert torch.equal(ref, (q.float() - zp.float()[:, gi]) * s.float()[:, gi])
    # and the package's own decompression (in the scale's dtype) agrees up to that rounding
    back = comp.decompress_weight({**d, "weight_scale": s, "weight_g_idx": g_idx}, args)
    assert torch.equal(back, ref.half())
    tensors = {"weight_packed": ("I32", t_np(d["weight_packed"])),
               "weight_scale": ("F16", t_np(s)),
               "weight_zero_point": ("I32", t_np(d["weight_zero_point"])),
               "weight_shape": ("I64", t_np(d["weight_shape"]).astype(np.int64)),
               "weight_g_idx": ("I32", t_np(g_idx))}
    return tensors, t_np(ref)


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "ref"), exist_ok=True)
    tokdir = os.path.join(out, ".tok")
    os.makedirs(tokdir, exist_ok=True)
    vocab, bos, eos = ms.write_standin_tokenizer(tokdir)
    deq = vllm_awq_dequant()
    folders = [
        ("awq-g32", dict(method="awq", group_size=G_AWQ, sym=False, desc_act=False),
         lambda gen, o, i: awq_layer(gen, o, i, deq)),
        ("gptq-actorder-asym-g32", dict(method="gptq", group_size=G, sym=False, desc_act=True),
         gptq_layer),
        ("ct-int4-actorder-asym-g32", dict(method="ct-int4", group_size=G, sym=False, desc_act=True),
         ct_layer),
    ]
    for k, (name, qa, layer) in enumerate(folders):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng(100 + k)
        gen = torch.Generator().manual_seed(100 + k)
        tensors = base_tensors(rng, vocab)
        refs = []
        for lin, o, i in linears():
            prefix = f"model.layers.0.{lin}"
            ts, ref = layer(gen, o, i)
            for suffix, (dt, arr) in ts.items():
                tensors.append((f"{prefix}.{suffix}", dt, arr.shape, arr))
            refs.append((prefix + ".weight", "F32", ref.shape, ref.astype(np.float32)))
        ckpt_io.write_folder(d, tensors, 1)
        cfg = ms.config(vocab, True, bos, eos)
        cfg.update({"hidden_size": DIM, "intermediate_size": FFN, "num_attention_heads": HEADS,
                    "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1, "max_window_layers": 1})
        cfg["quantization_config"] = qh.quant_config(types.SimpleNamespace(fp8_scheme=None, **qa))
        ckpt_io.write_json(os.path.join(d, "config.json"), cfg)
        ms.copy_tok(tokdir, d)
        ckpt_io.write_safetensors(os.path.join(out, "ref", name + ".dequant.safetensors"), refs)
    for fn in os.listdir(tokdir):
        os.remove(os.path.join(tokdir, fn))
    os.rmdir(tokdir)
    for root, _, files in sorted(os.walk(out)):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            if fn.endswith(".md"):
                continue
            print(hashlib.sha256(open(p, "rb").read()).hexdigest(), os.path.relpath(p, out))


if __name__ == "__main__":
    main()
