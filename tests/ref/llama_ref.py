#!/usr/bin/env python3
"""An independent numpy reference of the Llama forward pass.

cairn's C forward pass is checked against this file, so it is written to be
obviously right rather than fast: one full (non-cached) pass over the whole
token sequence, every product in float64, weights read straight from the GGUF
with the `gguf` package (no cairn code involved).

What the GGUF stores, and how this file uses it:

* Shapes. GGUF lists a tensor's dimensions fastest-varying first (ggml's
  `ne`); `gguf.GGUFReader` already hands back numpy arrays in the usual
  row-major order, so a matrix with ne = [n_in, n_out] arrives as
  [n_out, n_in] and a projection is simply `x @ W.T`.
* Q/K layout. HF Llama checkpoints rotate the two halves of each head
  ("NEOX" style); the GGUF converter permutes the rows of attn_q / attn_k so
  that the same rotation becomes one over adjacent pairs (2i, 2i+1), which is
  ggml's NORMAL rope mode used for the llama architecture. We therefore use
  the stored weights as they are and rotate adjacent pairs. qwen2 GGUFs keep
  the HF order, so for them the halves are rotated (NEOX), and q/k/v add
  their bias vectors before RoPE. qwen3 rotates halves too, has no biases,
  and RMS-normalises every head of q and k (weights attn_q_norm /
  attn_k_norm, [head_dim]) before RoPE; its head width (key_length) need not
  be dim / n_head.
* gemma3 is qwen3's attention (NEOX, q/k norms) with: embeddings times
  sqrt(dim); the attention output and the FFN output each RMS-normalised
  (post_attention_norm, post_ffw_norm) before they are added to the
  residual stream; GELU (tanh form) as the FFN gate; tied output. Its norm
  weights are used as stored: Gemma's (1 + w) is already in the GGUF. With
  attention.sliding_window W, every layer but each P-th
  (attention.sliding_window_pattern, default 6) is local: a query at p sees
  keys p-W+1 .. p, and RoPE uses base rope.freq_base_swa (default 10000)
  unscaled there. On llama, a sliding_window is Mistral's: every layer.
* Mixture of experts (qwen3moe, qwen2moe, and llama with expert_count:
  Mixtral): the FFN is, per token, sum over its top-k experts e of
  w_e * FFN_e(h), w = softmax(h @ router.T) at the chosen experts,
  renormalised to sum 1 (not on qwen2moe); experts are 3-D tensors
  ffn_{gate,up,down}_exps. qwen2moe adds sigmoid(h @ w_s) * FFN_shared(h).
* gpt-oss (OpenAI's, llama.cpp's LLM_ARCH_OPENAI_MOE): NEOX RoPE with the
  file's YaRN on every layer; biases on q/k/v and on the attention output;
  key_length (head_dim) independent of dim, so q may be wider than x. Layer
  l is local when l % P < P - 1 (attention.sliding_window_pattern P,
  default 2: the even layers), a query at p then seeing keys p-W+1 .. p;
  local and global layers rotate alike. Attention sinks: query head h adds
  attn_sinks[h] (unscaled) as one more logit to its softmax's denominator
  only: out = sum_j e^{s_j} v_j / (e^{sink_h} + sum_j e^{s_j}). The FFN's
  input norm is post_attention_norm. The router has a bias; the top k
  experts by router logit (ties to the lower index) are weighted by a
  softmax over those k logits alone (times expert_weights_scale when the
  key is there and nonzero). Each expert adds biases to gate, up and down
  and activates with the clamped SwiGLU: g = min(g, 7),
  u = clip(u, -7, 7), a = g * sigmoid(1.702 g) * (u + 1). Experts are
  MXFP4 in the real model (expanded by gguf's dequantizer).
* RoPE. For pair i of the first n_rot dimensions of a head at position p:
  theta_i = p * freq_scale * base^(-2i / n_rot) (divided by rope_freqs[i]
  when the file has that tensor), and
      (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos).
  With YaRN the frequency of each pair is HF's blend of base^(-2i/n_rot)
  and that over the factor, and cos/sin are scaled by 0.1 ln(factor) + 1.
  Dimensions past n_rot are left alone.

CLI:
  llama_ref.py MODEL --tokens 1,403,407 --out logits.f32 [--hidden h.f32]
      float32 little-endian logits [n_tokens][n_vocab] for every position
      (and the final hidden state after the output norm, [n_tokens][dim]).
  llama_ref.py MODEL --tokens 1,403,407 --greedy 32 [--expect "ids"]
      greedy decoding; prints the generated ids separated by spaces (and
      fails unless they equal --expect).
Exit status 77 when the gguf package is missing (ctest: skipped).
"""

