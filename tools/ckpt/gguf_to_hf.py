#!/usr/bin/env python3
"""Turn a GGUF model into a Hugging Face checkpoint folder (BF16 safetensors + config/tokenizer).

    gguf_to_hf.py MODEL.gguf OUTDIR [--shards N] [--f16-gguf OUT.gguf]

No model hub is reachable here, so this is how cairn gets real HF-layout test material: the GGUF's
weights are dequantized to float32 (gguf-py), rounded to BF16 (nearest, ties to even) and written
under the HF parameter names in HF shapes ([out, in] for linear weights, [vocab, hidden] for the
embeddings). lm_head.weight is written only when the GGUF has output.weight (otherwise
tie_word_embeddings is true, as HF does). For architecture llama the q_proj/k_proj rows are put
back in HF's rotate-half order: convert_hf_to_gguf.py interleaves each head's two halves
(rows h*D + s*D/2 + j -> h*D + 2*j + s); this tool applies the inverse. qwen2/qwen3 GGUFs keep
HF's order (NEOX RoPE), so nothing is permuted there.

Written files: model.safetensors (or N shards model-0000i-of-0000N.safetensors with
model.safetensors.index.json), config.json, generation_config.json, tokenizer.json,
tokenizer_config.json. tokenizer.json is built from the GGUF vocabulary for byte-level BPE
("gpt2") and SentencePiece ("llama") vocabularies; others get none (a warning says so).
--tokenizer-only writes just the tokenizer files (tokenizer.json, plus tokenizer_config.json with
the chat template and generation_config.json when the GGUF has a model section): what a router
that tokenizes requests itself needs, and all a vocabulary-only GGUF can give.

--f16-gguf writes a GGUF with exactly the same weights for comparison runs: 2-D tensors as F16
converted from the BF16 values (exact except magnitudes below 2^-14, where F16 is subnormal, or
above 65504; the counts are printed), 1-D tensors as F32 from the BF16 values, all metadata copied
from the source except general.file_type, set to 1 (MOSTLY_F16) since the tensor types changed.
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


def hf_name(gname):
    if gname in GLOBAL_MAP:
        return GLOBAL_MAP[gname]
    p = gname.split(".")
    if p[0] == "blk" and len(p) == 4 and p[2] in LAYER_MAP:
        return f"model.layers.{int(p[1])}.{LAYER_MAP[p[2]]}.{p[3]}"
    return None


def load_weights(r, arch):
    """-> list of (gguf_name, hf_name, float32 array in HF shape)"""
    nh = field(r, f"{arch}.attention.head_count")
    nkv = field(r, f"{arch}.attention.head_count_kv", nh)
    out = []
    for t in r.tensors:
        hn = hf_name(t.name)
        if hn is None:
            if t.name == "rope_freqs.weight":
                print(f"note: {t.name} not written (HF derives it from config rope_scaling)",
                      file=sys.stderr)
                continue
            raise SystemExit(f"no HF name for GGUF tensor {t.name}")
        shape = [int(x) for x in reversed(t.shape)]   # ne[] is innermost first; numpy is outer first
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_rows(w, nh)
        elif arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_rows(w, nkv)
        out.append((t.name, hn, w))
    return out


def make_config(r, arch, vocab_rows, tied):
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
        "rope_scaling": None,
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
    if arch == "qwen2":
        cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                    # Qwen2.5 ships the sliding-window fields with the window off.
                    "sliding_window": ctx, "use_sliding_window": False,
                    "max_window_layers": g("block_count")})
    elif arch == "qwen3":
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
    else:
        raise SystemExit(f"architecture {arch} not supported")
    return dict(sorted(cfg.items()))


def tokens_and_types(r):
    toks = field(r, "tokenizer.ggml.tokens")
    tt = r.fields.get("tokenizer.ggml.token_type")
    types = [int(tt.parts[i][0]) for i in tt.data] if tt is not None else [1] * len(toks)
    return toks, types


def make_spm_tokenizer_json(r):
    """SentencePiece ("llama") vocabulary -> the BPE-with-byte-fallback tokenizer.json that HF's
    Llama converter writes (legacy form: normalizer prepends U+2581 and replaces spaces by it).
    Merges follow the converter's rule: every split of a piece into two vocabulary pieces is a
    merge, ordered by the merged piece's score (descending, stable), splits of one piece by the
    ids of their halves."""
    toks, types = tokens_and_types(r)
    sf = r.fields.get("tokenizer.ggml.scores")
    scores = list(sf.contents()) if sf is not None else [-float(i) for i in range(len(toks))]
    vocab = {s: i for i, s in enumerate(toks) if types[i] != 5}
    merges = []
    for piece, pid in vocab.items():
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
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
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
    cfg = {
        "add_bos_token": bool(add_bos) if add_bos is not None else arch == "llama",
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
        "tokenizer_class": ("Qwen2Tokenizer" if arch in ("qwen2", "qwen3") else
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
    for gname, _, bits in weights:
        v = ckpt_io.bf16_bits_to_f32(bits)
        if arch == "llama" and gname.endswith(("attn_q.weight", "attn_q.bias")):
            v = permute_rows(v, nh)          # back to the GGUF's interleaved order
        elif arch == "llama" and gname.endswith(("attn_k.weight", "attn_k.bias")):
            v = permute_rows(v, nkv)
        if v.ndim >= 2:
            h = v.astype(np.float16)
            a = np.abs(v)
            sub += int(np.count_nonzero(h.astype(np.float32) != v))
            big += int(np.count_nonzero(a > 65504))
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
    ws = load_weights(r, arch)
    t1 = time.time()
    names = {hn for _, hn, _ in ws}
    tied = "lm_head.weight" not in names
    vocab_rows = next(w.shape[0] for _, hn, w in ws if hn == "model.embed_tokens.weight")
    bf = [(gn, hn, ckpt_io.f32_to_bf16_bits(w)) for gn, hn, w in ws]
    del ws
    # HF checkpoints list layers in order; inside a layer the order does not matter.
    tensors = [(hn, "BF16", b.shape, b) for _, hn, b in bf]
    ckpt_io.write_folder(a.outdir, tensors, a.shards)
    ckpt_io.write_json(os.path.join(a.outdir, "config.json"), make_config(r, arch, vocab_rows, tied))
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
