#!/usr/bin/env python3
"""gpt-oss's real vocabulary (o200k_harmony) as a vocab-only GGUF, built from
OpenAI's o200k_base.tiktoken without any Hugging Face or GGUF download.

usage: o200k_vocab.py OUT.gguf [--tiktoken FILE] [--scratch DIR]

Without --tiktoken the rank file is taken from the llama-index-core wheel on
PyPI (fetch_o200k_base below), which carries tiktoken's cache copy of
https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken
under its cache name (the sha1 of that URL); its sha256 must be the one
tiktoken itself expects (O200K_BASE_SHA256).

The GGUF is what llama.cpp's converter writes for gpt-oss's tokenizer.json,
tokenizer part only:
  tokenizer.ggml.model  "gpt2" (byte-level BPE), pre "gpt-4o";
  tokens                the 199998 ranks of o200k_base as GPT-2 byte-to-unicode
                        strings (id = rank), then the harmony specials 199998 ..
                        201087 (HARMONY_SPECIALS) as control tokens (type 3);
  merges                recovered from the ranks as Hugging Face's tiktoken
                        converter does (transformers' TikTokenConverter): every
                        split of a token into two tokens, ordered by the rank of
                        the token they make, then by the left and right ranks;
  bos <|startoftext|> 199998, eos <|return|> 200002, padding <|endoftext|>
  199999, add_bos_token false.
No tensors: cairn (and llama.cpp) read it as a vocabulary. A synthetic
gpt-oss with this vocabulary needs a model writer that copies byte-level
BPE metadata (tokens, token_type, merges, pre).

Reusable pieces: fetch_o200k_base(), load_tiktoken_ranks(), harmony_specials(),
recover_merges(), build_vocab(), write_vocab_gguf(), build_o200k_harmony_gguf().
"""
import base64
import glob
import hashlib
import os
import struct
import subprocess
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "ckpt"))
from make_synthetic import bytes_to_unicode  # noqa: E402  GPT-2's byte -> character map

O200K_BASE_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
# tiktoken_ext/openai_public.py: expected_hash of o200k_base
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# tiktoken's cache file name: sha1 of the URL
O200K_BASE_CACHE_NAME = hashlib.sha1(O200K_BASE_URL.encode()).hexdigest()
LLAMA_INDEX_CORE = "llama-index-core==0.14.25"
N_VOCAB = 201088  # gpt-oss's vocab_size (embedding rows)
BOS, EOS, PAD = 199998, 200002, 199999

# gpt-oss (o200k_harmony): tiktoken's o200k_harmony and openai-harmony's table
HARMONY_NAMED = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
}


def harmony_specials(n_base=199998, n_vocab=N_VOCAB):
    """{id: text} of o200k_harmony's special tokens: the named ones, the rest
    <|reserved_ID|>. (200018: openai-harmony has <|reserved_200018|>;
    tiktoken also maps o200k_base's <|endofprompt|> there.)"""
    return {i: HARMONY_NAMED.get(i, "<|reserved_%d|>" % i) for i in range(n_base, n_vocab)}


class Unavailable(Exception):
    """The rank file cannot be had (no pip, no network, not in the wheel)."""


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_o200k_base(scratch):
    """Path of a verified o200k_base.tiktoken under scratch/tiktoken_cache/
    (named as tiktoken names its cache file, so TIKTOKEN_CACHE_DIR can point
    there). Reuses what an earlier run left; else pip-downloads the
    llama-index-core wheel (no dependencies) into scratch and takes the file
    out of it. Raises Unavailable with the reason."""
    cache_dir = os.path.join(scratch, "tiktoken_cache")
    path = os.path.join(cache_dir, O200K_BASE_CACHE_NAME)
    if os.path.exists(path) and sha256_file(path) == O200K_BASE_SHA256:
        return path
    os.makedirs(cache_dir, exist_ok=True)
    wheels = os.path.join(scratch, "wheels")
    found = glob.glob(os.path.join(wheels, "llama_index_core-*.whl"))
    if not found:
        p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                            wheels, LLAMA_INDEX_CORE], capture_output=True, text=True,
                           timeout=240)
        found = glob.glob(os.path.join(wheels, "llama_index_core-*.whl"))
        if p.returncode != 0 or not found:
            raise Unavailable("pip download %s failed: %s" % (
                LLAMA_INDEX_CORE, (p.stderr.strip().splitlines() or ["?"])[-1]))
    member = "llama_index/core/_static/tiktoken_cache/" + O200K_BASE_CACHE_NAME
    try:
        with zipfile.ZipFile(sorted(found)[-1]) as z:
            data = z.read(member)
    except (KeyError, zipfile.BadZipFile) as e:
        raise Unavailable("%s: no %s (%s)" % (found[-1], member, e))
    if hashlib.sha256(data).hexdigest() != O200K_BASE_SHA256:
        raise Unavailable("%s in %s is not o200k_base (sha256 %s)" % (
            member, found[-1], hashlib.sha256(data).hexdigest()))
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return path


def load_tiktoken_ranks(path):
    """[bytes of rank 0, rank 1, ...] of a .tiktoken file ("base64 rank" lines);
    the ranks must be 0..n-1, each once."""
    toks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if not line:
                continue
            b64, rank = line.split()
            toks[int(rank)] = base64.b64decode(b64)
    out = [toks[r] for r in range(len(toks))]  # KeyError: a gap in the ranks
    if len(set(out)) != len(out):
        raise ValueError("%s: a token has two ranks" % path)
    return out