import argparse
import sys

try:
    import gguf
    import numpy as np
except ImportError:  # the tests treat exit code 77 as "skipped"
    sys.stderr.write("llama_ref.py: the 'numpy' and 'gguf' Python packages are needed "
                     "(scripts/setup.sh --test installs them)\n")
    sys.exit(77)


class Model:
    """Hyper-parameters and float64 weights of a llama, qwen2, qwen3, gemma3,
    qwen3moe, qwen2moe or gpt-oss GGUF.

    qwen2 is the llama decoder with biases on the q/k/v projections and the
    NEOX RoPE pairing (dimension i with i + n_rot/2 instead of 2i with 2i+1)."""

    def __init__(self, path):
        reader = gguf.GGUFReader(path)
        self.meta = {name: field for name, field in reader.fields.items()}
        arch = self._str("general.architecture")
        if arch not in ("llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "qwen2moe", "gpt-oss"):
            raise SystemExit(f"llama_ref.py: architecture '{arch}' is not llama, qwen2, qwen3, "
                             "gemma3, qwen3moe, qwen2moe or gpt-oss")
        self.arch = arch
        self.neox = arch in ("qwen2", "qwen3", "gemma3", "qwen3moe", "qwen2moe", "gpt-oss")
        k = lambda suffix: f"{arch}.{suffix}"

        self.dim = self._int(k("embedding_length"))
        self.n_layer = self._int(k("block_count"))
        self.n_head = self._int(k("attention.head_count"))
        self.n_kv_head = self._int(k("attention.head_count_kv"), self.n_head)
        self.ffn_dim = self._int(k("feed_forward_length"))
        self.head_dim = self._int(k("attention.key_length"), self.dim // self.n_head)
        self.n_rot = self._int(k("rope.dimension_count"), self.head_dim)
        self.rope_base = self._float(k("rope.freq_base"), 10000.0)
        self.rms_eps = self._float(k("attention.layer_norm_rms_epsilon"), 1e-5)
        # Linear position interpolation: positions are multiplied by 1/factor.
        self.rope_scale = 1.0
        if self._str(k("rope.scaling.type"), "none") == "linear":
            self.rope_scale = 1.0 / self._float(k("rope.scaling.factor"), 1.0)
        # YaRN (HF's rule): per pair, a blend of the interpolated (1/factor)
        # and the trained frequency, the blend a linear ramp over the pairs
        # that turn between beta_fast and beta_slow times in the trained
        # context; cos and sin scaled by 0.1 ln(factor) + 1.
        self.yarn = None
        if self._str(k("rope.scaling.type"), "none") == "yarn":
            factor = self._float(k("rope.scaling.factor"), 1.0)
            orig = self._int(k("rope.scaling.original_context_length"),
                             self._int(k("context_length")))
            fast = self._float(k("rope.scaling.yarn_beta_fast"), 32.0)
            slow = self._float(k("rope.scaling.yarn_beta_slow"), 1.0)
            d = self.n_rot

            def corr(beta):
                return d * np.log(orig / (beta * 2 * np.pi)) / (2 * np.log(self.rope_base))
            low, high = corr(fast), corr(slow)
            # rounded out to whole pairs (llama.cpp; HF's truncate true),
            # unless the file says rope.scaling.yarn_truncate false (HF's
            # truncate false, gpt-oss's folders)
            trunc = self._scalar(k("rope.scaling.yarn_truncate"))
            if trunc is None or bool(trunc[0]):
                low, high = np.floor(low), np.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
            extrapolate = 1 - ramp
            inv = self.rope_base ** (-2.0 * np.arange(d // 2) / d)
            self.yarn = (inv / factor * (1 - extrapolate) + inv * extrapolate,
                         (0.1 * np.log(factor) + 1) *
                         self._float(k("rope.scaling.attn_factor"), 1.0))
        self.window = self._int(k("attention.sliding_window"), 0)
        self.swa_period = self._int(k("attention.sliding_window_pattern"), 6) \
            if arch == "gemma3" else 0
        if arch == "gpt-oss":  # even layers local (llama.cpp's set_swa_pattern(2))
            self.swa_period = self._int(k("attention.sliding_window_pattern"), 2)
        self.rope_base_local = self._float(k("rope.freq_base_swa"), 10000.0) \
            if arch == "gemma3" else self.rope_base
        # Gemma 3 27B (62 layers) scales queries by 1/sqrt(dim / n_head)
        self.attn_scale = 1.0 / np.sqrt(self.head_dim)
        if arch == "gemma3" and self.n_layer == 62:
            self.attn_scale = 1.0 / np.sqrt(self.dim // self.n_head)

        self.n_expert = self._int(k("expert_count"), 0) if arch != "qwen2" else 0
        self.n_expert_used = self._int(k("expert_used_count"), 0) if self.n_expert else 0
        self.expert_norm = arch != "qwen2moe"
        # gpt-oss: softmax over the chosen experts' logits, then this factor
        self.expert_scale = self._float(k("expert_weights_scale"), 0.0) \
            if arch == "gpt-oss" else 0.0
        self.tensors = {t.name: t for t in reader.tensors}
        self.tok_embd = self._weight("token_embd.weight")      # [n_vocab][dim]
        self.n_vocab = self.tok_embd.shape[0]
        self.output_norm = self._weight("output_norm.weight")  # [dim]
        if "output.weight" in self.tensors:
            self.output = self._weight("output.weight")        # [n_vocab][dim]
        else:
            self.output = self.tok_embd                         # tied embeddings
        self.rope_freqs = None
        if "rope_freqs.weight" in self.tensors:
            self.rope_freqs = self._weight("rope_freqs.weight")  # [n_rot/2]

        self.layers = []
        for i in range(self.n_layer):
            w = lambda name: self._weight(f"blk.{i}.{name}.weight")
            b = lambda name: self._weight(f"blk.{i}.{name}.bias")
            if self.arch == "gpt-oss":
                self.layers.append({
                    "attn_norm": w("attn_norm"),            # [dim]
                    "wq": w("attn_q"),                      # [n_head*head_dim][dim]
                    "wk": w("attn_k"),                      # [n_kv_head*head_dim][dim]
                    "wv": w("attn_v"),                      # [n_kv_head*head_dim][dim]
                    "bq": b("attn_q"),
                    "bk": b("attn_k"),
                    "bv": b("attn_v"),
                    "wo": w("attn_output"),                 # [dim][n_head*head_dim]
                    "bo": b("attn_output"),                 # [dim]
                    "sinks": w("attn_sinks"),               # [n_head]
                    "ffn_norm": w("post_attention_norm"),   # [dim]: the FFN's input norm
                    "router": w("ffn_gate_inp"),            # [n_expert][dim]
                    "router_b": b("ffn_gate_inp"),          # [n_expert]
                    "exp_gate": w("ffn_gate_exps"),         # [n_expert][eff][dim]
                    "exp_gate_b": b("ffn_gate_exps"),       # [n_expert][eff]
                    "exp_up": w("ffn_up_exps"),             # [n_expert][eff][dim]
                    "exp_up_b": b("ffn_up_exps"),           # [n_expert][eff]
                    "exp_down": w("ffn_down_exps"),         # [n_expert][dim][eff]
                    "exp_down_b": b("ffn_down_exps"),       # [n_expert][dim]
                })
                continue
            self.layers.append({
                "attn_norm": w("attn_norm"),   # [dim]
                "wq": w("attn_q"),             # [n_head*head_dim][dim]
                "wk": w("attn_k"),             # [n_kv_head*head_dim][dim]
                "wv": w("attn_v"),             # [n_kv_head*head_dim][dim]
                "wo": w("attn_output"),        # [dim][n_head*head_dim]
                "ffn_norm": w("ffn_norm"),     # [dim]
            })
            if self.n_expert:
                self.layers[-1].update({
                    "router": w("ffn_gate_inp"),         # [n_expert][dim]
                    "exp_gate": w("ffn_gate_exps"),      # [n_expert][eff][dim]
                    "exp_up": w("ffn_up_exps"),          # [n_expert][eff][dim]
                    "exp_down": w("ffn_down_exps"),      # [n_expert][dim][eff]
                })
                if self.arch == "qwen2moe":
                    self.layers[-1].update({
                        "sh_router": w("ffn_gate_inp_shexp"),  # [dim]
                        "sh_gate": w("ffn_gate_shexp"),        # [sff][dim]
                        "sh_up": w("ffn_up_shexp"),
                        "sh_down": w("ffn_down_shexp"),        # [dim][sff]
                    })
            else:
                self.layers[-1].update({
                    "w_gate": w("ffn_gate"),       # [ffn_dim][dim]
                    "w_up": w("ffn_up"),           # [ffn_dim][dim]
                    "w_down": w("ffn_down"),       # [dim][ffn_dim]
                })
            if self.arch in ("qwen2", "qwen2moe"):
                self.layers[-1].update({
                    "bq": b("attn_q"),         # [n_head*head_dim]
                    "bk": b("attn_k"),         # [n_kv_head*head_dim]
                    "bv": b("attn_v"),         # [n_kv_head*head_dim]
                })
            if self.arch in ("qwen3", "gemma3", "qwen3moe"):
                self.layers[-1].update({
                    "q_norm": w("attn_q_norm"),  # [head_dim]
                    "k_norm": w("attn_k_norm"),  # [head_dim]
                })
            if self.arch == "gemma3":
                self.layers[-1].update({
                    "attn_post_norm": w("post_attention_norm"),  # [dim]
                    "ffn_post_norm": w("post_ffw_norm"),         # [dim]
                })

    # -- metadata helpers ----------------------------------------------------
    def _scalar(self, key):
        field = self.meta.get(key)
        if field is None:
            return None
        return field.parts[field.data[0]]

    def layer_window(self, li):
        """The keys a query of layer li sees (0: all before it)."""
        if self.window <= 0:
            return 0
        if self.swa_period > 0 and li % self.swa_period == self.swa_period - 1:
            return 0
        return self.window

    def _int(self, key, default=None):
        v = self._scalar(key)
        if v is None:
            if default is None:
                raise SystemExit(f"llama_ref.py: metadata key '{key}' missing")
            return default
        return int(v[0])

    def _float(self, key, default):
        v = self._scalar(key)
        return default if v is None else float(v[0])

    def _str(self, key, default=None):
        v = self._scalar(key)
        if v is None:
            if default is None:
                raise SystemExit(f"llama_ref.py: metadata key '{key}' missing")
            return default
        return bytes(v).decode("utf-8")

    def _weight(self, name):
        t = self.tensors.get(name)
        if t is None:
            raise SystemExit(f"llama_ref.py: tensor '{name}' missing")
        kind = t.tensor_type
        if kind == gguf.GGMLQuantizationType.F32:
            data = np.asarray(t.data, dtype=np.float32)
        elif kind == gguf.GGMLQuantizationType.F16:
            data = np.asarray(t.data, dtype=np.float16)
        else:
            # Quantized blocks expanded by gguf's own Python dequantizer: an
            # implementation independent of cairn's (common/quant.c).
            try:
                from gguf.quants import dequantize
                data = dequantize(np.asarray(t.data), kind)
            except (ImportError, NotImplementedError) as e:
                raise SystemExit(f"llama_ref.py: tensor '{name}' has type {kind.name}, "
                                 f"which this gguf package cannot expand ({e})")
        # ne is fastest-first; numpy wants slowest-first.
        shape = tuple(int(n) for n in reversed(t.shape))
        return data.reshape(shape).astype(np.float64)


def rms_norm(x, weight, eps):
    """x: [n][dim] -> x / sqrt(mean(x^2) + eps) * weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x, positions, m, base=None, scale=None):
    """Rotate pairs of the first n_rot dims of each head: adjacent pairs
    (2i, 2i+1) for llama, (i, i + n_rot/2) for NEOX (qwen2).

    x: [n][heads][head_dim], positions: [n]. base, scale: the model's
    unless given (Gemma's local layers)."""
    local = base is not None
    base = m.rope_base if base is None else base
    scale = m.rope_scale if scale is None else scale
    half = m.n_rot // 2
    inv_freq = base ** (-2.0 * np.arange(half) / m.n_rot)          # [half]
    if m.rope_freqs is not None:
        inv_freq = inv_freq / m.rope_freqs[:half]
    mscale = 1.0
    if getattr(m, "yarn", None) is not None and not local:
        inv_freq, mscale = m.yarn
    theta = np.outer(positions * scale, inv_freq)                   # [n][half]
    cos = mscale * np.cos(theta)[:, None, :]                        # [n][1][half]
    sin = mscale * np.sin(theta)[:, None, :]
    out = x.copy()
    if m.neox:
        first, second = slice(0, half), slice(half, m.n_rot)
    else:
        first, second = slice(0, m.n_rot, 2), slice(1, m.n_rot, 2)
    x0 = x[:, :, first]                                             # [n][heads][half]
    x1 = x[:, :, second]
    out[:, :, first] = x0 * cos - x1 * sin
    out[:, :, second] = x0 * sin + x1 * cos
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def swiglu_oai(g, u):
    """gpt-oss's expert activation: the gate clamped above at 7, up to
    [-7, 7], g * sigmoid(1.702 g) * (u + 1)."""
    g = np.minimum(g, 7.0)
    u = np.clip(u, -7.0, 7.0)
    return g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)


def moe_ffn_gptoss(m, layer, h):
    """gpt-oss's FFN of h [n][dim]: top k by biased router logit, softmax
    over those k logits, biased experts with the clamped SwiGLU."""
    out = np.zeros_like(h)
    logits = h @ layer["router"].T + layer["router_b"]              # [n][n_expert]
    for t in range(h.shape[0]):
        # the top k, ties to the lower index (a stable sort of -logits)
        chosen = np.argsort(-logits[t], kind="stable")[:m.n_expert_used]
        w = np.exp(logits[t][chosen] - logits[t][chosen].max())
        w /= w.sum()
        if m.expert_scale != 0.0:
            w = w * m.expert_scale
        for e, we in zip(chosen, w):
            g = layer["exp_gate"][e] @ h[t] + layer["exp_gate_b"][e]
            u = layer["exp_up"][e] @ h[t] + layer["exp_up_b"][e]
            y = layer["exp_down"][e] @ swiglu_oai(g, u) + layer["exp_down_b"][e]
            out[t] += we * y
    return out


def moe_ffn(m, layer, h):
    """The mixture-of-experts FFN of h [n][dim], token by token."""
    if m.arch == "gpt-oss":
        return moe_ffn_gptoss(m, layer, h)
    out = np.zeros_like(h)
    logits = h @ layer["router"].T                                  # [n][n_expert]
    for t in range(h.shape[0]):
        p = np.exp(logits[t] - logits[t].max())
        p /= p.sum()
        # the top k, ties to the lower index (a stable sort of -p)
        chosen = np.argsort(-p, kind="stable")[:m.n_expert_used]
        w = p[chosen]
        if m.expert_norm:
            w = w / w.sum()
        for e, we in zip(chosen, w):
            g = layer["exp_gate"][e] @ h[t]
            u = layer["exp_up"][e] @ h[t]
            out[t] += we * (layer["exp_down"][e] @ (silu(g) * u))
    if "sh_router" in layer:
        gate = 1.0 / (1.0 + np.exp(-(h @ layer["sh_router"])))       # [n]
        sh = silu(h @ layer["sh_gate"].T) * (h @ layer["sh_up"].T)
        out += gate[:, None] * (sh @ layer["sh_down"].T)
    return out


def forward(m, tokens, states=None):
    """Full causal pass over `tokens`.

    Returns (logits [n][n_vocab], hidden [n][dim]) in float64; hidden is the
    state after the output norm (what the output projection multiplies).
    `states`, a dict, receives the residual stream entering each layer l
    (states[l], [n][dim]; states[n_layer] leaving the last, before the norm)."""
    n = len(tokens)
    positions = np.arange(n, dtype=np.float64)
    x = m.tok_embd[np.asarray(tokens)]                       # [n][dim]
    if m.arch == "gemma3":
        x = x * np.sqrt(m.dim)
    group = m.n_head // m.n_kv_head                          # query heads per KV head
    scale = m.attn_scale
    causal = np.triu(np.ones((n, n), dtype=bool), k=1)       # True = future, masked

    for li, layer in enumerate(m.layers):
        if states is not None:
            states[li] = x.copy()
        h = rms_norm(x, layer["attn_norm"], m.rms_eps)
        q, k, v = h @ layer["wq"].T, h @ layer["wk"].T, h @ layer["wv"].T
        if "bq" in layer:
            q, k, v = q + layer["bq"], k + layer["bk"], v + layer["bv"]
        q = q.reshape(n, m.n_head, m.head_dim)
        k = k.reshape(n, m.n_kv_head, m.head_dim)
        v = v.reshape(n, m.n_kv_head, m.head_dim)
        if "q_norm" in layer:  # per head, over head_dim
            q = rms_norm(q, layer["q_norm"], m.rms_eps)
            k = rms_norm(k, layer["k_norm"], m.rms_eps)
        window = m.layer_window(li)
        hidden_keys = causal
        if window > 0:  # and the keys before the window (j <= i - W)
            hidden_keys = causal | np.tril(np.ones((n, n), dtype=bool), k=-window)
        # Gemma's local layers rotate with a base of their own, unscaled;
        # gpt-oss's like its global ones
        local = window > 0 and m.swa_period > 0 and m.arch == "gemma3"
        q = rope(q, positions, m, m.rope_base_local if local else None, 1.0 if local else None)
        k = rope(k, positions, m, m.rope_base_local if local else None, 1.0 if local else None)

        attn = np.empty((n, m.n_head, m.head_dim))
        for head in range(m.n_head):
            kv = head // group
            scores = (q[:, head, :] @ k[:, kv, :].T) * scale  # [n_q][n_k]
            scores[hidden_keys] = -np.inf
            if "sinks" in layer:  # one more logit, in the denominator only
                sink = layer["sinks"][head]
                top = np.maximum(scores.max(axis=-1, keepdims=True), sink)
                p = np.exp(scores - top)
                p /= p.sum(axis=-1, keepdims=True) + np.exp(sink - top)
                attn[:, head, :] = p @ v[:, kv, :]
                continue
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            attn[:, head, :] = p @ v[:, kv, :]
        a = attn.reshape(n, m.n_head * m.head_dim) @ layer["wo"].T
        if "bo" in layer:
            a = a + layer["bo"]
        if "attn_post_norm" in layer:
            a = rms_norm(a, layer["attn_post_norm"], m.rms_eps)
        x = x + a

        h = rms_norm(x, layer["ffn_norm"], m.rms_eps)
        if m.n_expert:
            x = x + moe_ffn(m, layer, h)
            continue
        gate = h @ layer["w_gate"].T
        gate = gelu_tanh(gate) if m.arch == "gemma3" else silu(gate)
        ffn = gate * (h @ layer["w_up"].T)                      # [n][ffn_dim]
        f = ffn @ layer["w_down"].T
        if "ffn_post_norm" in layer:
            f = rms_norm(f, layer["ffn_post_norm"], m.rms_eps)
        x = x + f

    if states is not None:
        states[m.n_layer] = x.copy()
    hidden = rms_norm(x, m.output_norm, m.rms_eps)
    logits = hidden @ m.output.T
    return logits, hidden


def main():
    ap = argparse.ArgumentParser(description="numpy reference of the Llama forward pass")
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write float32 logits [n_tokens][n_vocab] here")
    ap.add_argument("--hidden", help="write float32 hidden states [n_tokens][dim] here")
    ap.add_argument("--layer-states", metavar="L,L,...",
                    help="with --states: the layers whose input state to write (0 = the "
                    "embeddings, n_layer = after the last layer, before the norm)")
    ap.add_argument("--states", help="write float32 [n_tokens][len(layers)][dim] here")
    ap.add_argument("--greedy", type=int, metavar="N",
                    help="greedily generate N tokens and print their ids")
    ap.add_argument("--expect", help="with --greedy: space- or comma-separated ids the "
                    "generation must equal (exit status 1 otherwise)")
    args = ap.parse_args()

    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    m = Model(args.model)
    if not tokens or min(tokens) < 0 or max(tokens) >= m.n_vocab:
        raise SystemExit(f"llama_ref.py: tokens must be in [0, {m.n_vocab})")

    if args.states:
        want = [int(x) for x in args.layer_states.split(",")]
        states = {}
        forward(m, tokens, states)
        np.stack([states[l] for l in want], axis=1).astype("<f4").tofile(args.states)
    if args.out or args.hidden:
        logits, hidden = forward(m, tokens)
        if args.out:
            logits.astype("<f4").tofile(args.out)
        if args.hidden:
            hidden.astype("<f4").tofile(args.hidden)

    if args.greedy:
        seq = list(tokens)
        generated = []
        for _ in range(args.greedy):
            logits, _ = forward(m, seq)
            # np.argmax returns the first maximum: ties go to the lowest id.
            nxt = int(np.argmax(logits[-1]))
            generated.append(nxt)
            seq.append(nxt)
        print(" ".join(str(t) for t in generated))
        if args.expect is not None:
            want = [int(t) for t in args.expect.replace(",", " ").split()]
            if generated != want:
                sys.stderr.write(f"llama_ref.py: greedy mismatch\n  want {want}\n"
                                 f"  got  {generated}\n")
                sys.exit(1)


if __name__ == "__main__":
    main()
