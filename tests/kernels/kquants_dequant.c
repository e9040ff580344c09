/*
 * tests/kernels/kquants_dequant.c — a helper of test_kquants_real.py:
 *   kquants_dequant TYPE_ID N_ELEMS IN_FILE OUT_FILE
 * reads rows of raw GGUF blocks of type TYPE_ID (N_ELEMS elements per row,
 * as many rows as IN_FILE holds), dequantizes each with
 * cairn_dequantize_row and writes the floats (little-endian float32) to
 * OUT_FILE. Exit status 0 on success, 1 with a message otherwise.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/common.h"

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s TYPE_ID N_ELEMS IN_FILE OUT_FILE\n", argv[0]);
        return 1;
    }
    const int type = atoi(argv[1]);
    const long long n = atoll(argv[2]);
    const size_t rb = cairn_type_row_bytes(type, n);
    if (rb == 0) {
        fprintf(stderr, "kquants_dequant: bad type %d or row length %lld\n", type, n);
        return 1;
    }
    FILE *in = fopen(argv[3], "rb"), *out = fopen(argv[4], "wb");
    unsigned char *row = malloc(rb);
    float *vals = malloc(sizeof(float) * (size_t)n);
    int rc = 0;
    if (!in || !out || !row || !vals) {
        fprintf(stderr, "kquants_dequant: cannot open files or allocate\n");
        rc = 1;
    }
    while (rc == 0 && fread(row, 1, rb, in) == rb) {
        const int st = cairn_dequantize_row(type, row, vals, n);
        if (st != CAIRN_OK) {
            fprintf(stderr, "kquants_dequant: %s\n", cairn_strerror(st));
            rc = 1;
        } else if (fwrite(vals, sizeof(float), (size_t)n, out) != (size_t)n) {
            fprintf(stderr, "kquants_dequant: write failed\n");
            rc = 1;
        }
    }
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        rc = 1;
    free(row);
    free(vals);
    return rc;
}
