/*
 * kernels/backend.c — backend-independent helpers: KV page geometry, the
 * argument checks every backend shares, the generic destroy, the wrappers of
 * the optional table slots with their fallbacks, and the CUDA entry point
 * when cairn is built without CUDA.
 */
#include "kernels/backend.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <stdlib.h>

size_t cairn_kv_head_bytes(cairn_type dtype, int head_dim)
{
    if (head_dim <= 0)
        return 0;
    switch (dtype) {
    case CAIRN_TYPE_F32:
        return (size_t)head_dim * 4;
    case CAIRN_TYPE_F16:
    case CAIRN_TYPE_BF16:
        return (size_t)head_dim * 2;
    case CAIRN_TYPE_Q8_0:
    case CAIRN_TYPE_Q4_0: {
        const cairn_type_traits *t = cairn_type_get(dtype);
        if (head_dim % t->block_elems)
            return 0;
        return (size_t)(head_dim / t->block_elems) * (size_t)t->block_bytes;
    }
    default:
        return 0;
    }
}

int cairn_kv_type_supported(cairn_type dtype)
{
    return cairn_kv_head_bytes(dtype, 256) != 0;
}

static const struct {
    const char *name;
    cairn_type type;
} KV_TYPE_NAMES[] = {
    {"f32", CAIRN_TYPE_F32},   {"f16", CAIRN_TYPE_F16},   {"bf16", CAIRN_TYPE_BF16},
    {"q8_0", CAIRN_TYPE_Q8_0}, {"q4_0", CAIRN_TYPE_Q4_0},
};

int cairn_kv_type_parse(const char *name, cairn_type *out)
{
    if (!name || !out)
        return CAIRN_EINVAL;
    for (size_t i = 0; i < sizeof KV_TYPE_NAMES / sizeof KV_TYPE_NAMES[0]; i++)
        if (strcasecmp(name, KV_TYPE_NAMES[i].name) == 0) {
            *out = KV_TYPE_NAMES[i].type;
            return CAIRN_OK;
        }
    return CAIRN_EINVAL;
}

const char *cairn_kv_type_name(cairn_type dtype)
{
    for (size_t i = 0; i < sizeof KV_TYPE_NAMES / sizeof KV_TYPE_NAMES[0]; i++)
        if (KV_TYPE_NAMES[i].type == dtype)
            return KV_TYPE_NAMES[i].name;
    return "?";
}

/* The rotation cairn_kv_layout_init gives a type: the quantized ones rotate
 * by the largest power of two that divides head_dim (at least their block
 * of 32, which head_dim is a multiple of). */
static int default_rotation(cairn_type dtype, int head_dim)
{
    if (dtype != CAIRN_TYPE_Q8_0 && dtype != CAIRN_TYPE_Q4_0)
        return 0;
    return head_dim & -head_dim;
}

int cairn_kv_layout_init(cairn_kv_layout *out, int n_layer, int n_kv_head, int head_dim,
                         int page_size, cairn_type dtype)
{
    if (!out || n_layer <= 0 || n_kv_head <= 0 || head_dim <= 0 || page_size <= 0)
        return CAIRN_EINVAL;
    const size_t head_bytes = cairn_kv_head_bytes(dtype, head_dim);
    if (!head_bytes)
        return CAIRN_EINVAL;
    out->n_layer = n_layer;
    out->n_kv_head = n_kv_head;
    out->head_dim = head_dim;
    out->page_size = page_size;
    out->dtype = dtype;
    out->rotation = default_rotation(dtype, head_dim);
    out->row_bytes = (size_t)n_kv_head * head_bytes;
    /* K and V for every layer, page_size rows each. */
    out->page_bytes = (size_t)n_layer * 2 * (size_t)page_size * out->row_bytes;
    out->layer_base = 0;
    return CAIRN_OK;
}

