/*
 * ckpt/ckpt.h — opening a model: a GGUF file, or a Hugging Face checkpoint
 * folder as the GPU serving stacks (vLLM, SGLang, TensorRT-LLM) download it.
 *
 * A checkpoint folder is
 *
 *     config.json                  architecture, shapes, quantization_config
 *     tokenizer.json               the HF tokenizer (byte-level BPE, or
 *                                  SentencePiece-style BPE with byte fallback)
 *     tokenizer_config.json        chat template, special tokens
 *     generation_config.json       (optional) stop ids
 *     model.safetensors            the weights, or shards named by
 *     model.safetensors.index.json
 *
 * and cairn_ckpt_open presents it as a cairn_gguf (gguf/gguf.h, "Building a
 * GGUF in memory"), with the keys and tensor names a converted GGUF would
 * have, so the model, vocabulary and chat-template loaders are the same for
 * both:
 *
 *     folder ──safetensors.c──▶ mapped tensors ─┐
 *            ──config.c───────▶ <arch>.* keys   ├─▶ builder ──▶ cairn_gguf
 *            ──tokenizer_json.c▶ tokenizer.*    │
 *            ──weights.c──────▶ GGUF names, cairn types (repacked)
 *
 * Weight formats and what loading them costs:
 *   BF16, F16, F32  used in place from the mapping (2-D weights; norms and
 *                   biases are converted to F32, a few MB). HF llama's q/k
 *                   rows are reordered to GGUF's RoPE pairing (a copy of
 *                   those two matrices per layer).
 *   AWQ (GEMM)      qweight/qzeros/scales, 4-bit, zero point -> Q4_Z: every
 *                   32 weights carry their group's f16 scale and zero, 5.0
 *                   bits per weight (AWQ's own is 4.16 at group 128).
 *   GPTQ            qweight/qzeros/scales/g_idx, 4-bit, sym or asym, v1
 *                   ("gptq", zeros stored minus one) or v2 zeros -> Q4_Z;
 *                   with act-order (desc_act) the input columns are sorted
 *                   by group and the matmul input is gathered in that order
 *                   (an I32 tensor "<name>.input_perm", backend gather_cols).
 *   compressed-tensors int4 ("pack-quantized", llm-compressor's W4A16):
 *                   weight_packed/weight_scale/weight_zero_point(/g_idx),
 *                   per group or per channel, sym or asym -> Q4_Z as GPTQ.
 *   FP8 e4m3        per-tensor, per-channel or 128x128-block scales
 *                   (compressed-tensors, fbgemm_fp8, "fp8" with
 *                   weight_block_size) -> F8_E4M3 with an f32 scale per 32,
 *                   9 bits per weight.
 *   MXFP4           gpt-oss's experts (quant_method "mxfp4": _blocks and
 *                   _scales) -> GGUF's MXFP4, the same bits with the nibbles
 *                   of each block reordered; its BF16 copies' experts
 *                   (gate_up_proj, down_proj, stored input-major) are
 *                   transposed into GGUF's rows.
 * Quantized tensors are repacked into memory the handle owns (once, at
 * load: the time and bytes are logged), and the model fingerprint hashes the
 * repacked bytes, so a prefix cached for the GGUF of a model and for its AWQ
 * build never share pages.
 *
 * Supported architectures: LlamaForCausalLM and MistralForCausalLM (llama,
 * with Mistral's window), Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM
 * (qwen3), Gemma3ForCausalLM (gemma3), and the mixtures of experts
 * Qwen2MoeForCausalLM (qwen2moe), Qwen3MoeForCausalLM (qwen3moe) and
 * MixtralForCausalLM (llama with experts), whose per-expert tensors become
 * GGUF's per-expert names "blk.L.ffn_{gate,up,down}.E.weight", used in place
 * like any other weight, and GptOssForCausalLM (gpt-oss), whose stacked
 * experts (gate and up interleaved in one tensor) become GGUF's 3-D
 * "blk.L.ffn_{gate,up,down}_exps" tensors, repacked. A gpt-oss config.json
 * as OpenAI ships it (rope_scaling.truncate false: YaRN's correction range
 * left unrounded, as transformers and vLLM compute it) carries that to the
 * loader as rope.scaling.yarn_truncate false (model.c: no GGUF writer has
 * the key; llama.cpp always rounds). Anything cairn does not implement, an unknown
 * quantization method, a tensor whose dtype or shape disagrees with
 * config.json, or a corrupt safetensors header is refused with a message
 * naming the file and the field. Nothing is ever written to the folder.
 */
#ifndef CAIRN_CKPT_H
#define CAIRN_CKPT_H

#include "gguf/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sampling settings a folder's generation_config.json recommends are
 * F32 keys "cairn.generation.<name>" of the handle, for these names (absent
 * when the folder gives none; a GGUF file never has them). */
#define CAIRN_CKPT_N_GENERATION 5
extern const char *const cairn_ckpt_generation_keys[CAIRN_CKPT_N_GENERATION];

/* True when `path` is a directory holding config.json. */
bool cairn_ckpt_is_folder(const char *path);

/* Open `path`: a checkpoint folder (above) or a GGUF file (cairn_gguf_open).
 * On success *out is closed with cairn_gguf_close. Errors: CAIRN_ENOTFOUND
 * (no such path / a required file missing), CAIRN_EFORMAT (corrupt or
 * inconsistent), CAIRN_EUNSUPPORTED (an architecture, dtype or quantization
 * cairn does not run), CAIRN_EIO, CAIRN_ENOMEM; err says which file and why.
 * Any thread; the handle is read-only and may be shared once open. */
int cairn_ckpt_open(const char *path, cairn_gguf **out, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_CKPT_H */
