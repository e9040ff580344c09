#!/usr/bin/env python3
"""Write the committed seed corpora under fuzz/corpus/ (run from anywhere).

The seeds are small, valid (or nearly valid) inputs that reach deep into each
target at once: one request per RPC method, small GGUF files of every value
type with tensors and both kinds of vocabulary, texts from the tokenizer
conformance cases for each vocabulary, and page values built as the disk tier
writes them. Regenerating gives the same bytes. Needs the `msgpack` Python
package (scripts/setup.sh --test). Page values carry no checksum: the
fuzzer's repair bit fills it in.
"""
import json
import os
import struct
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- msgpack-RPC requests -------------------------------------------------
def rpc_seeds():
    sid = "0123456789abcdef0123456789abcdef"
    sampling = {"max_tokens": 8, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.1,
                "repeat_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5,
                "seed": 42, "stop": ["\n", "end"], "stream": True}
    reqs = {
        "server_info": ["server.info", {}],
        "generate_prompt": ["generate", dict(prompt="Once upon a time", **sampling)],
        "generate_tokens": ["generate", {"tokens": [1, 403, 407, 261], "max_tokens": 4,
                                         "temperature": 0, "stop": "x", "add_bos": False}],
        "generate_messages": ["generate", {"system": "be brief", "messages": [
            {"role": "user", "content": "weather?"}], "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "w", "parameters": {
                "type": "object", "properties": {"c": {"type": "string"}}}}}]}],
        "generate_logit_bias": ["generate", {"prompt": "hi", "logit_bias": {
            5: -100, "17": 2.5, 511: 100.0}}],
        "generate_special": ["generate", {"prompt": "<s>hi</s>", "parse_special": True,
                                          "seed": None, "unknown": [1, {"a": 2}]}],
        "session_open": ["session.open", {"system": "be brief", "messages": [
            {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}],
            "persist": True, "ttl_s": 60}],
        "session_open_text": ["session.open", {"text": "Lily", "persist": False}],
        "session_append": ["session.append", {"session_id": sid, "tokens": [5, 6, 7]}],
        "session_generate": ["session.generate", dict(session_id=sid, messages=[
            {"role": "tool", "content": "42"}], **sampling)],
        "session_open_tools": ["session.open", {"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
            "tools": [{"type": "function", "function": {
                "name": "get_weather", "parameters": {
                    "type": "object", "properties": {"city": {"type": "string"}}}}}]}],
        "session_generate_tools": ["session.generate", {
            "session_id": sid, "messages": [], "max_tokens": 8,
            "tool_choice": {"type": "function", "function": {"name": "book"}},
            "parallel_tool_calls": False,
            "tools": [{"type": "function", "function": {"name": "book", "parameters": {
                "type": "object", "properties": {"when": {"$ref": "#/$defs/Slot"}},
                "$defs": {"Slot": {"enum": ["mon", "tue"]}}}}},
                {"type": "function", "function": {"name": "volume", "parameters": {
                    "type": "object", "properties": {"n": {"type": "integer",
                                                           "minimum": 0}}}}}]}],
        "session_fork": ["session.fork", {"session_id": sid}],
        "session_truncate": ["session.truncate", {"session_id": sid, "n_tokens": 3}],
        "session_close": ["session.close", {"session_id": sid}],
        "session_info": ["session.info", {"session_id": sid}],
        "gen_cancel": ["gen.cancel", {"request": 7}],
        "tokenize": ["tokenize", {"text": "Once upon a time \u00e9\U0001f600", "add_bos": True}],
        "detokenize": ["detokenize", {"tokens": [1, 403, 407, 261, 378, 0, 2]}],
        "cache_stats": ["cache.stats", {}],
    }
    for i, (name, (method, params)) in enumerate(sorted(reqs.items())):
        write("rpc", name, msgpack.packb([0, i + 1, method, [params]], use_bin_type=True))
    write("rpc", "notification", msgpack.packb([2, "gen.cancel", [{"request": 1}]]))
    write("rpc", "response", msgpack.packb([1, 3, None, {"ok": True}]))
    write("rpc", "nested", msgpack.packb([0, 9, "generate", [{"x": [[[[[[1]]]]]]}]]))
    write("rpc", "wide_ints", msgpack.packb([0, 2**32 - 1, "generate", [
        {"tokens": [0, 2**63 - 1, -2**63, 2**64 - 1], "max_tokens": -1, "top_p": 1.5}]]))
    write("rpc", "bin_ext", msgpack.packb([0, 4, b"tokenize", [{"text": b"bytes"}]],
                                          use_bin_type=True) + b"\xd4\x01\x02")
    write("rpc", "float32", b"\x94\x00\x05\xa8generate\x91\x81\xabtemperature\xca\x3f\x00\x00\x00")
    write("rpc", "huge_str_header", b"\x94\x00\x06\xa8generate\x91\x81\xa6prompt\xdb\xff\xff\xff\xff")


