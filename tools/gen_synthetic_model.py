#!/usr/bin/env python3
"""Write a Llama-architecture GGUF file of any shape filled with random weights.

The file loads in cairn and in llama.cpp alike, so large-model speed can be
measured on the same bytes without downloading anything. The weights are
random but scaled like a trained model's (each projection keeps activations
of unit size), so the forward pass runs on realistic magnitudes: no
overflow, no denormals, softmax that is neither flat nor one-hot.

Shapes used by bench/cpu (see bench/cpu/README.md):

    110m: --dim 768  --layers 12 --heads 12 --kv-heads 4 --ffn 2048 --vocab 32000
    1b:   --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000

Every 2-D weight (embeddings, projections, output) is written in --type
(F32, F16, BF16, Q8_0, Q4_0 or Q4_K); the norm vectors are F32, as GGUF
writers keep them. The vocabulary is a SentencePiece-style one: <unk>, <s>,
</s>, the 256 byte tokens, then filler pieces.

Quantized tensors are generated directly in their block format (random codes
with scales chosen for the target spread) instead of quantizing floats, which
keeps a 1B model to a few seconds of generation.

--arch qwen2 writes the Qwen2 variant (q/k/v biases, NEOX RoPE, qwen2.*
metadata), --arch qwen3 the Qwen3 one (no biases, per-head q/k RMSNorm
weights, NEOX RoPE; with --head-dim the heads may be wider than dim / heads,
as Qwen3's are); --yarn FACTOR writes YaRN scaling over a trained context of
--yarn-orig-ctx (default 16, so that a short test runs past it); --rope-freqs adds a Llama 3 style rope_freqs.weight (per-frequency
divisors from the llama3 rope-scaling rule). The tests use both on tiny
shapes to check those code paths against tests/ref/llama_ref.py.

--arch gemma3 writes Gemma 3 (per-head q/k RMSNorm, norms after attention
and after the FFN, GeGLU, tied embeddings, NEOX RoPE); with
--sliding-window N its layers are local with an N-token window except every
--swa-period-th (default 6, Gemma's), whose RoPE base is 1e6 against the
local layers' 10000. --sliding-window on llama writes Mistral's window over
every layer. Every file loads in llama.cpp as it is.

--arch qwen3moe | qwen2moe | mixtral writes a mixture of experts: --experts
N experts of --expert-ffn (default --ffn) per layer as 3-D tensors
(ffn_{gate,up,down}_exps) and an F32 router (ffn_gate_inp), of which
--experts-used K run per token; qwen3moe has qwen3's attention, qwen2moe
qwen2's plus a shared expert of --ffn (ffn_*_shexp, gated by
ffn_gate_inp_shexp), mixtral is a llama file with experts. --expert-type
sets the experts' tensor type (default --type; MXFP4 is allowed there).

--arch gpt-oss writes OpenAI's gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE):
biases on q/k/v and the attention output, NEOX RoPE (base 150000), YaRN
by default (factor 32 over a trained context of 4096, unless --yarn and
--yarn-orig-ctx say otherwise), attention sinks (attn_sinks, one logit per
query head), alternating layers (even ones local with a --sliding-window
window, default 128; odd ones global), post_attention_norm as the FFN's
input norm, a router with a bias, and experts with biases and the clamped
SwiGLU (ffn_*_exps plus ffn_*_exps.bias; feed_forward_length is the expert
width). The real model's experts are MXFP4: --expert-type MXFP4. With
--head-dim the q width (heads * head_dim) may differ from dim, as it does in
gpt-oss (64 heads of 64 on a 2880-wide stream). Its expert gate/up weights
are scaled so that a few per cent of their outputs cross the clamp at 7.

--vocab-from FILE.gguf takes the vocabulary (tokens, scores, types and the
special ids of a SentencePiece "llama" tokenizer) from another GGUF instead,
so that real text tokenizes into as few tokens as that model's; --vocab is
then that file's size. Reading it needs the `gguf` package.

Usage: gen_synthetic_model.py --shape 110m --type q4_0 -o /tmp/s110m-q4_0.gguf
"""
import math
import argparse
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# GGUF metadata value types
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9

