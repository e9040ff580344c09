/*
 * kernels/backend.h — the compute backend interface.
 *
 * A backend is a table of function pointers plus an opaque context, in the
 * manner of ggml-backend: the engine is written once against this table and
 * runs on whichever device implements it. The CPU backend (kernels/cpu/) is
 * the reference and always exists; the CUDA backend (kernels/cuda/) must
 * produce the same logits within a stated tolerance. Most slots are
 * required; a few are optional, with a fallback behind a wrapper (see
 * "Required and optional slots" at cairn_backend_iface).
 *
 * Memory model
 * ------------
 *   - "Backend memory" is memory the backend allocated with alloc(): host RAM
 *     for the CPU backend, device memory for CUDA. Every tensor argument of an
 *     op (float *, const void *weights, the KV pool) is backend memory.
 *   - Small index arrays (token ids, positions, KV slots, page tables, masks)
 *     are host memory: they are a few KB per step and a device backend stages
 *     them itself. This keeps the engine free of device-side bookkeeping.
 *   - Ops may run asynchronously on a device; download() and
 *     cairn_backend_synchronize() are the points where results are
 *     guaranteed visible to the host. The CPU backend runs every op to
 *     completion before returning.
 *
 * Shapes
 * ------
 * Activations are row-major float32: a batch of T tokens of width D is a
 * [T][D] array. Weights are [n_out][n_in] in GGUF order (each output row is
 * contiguous, quantized in cairn_type block layout), so y = x · Wᵀ.
 *
 * Paged KV
 * --------
 * The KV cache is a pool of fixed-size pages. A page holds `page_size`
 * consecutive tokens of one sequence, for every layer, K and V:
 *
 *     page p:  [layer 0: K[page_size][n_kv_head][head_dim] V[...]] [layer 1 ...] ...
 *
 * so a page is one contiguous block of kv_layout.page_bytes bytes — the unit
 * that is shared, evicted, copied between tiers and written to disk. A
 * sequence's KV is addressed through its page table: token index j lives in
 * page pages[j / page_size] at row j % page_size. A "slot" is
 * page * page_size + row.
 *
 * Threading: a backend is used by one thread at a time (the engine thread);
 * the backend may use worker threads internally. Ops return CAIRN_OK or a
 * negative status (CAIRN_EINVAL for a bad argument, CAIRN_EBACKEND for a
 * device failure); they never abort on bad input.
 *
 * Edge rules every backend follows:
 *   - a size or count of 0 passed to an op is CAIRN_EINVAL; a copy of 0
 *     bytes is a no-op;
 *   - negative token ids, slots and page ids are CAIRN_EINVAL; ids beyond
 *     the pool or table cannot be checked and are the caller's invariant;
 *   - with a mask, q_index may be NULL; without one every q_index must be in
 *     [0, n_kv);
 *   - a query row that can see no KV entry gets zeros; a softmax row of all
 *     -inf becomes zeros;
 *   - attention may write `out` over `q`; matmul's y must not alias x;
 *   - slots within one kv_store call are distinct.
 */
#ifndef CAIRN_KERNELS_BACKEND_H
#define CAIRN_KERNELS_BACKEND_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Geometry of one KV page. Built by the engine from model hyper-parameters
 * (cairn_kv_layout_init) and shared by the engine, the backend and the store. */
typedef struct {
    int n_layer;       /* layers stored in a page (the model's, +1 for an EAGLE head) */
    int n_kv_head;     /* KV heads per layer                                   */
    int head_dim;      /* elements per head                                    */
    int page_size;     /* tokens per page                                      */
    cairn_type dtype;  /* F32, F16, BF16, Q8_0 or Q4_0 (see "KV types" below)   */
    int rotation;      /* 0, or R: K and V rows are stored rotated, each run of R
                          consecutive elements of a head by the orthonormal
                          Walsh-Hadamard matrix H_R (R a power of two dividing
                          head_dim); see "KV types"                             */
    size_t row_bytes;  /* bytes of one token's K (or V) in one layer           */
    size_t page_bytes; /* bytes of a whole page                                */
    size_t layer_base; /* byte offset of layer 0 inside a page: 0, except for a
                          second model whose layers follow the target's in the
                          same pages (a draft model's, an EAGLE head's)         */
} cairn_kv_layout;

/* KV types
 * --------
 * A K or V row (one token, one layer: n_kv_head heads of head_dim) is stored
 * as `dtype`:
 *
 *   F32, F16, BF16   head_dim plain elements per head
 *   Q8_0, Q4_0       head_dim / 32 blocks per head, in the block layouts of
 *                    common/common.h (a half scale, then 32 int8 or 32
 *                    packed 4-bit values); head_dim must be a multiple of 32
 *
 * so row_bytes = n_kv_head * head_dim / block_elems * block_bytes, and a
 * head's blocks never straddle another head's. The quantized types store
 * each head rotated (rotation = R > 0): x' = H_R x on every run of R
 * elements, H_R the orthonormal Walsh-Hadamard matrix (H_R = H_Rᵀ =
 * H_R⁻¹). A rotation spreads an outlier channel over R elements, so one
 * large value no longer sets the scale of its block and flattens the rest
 * to zero. Attention undoes it for free: q·k = (H q)·(H k), so the query is
 * rotated once per row and head (it stays in float, never quantized), and
 * Σ p_j H v_j = H (Σ p_j v_j), so the output is rotated back once.
 * cairn_kv_layout_init picks R = the largest power of two dividing head_dim
 * (64 for head_dim 64, 32 for 96) for Q8_0 and Q4_0, and 0 for the others.
 *
 * The dtype and rotation are part of the page namespace
 * (store/namespace.c), so pages of different formats never mix in any
 * tier or on disk. */

