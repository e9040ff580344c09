#!/usr/bin/env python3
"""Turn a GGUF model into a Hugging Face checkpoint folder (BF16 safetensors + config/tokenizer).

    gguf_to_hf.py MODEL.gguf OUTDIR [--shards N] [--f16-gguf OUT.gguf]

No model hub is reachable here, so this is how cairn gets real HF-layout test material: the GGUF's
weights are dequantized to float32 (gguf-py), rounded to BF16 (nearest, ties to even) and written
under the HF parameter names in HF shapes ([out, in] for linear weights, [vocab, hidden] for the
embeddings). lm_head.weight is written only when the GGUF has output.weight (otherwise
tie_word_embeddings is true, as HF does). For architecture llama the q_proj/k_proj rows are put
back in HF's rotate-half order: convert_hf_to_gguf.py interleaves each head's two halves
(rows h*D + s*D/2 + j -> h*D + 2*j + s); this tool applies the inverse. qwen2/qwen3/gemma3 GGUFs
keep HF's order (NEOX RoPE), so nothing is permuted there.

Architectures: llama (Mixtral when llama.expert_count > 0), qwen2, qwen3, qwen2moe, qwen3moe,
gemma3 (-> Gemma3ForCausalLM). Gemma's HF norms hold w and compute x*(1+w), while its GGUF holds
1+w, so every gemma3 norm weight is written as (GGUF value - 1). Mixtures of experts: the GGUF
keeps a layer's experts in one 3-D tensor per projection (ffn_{gate,up,down}_exps, numpy shape
[expert, out, in]); HF has one 2-D tensor per expert and projection (Qwen:
mlp.experts.E.{gate,up,down}_proj, Mixtral: block_sparse_moe.experts.E.{w1,w3,w2}), the router
as mlp.gate / block_sparse_moe.gate, and qwen2moe's shared expert as mlp.shared_expert.* with its
1-D gate as mlp.shared_expert_gate [1, hidden]. A GGUF whose <arch>.expert_weights_scale is not 1
is refused (HF configs have no field for it).

gpt-oss (-> GptOssForCausalLM, as openai/gpt-oss-* ship it): the attention's biases (o_proj's too),
self_attn.sinks [heads], post_attention_layernorm from GGUF's post_attention_norm (the FFN input
norm), the router as mlp.router.{weight,bias}, and each layer's experts stacked as HF stacks them,
gate and up interleaved along the 2*eff axis (gate the even entries, up the odd ones):
mlp.experts.gate_up_proj_bias [E, 2*eff] and down_proj_bias [E, hidden] always, and the weights
either as MXFP4 (when the GGUF's experts are MXFP4, unless --bf16-experts): gate_up_proj_blocks U8
[E, 2*eff, hidden/32, 16] / gate_up_proj_scales U8 [E, 2*eff, hidden/32] and down_proj_blocks /
down_proj_scales [E, hidden, eff/32(, 16)], the GGUF's blocks moved bit for bit into HF's nibble
order (byte b holds elements 2b and 2b+1, low nibble first, where GGUF's byte b holds b and
b+16), with config.json's quantization_config {"quant_method": "mxfp4"}; or as BF16 (the
dequantized variants): gate_up_proj [E, hidden, 2*eff] and down_proj [E, eff, hidden], input-major
as HF multiplies them (x @ W). MXFP4 values are BF16 values, so --bf16-experts loses nothing.
config.json's rope_scaling says "truncate": true: the YaRN a GGUF holds is llama.cpp's, which
rounds the correction range (the openai checkpoints say false, HF's unrounded maths).

Written files: model.safetensors (or N shards model-0000i-of-0000N.safetensors with
model.safetensors.index.json), config.json, generation_config.json, tokenizer.json,
tokenizer_config.json. tokenizer.json is built from the GGUF vocabulary for byte-level BPE
("gpt2") and SentencePiece ("llama") vocabularies; others get none (a warning says so).
--tokenizer-only writes just the tokenizer files (tokenizer.json, plus tokenizer_config.json with
the chat template and generation_config.json when the GGUF has a model section): what a router
that tokenizes requests itself needs, and all a vocabulary-only GGUF can give.

--f16-gguf writes a GGUF with exactly the same weights for comparison runs: 2-D and 3-D tensors as
F16 converted from the BF16 values (exact except magnitudes below 2^-14, where F16 is subnormal, or
above 65504; the counts are printed), 1-D tensors as F32 from the BF16 values, all metadata copied
from the source except general.file_type, set to 1 (MOSTLY_F16) since the tensor types changed.
Tensor names, order and shapes are the source's: experts are stacked back into the 3-D tensors,
and gemma3 norms are written as float32(BF16 value + 1), which is what a loader that adds 1 in
float32 to the HF value computes. gpt-oss's MXFP4 experts are copied as they are, and its expert
biases written as F32 (its loaders read them as F32 only).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_io  # noqa: E402

import gguf  # noqa: E402
from gguf import GGUFReader, GGUFValueType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

# GGUF per-layer tensor name -> HF name (without the "model.layers.N." prefix)
LAYER_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# Gemma 3 has norms after attention and after the FFN too; its ffn_norm is the pre-FFN one.
GEMMA3_LAYER_MAP = dict(LAYER_MAP, ffn_norm="pre_feedforward_layernorm",
                        post_attention_norm="post_attention_layernorm",
                        post_ffw_norm="post_feedforward_layernorm")
# Its norm weights are stored as 1+w in the GGUF, as w in HF.
GEMMA3_NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm",
                "post_ffw_norm")
# Mixtures of experts: "{}" in a name is the expert index (one HF tensor per expert).
QWEN_MOE_MAP = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.{}.gate_proj",
    "ffn_up_exps": "mlp.experts.{}.up_proj",
    "ffn_down_exps": "mlp.experts.{}.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",   # 1-D [hidden] in the GGUF, [1, hidden] in HF
}
MIXTRAL_MAP = {
    "ffn_gate_inp": "block_sparse_moe.gate",
    "ffn_gate_exps": "block_sparse_moe.experts.{}.w1",
    "ffn_up_exps": "block_sparse_moe.experts.{}.w3",
    "ffn_down_exps": "block_sparse_moe.experts.{}.w2",
}
# gpt-oss: the tensors named one to one (its experts are stacked: gptoss_experts); the FFN input
# norm is post_attention_norm in the GGUF, and the sinks have no ".weight" in HF.
GPTOSS_LAYER_MAP = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_sinks": "self_attn.sinks",
    "ffn_gate_inp": "mlp.router",
}
SUPPORTED = ("llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma3", "gpt-oss")
ARCH_LAYER_MAP = {
    "gemma3": GEMMA3_LAYER_MAP,
    "qwen2moe": dict(LAYER_MAP, **QWEN_MOE_MAP),
    "qwen3moe": dict(LAYER_MAP, **QWEN_MOE_MAP),
    "llama": dict(LAYER_MAP, **MIXTRAL_MAP),
    "gpt-oss": GPTOSS_LAYER_MAP,
}

# Qwen2's pre-tokenizer regex, as Qwen2/2.5 tokenizer.json ships it.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# GPT-2's (used for pre types this tool has no specific regex for).
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    return f.contents()


def token_id(r, key):
    """a tokenizer.ggml.*_token_id, or None when absent or out of range (GGUF writers store
    0xFFFFFFFF for 'none', e.g. the padding id of llama2.c conversions)"""
    v = field(r, key)
    n = len(r.fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in r.fields else 0
    return int(v) if v is not None and 0 <= int(v) < n else None


def f32_repr(x):
    """GGUF stores eps/theta as float32; HF configs carry the short decimal (1e-06, not
    9.99999997e-07). The shortest decimal that rounds to the same float32 is that value."""
    return float(repr(np.float32(x)).replace("np.float32(", "").rstrip(")"))


def unpermute_rows(w, n_head):
    """Inverse of convert_hf_to_gguf.py's permute(): GGUF row h*D + 2*j + s came from HF row
    h*D + s*D/2 + j (D = head size, s in {0, 1}, j < D/2)."""
    shp = w.shape
    return (w.reshape(n_head, shp[0] // n_head // 2, 2, *shp[1:])
            .swapaxes(1, 2).reshape(shp))


def permute_rows(w, n_head):
    """convert_hf_to_gguf.py's permute (HF rotate-half order -> GGUF interleaved order)."""
    shp = w.shape
    return (w.reshape(n_head, 2, shp[0] // n_head // 2, *shp[1:])
            .swapaxes(1, 2).reshape(shp))


def hf_name(gname, arch="llama"):
    """HF name of a GGUF tensor ("{}" standing for the expert index in per-expert names), or None"""
    if gname in GLOBAL_MAP:
        return GLOBAL_MAP[gname]
    lm = ARCH_LAYER_MAP.get(arch, LAYER_MAP)
    p = gname.split(".")
    if p[0] == "blk" and len(p) == 4 and p[2] in lm:
        if arch == "gpt-oss" and p[2] == "attn_sinks":
            return f"model.layers.{int(p[1])}.{lm[p[2]]}"
        return f"model.layers.{int(p[1])}.{lm[p[2]]}.{p[3]}"
    return None


def is_gemma_norm(arch, gname):
    p = gname.split(".")
    return arch == "gemma3" and (gname == "output_norm.weight" or
                                 (p[0] == "blk" and len(p) == 4 and p[2] in GEMMA3_NORMS))


def moe_check(r, arch):
    """-> expert count (0 for a dense model). HF's MoE configs have no routing-weight scale, so a
    file that scales the chosen experts' weights cannot be expressed; refuse it."""
    n_exp = int(field(r, f"{arch}.expert_count", 0) or 0)
    scale = field(r, f"{arch}.expert_weights_scale")
    if n_exp and scale is not None and float(scale) not in (0.0, 1.0):
        raise SystemExit(f"{arch}.expert_weights_scale = {scale}: HF configs cannot express it")
    return n_exp


def to_bf16_bits(t, shape, minus_one=False):
    """Dequantize a GGUF tensor (minus 1 for Gemma norms) and round it to BF16, a slab of rows at
    a time: gguf-py's dequantize makes several float32 temporaries of what it is given, which for
    a 262k-row embedding would be GBs at once."""
    rows = t.data.reshape(-1, t.data.shape[-1])    # quantized: the last axis is bytes of a row
    out = np.empty((rows.shape[0], shape[-1]), dtype=np.uint16)
    step = max(1, (1 << 24) // shape[-1])          # 64 MiB of float32
    for i in range(0, rows.shape[0], step):
        w = dequantize(rows[i:i + step], t.tensor_type).astype(np.float32, copy=False)
        if minus_one:
            w = w - np.float32(1)
        out[i:i + step] = ckpt_io.f32_to_bf16_bits(w).reshape(-1, shape[-1])
    return out.reshape(shape)


def mxfp4_to_hf(blocks):
    """GGUF MXFP4 blocks ([..., 17] bytes: the E8M0 scale, then byte j holding element j in its
    low nibble and j+16 in its high one) -> (HF's 16 bytes [..., 16] with byte b holding element
    2b in its low nibble and 2b+1 in its high one, the scale bytes [...])."""
    qs = blocks[..., 1:]
    el = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)          # [..., 32] codes, in order
    return (el[..., 0::2] | (el[..., 1::2] << 4)).astype(np.uint8), blocks[..., 0].copy()


def gptoss_experts(r, bf16_experts):
    """gpt-oss's expert tensors: {gguf name: (parts, twin)} where parts are the HF tensors that
    GGUF tensor stands for ([(hf_name, array)], the stacked gate_up ones on the gate entry) and twin
    is (array, how) for the --f16-gguf copy: the MXFP4 bytes as they are (how: the GGUF type), float
    experts as F16 of their BF16 values (how "F16"; array float32), biases as F32 of theirs (how
    "F32": model.c reads expert biases as F32 only)."""
    by_name = {t.name: t for t in r.tensors}
    out = {}
    bf16_cache = {}

    def bf16(name):                              # BF16 bits in numpy (GGUF outer-first) shape
        if name not in bf16_cache:
            t = by_name[name]
            bf16_cache[name] = to_bf16_bits(t, [int(x) for x in reversed(t.shape)])
        return bf16_cache[name]

    def interleave(a, b, axis):                  # a on the even entries of `axis`, b on the odd
        shape = list(a.shape)
        shape[axis] *= 2
        o = np.empty(shape, dtype=a.dtype)
        sl = [slice(None)] * len(shape)
        sl[axis] = slice(0, None, 2)
        o[tuple(sl)] = a
        sl[axis] = slice(1, None, 2)
        o[tuple(sl)] = b
        return o

    layers = sorted({int(n.split(".")[1]) for n in by_name if "_exps." in n})
    for l in layers:
        g = {k: by_name[f"blk.{l}.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")}
        pre = f"model.layers.{l}.mlp.experts."
        mx = all(t.tensor_type == gguf.GGMLQuantizationType.MXFP4 for t in g.values())
        if mx and not bf16_experts:
            hf = {}
            for k, t in g.items():
                q, sc = mxfp4_to_hf(np.asarray(t.data).reshape(t.data.shape[0], t.data.shape[1],
                                                               -1, 17))
                hf[k] = (q, sc)
                out[t.name] = ([], (np.asarray(t.data), gguf.GGMLQuantizationType.MXFP4))
            out[g["gate"].name] = ([
                (pre + "gate_up_proj_blocks", interleave(hf["gate"][0], hf["up"][0], 1)),
                (pre + "gate_up_proj_scales", interleave(hf["gate"][1], hf["up"][1], 1))],
                out[g["gate"].name][1])
            out[g["down"].name] = ([(pre + "down_proj_blocks", hf["down"][0]),
                                    (pre + "down_proj_scales", hf["down"][1])],
                                   out[g["down"].name][1])
        else:
            # (from MXFP4: E2M1 codes times a power of two, which BF16 holds exactly)
            w = {k: bf16(t.name) for k, t in g.items()}              # [E, out, in]
            for k, t in g.items():
                out[t.name] = ([], (ckpt_io.bf16_bits_to_f32(w[k]), "F16"))
            # HF multiplies x @ W: the input axis before the output one
            gate_up = interleave(w["gate"].transpose(0, 2, 1), w["up"].transpose(0, 2, 1), 2)
            out[g["gate"].name] = ([(pre + "gate_up_proj", gate_up)], out[g["gate"].name][1])
            out[g["down"].name] = ([(pre + "down_proj", np.ascontiguousarray(
                w["down"].transpose(0, 2, 1)))], out[g["down"].name][1])
        b = {k: bf16(f"blk.{l}.ffn_{k}_exps.bias") for k in ("gate", "up", "down")}   # [E, n]
        for k in b:
            out[f"blk.{l}.ffn_{k}_exps.bias"] = ([], (ckpt_io.bf16_bits_to_f32(b[k]), "F32"))
        out[f"blk.{l}.ffn_gate_exps.bias"] = ([(pre + "gate_up_proj_bias",
                                                interleave(b["gate"], b["up"], 1))],
                                              out[f"blk.{l}.ffn_gate_exps.bias"][1])
        out[f"blk.{l}.ffn_down_exps.bias"] = ([(pre + "down_proj_bias", b["down"])],
                                              out[f"blk.{l}.ffn_down_exps.bias"][1])
        bf16_cache.clear()
    return out


def load_weights(r, arch, bf16_experts=False):
    """-> list of (gguf_name, gguf numpy shape, [(hf_name, BF16 bits in HF shape), ...], twin),
    one entry per GGUF tensor in file order; a 3-D expert tensor gives one HF tensor per expert.
    Weights are rounded to BF16 as they are dequantized, so the model is held once, as BF16.
    twin is None, or what --f16-gguf writes for that tensor instead (gpt-oss's experts, whose HF
    tensors stand for several GGUF ones and may be U8 MXFP4 blocks: gptoss_experts)."""
    nh = field(r, f"{arch}.attention.head_count")
    nkv = field(r, f"{arch}.attention.head_count_kv", nh)
    experts = gptoss_experts(r, bf16_experts) if arch == "gpt-oss" else {}
    out = []
    for t in r.tensors:
        if t.name in experts:
            parts, twin = experts[t.name]
            out.append((t.name, [int(x) for x in reversed(t.shape)], parts, twin))
            continue
        hn = hf_name(t.name, arch)
        if hn is None:
            if t.name == "rope_freqs.weight":
                print(f"note: {t.name} not written (HF derives it from config rope_scaling)",
                      file=sys.stderr)
                continue
            raise SystemExit(f"no HF name for GGUF tensor {t.name}")
        shape = [int(x) for x in reversed(t.shape)]   # ne[] is innermost first; numpy is outer first
        b = to_bf16_bits(t, shape, minus_one=is_gemma_norm(arch, t.name))
        # Row permutations commute with the elementwise rounding, so they act on the BF16 bits.
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            b = unpermute_rows(b, nh)
        elif arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            b = unpermute_rows(b, nkv)
        elif hn.endswith("shared_expert_gate.weight"):
            b = b.reshape(1, -1)                      # HF's Linear(hidden, 1)
        if "{}" in hn:
            if b.ndim != 3:
                raise SystemExit(f"{t.name}: expected a 3-D expert tensor, got shape {shape}")
            parts = [(hn.format(e), b[e]) for e in range(b.shape[0])]
        else:
            parts = [(hn, b)]
        out.append((t.name, shape, parts, None))
    return out


def yarn_scaling(r, arch):
    """HF's rope_scaling for a GGUF with YaRN (Qwen2.5's long-context setting), else None."""
    g = lambda k, d=None: field(r, f"{arch}.{k}", d)  # noqa: E731
    if g("rope.scaling.type") != "yarn":
        return None
    sc = {"type": "yarn", "factor": f32_repr(g("rope.scaling.factor")),
          "original_max_position_embeddings": int(g("rope.scaling.original_context_length",
                                                    g("context_length")))}
    for key, hf in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        if g("rope.scaling." + key) is not None:
            sc[hf] = f32_repr(g("rope.scaling." + key))
    return sc


def make_config(r, arch, vocab_rows, tied, mxfp4=False):
    g = lambda k, d=None: field(r, f"{arch}.{k}", d)  # noqa: E731
    nh = g("attention.head_count")
    dim = g("embedding_length")
    ctx = g("context_length")
    cfg = {
        "hidden_act": "silu",
        "hidden_size": dim,
        "intermediate_size": g("feed_forward_length"),
        "num_hidden_layers": g("block_count"),
        "num_attention_heads": nh,
        "num_key_value_heads": g("attention.head_count_kv", nh),
        "max_position_embeddings": ctx,
        "rms_norm_eps": f32_repr(g("attention.layer_norm_rms_epsilon")),
        "rope_theta": f32_repr(g("rope.freq_base", 10000.0)),
        "rope_scaling": yarn_scaling(r, arch),
        "tie_word_embeddings": tied,
        "vocab_size": vocab_rows,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "transformers_version": "4.43.1",
    }
    bos = token_id(r, "tokenizer.ggml.bos_token_id")
    eos = token_id(r, "tokenizer.ggml.eos_token_id")
    if bos is not None:
        cfg["bos_token_id"] = int(bos)
    if eos is not None:
        cfg["eos_token_id"] = int(eos)
    head_dim = g("attention.key_length")
    n_exp = moe_check(r, arch)
    base = {"qwen2moe": "qwen2", "qwen3moe": "qwen3"}.get(arch, arch)
    if base == "qwen2":
        cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                    # Qwen2.5 ships the sliding-window fields with the window off.
                    "sliding_window": ctx, "use_sliding_window": False,
                    "max_window_layers": g("block_count")})
    elif base == "qwen3":
        cfg.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                    "head_dim": head_dim or dim // nh, "attention_bias": False,
                    "sliding_window": None, "use_sliding_window": False,
                    "max_window_layers": g("block_count")})
    elif arch == "llama":
        cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "head_dim": head_dim or dim // nh, "attention_bias": False,
                    "mlp_bias": False, "pretraining_tp": 1})
        if any(t.name == "rope_freqs.weight" for t in r.tensors):
            print("warning: rope_freqs present; config rope_scaling left null", file=sys.stderr)
    elif arch == "gemma3":
        del cfg["hidden_act"]                   # Gemma's field is hidden_activation
        cfg.update(gemma3_config(r, g, head_dim or dim // nh))
    elif arch == "gpt-oss":
        cfg.update(gptoss_config(r, g, head_dim or dim // nh, n_exp, mxfp4))
        return dict(sorted(cfg.items()))
    else:
        raise SystemExit(f"architecture {arch} not supported")
    if n_exp or arch.endswith("moe"):
        cfg.update(moe_config(g, arch, n_exp))
    return dict(sorted(cfg.items()))


def gptoss_config(r, g, head_dim, n_exp, mxfp4):
    """GptOssForCausalLM's fields, as openai/gpt-oss-20b ships them (with its duplicate
    experts_per_token and initial_context_length), for the GGUF's shapes."""
    n_layer = g("block_count")
    pattern = g("attention.sliding_window_pattern", 2)
    if pattern != 2:
        raise SystemExit(f"gpt-oss.attention.sliding_window_pattern = {pattern}: "
                         "GptOssConfig's layer_types alternate (local, global)")
    if not n_exp:
        raise SystemExit("gpt-oss: no gpt-oss.expert_count")
    cfg = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "head_dim": head_dim, "attention_bias": True,
        "intermediate_size": g("expert_feed_forward_length", g("feed_forward_length")),
        "num_local_experts": n_exp, "num_experts_per_tok": g("expert_used_count"),
        "experts_per_token": g("expert_used_count"),
        "sliding_window": g("attention.sliding_window"),
        # even layers local, as GptOssConfig's default and llama.cpp's
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                        for i in range(n_layer)],
        "swiglu_limit": 7.0, "router_aux_loss_coef": 0.9, "output_router_logits": False,
        "transformers_version": "4.55.0",
    }
    sc = yarn_scaling(r, "gpt-oss")
    if sc is not None:
        del sc["type"]
        sc.update({"rope_type": "yarn", "beta_fast": sc.get("beta_fast", 32.0),
                   "beta_slow": sc.get("beta_slow", 1.0),
                   # the GGUF's YaRN is llama.cpp's, with the correction range rounded
                   "truncate": True})
        cfg["initial_context_length"] = sc["original_max_position_embeddings"]
        # some transformers versions take YaRN's factor as max_position_embeddings over
        # original_max_position_embeddings rather than rope_scaling.factor: make the two agree,
        # as OpenAI's 131072 = 32 * 4096 do
        stretched = int(sc["original_max_position_embeddings"] * sc["factor"])
        cfg["max_position_embeddings"] = max(g("context_length"), stretched)
    cfg["rope_scaling"] = sc
    if mxfp4:
        cfg["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"]}
    return cfg


def gemma3_config(r, g, head_dim):
    """Gemma3ForCausalLM's fields (what google/gemma-3-*-it ship, with newer transformers'
    layer_types). Every sliding_window_pattern-th layer is global, the others see the last
    sliding_window positions and use rope_local_base_freq."""
    n_layer = g("block_count")
    pattern = g("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):           # per-layer "is SWA" flags, as some writers store it
        swa = [bool(x) for x in pattern]
        pattern = swa.index(False) + 1 if False in swa else n_layer + 1
    else:
        swa = [(i + 1) % pattern != 0 for i in range(n_layer)]
    scaling = None
    if g("rope.scaling.type") == "linear" and g("rope.scaling.factor", 1.0) != 1.0:
        # Gemma 3 4B+ stretch the global layers' RoPE (HF applies rope_scaling to those only).
        scaling = {"factor": f32_repr(g("rope.scaling.factor")), "rope_type": "linear"}
    pad = token_id(r, "tokenizer.ggml.padding_token_id")
    cfg = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh", "head_dim": head_dim,
        "rope_theta": f32_repr(g("rope.freq_base", 1000000.0)),
        "rope_local_base_freq": f32_repr(g("rope.freq_base_swa", 10000.0)),
        "sliding_window": g("attention.sliding_window"),
        "sliding_window_pattern": pattern,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in swa],
        # Gemma 3 scales queries by query_pre_attn_scalar^-0.5: head_dim, except the 27B (62
        # layers), trained with hidden / heads.
        "query_pre_attn_scalar": (g("embedding_length") // g("attention.head_count")
                                  if n_layer == 62 else head_dim),
        "final_logit_softcapping": None, "attn_logit_softcapping": None,
        "attention_bias": False, "rope_scaling": scaling, "use_bidirectional_attention": False,
        "transformers_version": "4.55.0",
    }
    if pad is not None:
        cfg["pad_token_id"] = int(pad)
    return cfg


