/*
 * tests/gguf/test_gguf.c — the GGUF reader: a real model file, files written
 * with the tests' GGUF writer (every value type, arrays, tensors), and hostile
 * files (truncated at every byte, corrupted at random, crafted bad fields).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "tests/support/support.h"

/* Opens an image and returns the status; on success checks that every
 * accessor gives consistent answers (a corrupt file that opens must still be
 * safe to read), then closes it. */
static int open_and_walk(const void *data, size_t size, char *err, size_t err_len)
{
    cairn_gguf *g = NULL;
    int rc = cairn_gguf_open_memory(data, size, &g, err, err_len);
    if (rc != CAIRN_OK) {
        assert_null(g);
        return rc;
    }
    const uint8_t *base = data;
    for (int64_t i = 0; i < cairn_gguf_n_kv(g); i++) {
        const char *key = cairn_gguf_key(g, i);
        assert_non_null(key);
        assert_int_equal(cairn_gguf_find_key(g, key), i);
        cairn_gguf_vtype t = cairn_gguf_kv_type(g, i);
        if (t == CAIRN_GGUF_STRING) {
            const char *s;
            size_t len;
            assert_int_equal(cairn_gguf_get_str(g, key, &s, &len), CAIRN_OK);
            assert_int_equal(s[len], '\0');
        } else if (t == CAIRN_GGUF_ARRAY) {
            cairn_gguf_vtype et;
            uint64_t n;
            const void *d;
            assert_int_equal(cairn_gguf_get_arr(g, key, &et, &n, &d), CAIRN_OK);
            if (et == CAIRN_GGUF_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    const char *s;
                    size_t len;
                    assert_int_equal(cairn_gguf_get_arr_str(g, key, j, &s, &len), CAIRN_OK);
                    assert_int_equal(s[len], '\0');
                }
            } else if (et != CAIRN_GGUF_ARRAY && n > 0) {
                assert_true((const uint8_t *)d >= base && (const uint8_t *)d < base + size);
            }
        }
    }
    size_t fsize;
    assert_ptr_equal(cairn_gguf_file_data(g, &fsize), data);
    assert_int_equal(fsize, size);
    for (int64_t i = 0; i < cairn_gguf_n_tensors(g); i++) {
        const cairn_gguf_tensor *t = cairn_gguf_tensor_at(g, i);
        assert_non_null(t);
        assert_ptr_equal(cairn_gguf_find_tensor(g, t->name), t);
        assert_true(t->n_dims >= 1 && t->n_dims <= 4);
        const uint8_t *d = t->data;
        assert_true(d >= base && d + t->size <= base + size);
        assert_int_equal(t->offset % cairn_gguf_alignment(g), 0);
        /* Touch first and last byte so ASan would catch a bad range. */
        if (t->size) {
            volatile uint8_t x = d[0];
            x = d[t->size - 1];
            (void)x;
        }
    }
    cairn_gguf_close(g);
    return CAIRN_OK;
}

/* ---- the bundled model ---------------------------------------------------- */

static const char *model_path(void)
{
    const char *p = getenv("CAIRN_MODEL");
    return p ? p : "models/stories260K.gguf";
}

static uint8_t *read_whole(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return p;
}

static void test_stories_metadata(void **state)
{
    (void)state;
    char err[256] = "";
    cairn_gguf *g = NULL;
    int rc = cairn_gguf_open(model_path(), &g, err, sizeof err);
    if (rc)
        fail_msg("open %s: %s", model_path(), err);
    assert_int_equal(cairn_gguf_version(g), 3); /* stories260K.gguf is a v3 file */
    assert_int_equal(cairn_gguf_alignment(g), 32);

    const char *s;
    size_t len;
    assert_int_equal(cairn_gguf_get_str(g, "general.architecture", &s, &len), CAIRN_OK);
    assert_string_equal(s, "llama");
    assert_int_equal(len, 5);
    uint32_t u;
    assert_int_equal(cairn_gguf_get_u32(g, "llama.embedding_length", &u), CAIRN_OK);
    assert_int_equal(u, 64);
    assert_int_equal(cairn_gguf_get_u32(g, "llama.block_count", &u), CAIRN_OK);
    assert_int_equal(u, 5);
    assert_int_equal(cairn_gguf_get_u32(g, "llama.attention.head_count", &u), CAIRN_OK);
    assert_int_equal(u, 8);
    assert_int_equal(cairn_gguf_get_u32(g, "llama.attention.head_count_kv", &u), CAIRN_OK);
    assert_int_equal(u, 4);
    int64_t i64;
    assert_int_equal(cairn_gguf_get_i64(g, "llama.context_length", &i64), CAIRN_OK);
    assert_int_equal(i64, 2048);
    float f;
    assert_int_equal(cairn_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f),
                     CAIRN_OK);
    assert_true(f > 0 && f < 1e-3f);
    /* A string is not a number. */
    assert_int_equal(cairn_gguf_get_u32(g, "general.architecture", &u), CAIRN_EFORMAT);
    assert_int_equal(cairn_gguf_get_u32(g, "no.such.key", &u), CAIRN_ENOTFOUND);
    assert_int_equal(cairn_gguf_find_key(g, "no.such.key"), -1);

    cairn_gguf_vtype et;
    uint64_t n;
    const void *data;
    assert_int_equal(cairn_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data), CAIRN_OK);
    assert_int_equal(et, CAIRN_GGUF_STRING);
    assert_int_equal(n, 512);
    assert_int_equal(cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 0, &s, &len), CAIRN_OK);
    assert_string_equal(s, "<unk>");
    assert_int_equal(cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 1, &s, &len), CAIRN_OK);
    assert_string_equal(s, "<s>");
    assert_int_equal(cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 512, &s, &len),
                     CAIRN_EINVAL);
    assert_int_equal(cairn_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data), CAIRN_OK);
    assert_int_equal(et, CAIRN_GGUF_FLOAT32);
    assert_int_equal(n, 512);
    assert_non_null(data);

    const cairn_gguf_tensor *t = cairn_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->type, CAIRN_TYPE_F32);
    assert_int_equal(t->size, 64 * 512 * 4);
    assert_null(cairn_gguf_find_tensor(g, "no.such.tensor"));
    t = cairn_gguf_find_tensor(g, "blk.4.ffn_gate.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 172);
    /* 5 layers x 9 tensors + embedding + output norm (+ output when untied). */
    assert_true(cairn_gguf_n_tensors(g) >= 47);
    cairn_gguf_close(g);

    /* The same bytes through open_memory pass the same validation. */
    size_t size;
    uint8_t *img = read_whole(model_path(), &size);
    assert_non_null(img);
    assert_int_equal(open_and_walk(img, size, err, sizeof err), CAIRN_OK);
    free(img);
}

