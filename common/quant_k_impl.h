/*
 * common/quant_k_impl.h — internal to common/: the Q5_0 and K-quant halves of
 * cairn_dequantize_row / cairn_quantize_row (implemented in quant_k.c). Other
 * modules call the public functions in common/common.h.
 */
#ifndef CAIRN_COMMON_QUANT_K_IMPL_H
#define CAIRN_COMMON_QUANT_K_IMPL_H

#include "common/common.h"

/* Same contract as cairn_dequantize_row / cairn_quantize_row, for Q5_0,
 * Q4_K, Q5_K and Q6_K; CAIRN_EUNSUPPORTED for any other type, CAIRN_EINVAL
 * when n is not a whole number of blocks. */
int quantk_dequantize_row(int type, const void *src, float *dst, int64_t n);
int quantk_quantize_row(int type, const float *src, void *dst, int64_t n);

#endif /* CAIRN_COMMON_QUANT_K_IMPL_H */