/* Fill *out from the four shape numbers. CAIRN_EINVAL when a number is not
 * positive, dtype is not one of the KV types above, or a quantized dtype
 * meets a head_dim that is not a multiple of 32. */
int cairn_kv_layout_init(cairn_kv_layout *out, int n_layer, int n_kv_head, int head_dim,
                         int page_size, cairn_type dtype);

/* Nonzero when `dtype` is a KV type (above). */
int cairn_kv_type_supported(cairn_type dtype);

/* Bytes of one head's K (or V) row of head_dim elements stored as dtype;
 * 0 when that cannot be stored (not a KV type, or head_dim not a multiple of
 * the type's block). */
size_t cairn_kv_head_bytes(cairn_type dtype, int head_dim);

/* The KV type named by `name` ("f32", "f16", "bf16", "q8_0", "q4_0", any
 * case): CAIRN_OK and *out, else CAIRN_EINVAL. cairn_kv_type_name is the
 * inverse ("?" for a type that is not a KV type). */
int cairn_kv_type_parse(const char *name, cairn_type *out);
const char *cairn_kv_type_name(cairn_type dtype);

/* Make room for `part` (a layout of its own, layer_base 0) after everything
 * `page` holds: *placed = part at layer_base = page's old page_bytes, and
 * page_bytes of both = the grown page. Pages of `page` and of every part
 * placed before keep their offsets; their page_bytes must be updated to the
 * final page's by the caller (cairn_spec_kv_layout does). CAIRN_EINVAL when
 * the dtypes or page sizes differ. */
int cairn_kv_layout_place(cairn_kv_layout *page, const cairn_kv_layout *part,
                          cairn_kv_layout *placed);

/* Byte offset, inside a page, of K (kv = 0) or V (kv = 1) of `layer` at
 * page row `row`. */
static inline size_t cairn_kv_offset(const cairn_kv_layout *L, int layer, int kv, int row)
{
    return L->layer_base + ((size_t)layer * 2 + (size_t)kv) * (size_t)L->page_size * L->row_bytes +
           (size_t)row * L->row_bytes;
}

/* One sequence's share of an attention call. */
typedef struct {
    int q_start;            /* first row of this sequence in q / out            */
    int n_q;                /* number of query rows                             */
    int n_kv;               /* KV entries visible to this sequence: indices
                               0 .. n_kv-1 of its page table                    */
    const int32_t *q_index; /* [n_q] KV index of each query token; without a
                               mask, query i sees KV indices 0 .. q_index[i]
                               (causal). Equals the position in plain decoding. */
    const int32_t *pages;   /* page table, ceil(n_kv / page_size) page ids       */
    const uint8_t *mask;    /* optional [n_q][n_kv], 1 = visible (EAGLE tree).
                               When set it replaces the causal rule.            */
} cairn_attn_seq;

/* Sliding windows. With window = W > 0 a query whose KV index is i sees
 * only keys j with i - W < j (besides the causal or mask rule), i.e. its
 * own key and the W - 1 before it: a sliding-window layer (Mistral,
 * Gemma's local layers). The window needs every row's index, so q_index is
 * required then, with a mask too. */

typedef struct {
    float *out;               /* [n_rows][n_head * head_dim]                     */
    const float *q;           /* [n_rows][n_head * head_dim], RoPE applied        */
    const void *kv_pool;      /* base of the page pool (backend memory)           */
    const cairn_kv_layout *kv;
    int layer;
    int n_head;               /* query heads; n_head % kv->n_kv_head == 0 (GQA)  */
    float scale;              /* usually 1/sqrt(head_dim)                         */
    int n_seqs;
    const cairn_attn_seq *seqs; /* host array [n_seqs]                            */
    int window;               /* 0: every key the rule allows; > 0: sliding
                                 window of that many keys (above)               */
    const float *sinks;       /* optional [n_head] F32, backend memory: a logit
                                 per query head that joins the softmax's
                                 denominator and adds no value (gpt-oss's
                                 attention sinks), i.e.
                                   out = Σ_j e^{s_j} v_j / (e^{sink} + Σ_j e^{s_j});
                                 NULL: none                                     */
} cairn_attn_args;

/* Argument checks every backend makes, in one place. A KV layout that is
 * internally consistent (what cairn_kv_layout_init builds, or a part of a
 * larger page placed at layer_base by cairn_kv_layout_place): 1, else 0. */