static void test_open_missing_file(void **state)
{
    (void)state;
    char err[256] = "";
    cairn_gguf *g = NULL;
    assert_int_equal(cairn_gguf_open("/nonexistent/x.gguf", &g, err, sizeof err),
                     CAIRN_ENOTFOUND);
    assert_null(g);
    assert_non_null(strstr(err, "/nonexistent/x.gguf"));
    /* A directory is not a GGUF file. */
    assert_int_equal(cairn_gguf_open("/", &g, err, sizeof err), CAIRN_EIO);
}

/* ---- written files: every type, round trip -------------------------------- */

/* Builds a file with one key of every scalar type, a string, arrays of every
 * element type (incl. strings and nested arrays), and three tensors. */
static void build_full(gw_buf *b, uint32_t version, uint32_t alignment)
{
    gw_header(b, version, 3, 24);
    gw_kv(b, "general.alignment", CAIRN_GGUF_UINT32);
    gw_u32(b, alignment);
    gw_kv(b, "t.u8", CAIRN_GGUF_UINT8);
    gw_u8(b, 200);
    gw_kv(b, "t.i8", CAIRN_GGUF_INT8);
    gw_u8(b, (uint8_t)(int8_t)-100);
    gw_kv(b, "t.u16", CAIRN_GGUF_UINT16);
    gw_u16(b, 60000);
    gw_kv(b, "t.i16", CAIRN_GGUF_INT16);
    gw_u16(b, (uint16_t)(int16_t)-30000);
    gw_kv(b, "t.u32", CAIRN_GGUF_UINT32);
    gw_u32(b, 4000000000u);
    gw_kv(b, "t.i32", CAIRN_GGUF_INT32);
    gw_u32(b, (uint32_t)(int32_t)-2000000000);
    gw_kv(b, "t.f32", CAIRN_GGUF_FLOAT32);
    gw_f32(b, 1.5f);
    gw_kv(b, "t.bool", CAIRN_GGUF_BOOL);
    gw_u8(b, 1);
    gw_kv(b, "t.str", CAIRN_GGUF_STRING);
    gw_str(b, "héllo wörld");
    gw_kv(b, "t.u64", CAIRN_GGUF_UINT64);
    gw_u64(b, 18000000000000000000ull);
    gw_kv(b, "t.i64", CAIRN_GGUF_INT64);
    gw_u64(b, (uint64_t)(int64_t)-9000000000000000000ll);
    gw_kv(b, "t.f64", CAIRN_GGUF_FLOAT64);
    gw_f64(b, -2.25);
    gw_kv(b, "t.emptystr", CAIRN_GGUF_STRING);
    gw_str(b, "");
    /* arrays of each scalar element type */
    gw_kv(b, "a.u8", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_UINT8);
    gw_u64(b, 3);
    gw_u8(b, 1), gw_u8(b, 2), gw_u8(b, 3);
    gw_kv(b, "a.i16", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_INT16);
    gw_u64(b, 2);
    gw_u16(b, (uint16_t)-5), gw_u16(b, 7);
    gw_kv(b, "a.i32", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_INT32);
    gw_u64(b, 4);
    for (int i = 0; i < 4; i++)
        gw_u32(b, (uint32_t)(i * 1000 - 1));
    gw_kv(b, "a.f32", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_FLOAT32);
    gw_u64(b, 2);
    gw_f32(b, -0.5f), gw_f32(b, 3.25f);
    gw_kv(b, "a.bool", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_BOOL);
    gw_u64(b, 2);
    gw_u8(b, 0), gw_u8(b, 1);
    gw_kv(b, "a.u64", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_UINT64);
    gw_u64(b, 1);
    gw_u64(b, 0x0102030405060708ull);
    gw_kv(b, "a.f64", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_FLOAT64);
    gw_u64(b, 1);
    gw_f64(b, 6.5);
    gw_kv(b, "a.str", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_STRING);
    gw_u64(b, 3);
    gw_str(b, "alpha"), gw_str(b, ""), gw_str(b, "▁gamma");
    gw_kv(b, "a.empty", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_INT32);
    gw_u64(b, 0);
    /* array of arrays: [[1,2],[\"x\"], [[], []]] — only counted */
    gw_kv(b, "a.nested", CAIRN_GGUF_ARRAY);
    gw_u32(b, CAIRN_GGUF_ARRAY);
    gw_u64(b, 3);
    gw_u32(b, CAIRN_GGUF_UINT16), gw_u64(b, 2), gw_u16(b, 1), gw_u16(b, 2);
    gw_u32(b, CAIRN_GGUF_STRING), gw_u64(b, 1), gw_str(b, "x");
    gw_u32(b, CAIRN_GGUF_ARRAY), gw_u64(b, 2);
    gw_u32(b, CAIRN_GGUF_INT8), gw_u64(b, 0);
    gw_u32(b, CAIRN_GGUF_FLOAT32), gw_u64(b, 0);

    /* tensors: a [4][8] F32, a [2][32] Q8_0 (2 rows x 34 bytes), a [3] F16 */
    uint64_t ne_a[2] = {8, 4}, ne_b[2] = {32, 2}, ne_c[1] = {3};
    uint64_t size_a = 8 * 4 * 4, size_b = 2 * 34;
    uint64_t off_a = 0;
    uint64_t off_b = (size_a + alignment - 1) / alignment * alignment;
    uint64_t off_c = (off_b + size_b + alignment - 1) / alignment * alignment;
    gw_tensor_info(b, "w.a", 2, ne_a, CAIRN_TYPE_F32, off_a);
    gw_tensor_info(b, "w.b", 2, ne_b, CAIRN_TYPE_Q8_0, off_b);
    gw_tensor_info(b, "w.c", 1, ne_c, CAIRN_TYPE_F16, off_c);
    gw_pad(b, alignment);
    size_t data_start = b->n;
    for (int i = 0; i < 32; i++)
        gw_f32(b, (float)i);
    while (b->n < data_start + off_b)
        gw_u8(b, 0xEE);
    for (int i = 0; i < 68; i++)
        gw_u8(b, (uint8_t)i);
    while (b->n < data_start + off_c)
        gw_u8(b, 0xEE);
    gw_u16(b, 0x3c00), gw_u16(b, 0x4000), gw_u16(b, 0x4200); /* 1, 2, 3 in fp16 */
}

