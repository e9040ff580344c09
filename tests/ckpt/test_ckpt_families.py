#!/usr/bin/env python3
"""Hugging Face folders of Gemma 3, of the mixtures of experts (Qwen3-MoE, Qwen2-MoE, Mixtral,
gpt-oss) and of Qwen2 with YaRN through the cairn executable, against GGUFs of exactly the same
weights.

usage: test_ckpt_families.py CAIRN_BIN CKPT_DIR TESTDATA [unittest args...]

The material is tests/ckpt/make_material.py's `families` (tiny random models written by
tools/gen_synthetic_model.py, turned into folders by tools/ckpt/gguf_to_hf.py, with an F16 GGUF
of the same BF16 values beside each) and `gemma` (the real Gemma 3 270M, when it is present).
A folder is read through ckpt/: its config.json fields become the GGUF keys (windows, global
layers, experts), Gemma's norms get their 1 added, the experts stay per-expert tensors, and its
tokenizer.json (SentencePiece-style BPE) becomes the SentencePiece vocabulary. gpt-oss comes twice:
as openai/gpt-oss-* ship it (MXFP4 experts: HF's blocks and scales repacked into GGUF's nibble
order, gate and up de-interleaved; its F16 GGUF keeps the same MXFP4 bytes) and as the BF16
checkpoints dequantized from it (gate_up_proj/down_proj, input-major, transposed at load). So:

  - greedy tokens from the folder equal the F16 GGUF's when both multiply float activations
    (CAIRN_CPU_BF16=0), on prompts longer than the synthetic Gemma's 8-token window; the same
    for the Gemma folder laid out as a Gemma3ForConditionalGeneration (4B and up) checkpoint;
  - teacher-forced over a text, the folder's distributions match the GGUF's (mean KL and top-1
    agreement from `cairn perplexity --kl-model`): a wrong norm offset, a swapped gate and up
    projection or a misread router shows as nats, not as a rounding difference;
  - the experts quantized as AWQ, GPTQ (symmetric, and act-order asymmetric: each expert
    reads its input in its own order) and FP8 (128x128 blocks)
    checkpoints of Qwen3-MoE, Qwen2-MoE and Mixtral carry them (tools/ckpt/quantize_hf.py,
    round to nearest) give the distributions of a float folder holding the same weights
    dequantized by the tool: every expert's codes, scales, zero points and order read right;
  - config.json fields cairn does not implement, or that disagree with the tensors, are refused
    with the field's name: renormalised expert weights where the family does not renormalise,
    an expert count the router does not have, an irregular layer_types, logit soft-capping, a
    window wider than the context; for gpt-oss another SwiGLU clamp, other local layers than the
    even ones, no window, YaRN unrounded (rope_scaling.truncate false: what the openai
    checkpoints say, and transformers' default when rope_scaling is left out), MXFP4 tensors
    without the quantization_config that declares them; and gpt-oss expert tensors that cannot
    be read are refused naming them (a NaN MXFP4 scale, a missing bias, blocks of another dtype).
Greedy throughout; no timing thresholds.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "ckpt"))
import harness  # noqa: E402
import ckpt_io  # noqa: E402
import quantize_hf  # noqa: E402
import numpy as np  # noqa: E402

CAIRN, CKPT, TESTDATA = harness.take_argv("CAIRN_BIN", "CKPT_DIR", "TESTDATA", usage=__doc__)
TEXT = os.path.join(TESTDATA, "text", "gpl-3.txt")
# qwen2: with YaRN; gpt-oss-bf16: gpt-oss's folder with BF16 experts
ARCHES = ("gemma3", "qwen3moe", "qwen2moe", "mixtral", "qwen2", "gpt-oss", "gpt-oss-bf16")
GEMMA = os.path.join(CKPT, "gemma-bf16")
EXACT = {"CAIRN_CPU_BF16": "0"}
# and 4-bit weights multiplied by float activations (not 8-bit ones): the dequantized
# reference's arithmetic, so near-ties of a random model cannot part them
EXACT_MATMUL = dict(EXACT, CAIRN_CPU_EXACT_MATMUL="1")

PROMPT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the "
          "deep dark forest where nobody can find it again.")


ABSENT = object()  # edited(): a field left out of config.json


def run(model, prompt, n=24, chat=False, env=None):
    return harness.cairn_run(CAIRN, model, prompt, n=n, chat=chat, env=env)


def kl_against(model, ref, ctx, chunks, env=None):
    r = subprocess.run([CAIRN, "perplexity", "-m", model, "-f", TEXT, "-c", str(ctx),
                        "--chunks", str(chunks), "--kl-model", ref],
                       capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        raise AssertionError(f"cairn perplexity -m {model} failed:\n{r.stderr[-2000:]}")
    m = re.search(r"mean KL ([0-9.e+-]+), top-1 agreement ([0-9.]+)%", r.stdout)
    if not m:
        raise AssertionError(f"no KL line in:\n{r.stdout}")
    return float(m.group(1)), float(m.group(2))


def load_error(folder):
    """cairn run on a folder that must be refused: its stderr."""
    r = subprocess.run([CAIRN, "run", "-m", folder, "-p", "hi", "-n", "1"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        raise AssertionError(f"{folder} was loaded; it must be refused")
    return r.stderr


class Families(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="cairn-ckpt-fam-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def folder(self, arch):
        path = os.path.join(CKPT, f"fam-{arch}")
        if not os.path.isdir(path):
            self.fail(f"no material at {path} (ckpt_material_families builds it)")
        return path

    def edited(self, arch, **changes):
        """A copy of the folder (weights linked, not copied) with config.json changed (a value
        ABSENT removes the field)."""
        src = self.folder(arch)
        dst = os.path.join(self.tmp, f"{arch}-edited")
        os.makedirs(dst)
        for name in os.listdir(src):
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
        os.unlink(os.path.join(dst, "config.json"))
        with open(os.path.join(src, "config.json")) as f:
            cfg = json.load(f)
        cfg.update(changes)
        cfg = {k: v for k, v in cfg.items() if v is not ABSENT}
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump(cfg, f)
        return dst

    def test_same_greedy_tokens_as_the_f16_gguf(self):
        for arch in ARCHES:
            with self.subTest(arch=arch):
                folder = self.folder(arch)
                self.assertEqual(run(folder, PROMPT, env=EXACT),
                                 run(folder + "-f16.gguf", PROMPT, env=EXACT))

    def test_distributions_match_the_f16_gguf(self):
        for arch in ARCHES:
            with self.subTest(arch=arch):
                folder = self.folder(arch)
                kl, top1 = kl_against(folder, folder + "-f16.gguf", 64, 2, env=EXACT)
                print(f"{arch}: folder vs F16 GGUF, mean KL {kl:.2e}, top-1 {top1:.1f}%",
                      file=sys.stderr)
                self.assertLess(kl, 1e-6)
                self.assertEqual(top1, 100.0)

    def test_multimodal_gemma_reads_its_language_model(self):
        # Gemma3ForConditionalGeneration: text_config with defaults left out, tensors under
        # language_model.model., a vision tower that is not read
        mm = os.path.join(CKPT, "fam-gemma3-mm")
        ref = os.path.join(CKPT, "fam-gemma3-f16.gguf")
        self.assertEqual(run(mm, PROMPT, env=EXACT), run(ref, PROMPT, env=EXACT))
        kl, top1 = kl_against(mm, ref, 64, 2, env=EXACT)
        self.assertLess(kl, 1e-6)
        self.assertEqual(top1, 100.0)

    def test_config_fields_refused_by_name(self):
        cases = [
            ("qwen3moe", {"norm_topk_prob": False}, "norm_topk_prob"),
            ("qwen2moe", {"norm_topk_prob": True}, "norm_topk_prob"),
            ("qwen3moe", {"num_experts": 7}, "mlp.gate.weight"),
            ("qwen3moe", {"mlp_only_layers": [0]}, "mlp_only_layers"),
            ("mixtral", {"num_local_experts": 5}, "block_sparse_moe.gate.weight"),
            ("mixtral", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
            ("gemma3", {"layer_types": ["sliding_attention", "full_attention",
                                        "full_attention"]}, "layer_types"),
            ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
            ("gemma3", {"sliding_window": 1 << 20}, "sliding_window"),
            ("gemma3", {"hidden_activation": "gelu"}, "hidden_activation"),
            ("gemma3", {"query_pre_attn_scalar": 300}, "query_pre_attn_scalar"),
            ("qwen2", {"rope_scaling": {"type": "yarn", "factor": 4, "mscale": 0.7}},
             "mscale"),
            ("qwen2", {"rope_scaling": {"type": "longrope", "factor": 4}}, "longrope"),
            ("qwen2", {"quantization_config": {"quant_method": "mxfp4"}}, "mxfp4"),
            ("gpt-oss", {"swiglu_limit": 10.0}, "swiglu_limit"),
            ("gpt-oss", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
            ("gpt-oss", {"layer_types": ["sliding_attention"] * 2}, "layer_types"),
            ("gpt-oss", {"sliding_window": None}, "sliding_window"),
            ("gpt-oss", {"rope_scaling": {"rope_type": "yarn", "factor": 32.0,
                                          "truncate": "no"}}, "truncate"),
            ("gpt-oss", {"num_local_experts": 5}, "mlp.router.weight"),
            ("gpt-oss", {"quantization_config": ABSENT}, "mxfp4"),
            ("gpt-oss", {"quantization_config": {"quant_method": "fp8"}}, "quantized as fp8"),
            ("gpt-oss-bf16", {"intermediate_size": 64}, "gate_up_proj"),
        ]
        for arch, change, field in cases:
            with self.subTest(arch=arch, change=change):
                err = load_error(self.edited(arch, **change))
                self.assertIn(field, err)
                shutil.rmtree(os.path.join(self.tmp, f"{arch}-edited"))


    def test_quantized_experts(self):
        methods = {"awq": ["--group-size", "32"],
                   "gptq": ["--group-size", "32"],
                   "gptq-actorder": ["--group-size", "32", "--desc-act", "--asym"],
                   "fp8": ["--fp8-scheme", "block"]}
        for arch in ("qwen3moe", "qwen2moe", "mixtral"):
            for method, extra in methods.items():
                with self.subTest(arch=arch, method=method):
                    quant = os.path.join(self.tmp, f"{arch}-{method}")
                    args = [self.folder(arch), quant, "--method", method.split("-")[0]] + extra
                    quantize_hf.main(args)
                    ref = self.dequantized(quant, args)
                    experts = [n for n in ckpt_io.read_folder(quant)
                               if re.search(r"experts\.\d+\.(\w+_proj|w[123])\.", n)]
                    self.assertTrue(experts, "no expert was quantized")
                    kl, top1 = kl_against(quant, ref, 64, 2, env=EXACT_MATMUL)
                    print(f"{arch} {method} experts vs their dequantized values: mean KL "
                          f"{kl:.2e}, top-1 {top1:.1f}%", file=sys.stderr)
                    self.assertLess(kl, 1e-3)
                    self.assertGreaterEqual(top1, 99.0)
                    shutil.rmtree(quant)
                    shutil.rmtree(ref)

    def dequantized(self, quant, args):
        """A float folder beside `quant` with its quantized linears as the quantizer's own
        dequantized values (F32: exact), everything else as it is, no quantization_config."""
        a = quantize_hf.parse(args)
        tensors = ckpt_io.read_folder(quant)
        prefixes = sorted({n.rsplit(".", 1)[0] for n in tensors
                           if quantize_hf.LINEAR_RE.match(n.rsplit(".", 1)[0] + ".weight")})
        out = []
        for name, (dt, shape, arr) in tensors.items():
            prefix, part = name.rsplit(".", 1)
            if prefix in prefixes and part != "bias":  # its codes, scales, zeros, order
                continue
            out.append((name, dt, shape, np.asarray(arr)))
        for prefix in prefixes:
            w = quantize_hf.dequant_of(a, quantize_hf.unpack_of(a, tensors, prefix))
            w = np.ascontiguousarray(w, dtype=np.float32)
            out.append((prefix + ".weight", "F32", w.shape, w))
        ref = quant + "-dequantized"
        ckpt_io.write_folder(ref, out)
        with open(os.path.join(quant, "config.json")) as f:
            cfg = json.load(f)
        del cfg["quantization_config"]
        ckpt_io.write_json(os.path.join(ref, "config.json"), cfg)
        for fn in os.listdir(quant):
            if fn.endswith(".json") and fn not in ("config.json", "model.safetensors.index.json"):
                shutil.copyfile(os.path.join(quant, fn), os.path.join(ref, fn))
        return ref

    def test_gpt_oss_unrounded_yarn(self):
        # rope_scaling as openai/gpt-oss-20b's config.json has it (truncate false: YaRN's ramp
        # ends kept fractional, as transformers and vLLM compute it), and GptOssConfig's
        # default, which is the same, when rope_scaling is left out: both load, to the same
        # maths, which is not the rounded YaRN of the GGUF twin (llama.cpp's)
        hub = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
               "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False}
        twin = self.folder("gpt-oss") + "-f16.gguf"
        dists = []
        for change in (hub, ABSENT):
            folder = self.edited("gpt-oss", rope_scaling=change)
            dists.append(kl_against(folder, twin, 64, 2, env=EXACT))
            self.assertEqual(run(folder, PROMPT, env=EXACT), run(folder, PROMPT, env=EXACT))
            shutil.rmtree(folder)
        print(f"gpt-oss unrounded YaRN vs the rounded GGUF: mean KL {dists[0][0]:.2e}",
              file=sys.stderr)
        self.assertGreater(dists[0][0], 1e-9)  # the ramp's pairs turn at other speeds
        self.assertEqual(dists[0], dists[1])

    def rewritten(self, arch, edit):
        """A copy of the folder whose tensors `edit` changed ({name: (dtype, shape, array)})."""
        src = self.folder(arch)
        dst = os.path.join(self.tmp, f"{arch}-rewritten")
        if os.path.isdir(dst):
            shutil.rmtree(dst)
        tensors = {n: (dt, shape, np.array(a)) for n, (dt, shape, a) in
                   ckpt_io.read_folder(src).items()}
        edit(tensors)
        ckpt_io.write_folder(dst, [(n, dt, a.shape, a) for n, (dt, _, a) in sorted(tensors.items())])
        for name in os.listdir(src):
            if name.endswith(".json") and "safetensors" not in name:
                shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
        return dst

    def test_gpt_oss_expert_tensors_refused_by_name(self):
        pre = "model.layers.1.mlp.experts."

        def nan_scale(t):
            t[pre + "down_proj_scales"][2][3, 5, 1] = 0xFF   # E8M0's NaN

        def no_bias(t):
            del t[pre + "gate_up_proj_bias"]

        def i8_blocks(t):
            dt, shape, a = t[pre + "gate_up_proj_blocks"]
            t[pre + "gate_up_proj_blocks"] = ("I8", shape, a.view(np.int8))

        cases = [("gpt-oss", nan_scale, "down_proj_scales"),
                 ("gpt-oss", no_bias, "gate_up_proj_bias"),
                 ("gpt-oss", i8_blocks, "must be U8"),
                 ("gpt-oss-bf16", no_bias, "gate_up_proj_bias")]
        for arch, edit, field in cases:
            with self.subTest(arch=arch, edit=edit.__name__):
                self.assertIn(field, load_error(self.rewritten(arch, edit)))


@unittest.skipUnless(os.path.isdir(GEMMA), f"no Gemma 3 material at {GEMMA}")
class RealGemma(unittest.TestCase):
    def test_same_greedy_tokens_as_the_f16_gguf(self):
        # past the 512-token window: the prompt is the GPL's first ~700 tokens
        with open(TEXT, encoding="utf-8") as f:
            long_prompt = f.read()[:3000] + "\n\nIn one sentence, this license"
        for prompt, chat in ((PROMPT, False), ("Name three prime numbers.", True),
                             (long_prompt, False)):
            with self.subTest(prompt=prompt[:30], chat=chat):
                self.assertEqual(run(GEMMA, prompt, chat=chat, env=EXACT),
                                 run(os.path.join(CKPT, "gemma-f16.gguf"), prompt, chat=chat,
                                     env=EXACT))

    def test_distributions_close_to_the_f16_gguf(self):
        # default kernels: bf16 activations where the CPU has AVX512_BF16
        kl, top1 = kl_against(GEMMA, os.path.join(CKPT, "gemma-f16.gguf"), 640, 1)
        print(f"Gemma 3 270M folder vs F16 GGUF: mean KL {kl:.5f}, top-1 {top1:.1f}%",
              file=sys.stderr)
        self.assertLess(kl, 0.01)
        self.assertGreater(top1, 95.0)


if __name__ == "__main__":
    harness.main()