int cairn_kv_layout_valid(const cairn_kv_layout *L);
/* The host-side checks of an attention call: pointers present, a valid
 * layout and layer, n_head a multiple of n_kv_head, a finite scale, and for
 * every sequence rows, causal indices inside its KV and a page id for every
 * page it uses. CAIRN_EINVAL otherwise; *max_kv (may be NULL) receives the
 * longest sequence's n_kv. */
int cairn_attn_args_check(const cairn_attn_args *a, int *max_kv);
/* The host-side checks of kv_store: pointers present, a valid layout and
 * layer, T > 0 and no negative slot. CAIRN_EINVAL otherwise. */
int cairn_kv_store_args_check(const void *kv_pool, const cairn_kv_layout *L, int layer,
                              const float *k, const float *v, const int32_t *slots, int T);
/* The host-side checks of add_rows_scaled: pointers present, n and D
 * positive, no negative row. CAIRN_EINVAL otherwise. */
int cairn_add_rows_args_check(const float *y, const float *src, const int32_t *rows,
                              const float *w, int n, int D);

typedef enum { CAIRN_ROPE_NORMAL = 0, CAIRN_ROPE_NEOX = 2 } cairn_rope_mode;

typedef struct {
    int n_rot;                 /* rotated dims per head (<= head_dim, even)      */
    cairn_rope_mode mode;      /* NORMAL rotates pairs (2i, 2i+1); NEOX rotates
                                  (i, i + n_rot/2)                               */
    float freq_base;           /* theta, e.g. 10000                              */
    float freq_scale;          /* linear position scaling, 1 = none              */
    const float *freq_factors; /* optional [n_rot/2] divisors of each frequency
                                  (Llama 3 rope_freqs), backend memory          */
} cairn_rope_params;

/* The checks of a rope call: pointers present, positive sizes, an even
 * n_rot <= head_dim, a known mode, finite positive base and scale.
 * CAIRN_EINVAL otherwise. */
int cairn_rope_args_check(const float *x, int T, int n_heads, int head_dim, const int32_t *pos,
                          const cairn_rope_params *p);

/* Weight layouts
 * --------------
 * matmul and get_rows take weights in GGUF's row layout. A backend may also
 * keep a weight matrix in a layout of its own that its kernels stream
 * faster (the CPU backend interleaves groups of 16 rows; kernels/cpu/
 * cpu_impl.h, "Packed weights"). Such a weight is uploaded through
 * cairn_backend_upload_weight and afterwards passed to matmul and get_rows
 * with the type cairn_backend_weight_layout named, which carries
 * CAIRN_TYPE_PACKED when the layout is the backend's own:
 *
 *     cairn_backend_weight_layout(be, Q4_0, n_in, n_out, &bytes, &as);
 *     alloc(bytes) -> W;  cairn_backend_upload_weight(be, W, host, Q4_0, n_in, n_out);
 *     matmul(be, y, W, as, x, T, n_in, n_out);   get_rows(be, out, W, as, n_in, ids, T);
 *
 * A packed weight is a whole matrix: it is only ever passed whole (never a
 * range of its rows), with the n_in it was packed for, and only to the
 * backend that packed it. Packing keeps every value exactly, so results
 * equal those of the GGUF layout. */
#define CAIRN_TYPE_PACKED 0x1000

/* One matrix of a matmul_multi call: y[T][n_out] = x[T][n_in] · Wᵀ, W of
 * type `wtype` (GGUF layout or the backend's own, as for matmul). */
typedef struct {
    float *y;
    const void *W;
    cairn_type wtype;
    int n_out;
} cairn_matmul_part;

typedef struct cairn_backend cairn_backend;

/* ---- sampling on the device (the sample_rows slot) ----------------------
 * One row of logits to one token, with the CPU sampler's semantics
 * (model/sampler.c says them in full; model/sample_batch.c fills these rows
 * from cairn_sampler state). Plain data: every pointer is host memory that
 * only has to live through the call. */
#define CAIRN_SAMPLE_MAX_LOGPROBS 20

typedef struct {
    int32_t token; /* in [0, n_vocab), each token at most once per row */
    int32_t count; /* > 0: occurrences in the sampler's penalty window */
    float bias;    /* the token's logit bias (0 without one): the penalty acts
                      on the biased value, as on the CPU */
} cairn_sample_penalty;

typedef struct {
    int32_t token; /* in [0, n_vocab); a token listed twice carries the same
                      bias both times (the sampler's "last wins" resolved) */
    float bias;
} cairn_sample_bias;

typedef struct {
    int32_t token; /* -1 past a vocabulary smaller than n_logprobs */
    float logprob;
} cairn_sample_logprob;