static void check_full(const cairn_gguf *g, uint32_t version, uint32_t alignment)
{
    assert_int_equal(cairn_gguf_version(g), version);
    assert_int_equal(cairn_gguf_alignment(g), alignment);
    assert_int_equal(cairn_gguf_n_kv(g), 24);
    assert_string_equal(cairn_gguf_key(g, 1), "t.u8");
    assert_int_equal(cairn_gguf_kv_type(g, 1), CAIRN_GGUF_UINT8);
    assert_null(cairn_gguf_key(g, 24));

    uint32_t u;
    int64_t i;
    float f;
    bool bo;
    assert_int_equal(cairn_gguf_get_u32(g, "t.u8", &u), CAIRN_OK);
    assert_int_equal(u, 200);
    assert_int_equal(cairn_gguf_get_i64(g, "t.i8", &i), CAIRN_OK);
    assert_int_equal(i, -100);
    assert_int_equal(cairn_gguf_get_u32(g, "t.i8", &u), CAIRN_EFORMAT); /* negative */
    assert_int_equal(cairn_gguf_get_u32(g, "t.u16", &u), CAIRN_OK);
    assert_int_equal(u, 60000);
    assert_int_equal(cairn_gguf_get_i64(g, "t.i16", &i), CAIRN_OK);
    assert_int_equal(i, -30000);
    assert_int_equal(cairn_gguf_get_u32(g, "t.u32", &u), CAIRN_OK);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(cairn_gguf_get_i64(g, "t.i32", &i), CAIRN_OK);
    assert_int_equal(i, -2000000000);
    assert_int_equal(cairn_gguf_get_f32(g, "t.f32", &f), CAIRN_OK);
    assert_true(f == 1.5f);
    assert_int_equal(cairn_gguf_get_f32(g, "t.i32", &f), CAIRN_OK); /* ints convert */
    assert_true(f == -2000000000.0f);
    assert_int_equal(cairn_gguf_get_bool(g, "t.bool", &bo), CAIRN_OK);
    assert_true(bo);
    assert_int_equal(cairn_gguf_get_u32(g, "t.bool", &u), CAIRN_OK);
    assert_int_equal(u, 1);
    assert_int_equal(cairn_gguf_get_bool(g, "t.u16", &bo), CAIRN_EFORMAT);
    assert_int_equal(cairn_gguf_get_f32(g, "t.bool", &f), CAIRN_EFORMAT);
    const char *s;
    size_t len;
    assert_int_equal(cairn_gguf_get_str(g, "t.str", &s, &len), CAIRN_OK);
    assert_string_equal(s, "héllo wörld");
    assert_int_equal(len, strlen("héllo wörld"));
    assert_int_equal(cairn_gguf_get_str(g, "t.emptystr", &s, &len), CAIRN_OK);
    assert_int_equal(len, 0);
    assert_string_equal(s, "");
    assert_int_equal(cairn_gguf_get_str(g, "t.u8", &s, &len), CAIRN_EFORMAT);
    assert_int_equal(cairn_gguf_get_u32(g, "t.u64", &u), CAIRN_EFORMAT); /* too big */
    assert_int_equal(cairn_gguf_get_i64(g, "t.u64", &i), CAIRN_EFORMAT); /* > INT64_MAX */
    assert_int_equal(cairn_gguf_get_i64(g, "t.i64", &i), CAIRN_OK);
    assert_true(i == -9000000000000000000ll);
    assert_int_equal(cairn_gguf_get_f32(g, "t.f64", &f), CAIRN_OK);
    assert_true(f == -2.25f);
    assert_int_equal(cairn_gguf_get_f32(g, "t.str", &f), CAIRN_EFORMAT);

    cairn_gguf_vtype et;
    uint64_t n;
    const void *d;
    assert_int_equal(cairn_gguf_get_arr(g, "a.u8", &et, &n, &d), CAIRN_OK);
    assert_int_equal(et, CAIRN_GGUF_UINT8);
    assert_int_equal(n, 3);
    assert_memory_equal(d, "\x01\x02\x03", 3);
    assert_int_equal(cairn_gguf_get_arr(g, "a.i16", &et, &n, &d), CAIRN_OK);
    int16_t i16[2];
    memcpy(i16, d, sizeof i16);
    assert_int_equal(i16[0], -5);
    assert_int_equal(i16[1], 7);
    assert_int_equal(cairn_gguf_get_arr(g, "a.i32", &et, &n, &d), CAIRN_OK);
    assert_int_equal(n, 4);
    int32_t i32[4];
    memcpy(i32, d, sizeof i32);
    assert_int_equal(i32[3], 2999);
    assert_int_equal(cairn_gguf_get_arr(g, "a.f32", &et, &n, &d), CAIRN_OK);
    float f2[2];
    memcpy(f2, d, sizeof f2);
    assert_true(f2[0] == -0.5f && f2[1] == 3.25f);
    assert_int_equal(cairn_gguf_get_arr(g, "a.bool", &et, &n, &d), CAIRN_OK);
    assert_int_equal(et, CAIRN_GGUF_BOOL);
    assert_int_equal(cairn_gguf_get_arr(g, "a.u64", &et, &n, &d), CAIRN_OK);
    uint64_t u64;
    memcpy(&u64, d, 8);
    assert_true(u64 == 0x0102030405060708ull);
    assert_int_equal(cairn_gguf_get_arr(g, "a.f64", &et, &n, &d), CAIRN_OK);
    double f64;
    memcpy(&f64, d, 8);
    assert_true(f64 == 6.5);
    assert_int_equal(cairn_gguf_get_arr(g, "a.str", &et, &n, &d), CAIRN_OK);
    assert_int_equal(et, CAIRN_GGUF_STRING);
    assert_int_equal(n, 3);
    assert_int_equal(cairn_gguf_get_arr_str(g, "a.str", 0, &s, &len), CAIRN_OK);
    assert_string_equal(s, "alpha");
    assert_int_equal(cairn_gguf_get_arr_str(g, "a.str", 1, &s, &len), CAIRN_OK);
    assert_int_equal(len, 0);
    assert_int_equal(cairn_gguf_get_arr_str(g, "a.str", 2, &s, &len), CAIRN_OK);
    assert_string_equal(s, "▁gamma");
    assert_int_equal(cairn_gguf_get_arr_str(g, "a.str", 3, &s, &len), CAIRN_EINVAL);
    assert_int_equal(cairn_gguf_get_arr_str(g, "a.u8", 0, &s, &len), CAIRN_EFORMAT);
    assert_int_equal(cairn_gguf_get_arr(g, "a.empty", &et, &n, &d), CAIRN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(cairn_gguf_get_arr(g, "a.nested", &et, &n, &d), CAIRN_OK);
    assert_int_equal(et, CAIRN_GGUF_ARRAY);
    assert_int_equal(n, 3);
    assert_int_equal(cairn_gguf_get_arr(g, "t.u8", &et, &n, &d), CAIRN_EFORMAT);
    assert_int_equal(cairn_gguf_get_u32(g, "a.u8", &u), CAIRN_EFORMAT);

    assert_int_equal(cairn_gguf_n_tensors(g), 3);
    const cairn_gguf_tensor *t = cairn_gguf_find_tensor(g, "w.a");
    assert_ptr_equal(t, cairn_gguf_tensor_at(g, 0));
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 8);
    assert_int_equal(t->ne[1], 4);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->ne[3], 1);
    assert_int_equal(t->size, 128);
    float fa[32];
    memcpy(fa, t->data, sizeof fa);
    assert_true(fa[0] == 0.0f && fa[31] == 31.0f);
    t = cairn_gguf_find_tensor(g, "w.b");
    assert_int_equal(t->type, CAIRN_TYPE_Q8_0);
    assert_int_equal(t->size, 68);
    assert_int_equal(((const uint8_t *)t->data)[67], 67);
    t = cairn_gguf_find_tensor(g, "w.c");
    assert_int_equal(t->type, CAIRN_TYPE_F16);
    assert_int_equal(t->size, 6);
    uint16_t h[3];
    memcpy(h, t->data, 6);
    assert_true(cairn_fp16_to_fp32(h[2]) == 3.0f);
    assert_null(cairn_gguf_tensor_at(g, 3));
    assert_null(cairn_gguf_tensor_at(g, -1));
}