int cairn_kv_layout_valid(const cairn_kv_layout *L)
{
    if (!L || L->n_layer <= 0 || L->n_kv_head <= 0 || L->head_dim <= 0 || L->page_size <= 0)
        return 0;
    const size_t head_bytes = cairn_kv_head_bytes(L->dtype, L->head_dim);
    if (!head_bytes)
        return 0;
    /* 0, or a power of two dividing head_dim */
    const int R = L->rotation;
    if (R < 0 || (R && ((R & (R - 1)) || L->head_dim % R)))
        return 0;
    const size_t own = (size_t)L->n_layer * 2 * (size_t)L->page_size * L->row_bytes;
    return L->row_bytes == (size_t)L->n_kv_head * head_bytes && L->layer_base <= L->page_bytes &&
           own <= L->page_bytes - L->layer_base;
}

int cairn_kv_layout_place(cairn_kv_layout *page, const cairn_kv_layout *part,
                          cairn_kv_layout *placed)
{
    if (!page || !part || !placed || !cairn_kv_layout_valid(page) || !cairn_kv_layout_valid(part) ||
        part->layer_base != 0 || part->dtype != page->dtype || part->page_size != page->page_size)
        return CAIRN_EINVAL;
    *placed = *part;
    placed->layer_base = page->page_bytes;
    page->page_bytes += part->page_bytes;
    placed->page_bytes = page->page_bytes;
    return CAIRN_OK;
}

/* One sequence's share of an attention call is usable. */
static int attn_seq_valid(const cairn_attn_seq *seq, int page_size, int window)
{
    if (seq->q_start < 0 || seq->n_q <= 0 || seq->n_kv <= 0 || !seq->pages)
        return 0;
    if (!seq->mask || window > 0) {
        if (!seq->q_index)
            return 0;
        for (int i = 0; i < seq->n_q; i++)
            if (seq->q_index[i] < 0 || seq->q_index[i] >= seq->n_kv)
                return 0;
    }
    const int n_pages = (seq->n_kv + page_size - 1) / page_size;
    for (int p = 0; p < n_pages; p++)
        if (seq->pages[p] < 0)
            return 0;
    return 1;
}

int cairn_attn_args_check(const cairn_attn_args *a, int *max_kv)
{
    if (!a || !a->out || !a->q || !a->kv_pool || !a->seqs || a->n_seqs <= 0)
        return CAIRN_EINVAL;
    const cairn_kv_layout *L = a->kv;
    if (!cairn_kv_layout_valid(L) || a->layer < 0 || a->layer >= L->n_layer)
        return CAIRN_EINVAL;
    if (a->n_head <= 0 || a->n_head % L->n_kv_head != 0 || !isfinite(a->scale) || a->window < 0)
        return CAIRN_EINVAL;
    int longest = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        if (!attn_seq_valid(&a->seqs[s], L->page_size, a->window))
            return CAIRN_EINVAL;
        if (a->seqs[s].n_kv > longest)
            longest = a->seqs[s].n_kv;
    }
    if (max_kv)
        *max_kv = longest;
    return CAIRN_OK;
}

int cairn_kv_store_args_check(const void *kv_pool, const cairn_kv_layout *L, int layer,
                              const float *k, const float *v, const int32_t *slots, int T)
{
    if (!kv_pool || !k || !v || !slots || T <= 0 || !cairn_kv_layout_valid(L))
        return CAIRN_EINVAL;
    if (layer < 0 || layer >= L->n_layer)
        return CAIRN_EINVAL;
    for (int t = 0; t < T; t++)
        if (slots[t] < 0)
            return CAIRN_EINVAL;
    return CAIRN_OK;
}

int cairn_add_rows_args_check(const float *y, const float *src, const int32_t *rows,
                               const float *w, int n, int D)
{
    if (!y || !src || !rows || !w || n <= 0 || D <= 0)
        return CAIRN_EINVAL;
    for (int i = 0; i < n; i++)
        if (rows[i] < 0)
            return CAIRN_EINVAL;
    return CAIRN_OK;
}

int cairn_rope_args_check(const float *x, int T, int n_heads, int head_dim, const int32_t *pos,
                          const cairn_rope_params *p)
{
    if (!x || !pos || !p || T <= 0 || n_heads <= 0 || head_dim <= 0)
        return CAIRN_EINVAL;
    if (p->n_rot <= 0 || p->n_rot % 2 != 0 || p->n_rot > head_dim)
        return CAIRN_EINVAL;
    if (p->mode != CAIRN_ROPE_NORMAL && p->mode != CAIRN_ROPE_NEOX)
        return CAIRN_EINVAL;
    if (!(p->freq_base > 0.0f) || !(p->freq_scale > 0.0f) || !isfinite(p->freq_base) ||
        !isfinite(p->freq_scale))
        return CAIRN_EINVAL;
    return CAIRN_OK;
}