def moe_config(g, arch, n_exp):
    """The expert fields of Qwen2MoeForCausalLM / Qwen3MoeForCausalLM / MixtralForCausalLM."""
    k = g("expert_used_count")
    if not n_exp:
        raise SystemExit(f"{arch}: no {arch}.expert_count")
    if arch == "qwen3moe":
        return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                "num_experts": n_exp, "num_experts_per_tok": k,
                "moe_intermediate_size": g("expert_feed_forward_length"),
                "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                "router_aux_loss_coef": 0.001, "output_router_logits": False}
    if arch == "qwen2moe":
        return {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                "num_experts": n_exp, "num_experts_per_tok": k,
                "moe_intermediate_size": g("expert_feed_forward_length"),
                "shared_expert_intermediate_size": g("expert_shared_feed_forward_length"),
                "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                "router_aux_loss_coef": 0.001, "output_router_logits": False}
    if arch == "llama":
        # Mixtral: its experts are feed_forward_length wide (intermediate_size, already set).
        return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": n_exp, "num_experts_per_tok": k, "sliding_window": None,
                "router_aux_loss_coef": 0.02, "output_router_logits": False}
    raise SystemExit(f"architecture {arch} with experts not supported")


def tokens_and_types(r):
    toks = field(r, "tokenizer.ggml.tokens")
    tt = r.fields.get("tokenizer.ggml.token_type")
    types = [int(tt.parts[i][0]) for i in tt.data] if tt is not None else [1] * len(toks)
    return toks, types


