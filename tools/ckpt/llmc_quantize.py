#!/usr/bin/env python3
"""Quantize a BF16 checkpoint folder with llm-compressor, the reference tool, when it is installed.

    llmc_quantize.py SRC_BF16_DIR OUTDIR SCHEME      (SCHEME: FP8_DYNAMIC, W4A16, W4A16_ASYM, ...)

Not part of the tests: llm-compressor needs torch and transformers (about 6 GB from PyPI), which the
test setup does not install. It is how the compressed-tensors layouts cairn reads were checked
against the real writer (`pip install llmcompressor` in a virtual environment, then this script on
the folder tools/ckpt/gguf_to_hf.py makes). The schemes used need no calibration data: FP8_DYNAMIC
is per-channel FP8 with dynamic activations; W4A16 / W4A16_ASYM are round-to-nearest 4-bit
groups of 128 (min/max observer). lm_head stays unquantized, as llm-compressor's examples do.
"""
import sys
import time


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, out, scheme = sys.argv[1:]
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype="auto")
    tok = AutoTokenizer.from_pretrained(src)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme,
                                                    ignore=["lm_head"]))
    model.save_pretrained(out, save_compressed=True)
    tok.save_pretrained(out)
    print(f"{out}: {scheme} in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