void cairn_backend_destroy(cairn_backend *be)
{
    if (be)
        be->iface->destroy(be);
}

/* ---- optional slots: wrappers and fallbacks ----------------------------- */

int cairn_backend_supports_type(const cairn_backend *be, cairn_type t)
{
    if (!be)
        return 0;
    if (be->iface->supports_type)
        return be->iface->supports_type(be, t) != 0;
    const cairn_type_traits *tr = cairn_type_get((int)t);
    return tr && tr->compute;
}

int cairn_backend_weight_layout(const cairn_backend *be, cairn_type type, int n_in, int n_out,
                                size_t *bytes, cairn_type *as)
{
    if (!be || !bytes || !as || n_in <= 0 || n_out <= 0 || !cairn_backend_supports_type(be, type))
        return CAIRN_EINVAL;
    if (be->iface->weight_layout)
        return be->iface->weight_layout(be, type, n_in, n_out, bytes, as);
    const size_t rb = cairn_type_row_bytes((int)type, n_in);
    if (rb == 0)
        return CAIRN_EINVAL;
    *bytes = rb * (size_t)n_out;
    *as = type;
    return CAIRN_OK;
}

int cairn_backend_upload_weight(cairn_backend *be, void *dst, const void *host_src,
                                cairn_type type, int n_in, int n_out)
{
    if (!be || !dst || !host_src || n_in <= 0 || n_out <= 0 ||
        !cairn_backend_supports_type(be, type))
        return CAIRN_EINVAL;
    if (be->iface->upload_weight)
        return be->iface->upload_weight(be, dst, host_src, type, n_in, n_out);
    const size_t rb = cairn_type_row_bytes((int)type, n_in);
    if (rb == 0)
        return CAIRN_EINVAL;
    return be->iface->upload(be, dst, host_src, rb * (size_t)n_out);
}

int cairn_backend_matmul_multi(cairn_backend *be, const float *x, int T, int n_in, int n,
                               const cairn_matmul_part *parts)
{
    if (!be || n < 1 || !parts)
        return CAIRN_EINVAL;
    if (be->iface->matmul_multi)
        return be->iface->matmul_multi(be, x, T, n_in, n, parts);
    for (int i = 0; i < n; i++) {
        int rc = be->iface->matmul(be, parts[i].y, parts[i].W, parts[i].wtype, x, T, n_in,
                                   parts[i].n_out);
        if (rc != CAIRN_OK)
            return rc;
    }
    return CAIRN_OK;
}

int cairn_backend_matmul_invariant_rows(const cairn_backend *be, cairn_type wtype)
{
    if (!be || !be->iface->matmul_invariant_rows)
        return 0;
    return be->iface->matmul_invariant_rows(be, wtype);
}

int cairn_backend_synchronize(cairn_backend *be)
{
    if (!be)
        return CAIRN_EINVAL;
    if (be->iface->synchronize)
        return be->iface->synchronize(be);
    return CAIRN_OK; /* a backend without the slot has nothing in flight */
}

/* Host buffer of the copy fallback: big enough that the per-chunk cost of a
 * download and an upload is amortised, small enough to be a plain malloc. */
#define BOUNCE_BYTES ((size_t)1 << 20)

/* download + upload, a chunk at a time. When dst lies above an overlapping
 * src the chunks go from the end down (as memmove does), so no chunk of src
 * is overwritten before it has been read. */
static int copy_via_host(cairn_backend *be, void *dst, const void *src, size_t bytes)
{
    const size_t cap = bytes < BOUNCE_BYTES ? bytes : BOUNCE_BYTES;
    void *host = malloc(cap);
    if (!host)
        return CAIRN_ENOMEM;
    const int backward = (uintptr_t)dst > (uintptr_t)src && (uintptr_t)dst - (uintptr_t)src < bytes;
    int rc = CAIRN_OK;
    for (size_t done = 0; done < bytes && rc == CAIRN_OK;) {
        const size_t n = bytes - done < cap ? bytes - done : cap;
        const size_t off = backward ? bytes - done - n : done;
        rc = be->iface->download(be, host, (const uint8_t *)src + off, n);
        if (rc == CAIRN_OK)
            rc = be->iface->upload(be, (uint8_t *)dst + off, host, n);
        done += n;
    }
    free(host);
    return rc;
}

