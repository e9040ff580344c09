/*
 * fuzz/fuzz_gguf.c — GGUF parsing (cairn_gguf_open_memory) and, on what
 * parses, every metadata getter, the tensor table, and building a
 * vocabulary from the (hostile) metadata, which is then used to tokenize
 * and detokenize a fixed text.
 *
 * Properties: whatever opens has tensors whose data lie inside the image
 * with the sizes their shapes and types imply; a string getter hands back a
 * NUL-terminated string of the stated length; a vocabulary built from the
 * file only ever produces ids inside itself.
 */
#include "fuzz_common.h"

#include <string.h>

static void walk_metadata(const cairn_gguf *g)
{
    int64_t n_kv = cairn_gguf_n_kv(g);
    FUZZ_CHECK(n_kv >= 0);
    for (int64_t i = 0; i < n_kv; i++) {
        const char *key = cairn_gguf_key(g, i);
        FUZZ_CHECK(key != NULL);
        int64_t found = cairn_gguf_find_key(g, key);
        FUZZ_CHECK(found == i); /* keys are unique (duplicates are refused) */
        (void)cairn_gguf_kv_type(g, i);
        uint32_t u32;
        int64_t i64;
        float f32;
        bool b;
        const char *s;
        size_t len;
        (void)cairn_gguf_get_u32(g, key, &u32);
        (void)cairn_gguf_get_i64(g, key, &i64);
        (void)cairn_gguf_get_f32(g, key, &f32);
        (void)cairn_gguf_get_bool(g, key, &b);
        if (cairn_gguf_get_str(g, key, &s, &len) == CAIRN_OK)
            FUZZ_CHECK(s != NULL && strlen(s) <= len && s[len] == '\0');
        cairn_gguf_vtype et;
        uint64_t n;
        const void *arr;
        if (cairn_gguf_get_arr(g, key, &et, &n, &arr) == CAIRN_OK) {
            if (et == CAIRN_GGUF_STRING) {
                uint64_t probe[3] = {0, n / 2, n ? n - 1 : 0};
                for (int k = 0; k < 3 && n > 0; k++) {
                    if (cairn_gguf_get_arr_str(g, key, probe[k], &s, &len) == CAIRN_OK)
                        FUZZ_CHECK(s != NULL && s[len] == '\0');
                }
                FUZZ_CHECK(cairn_gguf_get_arr_str(g, key, n, &s, &len) != CAIRN_OK);
            } else if (arr && n > 0) {
                /* Touch both ends so ASan sees any out-of-image pointer. */
                volatile uint8_t first = *(const uint8_t *)arr;
                (void)first;
            }
        }
    }
}

static void walk_tensors(const cairn_gguf *g)
{
    size_t file_size = 0;
    const uint8_t *file = cairn_gguf_file_data(g, &file_size);
    int64_t n = cairn_gguf_n_tensors(g);
    FUZZ_CHECK(n >= 0);
    for (int64_t i = 0; i < n; i++) {
        const cairn_gguf_tensor *t = cairn_gguf_tensor_at(g, i);
        FUZZ_CHECK(t != NULL && t->name != NULL);
        FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= 4);
        FUZZ_CHECK(cairn_gguf_find_tensor(g, t->name) != NULL);
        const uint8_t *d = t->data;
        FUZZ_CHECK(d >= file && d <= file + file_size && t->size <= (uint64_t)(file + file_size - d));
        /* size = bytes of a row of ne[0] elements x the other dims (in
         * unsigned arithmetic: an empty tensor may have huge other dims). */
        uint64_t want = cairn_type_row_bytes(t->type, t->ne[0]);
        bool overflow = false;
        for (int k = 1; k < 4; k++)
            overflow |= __builtin_mul_overflow(want, (uint64_t)t->ne[k], &want);
        bool empty = t->ne[0] == 0 || t->ne[1] == 0 || t->ne[2] == 0 || t->ne[3] == 0;
        FUZZ_CHECK(empty ? t->size == 0 : !overflow && t->size == want);
        if (t->size > 0) {
            volatile uint8_t last = d[t->size - 1];
            (void)last;
        }
    }
}

static void exercise_vocab(const cairn_vocab *v)
{
    static const char text[] = "Hello world! <s> 12345 \xe2\x96\x81x \xf0\x9f\x98\x80 \xff tail";
    int32_t n_vocab = cairn_vocab_n_tokens(v);
    FUZZ_CHECK(n_vocab > 0);
    int32_t ids[256];
    for (int flags = 0; flags < 4; flags++) {
        size_t n = 0;
        int rc = cairn_tokenize(v, text, sizeof text - 1, flags, ids, 256, &n);
        if (rc != CAIRN_OK)
            continue;
        cairn_detok *d = NULL;
        if (cairn_detok_create(v, flags & 1, &d) != CAIRN_OK)
            continue;
        char out[300];
        size_t got;
        for (size_t i = 0; i < n; i++) {
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab);
            if (cairn_detok_push(d, ids[i], out, sizeof out, &got) == CAIRN_OK)
                FUZZ_CHECK(got <= sizeof out);
        }
        (void)cairn_detok_flush(d, out, sizeof out, &got);
        cairn_detok_free(d);
    }
    char piece[512];
    for (int32_t t = 0; t < n_vocab && t < 64; t++) {
        size_t got;
        (void)cairn_token_to_piece(v, t, true, piece, sizeof piece, &got);
        (void)cairn_vocab_token_text(v, t);
        (void)cairn_vocab_is_eog(v, t);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* Hostile metadata makes the vocab loader warn on most inputs; the
     * output would only slow the fuzzer down. */
    cairn_log_set_level(CAIRN_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cairn_gguf *g = NULL;
    char err[256];
    if (cairn_gguf_open_memory(data, size, &g, err, sizeof err) != CAIRN_OK) {
        FUZZ_CHECK(g == NULL);
        FUZZ_CHECK(memchr(err, 0, sizeof err) != NULL);
        return 0;
    }
    FUZZ_CHECK(cairn_gguf_alignment(g) > 0);
    walk_metadata(g);
    walk_tensors(g);
    cairn_vocab *v = NULL;
    if (cairn_vocab_load(g, &v, err, sizeof err) == CAIRN_OK)
        exercise_vocab(v);
    cairn_vocab_free(v);
    cairn_gguf_close(g);
    return 0;
}