typedef struct {
    int row;           /* the row of `logits` this draws from, >= 0        */
    /* the sampler's settings (cairn_sampling_params, already validated) */
    float temperature; /* <= 0: greedy (argmax, ties to the lowest id)    */
    int top_k;         /* <= 0 or >= n_vocab: off                          */
    float top_p;       /* (0, 1]; 1: off                                   */
    float min_p;       /* [0, 1]; 0: off                                   */
    float repeat_penalty, frequency_penalty, presence_penalty;
    /* penalties[n_penalties]: applied only when n_penalties > 0, i.e. the
     * sampler has penalties in effect (cairn_sampling_has_penalties) */
    int n_penalties;
    const cairn_sample_penalty *penalties;
    int n_bias;
    const cairn_sample_bias *bias;
    /* Optional grammar mask, n_vocab bits (bit t = word t/32, bit t%32),
     * 1 = allowed. A disallowed token's logit is -inf BEFORE anything else,
     * logprobs included: what masking the row on the host and then calling
     * the sampler does. NULL: every token allowed. */
    const uint32_t *allowed;
    int want_logprobs; /* nonzero: the chosen token's logprob, lp[0]      */
    int n_logprobs;    /* 0 .. CAIRN_SAMPLE_MAX_LOGPROBS best alternatives  */
    /* The draw, uniform in [0, 1), from the row's own generator (the host
     * draws it exactly as cairn_sampler_sample would). Unused when greedy. */
    double u;
} cairn_sample_row;

/* The table a backend implements.
 *
 * Required and optional slots
 * ---------------------------
 * Every slot must be set except those marked OPTIONAL, which a new
 * backend may leave NULL. Code outside the backend never calls an optional
 * slot directly but its wrapper (below the table: cairn_backend_supports_type,
 * cairn_backend_synchronize, cairn_backend_copy), which runs the slot when
 * it is set and otherwise the fallback, written once in kernels/backend.c:
 *
 *   slot           fallback when NULL            may be NULL when
 *   supports_type  the types whose traits say    get_rows and matmul take
 *                  `compute` (common/common.h)   exactly those types
 *   synchronize    CAIRN_OK, nothing waited for  every op has finished when
 *                                                it returns (as on the CPU)
 *   copy           download() a chunk of src     always (it is correct, only
 *                  into a host buffer, upload()  slower than a copy on the
 *                  it to dst, chunk by chunk;    device)
 *                  overlapping ranges are
 *                  copied like memmove
 *   host_alloc,    64-byte aligned calloc/free   host memory is what the
 *   host_free                                    device copies from anyway
 *   transfer       upload() or download() at     every op has finished when
 *                  once; the fence has passed    it returns (as on the CPU)
 *                  when it returns
 *   fence_wait     CAIRN_OK (every fence the     transfer is NULL too
 *                  fallback hands out has passed)
 *   memory_info    CAIRN_EUNSUPPORTED            memory is not the backend's
 *                                                to count (the CPU's is RAM)
 *   graph_begin,   CAIRN_EUNSUPPORTED (the ops   launching ops costs nothing
 *   graph_end,     run as they are issued)       worth saving (the CPU)
 *   graph_abandon
 *   matmul_multi   one matmul call per part     always (the same results)
 *   matmul_        0: every row of a matmul is   a row's result never depends
 *   invariant_rows independent of T              on T or the other rows (CPU)
 *   weight_layout, GGUF's layout: the row bytes   the backend's kernels read
 *   upload_weight  times n_out, the type as is,  GGUF's layout as fast as any
 *                  and upload()                  other
 *   sample_rows    download the rows and run     always (the same tokens,
 *                  the CPU sampler: written in   only a [rows][n_vocab]
 *                  model/ (cairn_sample_batch_   download slower)
 *                  run), the one layer that
 *                  knows the sampler
 *
 * Required: name, destroy, alloc, free, upload, download, get_rows, matmul,
 * rmsnorm, rope, swiglu, geglu, scale, add, add_bias, softmax, kv_store,
 * attention.
 *
 * Transfers and fences
 * --------------------
 * The store moves whole KV pages between tier 0 (backend memory) and tier 1
 * (host RAM) while the model computes. On a device these copies run on a
 * queue of their own, beside the compute queue:
 *
 *     compute  ──op──op──┬──op──op────────────────┬──op (reads the page)──
 *                        │ (ordered after)        │ (waits for)
 *     copy     ──────────┴──page D2H──page H2D────┴──────────────────────
 *                               fence 7   fence 8
 *
 *   - a transfer starts after every op issued before it, so the K/V rows an
 *     op wrote are in the page it copies;
 *   - a transfer into backend memory comes before every op issued after it
 *     (the compute queue waits on the copy queue, the host does not);
 *   - the host learns that a transfer is over from its fence: until
 *     fence_wait says so, its host memory must not be read, written or
 *     reused, and its backend source must not be written (the store keeps
 *     such pages and slots aside, draining, until their fence passes);
 *   - transfers are carried out in the order they were issued, so fence n
 *     passed means every fence below n passed too.
 * Host memory of a transfer should come from host_alloc (page-locked on
 * CUDA, so the copy engine reads it directly); any host memory is correct. */