def make_spm_tokenizer_json(r):
    """SentencePiece ("llama") vocabulary -> the BPE-with-byte-fallback tokenizer.json that HF's
    Llama converter writes (legacy form: normalizer prepends U+2581 and replaces spaces by it).
    When the GGUF says tokenizer.ggml.add_space_prefix = false (Gemma) it is the form HF's
    GemmaConverter writes instead: spaces replaced by U+2581, nothing prepended, and no Strip of
    a leading space when decoding.
    Merges follow the converter's rule: every split of a piece into two vocabulary pieces is a
    merge, ordered by the merged piece's score (descending, stable), splits of one piece by the
    ids of their halves. Control tokens (type 3, and 2: unknown) become special added tokens,
    user-defined ones (4: Gemma's newline/tab/space runs and HTML tags) non-special ones, unused
    ones (5) are left out."""
    toks, types = tokens_and_types(r)
    sf = r.fields.get("tokenizer.ggml.scores")
    scores = list(sf.contents()) if sf is not None else [-float(i) for i in range(len(toks))]
    vocab = {s: i for i, s in enumerate(toks) if types[i] != 5}
    merges = []
    for piece, pid in vocab.items():
        if " " in piece:
            # Only user-defined tokens hold spaces (convert_hf_to_gguf turns their U+2581 back into
            # spaces: Gemma's runs of spaces). They are matched as added tokens on the raw text;
            # BPE never sees a space (the normalizer replaces them), and the "left right" merge
            # format cannot hold one.
            continue
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges += [(scores[pid], lr) for lr in local]
    merges.sort(key=lambda m: -m[0])            # stable: ties keep vocabulary order
    unk = token_id(r, "tokenizer.ggml.unknown_token_id")
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, s in enumerate(toks) if types[i] in (2, 3)]
    added += [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
               "normalized": False, "special": False} for i, s in enumerate(toks) if types[i] == 4]
    added.sort(key=lambda a: a["id"])
    space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    decoders = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    asp = field(r, "tokenizer.ggml.add_space_prefix")
    if asp is not None and not asp:
        normalizer = space
    else:
        normalizer = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, space]}
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": toks[unk] if unk is not None else None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
                  "merges": [f"{lr[0]} {lr[1]}" for _, lr in merges]},
    }