static void test_written_roundtrip(void **state)
{
    (void)state;
    const uint32_t versions[] = {2, 3};
    const uint32_t aligns[] = {32, 64, 8};
    for (int vi = 0; vi < 2; vi++) {
        for (int ai = 0; ai < 3; ai++) {
            gw_buf b = {0};
            build_full(&b, versions[vi], aligns[ai]);
            char err[256] = "";
            cairn_gguf *g = NULL;
            int rc = cairn_gguf_open_memory(b.p, b.n, &g, err, sizeof err);
            if (rc)
                fail_msg("v%u align %u: %s", versions[vi], aligns[ai], err);
            check_full(g, versions[vi], aligns[ai]);
            cairn_gguf_close(g);

            /* through a real file and mmap too */
            char path[] = "/tmp/cairn-gguf-XXXXXX";
            int fd = mkstemp(path);
            assert_true(fd >= 0);
            assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
            close(fd);
            rc = cairn_gguf_open(path, &g, err, sizeof err);
            unlink(path);
            if (rc)
                fail_msg("file: %s", err);
            check_full(g, versions[vi], aligns[ai]);
            cairn_gguf_close(g);
            free(b.p);
        }
    }
}

/* A vocab-only style file: no tensors, so it may end right after the header. */
static void test_no_tensors(void **state)
{
    (void)state;
    gw_buf b = {0};
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "general.architecture", CAIRN_GGUF_STRING);
    gw_str(&b, "llama");
    char err[256];
    cairn_gguf *g = NULL;
    assert_int_equal(cairn_gguf_open_memory(b.p, b.n, &g, err, sizeof err), CAIRN_OK);
    assert_int_equal(cairn_gguf_n_tensors(g), 0);
    assert_null(cairn_gguf_find_tensor(g, "x"));
    cairn_gguf_close(g);
    /* empty input */
    assert_int_equal(cairn_gguf_open_memory(NULL, 0, &g, err, sizeof err), CAIRN_EFORMAT);
    free(b.p);
}