typedef struct {
    const char *name;

    void (*destroy)(cairn_backend *be);

    /* OPTIONAL. Nonzero when get_rows and matmul take tables/weights of
     * type `t` (the model loader refuses a model with any other weight
     * type). Must not fail or touch the device. */
    int (*supports_type)(const cairn_backend *be, cairn_type t);

    /* OPTIONAL (both or neither; see "Weight layouts"). weight_layout: the
     * bytes of backend memory a matmul weight [n_out][n_in] of `type` takes
     * in the layout this backend reads best, and *as, the type matmul and
     * get_rows then take it as (type itself, or type | CAIRN_TYPE_PACKED);
     * CAIRN_EINVAL for a type it does not support or a shape that is not a
     * whole number of blocks. upload_weight: write the host GGUF-layout
     * matrix at host_src into dst (alloc'ed with those bytes) in that
     * layout; the host memory may be reused when it returns. */
    int (*weight_layout)(const cairn_backend *be, cairn_type type, int n_in, int n_out,
                         size_t *bytes, cairn_type *as);
    int (*upload_weight)(cairn_backend *be, void *dst, const void *host_src, cairn_type type,
                         int n_in, int n_out);

    /* Memory. alloc returns zeroed memory aligned to at least 64 bytes. */
    int (*alloc)(cairn_backend *be, size_t bytes, void **out);
    void (*free)(cairn_backend *be, void *ptr);
    int (*upload)(cairn_backend *be, void *dst, const void *host_src, size_t bytes);
    int (*download)(cairn_backend *be, void *host_dst, const void *src, size_t bytes);
    /* OPTIONAL. Backend memory to backend memory, ordered after the ops
     * already issued. NULL pointers are CAIRN_EINVAL; 0 bytes is a no-op.
     * No overlap unless dst == src: CUDA's returns CAIRN_EINVAL on one. */
    int (*copy)(cairn_backend *be, void *dst, const void *src, size_t bytes);
    /* OPTIONAL. Wait until every op issued so far has finished. */
    int (*synchronize)(cairn_backend *be);

    /* out[T][D] = table[ids[t]][:], table rows of `type` (host ids). */
    int (*get_rows)(cairn_backend *be, float *out, const void *table, cairn_type type,
                    int D, const int32_t *ids, int T);

    /* y[T][n_out] = x[T][n_in] · W[n_out][n_in]ᵀ, W of type `wtype`. */
    int (*matmul)(cairn_backend *be, float *y, const void *W, cairn_type wtype,
                  const float *x, int T, int n_in, int n_out);

    /* OPTIONAL. y_i = x · W_iᵀ for n matrices that read the same x[T][n_in]
     * (a layer's q, k and v; gate and up): one pass that prepares x once
     * and shares the rows of all of them among the backend's workers.
     * Exactly the results of n matmul calls; no y_i may alias x or another
     * y_j. */
    int (*matmul_multi)(cairn_backend *be, const float *x, int T, int n_in, int n,
                        const cairn_matmul_part *parts);

    /* OPTIONAL. How far a row of matmul's result is independent of the
     * other rows: the largest T for which every row of y comes out the
     * same bits whatever the other T - 1 rows hold and whatever T is (up
     * to that bound); 0 when that holds for any T; -1 when it holds for no
     * T (a library kernel chosen per shape). Must not fail or touch the
     * device. The model keeps the rows that must not depend on their
     * batch (decode and verification rows) in calls of at most this many
     * rows ("Batch invariance" below). */
    int (*matmul_invariant_rows)(const cairn_backend *be, cairn_type wtype);

    /* out[T][D] = x / sqrt(mean(x²) + eps) * w[D]. out may equal x. */
    int (*rmsnorm)(cairn_backend *be, float *out, const float *x, const float *w,
                   int T, int D, float eps);

    /* Rotate x[T][n_heads][head_dim] in place; pos[T] on the host. */
    int (*rope)(cairn_backend *be, float *x, int T, int n_heads, int head_dim,
                const int32_t *pos, const cairn_rope_params *p);

    /* out[n] = silu(gate[n]) * up[n]. out may equal gate. */
    int (*swiglu)(cairn_backend *be, float *out, const float *gate, const float *up, size_t n);

    /* out[n] = gelu(gate[n]) * up[n], GELU in its tanh form
     * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))) (Gemma's GeGLU). out may
     * equal gate. */
    int (*geglu)(cairn_backend *be, float *out, const float *gate, const float *up, size_t n);

    /* OPTIONAL (gpt-oss's experts; a model that needs it is refused at load
     * without it). out[n] = g * sigmoid(alpha g) * (u + 1) with the gate
     * clamped from above, g = min(gate, limit), and the linear half both
     * ways, u = clamp(up, -limit, limit). out may equal gate. */
    int (*swiglu_clamped)(cairn_backend *be, float *out, const float *gate, const float *up,
                          size_t n, float alpha, float limit);

    /* x[n] *= s (Gemma's embedding scale). */
    int (*scale)(cairn_backend *be, float *x, float s, size_t n);

    /* out[t][j] = x[t][idx[j]] for T rows of n: the input of a matmul whose
     * weight columns were reordered at load (GPTQ's act-order). idx[n] is
     * backend memory (uploaded with the weights, as constant as they are),
     * every entry in [0, n); out must not overlap x. */
    int (*gather_cols)(cairn_backend *be, float *out, const float *x, const int32_t *idx, int T,
                       int n);

    /* y[n] = a[n] + b[n]. y may equal a. */
    int (*add)(cairn_backend *be, float *y, const float *a, const float *b, size_t n);

    /* x[T][n] += bias[n] for every row (Qwen2's q/k/v projection biases). */
    int (*add_bias)(cairn_backend *be, float *x, const float *bias, int T, int n);

    /* y[rows[i]][D] += w[i] * src[i][D] for i < n; rows and w are host
     * arrays, the rows distinct and >= 0. A mixture-of-experts layer adds
     * each expert's output, times its router weight, into the rows of the
     * tokens that chose it. */
    int (*add_rows_scaled)(cairn_backend *be, float *y, const float *src, const int32_t *rows,
                           const float *w, int n, int D);

    /* Softmax over each of the T rows of x[T][n], in place. */
    int (*softmax)(cairn_backend *be, float *x, int T, int n);

    /* Write K and V rows of T new tokens of `layer` into the pool at
     * slots[T] (host). k, v: [T][n_kv_head * head_dim] floats, rotated and
     * converted to the layout's dtype ("KV types"; quantized blocks as
     * common/quant.c quantizes them, so every backend stores the same
     * bytes up to float rounding of the rotation). */
    int (*kv_store)(cairn_backend *be, void *kv_pool, const cairn_kv_layout *L, int layer,
                    const float *k, const float *v, const int32_t *slots, int T);

    /* Scaled dot-product attention of each query row over its sequence's
     * paged KV, grouped-query: query head h reads KV head h / (n_head / n_kv_head). */
    int (*attention)(cairn_backend *be, const cairn_attn_args *args);

    /* OPTIONAL. Host memory for transfers, zeroed, 64-byte aligned: page-
     * locked where the device can copy it without staging. Freed with
     * host_free (NULL is a no-op). */
    int (*host_alloc)(cairn_backend *be, size_t bytes, void **out);
    void (*host_free)(cairn_backend *be, void *ptr);

    /* OPTIONAL. Start copying `bytes` between backend memory and host memory
     * on the copy queue (see "Transfers and fences"): to_host != 0 copies
     * backend src to host dst, else host src to backend dst. *fence receives
     * a number that fence_wait understands; 0 means already passed. */
    int (*transfer)(cairn_backend *be, void *dst, const void *src, size_t bytes, int to_host,
                    uint64_t *fence);
    /* OPTIONAL. block != 0: wait until `fence` has passed, then CAIRN_OK.
     * block == 0: CAIRN_OK when it has passed, CAIRN_EBUSY when not yet.
     * CAIRN_EBACKEND when the copy failed (the data is not there). */
    int (*fence_wait)(cairn_backend *be, uint64_t fence, int block);

    /* OPTIONAL. Free and total bytes of backend memory now. */
    int (*memory_info)(cairn_backend *be, size_t *free_bytes, size_t *total_bytes);

    /* OPTIONAL (see "Step graphs" below the table). graph_begin: CAIRN_OK
     * when the ops issued from now on are recorded, not run, until
     * graph_end; anything else means they run as usual. graph_end: run what
     * was recorded, as one launch (CAIRN_OK), or CAIRN_EBUSY when the
     * recording could not be used — then NONE of those ops has run, and the
     * caller issues them again without a graph. graph_abandon (set with
     * the other two): an op failed while recording; drop the recording,
     * running none of it: CAIRN_OK when the recording itself was intact
     * (the op failed on its own, and running it again would fail again),
     * CAIRN_EBUSY when it had already been broken (the failure may come
     * from recording, as graph_end's CAIRN_EBUSY: issue the ops again
     * without a graph). */
    int (*graph_begin)(cairn_backend *be, uint64_t key);
    int (*graph_end)(cairn_backend *be);
    int (*graph_abandon)(cairn_backend *be);

    /* OPTIONAL. One token for each of rows[0 .. n_rows), row i drawn from
     * row rows[i].row of logits [..][n_vocab] (backend memory, e.g. what
     * cairn_model_forward_keep leaves there; a row may be drawn from twice),
     * drawn as the CPU sampler draws from the same row with the same
     * settings and draw u (cairn_sample_row): bias, penalties, the grammar
     * mask, NaN as -inf, then greedy, or top-k, top-p, min-p, temperature
     * and the draw over the candidates in the CPU's cumulative order. Only
     * the tokens and the logprobs asked for come back to the host:
     *   tokens  host [n_rows]: the token, or -1 for a row the CPU sampler
     *           refuses (no finite maximum after the mask: all NaN/-inf, or
     *           any +inf);
     *   lp      optional host [n_rows][1 + CAIRN_SAMPLE_MAX_LOGPROBS]: for a
     *           row that asks, [0] the chosen token's logprob and [1 ..
     *           n_logprobs] the best tokens of the raw (masked) row, best
     *           first (ties to the lower id), as log-softmax of that row.
     * Decisions equal the CPU's except where float rounding of a sum puts
     * u or a top-p cut-off on the other side of a boundary (the backend
     * states its tolerance). Returns when the results are on the host. */
    int (*sample_rows)(cairn_backend *be, const float *logits, int n_rows, int n_vocab,
                       const cairn_sample_row *rows, int32_t *tokens, cairn_sample_logprob *lp);
} cairn_backend_iface;