# ---- GGUF -----------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def http_body_seeds():
    """One byte for the route (0 chat, 1 completions, 2 tokenize, 3
    detokenize), then a JSON body as clients send it."""
    bodies = {
        "chat": (0, {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                     "max_tokens": 8, "temperature": 0.5, "seed": 2**64 - 1}),
        "chat_prefill": (0, {"messages": [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "Once"}],
                             "continue_final_message": True, "stream": True}),
        "chat_tools": (0, {"messages": [{"role": "user", "content": "x"}],
                           "tools": [{"type": "function", "function": {
                               "name": "f", "parameters": {"type": "object", "properties": {
                                   "a": {"type": "integer", "minimum": 0}}}}}],
                           "tool_choice": "required"}),
        "chat_schema": (0, {"messages": [{"role": "user", "content": "x"}],
                            "response_format": {"type": "json_schema", "json_schema": {
                                "schema": {"type": "object", "properties": {
                                    "s": {"type": "string", "maxLength": 3}}}}}}),
        "completion_array": (1, {"prompt": ["Once", [1, 2, 3]], "n": 2, "echo": True,
                                 "logit_bias": {"5": -100}}),
        "completion_suffix": (1, {"prompt": "def f(", "suffix": "):", "max_tokens": 4}),
        "completion_big_seed": (1, {"prompt": "a", "seed": 10**30}),
        "tokenize": (2, {"text": "Once upon a time", "add_bos": False}),
        "detokenize": (3, {"tokens": [1, 2, 300, 511]}),
    }
    for name, (route, body) in bodies.items():
        write("http_body", name, bytes([route]) + json.dumps(body).encode())
    write("http_body", "not_json", b"\x01{\"prompt\": ")
    write("http_body", "big_ints", b"\x01{\"prompt\": \"a\", \"seed\": -99999999999999999999, "
                                   b"\"n\": 18446744073709551616}")


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(gval(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def gguf(kvs, tensors=(), version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ne, type, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += gstr(key) + struct.pack("<I", t) + gval(t, v)
    offset = 0
    blobs = []
    for name, ne, ttype, data in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", ttype, offset)
        pad = (-len(data)) % alignment
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    out += b"\0" * ((-len(out)) % alignment)
    return out + b"".join(blobs)


def byte_level_symbols():
    """The byte -> printable-character table of byte-level BPE."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def gguf_seeds():
    write("gguf", "empty", gguf([]))
    write("gguf", "v2_empty", gguf([], version=2))
    write("gguf", "all_types", gguf([
        ("general.architecture", STR, "llama"), ("general.alignment", U32, 64),
        ("u8", U8, 200), ("i8", I8, -5), ("u16", U16, 60000), ("i16", I16, -300),
        ("u32", U32, 4000000000), ("i32", I32, -7), ("f32", F32, 1.5), ("bool", BOOL, True),
        ("u64", U64, 2**40), ("i64", I64, -2**40), ("f64", F64, 2.25),
        ("arr_i32", ARR, (I32, [1, -2, 3])), ("arr_str", ARR, (STR, ["a", "", "ccc"])),
        ("arr_nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["x"])])),
        ("arr_empty", ARR, (F32, [])),
    ], alignment=64))
    f32 = struct.pack("<8f", *range(8))
    f16 = struct.pack("<8e", *[0.5 * i for i in range(8)])
    q8_0 = struct.pack("<e", 0.25) + bytes(range(32))
    write("gguf", "tensors", gguf([("general.architecture", STR, "llama")], [
        ("a.weight", [4, 2], 0, f32), ("b", [8], 1, f16), ("c", [32, 1, 1, 1], 8, q8_0)]))

    # SentencePiece-style vocabulary: specials, byte fallback, a few pieces.
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    pieces += ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "<|im_end|>", "  "]
    types = [2, 3, 3] + [6] * 256 + [1, 1, 1, 1, 1, 1, 3, 4]
    scores = [0.0] * 259 + [-1.0, -2.0, -2.0, -0.5, -0.7, -0.1, 0.0, 0.0]
    write("gguf", "spm_vocab", gguf([
        ("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, (STR, pieces)),
        ("tokenizer.ggml.scores", ARR, (F32, scores)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
        ("tokenizer.ggml.add_space_prefix", BOOL, True)]))

    # Byte-level BPE vocabulary with merges.
    sym = byte_level_symbols()
    toks = [sym[b] for b in range(256)]
    merges = ["h e", "l l", "he ll", "\u0120 w", "o r", "\u0120w or"]
    toks += ["he", "ll", "hell", "\u0120w", "or", "\u0120wor", "<|endoftext|>"]
    types = [1] * (len(toks) - 1) + [3]
    for pre in ("gpt-2", "falcon", "deepseek-coder", "gpt-4o", "no-such-pre"):
        write("gguf", "bpe_vocab_" + pre, gguf([
            ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, pre),
            ("tokenizer.ggml.tokens", ARR, (STR, toks)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.merges", ARR, (STR, merges)),
            ("tokenizer.ggml.bos_token_id", U32, len(toks) - 1),
            ("tokenizer.ggml.eos_token_id", U32, len(toks) - 1)]))


# ---- tokenizer texts --------------------------------------------------------
# Index of each vocabulary in fuzz_tokenizer.c's table.
TOK_VOCABS = ["stories260K", "llama-spm", "phi-3", "gpt-2", "mpt", "refact", "starcoder",
              "falcon", "deepseek-coder", "deepseek-llm"]


def tokenizer_seeds():
    tdir = os.path.join(ROOT, "tests", "data", "tokenizer")
    with open(os.path.join(tdir, "ggml-vocab-gpt-2.gguf.inp"), "rb") as f:
        cases = [c.strip(b"\n") for c in f.read().split(b"\n__ggml_vocab_test__\n")]
    cases = [c for c in cases if c][:24]
    extra = [b"<s>Hello</s> <|endoftext|><|im_end|>", b"\xff\xfe\xc3(\xe2\x82 bad utf8 \xf0\x9f",
             b"    indented\n\tcode();  // 123456789", b"\xe2\x96\x81\xe2\x96\x81x"]
    n = 0
    for i, text in enumerate(cases + extra):
        vocab = i % len(TOK_VOCABS)
        flags = (i // len(TOK_VOCABS)) % 4
        write("tokenizer", "%02d_%s" % (n, TOK_VOCABS[vocab]), bytes([vocab, flags]) + text)
        n += 1


# ---- disk page values -------------------------------------------------------
def disk_value_seeds():
    # byte 0: repairs (see fuzz_disk_value.c), byte 1: page size - 1, byte 2: flip.
    for repairs, page_size, payload in [(0x0f, 1, 16), (0x0f, 16, 64), (0x1f, 4, 32),
                                        (0x07, 2, 8), (0x01, 3, 0), (0x00, 1, 4)]:
        value = b"CKVP" + struct.pack("<HH", 1, 48) + bytes(16)
        value += struct.pack("<IIQQ", page_size, 0, payload, 0)
        value += bytes(4 * page_size) + bytes(range(payload % 256))[:payload]
        value += bytes(payload - min(payload, 256))
        write("disk_value", "r%02x_p%d_b%d" % (repairs, page_size, payload),
              bytes([repairs, page_size - 1, 0x5a]) + value)
    write("disk_value", "short", bytes([0x0f, 0, 0]) + b"CKVP")


# ---- Hugging Face checkpoint folders ------------------------------------------
# fuzz_ckpt rebuilds a tiny valid folder from fuzz/data/ckpt/ and replaces one
# of its files (byte 0 of the input picks which) with the rest of the input.
CKPT_FILES = ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"]
CKPT_DATA = os.path.join(HERE, "data", "ckpt")


def safetensors(tensors):
    """tensors: [(name, dtype, shape, bytes)] -> a .safetensors image."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def bf16_bytes(n, seed):
    """n BF16 values in about [-0.1, 0.1), deterministic."""
    out, x = bytearray(), seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7fffffff
        f = ((x >> 8) / float(1 << 23) - 0.5) * 0.2
        out += struct.pack("<f", f)[2:]
    return bytes(out)


def ckpt_seeds():
    dim, ffn, heads, kv, hd, vocab = 32, 64, 2, 1, 16, 260
    sym = byte_level_symbols()
    tokens = {sym[b]: b for b in range(256)}
    merges = ["Ġ t", "h e"]
    for m in merges:
        tokens[m.replace(" ", "")] = len(tokens)
    qwen2_split = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
                   "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    tok = {"version": "1.0", "added_tokens": [{"id": 258, "content": "<|endoftext|>",
                                               "special": True}],
           "normalizer": {"type": "NFC"},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
               {"type": "Split", "pattern": {"Regex": qwen2_split}, "behavior": "Isolated",
                "invert": False},
               {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                "use_regex": False}]},
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": tokens, "merges": merges, "byte_fallback": False}}
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": dim,
              "intermediate_size": ffn, "num_hidden_layers": 1, "num_attention_heads": heads,
              "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": 128,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "hidden_act": "silu", "torch_dtype": "bfloat16"}
    tcfg = {"eos_token": "<|endoftext|>", "add_bos_token": False,
            "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    L = "model.layers.0."
    shapes = [("model.embed_tokens.weight", (vocab, dim)), ("model.norm.weight", (dim,)),
              (L + "input_layernorm.weight", (dim,)), (L + "post_attention_layernorm.weight", (dim,)),
              (L + "self_attn.q_proj.weight", (heads * hd, dim)),
              (L + "self_attn.q_proj.bias", (heads * hd,)),
              (L + "self_attn.k_proj.weight", (kv * hd, dim)), (L + "self_attn.k_proj.bias", (kv * hd,)),
              (L + "self_attn.v_proj.weight", (kv * hd, dim)), (L + "self_attn.v_proj.bias", (kv * hd,)),
              (L + "self_attn.o_proj.weight", (dim, heads * hd)),
              (L + "mlp.gate_proj.weight", (ffn, dim)), (L + "mlp.up_proj.weight", (ffn, dim)),
              (L + "mlp.down_proj.weight", (dim, ffn))]
    tensors = []
    for i, (name, shape) in enumerate(shapes):
        n = 1
        for d in shape:
            n *= d
        tensors.append((name, "BF16", shape, bf16_bytes(n, i + 1)))
    files = {"model.safetensors": safetensors(tensors),
             "config.json": json.dumps(config, indent=1).encode(),
             "tokenizer.json": json.dumps(tok, ensure_ascii=False).encode(),
             "tokenizer_config.json": json.dumps(tcfg).encode()}
    os.makedirs(CKPT_DATA, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(CKPT_DATA, name), "wb") as f:
            f.write(data)
        write("ckpt", "base_" + name, bytes([CKPT_FILES.index(name)]) + data)
    # a few near misses to start from
    write("ckpt", "st_short_header", bytes([0]) + files["model.safetensors"][:40])
    write("ckpt", "cfg_awq", bytes([1]) + json.dumps(dict(config, quantization_config={
        "quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"})).encode())
    write("ckpt", "cfg_fp8_block", bytes([1]) + json.dumps(dict(config, quantization_config={
        "quant_method": "fp8", "weight_block_size": [16, 32]})).encode())
    # the newer families' fields (their tensors are not in the base folder:
    # these reach config.json's checks and the weights' error paths)
    write("ckpt", "cfg_gemma3_mm", bytes([1]) + json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "text_config": dict(
            config, model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh",
            sliding_window=8, layer_types=["full_attention"], head_dim=hd,
            query_pre_attn_scalar=hd)}).encode())
    write("ckpt", "cfg_qwen3moe_yarn", bytes([1]) + json.dumps(dict(
        config, architectures=["Qwen3MoeForCausalLM"], num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True,
        rope_scaling={"type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 32})).encode())
    # gpt-oss as OpenAI ships it (MXFP4 experts, YaRN left unrounded) and with the rounded
    # YaRN of GGUFs (tied, as the base folder is)
    oss = dict(config, architectures=["GptOssForCausalLM"], model_type="gpt_oss", head_dim=hd,
               num_local_experts=4, num_experts_per_tok=2, experts_per_token=2,
               intermediate_size=32, sliding_window=8, layer_types=["sliding_attention"],
               swiglu_limit=7.0, attention_bias=True, tie_word_embeddings=False,
               quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
                   "model.layers.*.self_attn", "model.layers.*.mlp.router",
                   "model.embed_tokens", "lm_head"]},
               rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                             "truncate": False})
    write("ckpt", "cfg_gptoss_hub", bytes([1]) + json.dumps(oss).encode())
    write("ckpt", "cfg_gptoss_rounded", bytes([1]) + json.dumps(dict(
        oss, rope_scaling=dict(oss["rope_scaling"], truncate=True),
        tie_word_embeddings=True)).encode())
    # a SentencePiece-style tokenizer.json (byte_fallback, Gemma's spaces)
    spm_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "\u2581": 3, "a": 4, "b": 5, "\u2581a": 6,
                 "ab": 7, "\u2581ab": 8}
    spm_vocab.update({"<0x%02X>" % i: 9 + i for i in range(251)})  # ids < 260 rows
    write("ckpt", "tok_spm", bytes([2]) + json.dumps({
        "version": "1.0", "added_tokens": [{"id": 2, "content": "</s>", "special": True}],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>", "vocab": spm_vocab,
                  "merges": [["\u2581", "a"], "a b", ["\u2581a", "b"]]}},
        ensure_ascii=False).encode())


if __name__ == "__main__":
    rpc_seeds()
    http_body_seeds()
    gguf_seeds()
    tokenizer_seeds()
    disk_value_seeds()
    ckpt_seeds()
    total = sum(len(files) for _, _, files in os.walk(OUT))
    print("wrote %d seeds under %s" % (total, OUT), file=sys.stderr)