/* ---- truncation and corruption -------------------------------------------- */

static void test_truncation_written(void **state)
{
    (void)state;
    gw_buf b = {0};
    build_full(&b, 3, 32);
    char err[256];
    /* The last tensor ends at the last byte, so every proper prefix is bad.
     * Copy each prefix into its own allocation so ASan sees over-reads. */
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, b.p, n);
        err[0] = '\0';
        int rc = open_and_walk(p, n, err, sizeof err);
        if (rc != CAIRN_EFORMAT)
            fail_msg("prefix %zu of %zu: status %d (%s)", n, b.n, rc, err);
        assert_true(strlen(err) > 0);
        free(p);
    }
    assert_int_equal(open_and_walk(b.p, b.n, err, sizeof err), CAIRN_OK);
    free(b.p);
}

static void test_truncation_stories(void **state)
{
    (void)state;
    size_t size;
    uint8_t *img = read_whole(model_path(), &size);
    assert_non_null(img);
    char err[256];
    /* Every prefix in the first 8 KB (the header with the vocabulary), then a
     * stride through the rest. */
    for (size_t n = 0; n < size; n += (n < 8192 ? 1 : 997)) {
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, img, n);
        int rc = open_and_walk(p, n, err, sizeof err);
        if (rc != CAIRN_EFORMAT)
            fail_msg("prefix %zu of %zu: status %d (%s)", n, size, rc, err);
        free(p);
    }
    assert_int_equal(open_and_walk(img, size - 1, err, sizeof err), CAIRN_EFORMAT);
    assert_non_null(strstr(err, "truncated"));
    free(img);
}

/* splitmix64 from a fixed state: deterministic across runs */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static void corrupt_many(const uint8_t *orig, size_t size, size_t region, int iters)
{
    uint8_t *p = malloc(size);
    char err[256];
    int opened = 0, failed = 0;
    for (int it = 0; it < iters; it++) {
        memcpy(p, orig, size);
        int flips = 1 + (int)(support_splitmix64(&rng_state) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(support_splitmix64(&rng_state) % region);
            switch (support_splitmix64(&rng_state) % 3) {
            case 0: p[at] ^= (uint8_t)(1u << (support_splitmix64(&rng_state) % 8)); break;
            case 1: p[at] = (uint8_t)support_splitmix64(&rng_state); break;
            default: p[at] = 0xFF; break;
            }
        }
        int rc = open_and_walk(p, size, err, sizeof err);
        if (rc == CAIRN_OK)
            opened++;
        else if (rc == CAIRN_EFORMAT || rc == CAIRN_EUNSUPPORTED)
            failed++;
        else
            fail_msg("iteration %d: unexpected status %d (%s)", it, rc, err);
    }
    /* Both outcomes must occur, or the corruption is not reaching the parser. */
    assert_true(opened > 0);
    assert_true(failed > 0);
    free(p);
}

static void test_corruption(void **state)
{
    (void)state;
    gw_buf b = {0};
    build_full(&b, 3, 32);
    corrupt_many(b.p, b.n, b.n, 20000);
    free(b.p);

    size_t size;
    uint8_t *img = read_whole(model_path(), &size);
    assert_non_null(img);
    corrupt_many(img, size, 8192, 3000);
    free(img);
}

/* ---- crafted bad fields --------------------------------------------------- */