def recover_merges(tokens):
    """BPE merges (left bytes, right bytes) in priority order, from tiktoken
    ranks (tokens[rank] = bytes), the way Hugging Face's tiktoken converter
    recovers them: for every token of two or more bytes, each split into two
    tokens that exist, those of one token ordered by (left rank, right rank);
    the tokens in rank order. Applied lowest first, merges then join what
    tiktoken's byte_pair_merge joins (the pair whose union has the lowest
    rank)."""
    rank = {t: r for r, t in enumerate(tokens)}
    merges = []
    for t in tokens:
        if len(t) < 2:
            continue
        local = [(rank[t[:i]], rank[t[i:]]) for i in range(1, len(t))
                 if t[:i] in rank and t[i:] in rank]
        local.sort()
        merges.extend((tokens[a], tokens[b]) for a, b in local)
    return merges


def recover_merges_min_max(tokens):
    """The other common recovery (one merge per token): the split whose
    larger rank is smallest, i.e. the last merge BPE would make on its way
    to the token. Kept for comparison; build_vocab uses recover_merges."""
    rank = {t: r for r, t in enumerate(tokens)}
    merges = []
    for t in tokens:
        if len(t) < 2:
            continue
        best = min(((max(rank[t[:i]], rank[t[i:]]), rank[t[:i]], i) for i in range(1, len(t))
                    if t[:i] in rank and t[i:] in rank), default=None)
        if best is not None:
            merges.append((t[:best[2]], t[best[2]:]))
    return merges


def build_vocab(tokens, specials, merges=None):
    """(token strings, token types, merge strings) for a GGUF: tokens as
    GPT-2 unicode strings (type 1), specials {id: text} as control (type 3)
    filling the ids after the ranks."""
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    strs = [enc(t) for t in tokens]
    types = [1] * len(strs)
    n = len(tokens) + len(specials)
    for i in range(len(tokens), n):
        strs.append(specials[i])  # KeyError: a gap in the special ids
        types.append(3)
    if merges is None:
        merges = recover_merges(tokens)
    return strs, types, ["%s %s" % (enc(a), enc(b)) for a, b in merges]


# ---- GGUF (version 3), metadata only ----------------------------------------

T_UINT32, T_INT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 7, 8, 9


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def write_vocab_gguf(path, tokens, types, merges, pre="gpt-4o", arch="gpt-oss",
                     name="o200k_harmony", ids=None, add_bos=False):
    """A tensor-less GGUF holding a byte-level BPE vocabulary (tokenizer.ggml.*).
    ids: {"bos": id, "eos": id, "padding": id, ...} -> tokenizer.ggml.X_token_id."""
    kv = []

    def put(key, vtype, payload):
        kv.append(_str(key) + struct.pack("<I", vtype) + payload)

    def put_arr(key, etype, items):
        if etype == T_STRING:
            body = b"".join(_str(s) for s in items)
        else:
            body = struct.pack("<%di" % len(items), *items)
        put(key, T_ARRAY, struct.pack("<IQ", etype, len(items)) + body)

    put("general.architecture", T_STRING, _str(arch))
    put("general.name", T_STRING, _str(name))
    put("tokenizer.ggml.model", T_STRING, _str("gpt2"))
    put("tokenizer.ggml.pre", T_STRING, _str(pre))
    put_arr("tokenizer.ggml.tokens", T_STRING, tokens)
    put_arr("tokenizer.ggml.token_type", T_INT32, types)
    put_arr("tokenizer.ggml.merges", T_STRING, merges)
    for k, v in sorted((ids or {}).items()):
        put("tokenizer.ggml.%s_token_id" % k, T_UINT32, struct.pack("<I", v))
    put("tokenizer.ggml.add_bos_token", T_BOOL, struct.pack("<B", 1 if add_bos else 0))
    with open(path + ".tmp", "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)))
        for item in kv:
            f.write(item)
    os.replace(path + ".tmp", path)


def build_o200k_harmony_gguf(tiktoken_path, out_path, merges="hf"):
    """Writes gpt-oss's vocabulary (o200k_harmony) as a vocab-only GGUF at
    out_path from an o200k_base.tiktoken file; merges "hf" (recover_merges)
    or "minmax" (recover_merges_min_max). Returns (n tokens, n merges)."""
    tokens = load_tiktoken_ranks(tiktoken_path)
    if len(tokens) != 199998:
        raise ValueError("%s: %d ranks, o200k_base has 199998" % (tiktoken_path, len(tokens)))
    m = recover_merges(tokens) if merges == "hf" else recover_merges_min_max(tokens)
    strs, types, mstrs = build_vocab(tokens, harmony_specials(len(tokens)), m)
    write_vocab_gguf(out_path, strs, types, mstrs,
                     ids={"bos": BOS, "eos": EOS, "padding": PAD})
    return len(strs), len(mstrs)


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the GGUF to write")
    ap.add_argument("--tiktoken", help="o200k_base.tiktoken (default: from PyPI, see --scratch)")
    ap.add_argument("--scratch", default="/tmp/cairn-o200k",
                    help="where the wheel and the rank file are kept (default %(default)s)")
    ap.add_argument("--merges", choices=("hf", "minmax"), default="hf")
    a = ap.parse_args()
    path = a.tiktoken
    if not path:
        try:
            path = fetch_o200k_base(a.scratch)
        except Unavailable as e:
            sys.exit("o200k_vocab: %s" % e)
    n, nm = build_o200k_harmony_gguf(path, a.out, a.merges)
    print("%s: %d tokens, %d merges" % (a.out, n, nm))


if __name__ == "__main__":
    main()