/* Step graphs
 * -----------
 * A device launches each op separately, and between two launches it idles.
 * A caller that issues the same kind of work over and over (a decode step:
 * the same ops for the same batch size, only positions and page tables
 * change) may bracket it: graph_begin(key) ... ops ... graph_end. The ops
 * in between may only be ops of the table's compute part — no upload,
 * download, alloc, free, synchronize or transfer — and must not depend on
 * each other's results on the host. Results are exactly those of running
 * the ops one by one; `key` (the caller's, e.g. the batch size) only says
 * which earlier recording is worth updating instead of making anew. */

/* Batch invariance
 * ----------------
 * A request's tokens must not depend on what else shares its step. The
 * scheduler puts decode rows, verification rows and prefill chunks in one
 * forward, so a matmul's T is the whole step's. A backend whose matmul
 * picks its kernel by T (CUDA: a GEMV up to 64 rows, a library GEMM above)
 * says up to which T a row is on its own (matmul_invariant_rows); the
 * model then stages the rows that must not move (single-token and
 * verification sequences) first and multiplies them in calls of at most
 * that many rows, the prefill rows after them in one call:
 *
 *     rows   [ decode, verify: exact ........ | prefill chunks ........ ]
 *     calls  [ <= L rows ][ <= L rows ][ ... ][ one call, any kernel    ]
 *
 * so a decode row's logits are the bits it gets alone. */