static int open_buf(gw_buf *b, char *err, size_t err_len)
{
    cairn_gguf *g = NULL;
    int rc = cairn_gguf_open_memory(b->p, b->n, &g, err, err_len);
    cairn_gguf_close(g);
    free(b->p);
    *b = (gw_buf){0};
    return rc;
}

#define EXPECT_FAIL(b, code, substr)                                                      \
    do {                                                                                   \
        char err_[256] = "";                                                               \
        int rc_ = open_buf(&(b), err_, sizeof err_);                                       \
        if (rc_ != (code) || !strstr(err_, (substr)))                                      \
            fail_msg("expected %d containing '%s', got %d: '%s'", (code), (substr), rc_,  \
                     err_);                                                                \
    } while (0)

/* One tensor file with a given tensor info tail; data of `data_len` bytes. */
static void one_tensor(gw_buf *b, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                       uint64_t offset, size_t data_len)
{
    gw_header(b, 3, 1, 0);
    gw_tensor_info(b, "t", n_dims, ne, type, offset);
    gw_pad(b, 32);
    gw_fill(b, 0, data_len);
}

static void test_crafted(void **state)
{
    (void)state;
    gw_buf b = {0};

    gw_put(&b, "GGUX", 4), gw_u32(&b, 3), gw_u64(&b, 0), gw_u64(&b, 0);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "magic");
    gw_header(&b, 1, 0, 0);
    EXPECT_FAIL(b, CAIRN_EUNSUPPORTED, "version 1");
    gw_header(&b, 0x03000000, 0, 0);
    EXPECT_FAIL(b, CAIRN_EUNSUPPORTED, "big-endian");

    /* huge counts in the header */
    gw_header(&b, 3, 0, UINT64_MAX);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "metadata pairs");
    gw_header(&b, 3, 1ull << 40, 0);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "tensors");

    /* huge string length */
    gw_header(&b, 3, 0, 1);
    gw_u64(&b, UINT64_MAX), gw_put(&b, "abcdefghijklmnop", 16);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "key length");
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", CAIRN_GGUF_STRING);
    gw_u64(&b, 1ull << 33);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "exceeds the limit");
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", CAIRN_GGUF_STRING);
    gw_u64(&b, 100), gw_put(&b, "short", 5);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "truncated: metadata 0 ('k') string value");

    /* huge array counts */
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", CAIRN_GGUF_ARRAY);
    gw_u32(&b, CAIRN_GGUF_UINT64), gw_u64(&b, 1ull << 61);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "array count");
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", CAIRN_GGUF_ARRAY);
    gw_u32(&b, CAIRN_GGUF_UINT64), gw_u64(&b, 1000), gw_u64(&b, 1);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "runs past end of file");
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", CAIRN_GGUF_ARRAY);
    gw_u32(&b, CAIRN_GGUF_STRING), gw_u64(&b, 1ull << 31), gw_str(&b, "a");
    EXPECT_FAIL(b, CAIRN_EFORMAT, "strings runs past end of file");
    /* unknown value type, unknown array element type */
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", 13), gw_u64(&b, 0);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "unknown value type 13");
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", CAIRN_GGUF_ARRAY);
    gw_u32(&b, 99), gw_u64(&b, 0);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "unknown element type 99");
    /* bool that is neither 0 nor 1 */
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", CAIRN_GGUF_BOOL), gw_u8(&b, 7);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "bool");
    /* nesting too deep */
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "k", CAIRN_GGUF_ARRAY);
    for (int d = 0; d < 20; d++)
        gw_u32(&b, CAIRN_GGUF_ARRAY), gw_u64(&b, 1);
    gw_u32(&b, CAIRN_GGUF_UINT8), gw_u64(&b, 0);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "nested deeper");
    /* duplicate keys */
    gw_header(&b, 3, 0, 2);
    gw_kv(&b, "k", CAIRN_GGUF_UINT8), gw_u8(&b, 1);
    gw_kv(&b, "k", CAIRN_GGUF_UINT8), gw_u8(&b, 2);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "duplicate metadata key 'k'");
    /* empty key, key with NUL */
    gw_header(&b, 3, 0, 1);
    gw_u64(&b, 0), gw_u32(&b, CAIRN_GGUF_UINT8), gw_u8(&b, 1);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "empty key");
    gw_header(&b, 3, 0, 1);
    gw_u64(&b, 3), gw_put(&b, "a\0b", 3), gw_u32(&b, CAIRN_GGUF_UINT8), gw_u8(&b, 1);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "NUL");
    /* bad alignment values */
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "general.alignment", CAIRN_GGUF_UINT32), gw_u32(&b, 48);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "power of two");
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "general.alignment", CAIRN_GGUF_UINT32), gw_u32(&b, 0);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "power of two");
    gw_header(&b, 3, 0, 1);
    gw_kv(&b, "general.alignment", CAIRN_GGUF_STRING), gw_str(&b, "32");
    EXPECT_FAIL(b, CAIRN_EFORMAT, "general.alignment");

    /* tensors */
    uint64_t ne[5] = {8, 2, 1, 1, 1};
    one_tensor(&b, 2, ne, CAIRN_TYPE_F32, 0, 64);
    {
        char err[256];
        assert_int_equal(open_buf(&b, err, sizeof err), CAIRN_OK);
    }
    one_tensor(&b, 5, ne, CAIRN_TYPE_F32, 0, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "5 dimensions");
    one_tensor(&b, 0, ne, CAIRN_TYPE_F32, 0, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "0 dimensions");
    one_tensor(&b, 2, ne, CAIRN_TYPE_F32, 16, 128);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "not a multiple of the alignment");
    one_tensor(&b, 2, ne, CAIRN_TYPE_F32, 0, 63);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "runs past end of file");
    one_tensor(&b, 2, ne, CAIRN_TYPE_F32, 32, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "runs past end of file");
    one_tensor(&b, 2, ne, 1000, 0, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "unknown tensor type 1000");
    one_tensor(&b, 2, ne, 16 /* IQ2_XXS */, 0, 64);
    EXPECT_FAIL(b, CAIRN_EUNSUPPORTED, "tensor type 16");
    one_tensor(&b, 2, ne, CAIRN_TYPE_Q8_0, 0, 64); /* 8 is not a multiple of 32 */
    EXPECT_FAIL(b, CAIRN_EFORMAT, "block size");
    uint64_t huge[4] = {1ull << 40, 1ull << 40, 1, 1};
    one_tensor(&b, 2, huge, CAIRN_TYPE_F32, 0, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "overflows");
    uint64_t big[2] = {1ull << 62, 1};
    one_tensor(&b, 2, big, CAIRN_TYPE_F64, 0, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "overflows");
    uint64_t neg[2] = {UINT64_MAX, 1};
    one_tensor(&b, 2, neg, CAIRN_TYPE_F32, 0, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "negative");
    uint64_t wide[2] = {UINT64_MAX / 4, 1};
    one_tensor(&b, 1, wide, CAIRN_TYPE_F32, 0, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "runs past end of file");
    one_tensor(&b, 2, ne, CAIRN_TYPE_F32, UINT64_MAX - 31, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "runs past end of file");

    /* Overlapping and duplicate tensors. */
    gw_header(&b, 3, 2, 0);
    gw_tensor_info(&b, "x", 1, ne, CAIRN_TYPE_F32, 0);  /* 32 bytes */
    uint64_t ne64[1] = {16};
    gw_tensor_info(&b, "y", 1, ne64, CAIRN_TYPE_F32, 0); /* 64 bytes, same start */
    gw_pad(&b, 32);
    gw_fill(&b, 0, 128);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "overlap");
    gw_header(&b, 3, 2, 0);
    gw_tensor_info(&b, "x", 1, ne64, CAIRN_TYPE_F32, 0);   /* [0, 64) */
    gw_tensor_info(&b, "y", 1, ne, CAIRN_TYPE_F32, 32);    /* [32, 64) */
    gw_pad(&b, 32);
    gw_fill(&b, 0, 128);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "overlap");
    gw_header(&b, 3, 2, 0);
    gw_tensor_info(&b, "x", 1, ne, CAIRN_TYPE_F32, 0);
    gw_tensor_info(&b, "x", 1, ne, CAIRN_TYPE_F32, 32);
    gw_pad(&b, 32);
    gw_fill(&b, 0, 64);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "duplicate tensor name 'x'");
    /* adjacent tensors are fine */
    gw_header(&b, 3, 2, 0);
    gw_tensor_info(&b, "x", 1, ne, CAIRN_TYPE_F32, 0);
    gw_tensor_info(&b, "y", 1, ne, CAIRN_TYPE_F32, 32);
    gw_pad(&b, 32);
    gw_fill(&b, 0, 64);
    {
        char err[256];
        assert_int_equal(open_buf(&b, err, sizeof err), CAIRN_OK);
    }
    /* tensor name too long, truncated name */
    gw_header(&b, 3, 1, 0);
    gw_u64(&b, 5000);
    gw_fill(&b, 'a', 5000);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "tensor info 0 name length");
    gw_header(&b, 3, 1, 0);
    gw_u64(&b, 500);
    gw_fill(&b, 'a', 100);
    EXPECT_FAIL(b, CAIRN_EFORMAT, "truncated: tensor info 0 name runs past end of file");
}

