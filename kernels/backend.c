/*
 * kernels/backend.c — backend-independent helpers: KV page geometry, the
 * generic destroy, and the CUDA entry point when cairn is built without CUDA.
 */
#include "kernels/backend.h"

int cairn_kv_layout_init(cairn_kv_layout *out, int n_layer, int n_kv_head, int head_dim,
                         int page_size, cairn_type dtype)
{
    if (!out || n_layer <= 0 || n_kv_head <= 0 || head_dim <= 0 || page_size <= 0)
        return CAIRN_EINVAL;
    if (dtype != CAIRN_TYPE_F32 && dtype != CAIRN_TYPE_F16)
        return CAIRN_EINVAL;
    size_t elem = dtype == CAIRN_TYPE_F32 ? 4 : 2;
    out->n_layer = n_layer;
    out->n_kv_head = n_kv_head;
    out->head_dim = head_dim;
    out->page_size = page_size;
    out->dtype = dtype;
    out->row_bytes = (size_t)n_kv_head * (size_t)head_dim * elem;
    /* K and V for every layer, page_size rows each. */
    out->page_bytes = (size_t)n_layer * 2 * (size_t)page_size * out->row_bytes;
    return CAIRN_OK;
}

void cairn_backend_destroy(cairn_backend *be)
{
    if (be)
        be->iface->destroy(be);
}

#ifndef CAIRN_HAVE_CUDA
int cairn_backend_cuda_create(int device, cairn_backend **out)
{
    (void)device;
    (void)out;
    cairn_log(CAIRN_LOG_ERROR, "this cairn was built without CUDA (nvcc not found at build time)");
    return CAIRN_EUNSUPPORTED;
}
#endif
