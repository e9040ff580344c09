#!/usr/bin/env python3
"""Build the checkpoint folders the ckpt tests read, with tools/ckpt.

    make_material.py synthetic OUT          OUT/synth: tiny good and broken folders
    make_material.py real OUT MODEL.gguf    OUT/qwen-*: folders made from a real GGUF
    make_material.py families OUT           OUT/fam-<arch>: Gemma 3 and the mixtures of experts
                                            (qwen3moe, qwen2moe, mixtral, gpt-oss with MXFP4
                                            experts, and fam-gpt-oss-bf16 with them as BF16), tiny
                                            and random (tools/gen_synthetic_model.py), each with an
                                            F16 GGUF of the same weights beside it
    make_material.py gemma OUT GEMMA.gguf   OUT/gemma-bf16 and OUT/gemma-f16.gguf from the real
                                            Gemma 3 270M

Each folder is rebuilt only when the tools or the source model changed since it was built (a
stamp file beside it holds a hash of both), so a second `make test` costs nothing. `real` and
`gemma` exit 77 (skip) when the model is absent.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.join(HERE, "..", "..", "tools", "ckpt")


def tools_hash(extra):
    h = hashlib.sha256()
    for name in sorted(os.listdir(TOOLS)):
        if name.endswith(".py"):
            with open(os.path.join(TOOLS, name), "rb") as f:
                h.update(name.encode() + f.read())
    h.update(repr(extra).encode())
    return h.hexdigest()


def build(out, stamp_key, argv):
    """Run a tool into `out` unless its stamp says it is up to date."""
    stamp = out.rstrip("/") + ".stamp"
    if os.path.exists(out) and os.path.exists(stamp) and open(stamp).read() == stamp_key:
        print(f"up to date: {out}")
        return
    if os.path.isdir(out):
        shutil.rmtree(out)
    elif os.path.exists(out):
        os.remove(out)
    print("+", " ".join(argv), flush=True)
    subprocess.run([sys.executable] + argv, check=True)
    with open(stamp, "w") as f:
        f.write(stamp_key)


# The synthetic families: windows over 8 tokens on every layer but the third
# (Gemma 3), 6 experts of which 2 run per token (the engine tests' shapes),
# and Qwen2 with YaRN (rope_scaling type yarn in its config.json).
FAMILIES = {
    "gemma3": ["--layers", "3", "--head-dim", "48", "--sliding-window", "8", "--swa-period", "3"],
    "qwen3moe": ["--experts", "6", "--experts-used", "2", "--expert-ffn", "96"],
    "qwen2moe": ["--experts", "6", "--experts-used", "2", "--expert-ffn", "96"],
    "mixtral": ["--experts", "6", "--experts-used", "2"],
    # named for the arch flag it passes; YaRN over a trained context of 16 tokens
    "qwen2": ["--yarn", "4", "--yarn-orig-ctx", "16"],
    # gpt-oss's shapes in small: q wider than the stream, MXFP4 experts, local layers of 8
    # tokens (YaRN x32 over 4096 by default)
    "gpt-oss": ["--head-dim", "48", "--experts", "6", "--experts-used", "2", "--expert-ffn", "96",
                "--expert-type", "MXFP4", "--sliding-window", "8"],
}
# Further folders from a family's GGUF: name -> (family, gguf_to_hf.py options)
VARIANTS = {
    "gpt-oss-bf16": ("gpt-oss", ["--bf16-experts"]),  # the dequantized checkpoints' form
}


def source_model(fetch):
    """The model named by argv[3] and what identifies its version for the stamps; exits 77
    (skip) when it is absent."""
    model = sys.argv[3] if len(sys.argv) > 3 else ""
    if not os.path.isfile(model):
        print(f"SKIP: no model at '{model}' ({fetch} fetches it)")
        sys.exit(77)
    st = os.stat(model)
    return model, (os.path.abspath(model), st.st_size, int(st.st_mtime))


def multimodal(src, dst):
    """A Gemma3ForCausalLM folder as the Gemma3ForConditionalGeneration (4B/12B/27B) checkpoints
    lay it out: the model fields in text_config, those equal to Gemma3TextConfig's defaults left
    out (as the 4B's config leaves out its heads), the language model's tensors under
    language_model.model., and a vision tower beside them that a text-only reader must skip."""
    sys.path.insert(0, TOOLS)
    import ckpt_io
    import numpy as np
    with open(os.path.join(src, "config.json")) as f:
        text = json.load(f)
    for key, default in (("rope_local_base_freq", 10000.0), ("rms_norm_eps", 1e-6),
                         ("hidden_activation", "gelu_pytorch_tanh"), ("rope_theta", 1e6),
                         ("bos_token_id", 2)):
        if text.get(key) == default:
            del text[key]
    text.pop("architectures", None)
    text["model_type"] = "gemma3_text"
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": text, "torch_dtype": "bfloat16",
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32,
                             "patch_size": 14, "image_size": 56},
           "mm_tokens_per_image": 4, "image_token_index": 262144}
    os.makedirs(dst, exist_ok=True)
    tensors = [("language_model." + name, dt, shape, a)
               for name, (dt, shape, a) in sorted(ckpt_io.read_folder(src).items())]
    patch = np.zeros((32, 3, 14, 14), dtype=np.uint16)  # BF16 zeros
    tensors.append(("vision_tower.vision_model.embeddings.patch_embedding.weight", "BF16",
                    patch.shape, patch))
    ckpt_io.write_folder(dst, tensors)
    ckpt_io.write_json(os.path.join(dst, "config.json"), cfg)
    for name in os.listdir(src):
        if name.endswith(".json") and name not in ("config.json",) and "safetensors" not in name:
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("synthetic", "real", "families", "gemma",
                                                 "multimodal"):
        sys.exit(__doc__)
    mode, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if mode == "families":
        gen = os.path.join(HERE, "..", "..", "tools", "gen_synthetic_model.py")
        with open(gen, "rb") as f:
            gen_hash = hashlib.sha256(f.read()).hexdigest()
        for arch, args in FAMILIES.items():
            src = os.path.join(out, f"fam-{arch}-src.gguf")
            build(src, tools_hash(("src", arch, args, gen_hash)),
                  [gen, "--shape", "tiny", "--type", "F32", "--arch", arch, "-o", src] + args)
            build(os.path.join(out, f"fam-{arch}"), tools_hash(("fam", arch, args, gen_hash)),
                  [os.path.join(TOOLS, "gguf_to_hf.py"), src, os.path.join(out, f"fam-{arch}"),
                   "--f16-gguf", os.path.join(out, f"fam-{arch}-f16.gguf")])
        for name, (arch, opts) in VARIANTS.items():
            src = os.path.join(out, f"fam-{arch}-src.gguf")
            build(os.path.join(out, f"fam-{name}"),
                  tools_hash(("fam", name, FAMILIES[arch], opts, gen_hash)),
                  [os.path.join(TOOLS, "gguf_to_hf.py"), src, os.path.join(out, f"fam-{name}"),
                   "--f16-gguf", os.path.join(out, f"fam-{name}-f16.gguf")] + opts)
        build(os.path.join(out, "fam-gemma3-mm"), tools_hash(("mm", FAMILIES["gemma3"], gen_hash)),
              [os.path.abspath(__file__), "multimodal", os.path.join(out, "fam-gemma3"),
               os.path.join(out, "fam-gemma3-mm")])
        return
    if mode == "multimodal":
        multimodal(sys.argv[2], sys.argv[3])
        return
    if mode == "gemma":
        model, src = source_model("scripts/get-model gemma3-270m-q4_k_m")
        build(os.path.join(out, "gemma-bf16"), tools_hash(("gemma", src)),
              [os.path.join(TOOLS, "gguf_to_hf.py"), model, os.path.join(out, "gemma-bf16"),
               "--f16-gguf", os.path.join(out, "gemma-f16.gguf")])
        return
    if mode == "synthetic":
        synth = os.path.join(out, "synth")
        build(synth, tools_hash("synth"), [os.path.join(TOOLS, "make_synthetic.py"), synth])
        # HF llama's q/k row order: the bundled llama GGUF as a folder (its SentencePiece
        # vocabulary swapped for the synthetic byte-level one, which cairn reads; the
        # test compares weights, not text)
        llama = os.path.join(out, "llama-stories")
        stories = os.path.join(HERE, "..", "..", "models", "stories260K.gguf")
        build(llama, tools_hash("llama-stories"),
              [os.path.join(TOOLS, "gguf_to_hf.py"), stories, llama])
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(synth, "bf16", name), os.path.join(llama, name))
        return
    model, src = source_model("scripts/get-model")
    bf16 = os.path.join(out, "qwen-bf16")
    f16 = os.path.join(out, "qwen-f16.gguf")
    key = tools_hash(("bf16", src))
    build(bf16, key, [os.path.join(TOOLS, "gguf_to_hf.py"), model, bf16, "--f16-gguf", f16])
    quantize = os.path.join(TOOLS, "quantize_hf.py")
    variants = {
        "qwen-awq": ["--method", "awq"],
        "qwen-gptq": ["--method", "gptq", "--asym", "--desc-act"],
        "qwen-fp8": ["--method", "fp8", "--fp8-scheme", "channel"],
    }
    # (FP8 with 128x128 blocks is checked exactly on the synthetic folders; on this model it
    # measured as per-channel did: -0.8% PPL, KL 0.011, top-1 94.9% over 2,048 positions.)
    for name, args in variants.items():
        dst = os.path.join(out, name)
        build(dst, tools_hash((name, args, key)), [quantize, bf16, dst] + args)


if __name__ == "__main__":
    main()