# GGUF tensor types: (ggml id, elements per block, bytes per block)
TYPES = {
    "F32": (0, 1, 4),
    "F16": (1, 1, 2),
    "Q4_0": (2, 32, 18),
    "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144),
    "BF16": (30, 1, 2),
    "MXFP4": (39, 32, 17),
}
# general.file_type values (llama_ftype) for the "mostly X" label
FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "Q4_K": 15, "BF16": 32,
             "MXFP4": 38}  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE

SHAPES = {
    "110m": dict(dim=768, layers=12, heads=12, kv_heads=4, ffn=2048, vocab=32000),
    "1b": dict(dim=2048, layers=16, heads=32, kv_heads=8, ffn=5632, vocab=32000),
    "tiny": dict(dim=128, layers=2, heads=4, kv_heads=2, ffn=320, vocab=512),
}


# ---- metadata encoding -----------------------------------------------------

def enc_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return enc_str(key) + struct.pack("<I", T_UINT32) + struct.pack("<I", v)


def kv_i32(key, v):
    return enc_str(key) + struct.pack("<I", T_INT32) + struct.pack("<i", v)


def kv_f32(key, v):
    return enc_str(key) + struct.pack("<I", T_FLOAT32) + struct.pack("<f", v)


def kv_bool(key, v):
    return enc_str(key) + struct.pack("<I", T_BOOL) + struct.pack("<B", 1 if v else 0)


def kv_str(key, v):
    return enc_str(key) + struct.pack("<I", T_STRING) + enc_str(v)


def kv_arr(key, elem_type, values):
    out = [enc_str(key), struct.pack("<IIQ", T_ARRAY, elem_type, len(values))]
    if elem_type == T_STRING:
        out.extend(enc_str(v) for v in values)
    elif elem_type == T_FLOAT32:
        out.append(np.asarray(values, dtype="<f4").tobytes())
    elif elem_type == T_INT32:
        out.append(np.asarray(values, dtype="<i4").tobytes())
    else:
        raise ValueError(elem_type)
    return b"".join(out)


def vocab(n_vocab):
    """A SentencePiece-shaped vocabulary: control tokens, byte tokens, then
    distinct filler pieces (so every id decodes to something)."""
    if n_vocab < 3 + 256 + 1:
        raise SystemExit("--vocab must be at least 260 (control + byte tokens)")
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(tokens) < n_vocab:
        # base-26 words, half of them with the SentencePiece word-start mark
        w, k = "", i
        while True:
            w = letters[k % 26] + w
            k //= 26
            if k == 0:
                break
        tokens.append(("\u2581" + w) if i % 2 == 0 else w)
        types.append(1)
        i += 1
    scores = [0.0] * 259 + [-float(j) for j in range(n_vocab - 259)]
    return tokens, scores, types


def read_vocab(path):
    """(tokens, scores, types, {special: id}) of a GGUF's SentencePiece vocabulary."""
    try:
        import gguf
    except ImportError:
        raise SystemExit("--vocab-from needs the gguf package (pip install gguf)")
    r = gguf.GGUFReader(path)
    f = r.fields
    model = f.get("tokenizer.ggml.model")
    if model is None or bytes(model.parts[model.data[0]]).decode() != "llama":
        raise SystemExit("%s: --vocab-from takes a SentencePiece ('llama') vocabulary" % path)
    field = f["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    scores = [float(f["tokenizer.ggml.scores"].parts[i][0]) for i in f["tokenizer.ggml.scores"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0])
             for i in f["tokenizer.ggml.token_type"].data]
    special = {}
    for k in ("unknown", "bos", "eos", "padding"):
        key = "tokenizer.ggml.%s_token_id" % k
        if key in f:
            special[k] = int(f[key].parts[f[key].data[0]][0])
    return tokens, scores, types, special


# ---- random tensors --------------------------------------------------------