def make_tokenizer_json(r):
    model = field(r, "tokenizer.ggml.model")
    if model == "llama":
        return make_spm_tokenizer_json(r)
    if model != "gpt2":
        print(f"warning: tokenizer.ggml.model={model}: no tokenizer.json written (byte-level BPE "
              "and SentencePiece only)", file=sys.stderr)
        return None
    pre = field(r, "tokenizer.ggml.pre", "default")
    toks, types = tokens_and_types(r)
    merges = field(r, "tokenizer.ggml.merges")
    vocab = {}
    added = []
    for i, (s, ty) in enumerate(zip(toks, types)):
        if ty == 1 or ty == 6:                    # normal (and byte) tokens: the BPE vocabulary
            vocab[s] = i
        elif ty in (3, 4):                       # control / user-defined: added tokens
            added.append({"id": i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": ty == 3})
        # type 5 (unused: the [PADn] fillers convert_hf_to_gguf adds up to the embedding rows)
        # and type 2 (unknown) are not part of the HF tokenizer.
    regex = {"qwen2": QWEN2_REGEX, "llama-bpe": LLAMA3_REGEX}.get(pre, GPT2_REGEX)
    if pre not in ("qwen2", "llama-bpe", "gpt-2", "default"):
        print(f"warning: pre-tokenizer {pre!r} unknown here; GPT-2's regex used", file=sys.stderr)
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"} if pre == "qwen2" else None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            bl]},
        "post_processor": bl,
        "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": list(merges)},
    }