/* ---- built in memory (cairn_gguf_builder) ---------------------------------- */

static int released;
static void count_release(void *ptr, size_t size)
{
    (void)size;
    free(ptr);
    released++;
}

static void test_builder_roundtrip(void **state)
{
    (void)state;
    cairn_gguf_builder *b = NULL;
    assert_int_equal(cairn_gguf_builder_new(&b), CAIRN_OK);
    float *w = malloc(4 * 3 * sizeof *w);
    for (int i = 0; i < 12; i++)
        w[i] = (float)i;
    uint8_t *q = calloc(2, 20); /* two Q4_Z blocks: cairn's own type, allowed here */
    released = 0;
    assert_int_equal(cairn_gguf_builder_keep(b, (cairn_gguf_keep){w, 48, count_release}), CAIRN_OK);
    assert_int_equal(cairn_gguf_builder_keep(b, (cairn_gguf_keep){q, 40, count_release}), CAIRN_OK);
    const char *strs[] = {"a", "bc", ""};
    const int32_t ints[] = {1, -2, 3};
    cairn_gguf_builder_set_str(b, "general.architecture", "qwen2");
    cairn_gguf_builder_set_u32(b, "qwen2.block_count", 7);
    cairn_gguf_builder_set_f32(b, "qwen2.rope.freq_base", 1e6f);
    cairn_gguf_builder_set_bool(b, "tokenizer.ggml.add_bos_token", true);
    cairn_gguf_builder_set_arr_str(b, "tokenizer.ggml.tokens", strs, NULL, 3);
    cairn_gguf_builder_set_arr(b, "tokenizer.ggml.token_type", CAIRN_GGUF_INT32, ints, 3);
    const int64_t ne[2] = {4, 3}, qne[2] = {32, 2};
    assert_int_equal(cairn_gguf_builder_add_tensor(b, "w", CAIRN_TYPE_F32, 2, ne, w), CAIRN_OK);
    assert_int_equal(cairn_gguf_builder_add_tensor(b, "q", CAIRN_TYPE_Q4_Z, 2, qne, q), CAIRN_OK);
    cairn_gguf *g = NULL;
    char err[256];
    assert_int_equal(cairn_gguf_builder_finish(b, &g, err, sizeof err), CAIRN_OK);
    const char *s;
    size_t len;
    uint32_t u;
    float f;
    bool flag;
    assert_int_equal(cairn_gguf_get_str(g, "general.architecture", &s, &len), CAIRN_OK);
    assert_string_equal(s, "qwen2");
    assert_int_equal(cairn_gguf_get_u32(g, "qwen2.block_count", &u), CAIRN_OK);
    assert_int_equal(u, 7);
    assert_int_equal(cairn_gguf_get_f32(g, "qwen2.rope.freq_base", &f), CAIRN_OK);
    assert_true(f == 1e6f);
    assert_int_equal(cairn_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &flag), CAIRN_OK);
    assert_true(flag);
    assert_int_equal(cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 1, &s, &len), CAIRN_OK);
    assert_string_equal(s, "bc");
    assert_int_equal(cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", 2, &s, &len), CAIRN_OK);
    assert_int_equal(len, 0);
    const cairn_gguf_tensor *t = cairn_gguf_find_tensor(g, "w");
    assert_non_null(t);
    assert_ptr_equal(t->data, w); /* not copied */
    assert_int_equal(t->size, 48);
    assert_int_equal(t->ne[1], 3);
    t = cairn_gguf_find_tensor(g, "q");
    assert_non_null(t);
    assert_int_equal(t->type, CAIRN_TYPE_Q4_Z);
    assert_int_equal(t->size, 40);
    assert_int_equal(released, 0);
    cairn_gguf_close(g);
    assert_int_equal(released, 2); /* the kept blocks go with the handle */
}