def random_rows(rng, type_name, n_rows, n_in, std):
    """Bytes of an [n_rows][n_in] weight in `type_name`, elements of about
    `std` spread and zero mean."""
    n = n_rows * n_in
    if type_name == "F32":
        return (rng.standard_normal(n, dtype=np.float32) * std).astype("<f4").tobytes()
    if type_name == "F16":
        return (rng.standard_normal(n, dtype=np.float32) * std).astype("<f2").tobytes()
    if type_name == "BF16":
        f = (rng.standard_normal(n, dtype=np.float32) * std).astype("<f4")
        u = f.view("<u4")
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
        return u.astype("<u2").tobytes()
    nb = n // 32
    if type_name == "Q8_0":
        # codes uniform in [-127, 127]: spread 127/sqrt(3) ~ 73.3 steps
        d = (std / 73.3) * rng.uniform(0.8, 1.2, nb).astype(np.float32)
        blocks = np.empty((nb, 34), dtype=np.uint8)
        blocks[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(nb, 2)
        blocks[:, 2:] = rng.integers(-127, 128, (nb, 32), dtype=np.int8).view(np.uint8)
        return blocks.tobytes()
    if type_name == "Q4_0":
        # codes uniform in [0, 15], value d*(q-8): spread ~ 4.6 steps
        d = (std / 4.6) * rng.uniform(0.8, 1.2, nb).astype(np.float32)
        blocks = np.empty((nb, 18), dtype=np.uint8)
        blocks[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(nb, 2)
        blocks[:, 2:] = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
        return blocks.tobytes()
    if type_name == "Q4_K":
        # 256-element super-block of 8 sub-blocks of 32: value
        # d*sc_j*q - dmin*m_j, q in [0, 15]. With dmin = d and m_j close to
        # 7.5*sc_j, each sub-block is centred on zero with spread ~4.6*d*sc_j.
        nsb = n // 256
        sc = rng.integers(1, 9, (nsb, 8)).astype(np.uint8)  # 1..8
        m = np.clip(np.rint(sc * 7.5), 0, 63).astype(np.uint8)
        d = (std / (4.6 * 4.5)) * rng.uniform(0.8, 1.2, nsb).astype(np.float32)
        blocks = np.empty((nsb, 144), dtype=np.uint8)
        dd = d.astype("<f2").view(np.uint8).reshape(nsb, 2)
        blocks[:, 0:2] = dd  # d
        blocks[:, 2:4] = dd  # dmin
        # 6-bit scales and mins packed in 12 bytes (GGUF's K-quant layout):
        # bytes 0-3: sc[0..3] | top 2 bits of sc[4..7]; 4-7: m[0..3] | top 2
        # bits of m[4..7]; 8-11: low 4 bits of sc[4..7] | low 4 of m[4..7].
        s = np.empty((nsb, 12), dtype=np.uint8)
        s[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
        s[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
        s[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
        blocks[:, 4:16] = s
        blocks[:, 16:] = rng.integers(0, 256, (nsb, 128), dtype=np.uint8)
        return blocks.tobytes()
    if type_name == "MXFP4":
        # 17-byte blocks: an E8M0 exponent e, then 32 4-bit e2m1 codes (low
        # nibbles elements 0-15, high nibbles 16-31), value
        # kvalues[code] * 2^(e - 128). Codes uniform over the 16: spread
        # sqrt(274 / 8) ~ 5.85 steps. e is floor(L) or floor(L) + 1 with
        # L = log2(std / 5.85), mixed so the mean square is std^2.
        L = math.log2(std / math.sqrt(274 / 8))
        f = math.floor(L)
        up = rng.random(nb) < (4.0 ** (L - f) - 1) / 3
        blocks = np.empty((nb, 17), dtype=np.uint8)
        blocks[:, 0] = np.clip(128 + f + up, 2, 254).astype(np.uint8)
        blocks[:, 1:] = rng.integers(0, 256, (nb, 16), dtype=np.uint8)
        return blocks.tobytes()
    raise ValueError(type_name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", required=True, help="output .gguf path")
    ap.add_argument("--type", default="Q4_0", help="F32, F16, BF16, Q8_0, Q4_0 or Q4_K")
    ap.add_argument("--expert-type",
                    help="MoE: the experts' type (F32, F16, Q8_0, MXFP4, ...; default --type)")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="a named shape (overridable)")
    ap.add_argument("--dim", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--ctx", type=int, default=4096, help="llama.context_length")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arch", default="llama",
                    choices=("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "qwen2moe", "mixtral",
                             "gpt-oss"))
    ap.add_argument("--experts", type=int, default=8, help="MoE: experts per layer")
    ap.add_argument("--experts-used", type=int, default=2, help="MoE: experts run per token")
    ap.add_argument("--expert-ffn", type=int, help="MoE: an expert's FFN width (default --ffn)")
    ap.add_argument("--sliding-window", type=int,
                    help="attention.sliding_window: keys a local layer sees (0: none; "
                    "gpt-oss: default 128)")
    ap.add_argument("--vocab-from", metavar="GGUF",
                    help="take the SentencePiece vocabulary of this GGUF (needs the gguf package)")
    ap.add_argument("--swa-period", type=int,
                    help="gemma3: every P-th layer is global (attention.sliding_window_pattern; "
                    "default 6, not written)")
    ap.add_argument("--head-dim", type=int,
                    help="head width (attention.key_length), default dim / heads")
    ap.add_argument("--yarn", type=float, metavar="FACTOR",
                    help="YaRN RoPE scaling by FACTOR (rope.scaling.type yarn; gpt-oss: "
                    "default 32, 0 for none)")
    ap.add_argument("--yarn-orig-ctx", type=int,
                    help="YaRN: the trained context (rope.scaling.original_context_length; "
                    "default 16, gpt-oss 4096)")
    ap.add_argument("--yarn-unrounded", action="store_true",
                    help="YaRN: keep the ramp's ends fractional (rope.scaling.yarn_truncate "
                    "false: what cairn's ckpt/ writes for a folder's rope_scaling.truncate "
                    "false; llama.cpp does not read it)")
    ap.add_argument("--rope-freqs", action="store_true",
                    help="add a Llama 3 rope_freqs.weight tensor (rope base 500000)")
    a = ap.parse_args()

    shape = dict(SHAPES[a.shape]) if a.shape else {}
    borrowed = read_vocab(a.vocab_from) if a.vocab_from else None
    if borrowed:
        a.vocab = len(borrowed[0])
    for k in ("dim", "layers", "heads", "kv_heads", "ffn", "vocab"):
        v = getattr(a, k)
        if v is not None:
            shape[k] = v
        if k not in shape:
            ap.error("--%s is required without --shape" % k.replace("_", "-"))
    tname = a.type.upper()
    if tname not in TYPES:
        ap.error("unknown --type %s" % a.type)
    etype = a.expert_type.upper() if a.expert_type else tname
    if etype not in TYPES:
        ap.error("unknown --expert-type %s" % a.expert_type)
    gptoss = a.arch == "gpt-oss"
    if gptoss:
        if a.yarn is None:
            a.yarn = 32.0
        if a.sliding_window is None:
            a.sliding_window = 128
        if a.sliding_window <= 0:
            ap.error("gpt-oss needs a --sliding-window (its even layers are local)")
    if a.yarn_orig_ctx is None:
        a.yarn_orig_ctx = 4096 if gptoss else 16
    dim, n_layer, n_head, n_kv = shape["dim"], shape["layers"], shape["heads"], shape["kv_heads"]
    ffn, n_vocab = shape["ffn"], shape["vocab"]
    if (dim % n_head and not a.head_dim) or n_head % n_kv:
        ap.error("dim must divide by heads (or give --head-dim) and heads by kv-heads")
    head_dim = a.head_dim or dim // n_head
    moe = a.arch in ("qwen3moe", "qwen2moe", "mixtral", "gpt-oss")
    n_exp, eff = a.experts, a.expert_ffn or ffn
    if a.arch in ("mixtral", "gpt-oss"):  # their experts are feed_forward_length wide
        ffn = eff
    if moe and not (1 <= a.experts_used <= n_exp):
        ap.error("--experts-used must be in [1, --experts]")
    if moe and eff % TYPES[etype][1]:
        ap.error("--expert-ffn must be a multiple of %d for %s" % (TYPES[etype][1], etype))
    if moe and dim % TYPES[etype][1]:
        ap.error("dim (%d) must be a multiple of %d for %s experts" % (dim, TYPES[etype][1], etype))
    if head_dim % 2:
        ap.error("--head-dim must be even")
    block = TYPES[tname][1]
    for what, n_in in (("dim", dim), ("ffn", ffn)):
        if n_in % block:
            ap.error("%s (%d) must be a multiple of %d for %s" % (what, n_in, block, tname))

    # (name, ne0 = row length, ne1 = rows, type, std)
    # Gemma scales its embeddings by sqrt(dim) and projects the output
    # through them: rows of a projection's spread serve both
    embd_std = dim ** -0.5 if a.arch == "gemma3" else 1.0
    tensors = [("token_embd.weight", dim, n_vocab, tname, embd_std)]
    for l in range(n_layer):
        p = "blk.%d." % l
        if gptoss:  # biases everywhere, sinks, and the experts' own biases
            q_dim, kv_dim = n_head * head_dim, n_kv * head_dim
            tensors += [
                (p + "attn_norm.weight", dim, 1, "F32", None),
                (p + "attn_q.weight", dim, q_dim, tname, dim ** -0.5),
                (p + "attn_q.bias", q_dim, 1, "F32", 0.3),
                (p + "attn_k.weight", dim, kv_dim, tname, dim ** -0.5),
                (p + "attn_k.bias", kv_dim, 1, "F32", 0.3),
                (p + "attn_v.weight", dim, kv_dim, tname, dim ** -0.5),
                (p + "attn_v.bias", kv_dim, 1, "F32", 0.3),
                (p + "attn_output.weight", q_dim, dim, tname, q_dim ** -0.5),
                (p + "attn_output.bias", dim, 1, "F32", 0.3),
                (p + "attn_sinks.weight", n_head, 1, "F32", "sinks"),
                (p + "post_attention_norm.weight", dim, 1, "F32", None),
                (p + "ffn_gate_inp.weight", dim, n_exp, "F32", 2 * dim ** -0.5),
                (p + "ffn_gate_inp.bias", n_exp, 1, "F32", 0.1),
                # gate and up of spread ~3, so a few per cent pass the clamp
                # at 7; down scaled back to keep the residual stream ~1
                (p + "ffn_gate_exps.weight", dim, eff, etype, 3 * dim ** -0.5, n_exp),
                (p + "ffn_gate_exps.bias", eff, n_exp, "F32", 0.3),
                (p + "ffn_up_exps.weight", dim, eff, etype, 3 * dim ** -0.5, n_exp),
                (p + "ffn_up_exps.bias", eff, n_exp, "F32", 0.3),
                (p + "ffn_down_exps.weight", eff, dim, etype, 0.25 * eff ** -0.5, n_exp),
                (p + "ffn_down_exps.bias", dim, n_exp, "F32", 0.3),
            ]
            continue
        tensors += [
            (p + "attn_norm.weight", dim, 1, "F32", None),
            (p + "attn_q.weight", dim, n_head * head_dim, tname, dim ** -0.5),
            (p + "attn_k.weight", dim, n_kv * head_dim, tname, dim ** -0.5),
            (p + "attn_v.weight", dim, n_kv * head_dim, tname, dim ** -0.5),
        ]
        if a.arch in ("qwen2", "qwen2moe"):  # biases of a trained size: a few tenths
            tensors += [
                (p + "attn_q.bias", n_head * head_dim, 1, "F32", 0.3),
                (p + "attn_k.bias", n_kv * head_dim, 1, "F32", 0.3),
                (p + "attn_v.bias", n_kv * head_dim, 1, "F32", 0.3),
            ]
        if a.arch in ("qwen3", "gemma3", "qwen3moe"):  # per-head RMSNorm weights of q and k
            tensors += [
                (p + "attn_q_norm.weight", head_dim, 1, "F32", None),
                (p + "attn_k_norm.weight", head_dim, 1, "F32", None),
            ]
        tensors += [
            (p + "attn_output.weight", n_head * head_dim, dim, tname, (n_head * head_dim) ** -0.5),
        ]
        if a.arch == "gemma3":
            tensors += [(p + "post_attention_norm.weight", dim, 1, "F32", None)]
        tensors += [(p + "ffn_norm.weight", dim, 1, "F32", None)]
        if moe:  # the router (F32, as quantizers leave it) and every expert
            tensors += [
                (p + "ffn_gate_inp.weight", dim, n_exp, "F32", 2 * dim ** -0.5),
                (p + "ffn_gate_exps.weight", dim, eff, etype, dim ** -0.5, n_exp),
                (p + "ffn_up_exps.weight", dim, eff, etype, dim ** -0.5, n_exp),
                (p + "ffn_down_exps.weight", eff, dim, etype, eff ** -0.5, n_exp),
            ]
            if a.arch == "qwen2moe":
                tensors += [
                    (p + "ffn_gate_inp_shexp.weight", dim, 1, "F32", dim ** -0.5),
                    (p + "ffn_gate_shexp.weight", dim, ffn, tname, dim ** -0.5),
                    (p + "ffn_up_shexp.weight", dim, ffn, tname, dim ** -0.5),
                    (p + "ffn_down_shexp.weight", ffn, dim, tname, ffn ** -0.5),
                ]
        else:
            tensors += [
                (p + "ffn_gate.weight", dim, ffn, tname, dim ** -0.5),
                (p + "ffn_up.weight", dim, ffn, tname, dim ** -0.5),
                (p + "ffn_down.weight", ffn, dim, tname, ffn ** -0.5),
            ]
        if a.arch == "gemma3":
            tensors += [(p + "post_ffw_norm.weight", dim, 1, "F32", None)]
    tensors += [("output_norm.weight", dim, 1, "F32", None)]
    if a.arch != "gemma3":  # Gemma ties its output to the embeddings
        tensors += [("output.weight", dim, n_vocab, tname, dim ** -0.5)]
    rope_base = 1000000.0 if a.arch in ("qwen2", "qwen3", "gemma3", "qwen3moe", "qwen2moe") \
        else 150000.0 if gptoss else 10000.0
    freq_factors = None
    if a.rope_freqs:
        # Llama 3.1's rule: keep high frequencies, divide low ones by
        # `factor`, blend in between (factor 8, low/high 1/4, 8192 context).
        rope_base, factor, low, high, old_ctx = 500000.0, 8.0, 1.0, 4.0, 8192.0
        freq_factors = []
        for i in range(head_dim // 2):
            wavelen = 2 * math.pi / rope_base ** (-2.0 * i / head_dim)
            if wavelen < old_ctx / high:
                freq_factors.append(1.0)
            elif wavelen > old_ctx / low:
                freq_factors.append(factor)
            else:
                smooth = (old_ctx / wavelen - low) / (high - low)
                freq_factors.append(1.0 / ((1 - smooth) / factor + smooth))
        tensors.append(("rope_freqs.weight", head_dim // 2, 1, "F32", "freqs"))

    toks, scores, ttypes = borrowed[:3] if borrowed else vocab(n_vocab)
    special = borrowed[3] if borrowed else {"unknown": 0, "bos": 1, "eos": 2}
    A = "llama" if a.arch == "mixtral" else a.arch
    ftype = FILE_TYPE["MXFP4"] if moe and etype == "MXFP4" else FILE_TYPE[tname]
    meta = [
        kv_str("general.architecture", A),
        kv_str("general.name", "synthetic-%s-%dx%d-%s" % (A, dim, n_layer, tname.lower())),
        kv_u32("general.file_type", ftype),
        kv_u32("general.alignment", ALIGNMENT),
        kv_u32(A + ".context_length", a.ctx),
        kv_u32(A + ".embedding_length", dim),
        kv_u32(A + ".block_count", n_layer),
        kv_u32(A + ".feed_forward_length", ffn),
        kv_u32(A + ".attention.head_count", n_head),
        kv_u32(A + ".attention.head_count_kv", n_kv),
        kv_u32(A + ".rope.dimension_count", head_dim),
        kv_u32(A + ".attention.key_length", head_dim),
        kv_u32(A + ".attention.value_length", head_dim),
        kv_f32(A + ".attention.layer_norm_rms_epsilon", 1e-5),
        kv_f32(A + ".rope.freq_base", rope_base),
        kv_u32(A + ".vocab_size", n_vocab),
    ]
    if gptoss:  # a converted gpt-oss has neither key: n_rot is key_length
        meta = [m for m in meta if not m.startswith((enc_str(A + ".rope.dimension_count"),
                                                     enc_str(A + ".vocab_size")))]
    if moe:
        meta += [kv_u32(A + ".expert_count", n_exp), kv_u32(A + ".expert_used_count", a.experts_used)]
        if a.arch != "mixtral":
            meta.append(kv_u32(A + ".expert_feed_forward_length", eff))
        if a.arch == "qwen2moe":
            meta.append(kv_u32(A + ".expert_shared_feed_forward_length", ffn))
    if a.yarn:
        meta += [kv_str(A + ".rope.scaling.type", "yarn"),
                 kv_f32(A + ".rope.scaling.factor", a.yarn),
                 kv_u32(A + ".rope.scaling.original_context_length", a.yarn_orig_ctx)]
        if a.yarn_unrounded:
            meta += [kv_bool(A + ".rope.scaling.yarn_truncate", False)]
    if a.sliding_window:
        meta.append(kv_u32(A + ".attention.sliding_window", a.sliding_window))
    if a.swa_period is not None:
        meta.append(kv_u32(A + ".attention.sliding_window_pattern", a.swa_period))
    meta += [
        kv_str("tokenizer.ggml.model", "llama"),
        kv_arr("tokenizer.ggml.tokens", T_STRING, toks),
        kv_arr("tokenizer.ggml.scores", T_FLOAT32, scores),
        kv_arr("tokenizer.ggml.token_type", T_INT32, ttypes),
    ]
    meta += [kv_u32("tokenizer.ggml.%s_token_id" % k, v) for k, v in sorted(special.items())]

    tensors = [x if len(x) == 6 else x + (1,) for x in tensors]  # ne2: experts
    infos, offset, sizes = [], 0, []
    for name, ne0, ne1, t, _, ne2 in tensors:
        tid, be, bb = TYPES[t]
        size = ne0 * ne1 * ne2 // be * bb
        dims = [ne0] if ne1 == 1 else [ne0, ne1] if ne2 == 1 else [ne0, ne1, ne2]
        infos.append(enc_str(name) + struct.pack("<I", len(dims)) +
                     b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", tid, offset))
        sizes.append(size)
        offset += (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT

    rng = np.random.default_rng(a.seed)
    with open(a.output, "wb") as f:
        f.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        for i in infos:
            f.write(i)
        pad = (-f.tell()) % ALIGNMENT
        f.write(b"\0" * pad)
        for (name, ne0, ne1, t, std, ne2), size in zip(tensors, sizes):
            if std is None:  # norm weights: near one, as trained models have
                data = (1.0 + 0.1 * rng.standard_normal(ne0, dtype=np.float32)).astype("<f4").tobytes()
            elif std == "sinks":  # one logit per query head, around 0..2
                data = (1.0 + rng.standard_normal(ne0, dtype=np.float32)).astype("<f4").tobytes()
            elif std == "freqs":
                data = np.asarray(freq_factors, dtype="<f4").tobytes()
            else:
                data = random_rows(rng, t, ne1 * ne2, ne0, std)
            assert len(data) == size, (name, len(data), size)
            f.write(data)
            f.write(b"\0" * ((-size) % ALIGNMENT))
    total = offset
    print("%s: %s, dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, %.1f MiB of tensors"
          % (a.output, tname, dim, n_layer, n_head, n_kv, ffn, n_vocab, total / 2 ** 20),
          file=sys.stderr)


if __name__ == "__main__":
    main()
