/*
 * gguf/gguf_impl.h — what gguf_build.c needs from the parser (gguf.c); not
 * for other folders.
 */
#ifndef CAIRN_GGUF_IMPL_H
#define CAIRN_GGUF_IMPL_H

#include "gguf/gguf.h"

/* Open a built image (malloc'ed; owned by the handle on success): tensor i's
 * bytes at tensor_data[i], its offset laid out inside [0, data_extent).
 * The handle owns keep[n_keep] (malloc'ed array) on success only. */
int gguf_open_built(void *image, size_t size, const void *const *tensor_data,
                    uint64_t data_extent, cairn_gguf_keep *keep, int n_keep, cairn_gguf **out,
                    char *err, size_t err_len);

/* Bytes of one scalar of value type t; 0 for strings, arrays and unknown. */
size_t gguf_scalar_size(uint32_t t);

#endif /* CAIRN_GGUF_IMPL_H */