struct cairn_backend {
    const cairn_backend_iface *iface;
    void *ctx; /* owned by the backend */
};

/* ---- backends ---------------------------------------------------------- */

/* The CPU backend with `n_threads` workers (0 = one per online core). The
 * worker pool is created once here and reused by every op. The caller owns
 * the result and releases it with cairn_backend_destroy(). */
int cairn_backend_cpu_create(int n_threads, cairn_backend **out);

/* Number of threads the CPU backend actually uses; CAIRN_EINVAL for NULL or
 * a backend that is not the CPU one. */
int cairn_backend_cpu_threads(const cairn_backend *be);

/* Measure, on this machine, the CPU backend's kernel knobs that change
 * speed and never a result (prefetch distance, two groups per pass;
 * kernels/cpu/cpu_tune.c), or take them from the cache file of an earlier
 * measurement on the same CPU model, thread count and ISA level. About 0.3 s
 * the first time (a 128 MiB synthetic matrix, freed again); the runtime
 * calls it once after creating the backend. CAIRN_CPU_TUNE=0 skips it.
 * CAIRN_EINVAL for NULL or another backend, CAIRN_ENOMEM without memory
 * (the defaults stay). */
int cairn_backend_cpu_tune(cairn_backend *be);

/* One line naming the kernels the CPU backend runs (ISA level, layouts,
 * knobs) into out[cap]: what `cairn bench` prints. CAIRN_EINVAL for NULL or
 * another backend. */
int cairn_backend_cpu_describe(const cairn_backend *be, char *out, size_t cap);

/* The CUDA backend on device `device`. CAIRN_EUNSUPPORTED when cairn was
 * built without CUDA or no such device exists. */
int cairn_backend_cuda_create(int device, cairn_backend **out);

/* CUDA devices the runtime sees: >= 0, 0 also when there is no driver or
 * cairn was built without CUDA; CAIRN_EBACKEND (logged) when a driver is
 * present but the runtime cannot use it. Tells "no GPU here" apart from "a
 * GPU the backend failed to open" (the gpu tests skip only on the first). */
int cairn_backend_cuda_device_count(void);

/* What a CUDA backend's step graphs did (kernels/cuda/cuda_graph.cu). */
typedef struct {
    uint64_t launched;     /* steps launched as one graph                    */
    uint64_t updated;      /* of those, run by an exec updated in place       */
    uint64_t instantiated; /* execs made anew (a new key, or a step whose
                              shape differed from its key's last one)        */
    uint64_t abandoned;    /* captures given up (those steps ran op by op)   */
} cairn_cuda_graph_stats;

/* *out for a CUDA backend's graphs. CAIRN_EUNSUPPORTED for another backend,
 * or graphs off (they are on with CAIRN_CUDA_GRAPHS=1 in the environment
 * when the backend is made). */
int cairn_backend_cuda_graph_stats(const cairn_backend *be, cairn_cuda_graph_stats *out);