def make_tokenizer_config(r, arch):
    toks, types = tokens_and_types(r)
    name = lambda k: (toks[token_id(r, k)] if token_id(r, k) is not None else None)  # noqa: E731
    dec = {}
    for i, ty in enumerate(types):
        if ty in (3, 4):
            dec[str(i)] = {"content": toks[i], "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False, "special": ty == 3}
    add_bos = field(r, "tokenizer.ggml.add_bos_token")
    if add_bos is None:
        # what a GGUF loader does without the key: BOS first for SentencePiece vocabularies
        add_bos = field(r, "tokenizer.ggml.model") == "llama"
    cfg = {
        "add_bos_token": bool(add_bos),
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": dec,
        "additional_special_tokens": [toks[i] for i, ty in enumerate(types) if ty == 3
                                      and i != token_id(r, "tokenizer.ggml.eos_token_id")
                                      and i != token_id(r, "tokenizer.ggml.padding_token_id")],
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": int(field(r, f"{arch}.context_length")),
        "split_special_tokens": False,
        "tokenizer_class": ("Qwen2Tokenizer" if arch in ("qwen2", "qwen3", "qwen2moe", "qwen3moe")
                            else "GemmaTokenizerFast" if arch == "gemma3" else
                            "LlamaTokenizerFast" if field(r, "tokenizer.ggml.model") == "llama" else
                            "PreTrainedTokenizerFast"),
    }
    tmpl = field(r, "tokenizer.chat_template")
    if tmpl is not None:
        cfg["chat_template"] = tmpl
    return cfg


def make_generation_config(r):
    bos = token_id(r, "tokenizer.ggml.bos_token_id")
    eos = token_id(r, "tokenizer.ggml.eos_token_id")
    pad = token_id(r, "tokenizer.ggml.padding_token_id")
    gc = {"bos_token_id": bos, "pad_token_id": pad if pad is not None else eos}
    if field(r, "tokenizer.ggml.pre") == "qwen2" and pad is not None and pad != eos:
        # Qwen2.5-(Coder-)Instruct: stop on <|im_end|> or <|endoftext|>, sampling defaults as shipped.
        gc.update({"eos_token_id": [int(eos), int(pad)], "do_sample": True, "temperature": 0.7,
                   "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05})
    else:
        gc.update({"eos_token_id": eos, "do_sample": False})
        if field(r, "general.architecture") == "gemma3" and eos is not None:
            # Gemma's chat turns end with <end_of_turn>; its HF generation config stops there too.
            toks = field(r, "tokenizer.ggml.tokens")
            eot = toks.index("<end_of_turn>") if "<end_of_turn>" in toks else eos
            if eot != eos:
                gc["eos_token_id"] = [int(eos), eot]
    gc["transformers_version"] = "4.43.1"
    return {k: v for k, v in gc.items() if v is not None}


def write_f16_gguf(r, arch, weights, path):
    nh = field(r, f"{arch}.attention.head_count")
    nkv = field(r, f"{arch}.attention.head_count_kv", nh)
    w = gguf.GGUFWriter(path, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue            # header fields / written by GGUFWriter itself
        vtype = f.types[0]
        if key == "general.file_type":
            w.add_key_value(key, int(gguf.LlamaFileType.MOSTLY_F16), vtype)
            continue
        if vtype == GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vtype)
    sub, big = 0, 0
    for gname, gshape, parts, twin in weights:
        if twin is not None:                 # gpt-oss's experts: prepared by gptoss_experts
            arr, how = twin
            if how == "F32":
                w.add_tensor(gname, np.ascontiguousarray(arr, dtype=np.float32).reshape(gshape))
            elif how == "F16":
                x = np.ascontiguousarray(arr, dtype=np.float32).reshape(gshape)
                h = x.astype(np.float16)
                sub += int(np.count_nonzero(h.astype(np.float32) != x))
                big += int(np.count_nonzero(np.abs(x) > 65504))
                w.add_tensor(gname, h)
            else:
                w.add_tensor(gname, arr, raw_dtype=how)
            continue
        # One GGUF tensor again: the experts stacked back ([expert, out, in]), 1-D tensors 1-D.
        if len(parts) == 1:
            v = ckpt_io.bf16_bits_to_f32(parts[0][1])
        else:
            v = np.stack([ckpt_io.bf16_bits_to_f32(b) for _, b in parts])
        v = v.reshape(gshape)
        if arch == "llama" and gname.endswith(("attn_q.weight", "attn_q.bias")):
            v = permute_rows(v, nh)          # back to the GGUF's interleaved order
        elif arch == "llama" and gname.endswith(("attn_k.weight", "attn_k.bias")):
            v = permute_rows(v, nkv)
        elif is_gemma_norm(arch, gname):
            v = v + np.float32(1)            # float32 sum, as a loader adding 1 to the HF value
        if v.ndim >= 2:
            v = np.ascontiguousarray(v)
            h = np.empty(v.shape, dtype=np.float16)
            hf, vf = h.reshape(-1), v.reshape(-1)
            for i in range(0, vf.size, 1 << 24):      # in slabs: no full-size temporaries
                x = vf[i:i + (1 << 24)]
                hf[i:i + (1 << 24)] = y = x.astype(np.float16)
                sub += int(np.count_nonzero(y.astype(np.float32) != x))
                big += int(np.count_nonzero(np.abs(x) > 65504))
            w.add_tensor(gname, h)
        else:
            w.add_tensor(gname, v.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: F16 copy; {sub} values not exact in F16 (BF16 values below 2^-17 lose bits "
          f"as F16 subnormals), {big} of them above 65504")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("outdir")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--f16-gguf")
    ap.add_argument("--bf16-experts", action="store_true",
                    help="gpt-oss: write MXFP4 experts as BF16 gate_up_proj/down_proj (the form of "
                         "the dequantized checkpoints) instead of blocks and scales")
    ap.add_argument("--tokenizer-only", action="store_true",
                    help="write only the tokenizer files: tokenizer.json, and tokenizer_config.json "
                         "(chat template) and generation_config.json when the file has them")
    a = ap.parse_args()
    t0 = time.time()
    r = GGUFReader(a.gguf)
    arch = field(r, "general.architecture")
    if a.tokenizer_only:
        os.makedirs(a.outdir, exist_ok=True)
        tj = make_tokenizer_json(r)
        if tj is None:
            raise SystemExit("no tokenizer.json for this vocabulary")
        ckpt_io.write_json(os.path.join(a.outdir, "tokenizer.json"), tj)
        # The tokenizer configuration and chat template go with it when the
        # file has them: a router that renders chat requests itself (vllm-router
        # kv_aware, sglang-router) needs the template to tokenize as cairn does.
        if arch is not None and field(r, f"{arch}.context_length") is not None:
            ckpt_io.write_json(os.path.join(a.outdir, "tokenizer_config.json"),
                               make_tokenizer_config(r, arch))
            ckpt_io.write_json(os.path.join(a.outdir, "generation_config.json"),
                               make_generation_config(r))
        return
    if arch not in SUPPORTED:
        raise SystemExit(f"architecture {arch} not supported")
    moe_check(r, arch)
    bf = load_weights(r, arch, a.bf16_experts)
    t1 = time.time()
    # HF checkpoints list layers in order; inside a layer the order does not matter. BF16 bits
    # are uint16 here, gpt-oss's MXFP4 blocks and scales uint8.
    tensors = [(hn, "U8" if b.dtype == np.uint8 else "BF16", b.shape, b)
               for _, _, parts, _ in bf for hn, b in parts]
    mxfp4 = any(dt == "U8" for _, dt, _, _ in tensors)
    tied = not any(hn == "lm_head.weight" for hn, _, _, _ in tensors)
    vocab_rows = next(b.shape[0] for hn, _, _, b in tensors if hn == "model.embed_tokens.weight")
    ckpt_io.write_folder(a.outdir, tensors, a.shards)
    ckpt_io.write_json(os.path.join(a.outdir, "config.json"),
                       make_config(r, arch, vocab_rows, tied, mxfp4))
    ckpt_io.write_json(os.path.join(a.outdir, "generation_config.json"), make_generation_config(r))
    ckpt_io.write_json(os.path.join(a.outdir, "tokenizer_config.json"), make_tokenizer_config(r, arch))
    tj = make_tokenizer_json(r)
    if tj is not None:
        ckpt_io.write_json(os.path.join(a.outdir, "tokenizer.json"), tj)
    t2 = time.time()
    print(f"{a.outdir}: {len(tensors)} tensors, arch {arch}, tied={tied}; dequantize {t1 - t0:.1f}s, "
          f"write {t2 - t1:.1f}s")
    if a.f16_gguf:
        write_f16_gguf(r, arch, bf, a.f16_gguf)
        print(f"f16 gguf {time.time() - t2:.1f}s")


if __name__ == "__main__":
    main()