static void test_builder_errors(void **state)
{
    (void)state;
    /* a bad call is sticky: finish reports it and releases what was kept */
    cairn_gguf_builder *b = NULL;
    assert_int_equal(cairn_gguf_builder_new(&b), CAIRN_OK);
    released = 0;
    assert_int_equal(cairn_gguf_builder_keep(b, (cairn_gguf_keep){malloc(8), 8, count_release}),
                     CAIRN_OK);
    float x[32] = {0};
    const int64_t bad[1] = {33}; /* not whole Q4_Z blocks */
    assert_int_equal(cairn_gguf_builder_add_tensor(b, "x", CAIRN_TYPE_Q4_Z, 1, bad, x),
                     CAIRN_EINVAL);
    assert_int_equal(cairn_gguf_builder_set_u32(b, "later", 1), CAIRN_EINVAL);
    cairn_gguf *g = NULL;
    char err[256] = "";
    assert_int_equal(cairn_gguf_builder_finish(b, &g, err, sizeof err), CAIRN_EINVAL);
    assert_null(g);
    assert_int_equal(released, 1);
    assert_true(strlen(err) > 0);

    /* duplicate names are refused by the parser, as in a file */
    assert_int_equal(cairn_gguf_builder_new(&b), CAIRN_OK);
    const int64_t ne[1] = {32};
    cairn_gguf_builder_add_tensor(b, "x", CAIRN_TYPE_F32, 1, ne, x);
    cairn_gguf_builder_add_tensor(b, "x", CAIRN_TYPE_F32, 1, ne, x);
    assert_int_equal(cairn_gguf_builder_finish(b, &g, err, sizeof err), CAIRN_EFORMAT);
    assert_non_null(strstr(err, "duplicate"));
}

/* cairn's own in-memory types are never valid in a file */
static void test_own_types_refused_in_files(void **state)
{
    (void)state;
    gw_buf b = {0};
    gw_header(&b, 3, 1, 0);
    const uint64_t ne[2] = {32, 1};
    gw_tensor_info(&b, "q", 2, ne, CAIRN_TYPE_Q4_Z, 0);
    gw_pad(&b, 32);
    gw_fill(&b, 0, 20);
    cairn_gguf *g = NULL;
    char err[256] = "";
    assert_int_equal(cairn_gguf_open_memory(b.p, b.n, &g, err, sizeof err), CAIRN_EFORMAT);
    assert_non_null(strstr(err, "own"));
    free(b.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_metadata),   cmocka_unit_test(test_open_missing_file),
        cmocka_unit_test(test_written_roundtrip),  cmocka_unit_test(test_no_tensors),
        cmocka_unit_test(test_truncation_written), cmocka_unit_test(test_truncation_stories),
        cmocka_unit_test(test_corruption),         cmocka_unit_test(test_crafted),
        cmocka_unit_test(test_builder_roundtrip),  cmocka_unit_test(test_builder_errors),
        cmocka_unit_test(test_own_types_refused_in_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