/* Kernels launched so far under the name `kernel` (the name a launch
 * failure would be logged with, e.g. "attention_split"), by every CUDA
 * backend of the process together: what tests use to show which path ran.
 * A launch recorded into a step graph counts once, when it is recorded.
 * CAIRN_EUNSUPPORTED when `be` is not a CUDA backend. */
int cairn_backend_cuda_launches(const cairn_backend *be, const char *kernel, uint64_t *n);

/* Destroy any backend; NULL is a no-op. All memory allocated from it must
 * have been freed first. */
void cairn_backend_destroy(cairn_backend *be);

/* ---- the optional slots ------------------------------------------------- */

/* Each runs the backend's slot when it has one and the fallback described
 * at cairn_backend_iface otherwise; callers use these, never the slots. */

/* Nonzero when get_rows and matmul accept rows of type `t`; 0 for a NULL
 * backend and for ids cairn does not know. */
int cairn_backend_supports_type(const cairn_backend *be, cairn_type t);

/* The layout of a matmul weight on this backend (the weight_layout slot,
 * else GGUF's: cairn_type_row_bytes(type, n_in) * n_out bytes, *as = type)
 * and its upload (upload_weight, else upload()). CAIRN_EINVAL for a NULL
 * backend or pointer, a type the backend does not support, or a shape that
 * is not a whole number of blocks. */
int cairn_backend_weight_layout(const cairn_backend *be, cairn_type type, int n_in, int n_out,
                                size_t *bytes, cairn_type *as);
int cairn_backend_upload_weight(cairn_backend *be, void *dst, const void *host_src,
                                cairn_type type, int n_in, int n_out);

/* y_i = x · W_iᵀ for the n parts (the matmul_multi slot, else one matmul
 * per part, in order). CAIRN_EINVAL for a NULL backend or n < 1; otherwise
 * what the slot or matmul returns. */
int cairn_backend_matmul_multi(cairn_backend *be, const float *x, int T, int n_in, int n,
                               const cairn_matmul_part *parts);

/* The matmul_invariant_rows slot for weights of `wtype`, else 0 (every row
 * independent of the batch, as on the CPU). */
int cairn_backend_matmul_invariant_rows(const cairn_backend *be, cairn_type wtype);

/* Wait for every op issued so far. CAIRN_EINVAL for a NULL backend. */
int cairn_backend_synchronize(cairn_backend *be);

/* Copy `bytes` of backend memory from src to dst. Callers keep the ranges
 * disjoint (the CPU slot and the fallback copy overlapping ones like
 * memmove, CUDA's does not). CAIRN_EINVAL for a NULL backend or pointer,
 * CAIRN_OK for 0 bytes or dst == src; the fallback may also return
 * CAIRN_ENOMEM (its host buffer) or whatever download/upload return. */
int cairn_backend_copy(cairn_backend *be, void *dst, const void *src, size_t bytes);

/* Host memory for transfers (host_alloc, else aligned calloc). CAIRN_EINVAL
 * for a NULL backend or out, CAIRN_ENOMEM when there is none. The memory is
 * released with cairn_backend_host_free by the same backend. */
int cairn_backend_host_alloc(cairn_backend *be, size_t bytes, void **out);
void cairn_backend_host_free(cairn_backend *be, void *ptr);

/* Start a page transfer (the slot, else a synchronous upload/download with
 * *fence = 0). CAIRN_EINVAL for NULL arguments, CAIRN_OK for 0 bytes with
 * *fence = 0; otherwise what the slot or upload/download returns. */
int cairn_backend_transfer(cairn_backend *be, void *dst, const void *src, size_t bytes,
                           int to_host, uint64_t *fence);
/* Has `fence` passed (block == 0), or wait until it has (block != 0):
 * CAIRN_OK, CAIRN_EBUSY (not yet), CAIRN_EBACKEND (the copy failed).
 * Fence 0 has always passed. */
int cairn_backend_fence_wait(cairn_backend *be, uint64_t fence, int block);

/* Free and total backend memory: CAIRN_EUNSUPPORTED when the backend does
 * not count its memory (the CPU: it is the process's RAM). */
int cairn_backend_memory_info(cairn_backend *be, size_t *free_bytes, size_t *total_bytes);

/* Start recording a step (CAIRN_OK), or CAIRN_EUNSUPPORTED / another status
 * when the ops will just run (the caller goes on either way, and must only
 * call cairn_backend_graph_end after CAIRN_OK). */
int cairn_backend_graph_begin(cairn_backend *be, uint64_t key);
/* Run the recorded step: CAIRN_OK, or CAIRN_EBUSY when none of it ran (issue
 * the ops again without a graph); other statuses are device failures. */
int cairn_backend_graph_end(cairn_backend *be);
/* Instead of cairn_backend_graph_end, after an op failed while recording:
 * nothing recorded runs. CAIRN_OK: report the op's failure; CAIRN_EBUSY:
 * the recording had broken, so issue the ops again without a graph (the
 * graph_abandon slot). CAIRN_EINVAL when there was no recording. */
int cairn_backend_graph_abandon(cairn_backend *be);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_KERNELS_BACKEND_H */