int cairn_backend_copy(cairn_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!be)
        return CAIRN_EINVAL;
    if (be->iface->copy)
        return be->iface->copy(be, dst, src, bytes);
    if (!dst || !src)
        return CAIRN_EINVAL;
    if (bytes == 0 || dst == src)
        return CAIRN_OK;
    return copy_via_host(be, dst, src, bytes);
}

int cairn_backend_host_alloc(cairn_backend *be, size_t bytes, void **out)
{
    if (!be || !out)
        return CAIRN_EINVAL;
    *out = NULL;
    if (be->iface->host_alloc)
        return be->iface->host_alloc(be, bytes, out);
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes || rounded == 0)
        return CAIRN_ENOMEM;
    void *p = aligned_alloc(64, rounded);
    if (!p)
        return CAIRN_ENOMEM;
    memset(p, 0, rounded);
    *out = p;
    return CAIRN_OK;
}

void cairn_backend_host_free(cairn_backend *be, void *ptr)
{
    if (!be || !ptr)
        return;
    if (be->iface->host_free)
        be->iface->host_free(be, ptr);
    else
        free(ptr);
}

int cairn_backend_transfer(cairn_backend *be, void *dst, const void *src, size_t bytes,
                           int to_host, uint64_t *fence)
{
    if (!be || !dst || !src || !fence)
        return CAIRN_EINVAL;
    *fence = 0;
    if (bytes == 0)
        return CAIRN_OK;
    if (be->iface->transfer)
        return be->iface->transfer(be, dst, src, bytes, to_host, fence);
    return to_host ? be->iface->download(be, dst, src, bytes) : be->iface->upload(be, dst, src, bytes);
}

int cairn_backend_fence_wait(cairn_backend *be, uint64_t fence, int block)
{
    if (!be)
        return CAIRN_EINVAL;
    if (fence == 0 || !be->iface->fence_wait)
        return CAIRN_OK;
    return be->iface->fence_wait(be, fence, block);
}

int cairn_backend_memory_info(cairn_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    if (!be || !free_bytes || !total_bytes)
        return CAIRN_EINVAL;
    if (!be->iface->memory_info)
        return CAIRN_EUNSUPPORTED;
    return be->iface->memory_info(be, free_bytes, total_bytes);
}

int cairn_backend_graph_begin(cairn_backend *be, uint64_t key)
{
    if (!be)
        return CAIRN_EINVAL;
    if (!be->iface->graph_begin)
        return CAIRN_EUNSUPPORTED;
    return be->iface->graph_begin(be, key);
}

int cairn_backend_graph_end(cairn_backend *be)
{
    if (!be || !be->iface->graph_end)
        return CAIRN_EINVAL; /* there was no CAIRN_OK from graph_begin */
    return be->iface->graph_end(be);
}

int cairn_backend_graph_abandon(cairn_backend *be)
{
    if (!be || !be->iface->graph_abandon)
        return CAIRN_EINVAL; /* there was no CAIRN_OK from graph_begin */
    return be->iface->graph_abandon(be);
}

#ifndef CAIRN_HAVE_CUDA
int cairn_backend_cuda_create(int device, cairn_backend **out)
{
    (void)device;
    (void)out;
    cairn_log(CAIRN_LOG_ERROR, "this cairn was built without CUDA (nvcc not found at build time)");
    return CAIRN_EUNSUPPORTED;
}

int cairn_backend_cuda_device_count(void)
{
    return 0;
}

int cairn_backend_cuda_graph_stats(const cairn_backend *be, cairn_cuda_graph_stats *out)
{
    (void)be, (void)out;
    return CAIRN_EUNSUPPORTED;
}

int cairn_backend_cuda_launches(const cairn_backend *be, const char *kernel, uint64_t *n)
{
    (void)be, (void)kernel, (void)n;
    return CAIRN_EUNSUPPORTED;
}
#endif
