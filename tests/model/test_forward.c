/*
 * tests/model/test_forward.c — the forward pass on stories260K against an
 * independent numpy implementation (tests/ref/llama_ref.py, which reads the
 * GGUF with the `gguf` Python package), and the properties the rest of
 * cairn relies on: chunked and incremental evaluation, several sequences in
 * one batch, scattered page tables, and clean errors for bad input.
 *
 * argv[1] = python interpreter, argv[2] = tests/ref/llama_ref.py
 * argv[3] (optional) = another model (a synthetic qwen2 or Llama 3 one) for
 *                      the tests that do not depend on stories260K's text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"
#include "store/tiers.h"
#include "tests/support/support.h"

static const char *python, *ref_script, *model_path;

/* "Once upon a time" with BOS, then the 32 tokens a greedy reference decode
 * produces (models/README.md). */
static const int32_t prompt[] = {1, 403, 407, 261, 378};
static const int32_t continuation[] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                       338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322,
                                       265, 282, 295, 433, 426, 385, 328, 432, 358, 394};
#define N_PROMPT 5
#define N_CONT 32
#define N_ALL (N_PROMPT + N_CONT)

typedef struct {
    cairn_backend *be;
    cairn_model *m;
    int n_vocab, dim;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    char err[256] = "";
    assert_int_equal(cairn_backend_cpu_create(2, &f->be), CAIRN_OK);
    cairn_model_params p = {.max_batch_tokens = 64, .max_seqs = 4};
    int rc = cairn_model_load(model_path, f->be, &p, &f->m, err, sizeof err);
    if (rc != CAIRN_OK)
        fail_msg("load %s: %s", model_path, err);
    f->n_vocab = cairn_model_hparams(f->m)->n_vocab;
    f->dim = cairn_model_hparams(f->m)->dim;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    cairn_model_free(f->m);
    cairn_backend_destroy(f->be);
    free(f);
    return 0;
}

static cairn_page_pool *make_pool(fixture *f, int page_size, cairn_type dtype, int n_pages,
                                  cairn_kv_layout *kv)
{
    cairn_page_pool *pool;
    assert_int_equal(cairn_model_kv_layout(f->m, page_size, dtype, kv), CAIRN_OK);
    assert_int_equal(cairn_page_pool_create(f->be, kv, (size_t)n_pages * kv->page_bytes, &pool),
                     CAIRN_OK);
    return pool;
}

/* Run the numpy reference on `tokens`; returns malloc'ed logits [n][n_vocab]
 * and hidden states [n][dim]. */
static void run_reference(fixture *f, const int32_t *tokens, int n, float **logits, float **hidden)
{
    char dir[] = "/tmp/cairn-ref-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[4096], ids[1024] = "", lpath[128], hpath[128];
    for (int i = 0; i < n; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), i ? ",%d" : "%d", tokens[i]);
    snprintf(lpath, sizeof lpath, "%s/logits.f32", dir);
    snprintf(hpath, sizeof hpath, "%s/hidden.f32", dir);
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' --tokens %s --out %s --hidden %s", python,
             ref_script, model_path, ids, lpath, hpath);
    if (system(cmd) != 0)
        fail_msg("reference failed: %s", cmd);
    const char *paths[2] = {lpath, hpath};
    size_t sizes[2] = {(size_t)n * f->n_vocab, (size_t)n * f->dim};
    float **outs[2] = {logits, hidden};
    for (int i = 0; i < 2; i++) {
        FILE *fp = fopen(paths[i], "rb");
        assert_non_null(fp);
        *outs[i] = malloc(sizes[i] * sizeof(float));
        assert_int_equal(fread(*outs[i], sizeof(float), sizes[i], fp), sizes[i]);
        fclose(fp);
        unlink(paths[i]);
    }
    rmdir(dir);
}

/* Every row within `rel` of the row's largest reference magnitude. */
static void assert_rows_close(const float *got, const float *want, int rows, int cols, double rel)
{
    for (int r = 0; r < rows; r++) {
        double scale = 0;
        for (int c = 0; c < cols; c++)
            scale = fmax(scale, fabs(want[(size_t)r * cols + c]));
        for (int c = 0; c < cols; c++) {
            double d = fabs((double)got[(size_t)r * cols + c] - want[(size_t)r * cols + c]);
            if (d > rel * scale)
                fail_msg("row %d col %d: got %.7g want %.7g (|diff| %.3g > %.1g x %.4g)", r, c,
                         got[(size_t)r * cols + c], want[(size_t)r * cols + c], d, rel, scale);
        }
    }
}

static void all_tokens(int32_t *out)
{
    memcpy(out, prompt, sizeof prompt);
    memcpy(out + N_PROMPT, continuation, sizeof continuation);
}

/* All 37 positions in one call, F32 KV, against numpy in float64. */
static void test_logits_match_reference(void **state)
{
    fixture *f = *state;
    int32_t toks[N_ALL];
    all_tokens(toks);
    cairn_kv_layout kv;
    cairn_page_pool *pool = make_pool(f, 16, CAIRN_TYPE_F32, 8, &kv);
    int32_t pages[3] = {0, 1, 2};
    uint8_t want[N_ALL];
    memset(want, 1, sizeof want);
    cairn_seq_batch sb = {.tokens = toks, .n_tokens = N_ALL, .pages = pages, .want = want};
    float *logits = malloc((size_t)N_ALL * f->n_vocab * sizeof(float));
    float *hidden = malloc((size_t)N_ALL * f->dim * sizeof(float));
    int n_out = 0;
    assert_int_equal(cairn_model_forward(f->m, cairn_page_pool_base(pool), &kv, &sb, 1, logits,
                                         hidden, &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, N_ALL);

    float *ref_logits, *ref_hidden;
    run_reference(f, toks, N_ALL, &ref_logits, &ref_hidden);
    assert_rows_close(logits, ref_logits, N_ALL, f->n_vocab, 1e-4);
    assert_rows_close(hidden, ref_hidden, N_ALL, f->dim, 1e-4);
    /* and the greedy choice at every position is the reference's */
    for (int i = 0; i < N_ALL; i++)
        assert_int_equal(support_argmax(logits + (size_t)i * f->n_vocab, f->n_vocab),
                         support_argmax(ref_logits + (size_t)i * f->n_vocab, f->n_vocab));
    free(ref_logits);
    free(ref_hidden);
    free(logits);
    free(hidden);
    cairn_page_pool_free(pool);
}

/* cairn_model_set_feature_layers: forward_features returns the residual
 * stream entering the chosen layers, side by side in the order asked, as
 * the numpy reference computes it (a middle layer, the last one's input, the
 * embeddings and the stream leaving the last layer), in two chunks so
 * the KV written by the first is read by the second; n = 0 restores the
 * final normed state. */
static void test_feature_layers(void **state)
{
    fixture *f = *state;
    const int L = cairn_model_hparams(f->m)->n_layer;
    const int layers[4] = {L / 2, L - 1, 0, L}, n = 4;
    int32_t toks[N_ALL];
    all_tokens(toks);
    cairn_kv_layout kv;
    cairn_page_pool *pool = make_pool(f, 16, CAIRN_TYPE_F32, 8, &kv);
    int32_t pages[3] = {2, 0, 1};
    assert_int_equal(cairn_model_set_feature_layers(f->m, layers, n), CAIRN_OK);
    assert_int_equal(cairn_model_feature_dim(f->m), n * f->dim);
    float *got = malloc((size_t)N_ALL * n * f->dim * sizeof(float));
    const int first = 20;
    for (int c = 0; c < 2; c++) {
        const int from = c ? first : 0, cnt = c ? N_ALL - first : first;
        cairn_seq_batch sb = {.tokens = toks + from, .n_tokens = cnt, .kv_start = from,
                              .pages = pages};
        int n_out = 0;
        assert_int_equal(cairn_model_forward_features(f->m, cairn_page_pool_base(pool), &kv, &sb,
                                                      1, NULL, got + (size_t)from * n * f->dim,
                                                      &n_out),
                         CAIRN_OK);
    }

    char dir[] = "/tmp/cairn-ref-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[4096], ids[1024] = "", spath[128];
    for (int i = 0; i < N_ALL; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), i ? ",%d" : "%d", toks[i]);
    snprintf(spath, sizeof spath, "%s/states.f32", dir);
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' --tokens %s --layer-states %d,%d,%d,%d --states %s",
             python, ref_script, model_path, ids, layers[0], layers[1], layers[2], layers[3],
             spath);
    if (system(cmd) != 0)
        fail_msg("reference failed: %s", cmd);
    float *want = malloc((size_t)N_ALL * n * f->dim * sizeof(float));
    FILE *fp = fopen(spath, "rb");
    assert_non_null(fp);
    assert_int_equal(fread(want, sizeof(float), (size_t)N_ALL * n * f->dim, fp),
                     (size_t)N_ALL * n * f->dim);
    fclose(fp);
    unlink(spath);
    rmdir(dir);
    /* each layer's row on its own scale: the stream grows with depth */
    assert_rows_close(got, want, N_ALL * n, f->dim, 1e-4);

    /* invalid choices are refused and leave the setting alone */
    const int bad[2] = {0, L + 1};
    assert_int_equal(cairn_model_set_feature_layers(f->m, bad, 2), CAIRN_EINVAL);
    assert_int_equal(cairn_model_set_feature_layers(f->m, layers, CAIRN_MAX_FEATURE_LAYERS + 1),
                     CAIRN_EINVAL);
    assert_int_equal(cairn_model_feature_dim(f->m), n * f->dim);
    /* n = 0: the final state after the output norm again (forward's hidden) */
    assert_int_equal(cairn_model_set_feature_layers(f->m, NULL, 0), CAIRN_OK);
    assert_int_equal(cairn_model_feature_dim(f->m), f->dim);
    float *feat = malloc((size_t)N_ALL * f->dim * sizeof(float));
    float *hidden = malloc((size_t)f->dim * sizeof(float));
    cairn_seq_batch sb = {.tokens = toks, .n_tokens = N_ALL, .pages = pages};
    int n_out = 0;
    assert_int_equal(cairn_model_forward_features(f->m, cairn_page_pool_base(pool), &kv, &sb, 1,
                                                  NULL, feat, &n_out),
                     CAIRN_OK);
    assert_int_equal(cairn_model_forward(f->m, cairn_page_pool_base(pool), &kv, &sb, 1, NULL,
                                         hidden, &n_out),
                     CAIRN_OK);
    assert_rows_close(feat + (size_t)(N_ALL - 1) * f->dim, hidden, 1, f->dim, 1e-6);
    free(feat);
    free(hidden);
    free(got);
    free(want);
    cairn_page_pool_free(pool);
}

/* Greedy decoding one token at a time reproduces the known continuation, with
 * both KV types and a page size that does not divide anything evenly. */
static void greedy_decode(fixture *f, cairn_type dtype, int page_size)
{
    cairn_kv_layout kv;
    int n_pages = (N_ALL + page_size - 1) / page_size;
    cairn_page_pool *pool = make_pool(f, page_size, dtype, n_pages + 4, &kv);
    int32_t pages[64];
    /* take pages in reverse so the table is not the identity */
    for (int i = 0; i < n_pages; i++)
        pages[i] = n_pages + 3 - i;
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    int n_out;
    cairn_seq_batch sb = {.tokens = prompt, .n_tokens = N_PROMPT, .pages = pages};
    assert_int_equal(cairn_model_forward(f->m, cairn_page_pool_base(pool), &kv, &sb, 1, logits,
                                         NULL, &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, 1);
    for (int i = 0; i < N_CONT; i++) {
        int32_t tok = support_argmax(logits, f->n_vocab);
        if (tok != continuation[i])
            fail_msg("kv %s page %d: token %d is %d, expected %d",
                     dtype == CAIRN_TYPE_F16 ? "f16" : "f32", page_size, i, tok, continuation[i]);
        sb = (cairn_seq_batch){.tokens = &tok, .n_tokens = 1, .kv_start = N_PROMPT + i,
                               .pages = pages};
        assert_int_equal(cairn_model_forward(f->m, cairn_page_pool_base(pool), &kv, &sb, 1,
                                             logits, NULL, &n_out),
                         CAIRN_OK);
    }
    free(logits);
    cairn_page_pool_free(pool);
}

static void test_greedy_continuation(void **state)
{
    greedy_decode(*state, CAIRN_TYPE_F32, 16);
    greedy_decode(*state, CAIRN_TYPE_F16, 16);
    greedy_decode(*state, CAIRN_TYPE_F32, 3);
}

/* Evaluating in chunks (prefill in pieces, then single tokens) gives the same
 * logits as one call over everything. */
static void test_chunked_equals_whole(void **state)
{
    fixture *f = *state;
    int32_t toks[N_ALL];
    all_tokens(toks);
    cairn_kv_layout kv;
    cairn_page_pool *pool = make_pool(f, 8, CAIRN_TYPE_F32, 16, &kv);
    int32_t pages_a[5] = {0, 1, 2, 3, 4}, pages_b[5] = {9, 7, 5, 11, 13};
    uint8_t want[N_ALL];
    memset(want, 1, sizeof want);
    float *whole = malloc((size_t)N_ALL * f->n_vocab * sizeof(float));
    float *piece = malloc((size_t)N_ALL * f->n_vocab * sizeof(float));
    int n_out;
    cairn_seq_batch sb = {.tokens = toks, .n_tokens = N_ALL, .pages = pages_a, .want = want};
    assert_int_equal(cairn_model_forward(f->m, cairn_page_pool_base(pool), &kv, &sb, 1, whole,
                                         NULL, &n_out),
                     CAIRN_OK);
    const int cuts[] = {0, 7, 20, 21, 22, 30, N_ALL};
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++) {
        sb = (cairn_seq_batch){.tokens = toks + cuts[c], .n_tokens = cuts[c + 1] - cuts[c],
                               .kv_start = cuts[c], .pages = pages_b, .want = want};
        assert_int_equal(cairn_model_forward(f->m, cairn_page_pool_base(pool), &kv, &sb, 1,
                                             piece + (size_t)cuts[c] * f->n_vocab, NULL, &n_out),
                         CAIRN_OK);
        assert_int_equal(n_out, cuts[c + 1] - cuts[c]);
    }
    assert_rows_close(piece, whole, N_ALL, f->n_vocab, 1e-5);
    free(whole);
    free(piece);
    cairn_page_pool_free(pool);
}

/* Several sequences in one call give what each gives alone: batching must not
 * change results. Sequence 1 continues from KV written by an earlier call. */
static void test_batch_of_sequences(void **state)
{
    fixture *f = *state;
    int32_t toks[N_ALL];
    all_tokens(toks);
    cairn_kv_layout kv;
    cairn_page_pool *pool = make_pool(f, 4, CAIRN_TYPE_F32, 64, &kv);
    void *base = cairn_page_pool_base(pool);
    int32_t pg[3][10];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 10; i++)
            pg[s][i] = i * 3 + s; /* interleaved page ownership */
    int n_out;
    /* seq 1 first gets 10 tokens of history on its own */
    cairn_seq_batch pre = {.tokens = toks, .n_tokens = 10, .pages = pg[1]};
    float *alone = malloc((size_t)3 * f->n_vocab * sizeof(float));
    float *together = malloc((size_t)3 * f->n_vocab * sizeof(float));
    assert_int_equal(cairn_model_forward(f->m, base, &kv, &pre, 1, alone, NULL, &n_out), CAIRN_OK);

    cairn_seq_batch seqs[3] = {
        {.tokens = toks, .n_tokens = 12, .pages = pg[0]},
        {.tokens = toks + 10, .n_tokens = 5, .kv_start = 10, .pages = pg[1]},
        {.tokens = toks + 20, .n_tokens = 1, .pages = pg[2]},
    };
    assert_int_equal(cairn_model_forward(f->m, base, &kv, seqs, 3, together, NULL, &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, 3);
    for (int s = 0; s < 3; s++)
        assert_int_equal(cairn_model_forward(f->m, base, &kv, &seqs[s], 1,
                                             alone + (size_t)s * f->n_vocab, NULL, &n_out),
                         CAIRN_OK);
    assert_rows_close(together, alone, 3, f->n_vocab, 1e-6);
    free(alone);
    free(together);
    cairn_page_pool_free(pool);
}

static void test_bad_input(void **state)
{
    fixture *f = *state;
    cairn_kv_layout kv;
    cairn_page_pool *pool = make_pool(f, 16, CAIRN_TYPE_F32, 8, &kv);
    void *base = cairn_page_pool_base(pool);
    int32_t pages[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int32_t bad_tok[2] = {1, 512}; /* vocab is 512 */
    int32_t many[65] = {0};
    float logits[512];
    int n_out;
    cairn_seq_batch sb = {.tokens = bad_tok, .n_tokens = 2, .pages = pages};
    assert_int_equal(cairn_model_forward(f->m, base, &kv, &sb, 1, logits, NULL, &n_out),
                     CAIRN_EINVAL);
    sb = (cairn_seq_batch){.tokens = many, .n_tokens = 65, .pages = pages}; /* max 64 */
    assert_int_equal(cairn_model_forward(f->m, base, &kv, &sb, 1, logits, NULL, &n_out),
                     CAIRN_ERANGE);
    sb = (cairn_seq_batch){.tokens = many, .n_tokens = 0, .pages = pages};
    assert_int_equal(cairn_model_forward(f->m, base, &kv, &sb, 1, logits, NULL, &n_out),
                     CAIRN_EINVAL);
    cairn_seq_batch five[5] = {{0}};
    assert_int_equal(cairn_model_forward(f->m, base, &kv, five, 5, logits, NULL, &n_out),
                     CAIRN_ERANGE);
    cairn_kv_layout wrong;
    assert_int_equal(cairn_kv_layout_init(&wrong, 5, 2, 8, 16, CAIRN_TYPE_F32), CAIRN_OK);
    sb = (cairn_seq_batch){.tokens = many, .n_tokens = 1, .pages = pages};
    assert_int_equal(cairn_model_forward(f->m, base, &wrong, &sb, 1, logits, NULL, &n_out),
                     CAIRN_EINVAL);
    cairn_page_pool_free(pool);
}

/* Loads an edited copy of the model on `be`: its status, *m, err. */
static int load_edited(void (*edit)(unsigned char *buf, size_t *len), cairn_backend *be,
                       cairn_model **m, char *err, size_t err_len)
{
    FILE *fp = fopen(model_path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    size_t len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc(len);
    assert_int_equal(fread(buf, 1, len, fp), len);
    fclose(fp);
    edit(buf, &len);
    char path[] = "/tmp/cairn-edited-model-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, len), (ssize_t)len);
    close(fd);
    free(buf);
    int rc = cairn_model_load(path, be, NULL, m, err, err_len);
    unlink(path);
    return rc;
}

/* Writes a damaged copy of the model and checks the load error. */
static void expect_load_error(const char *what, void (*damage)(unsigned char *buf, size_t *len),
                              int want_rc, const char *want_msg)
{
    cairn_backend *be;
    cairn_model *m = NULL;
    char err[256] = "";
    assert_int_equal(cairn_backend_cpu_create(1, &be), CAIRN_OK);
    int rc = load_edited(damage, be, &m, err, sizeof err);
    if (rc != want_rc)
        fail_msg("%s: rc %d (%s), expected %d", what, rc, err, want_rc);
    assert_null(m);
    if (!strstr(err, want_msg))
        fail_msg("%s: message '%s' does not mention '%s'", what, err, want_msg);
    cairn_backend_destroy(be);
}

static void truncate_half(unsigned char *buf, size_t *len)
{
    (void)buf;
    *len /= 2;
}

static unsigned char *find_bytes(unsigned char *buf, size_t len, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(buf + i, s, n) == 0)
            return buf + i;
    return NULL;
}

/* general.architecture's value "llama" (length-prefixed) becomes "llamb". */
static void rename_arch(unsigned char *buf, size_t *len)
{
    unsigned char *key = find_bytes(buf, *len, "general.architecture");
    assert_non_null(key);
    unsigned char *val = find_bytes(key, *len - (size_t)(key - buf), "llama");
    assert_non_null(val);
    val[4] = 'b';
}

/* Tensor `name` of a block (blk.N.…) is renamed blk.x…, so it is missing. */
static void misname_tensor(unsigned char *buf, size_t len, const char *name)
{
    unsigned char *at = find_bytes(buf, len, name);
    assert_non_null(at);
    at[4] = 'x';
}

static void drop_tensor(unsigned char *buf, size_t *len)
{
    misname_tensor(buf, *len, "blk.3.ffn_up.weight");
}

static void test_load_errors(void **state)
{
    (void)state;
    expect_load_error("truncated", truncate_half, CAIRN_EFORMAT, "");
    expect_load_error("unknown architecture", rename_arch, CAIRN_EUNSUPPORTED, "llamb");
    expect_load_error("missing tensor", drop_tensor, CAIRN_EFORMAT, "blk.3.ffn_up.weight");

    cairn_backend *be;
    cairn_model *m = NULL;
    char err[256] = "";
    assert_int_equal(cairn_backend_cpu_create(1, &be), CAIRN_OK);
    assert_int_not_equal(cairn_model_load("/nonexistent/model.gguf", be, NULL, &m, err, sizeof err),
                         CAIRN_OK);
    assert_null(m);
    assert_true(strlen(err) > 0);
    cairn_backend_destroy(be);
}

/* The u32 value of metadata key `key` (its first occurrence) in a GGUF
 * image: after the length-prefixed key comes the type, then the value. */
static void set_u32_value(unsigned char *buf, size_t len, const char *key, uint32_t v)
{
    unsigned char *k = find_bytes(buf, len, key);
    assert_non_null(k);
    uint32_t type;
    memcpy(&type, k + strlen(key), 4);
    assert_int_equal(type, 4); /* GGUF_TYPE_UINT32 */
    memcpy(k + strlen(key) + 4, &v, 4);
}

static void window_past_context(unsigned char *buf, size_t *len)
{
    set_u32_value(buf, *len, "gemma3.attention.sliding_window", 1u << 20);
}

static void no_swa_period(unsigned char *buf, size_t *len)
{
    set_u32_value(buf, *len, "gemma3.attention.sliding_window_pattern", 0);
}

static void drop_post_norm(unsigned char *buf, size_t *len)
{
    misname_tensor(buf, *len, "blk.1.post_ffw_norm.weight");
}

/* A Gemma 3 file that is inconsistent is refused, naming the field or
 * tensor (the synthetic one ctest writes: window 8, period 3). */
static void test_window_load_errors(void **state)
{
    (void)state;
    expect_load_error("window wider than the context", window_past_context, CAIRN_EFORMAT,
                      "gemma3.attention.sliding_window");
    expect_load_error("window period 0", no_swa_period, CAIRN_EUNSUPPORTED,
                      "gemma3.attention.sliding_window_pattern");
    expect_load_error("missing post-FFN norm", drop_post_norm, CAIRN_EFORMAT,
                      "blk.1.post_ffw_norm.weight");
}

static void more_experts(unsigned char *buf, size_t *len)
{
    set_u32_value(buf, *len, "qwen3moe.expert_count", 7);
}

static void used_past_count(unsigned char *buf, size_t *len)
{
    set_u32_value(buf, *len, "qwen3moe.expert_used_count", 9);
}

static void drop_router(unsigned char *buf, size_t *len)
{
    misname_tensor(buf, *len, "blk.1.ffn_gate_inp.weight");
}

/* A qwen3moe file that is inconsistent is refused, naming what (the
 * synthetic one ctest writes: 6 experts, 2 used). */
static void test_moe_load_errors(void **state)
{
    (void)state;
    /* the router is the first tensor whose shape counts the experts */
    expect_load_error("wrong expert count", more_experts, CAIRN_EFORMAT,
                      "blk.0.ffn_gate_inp.weight");
    expect_load_error("more experts used than there are", used_past_count, CAIRN_EFORMAT,
                      "expert_used_count");
    expect_load_error("missing router", drop_router, CAIRN_EFORMAT, "blk.1.ffn_gate_inp.weight");
}

static void oss_no_window(unsigned char *buf, size_t *len)
{
    set_u32_value(buf, *len, "gpt-oss.attention.sliding_window", 0);
}

static void oss_drop_sinks(unsigned char *buf, size_t *len)
{
    misname_tensor(buf, *len, "blk.1.attn_sinks.weight");
}

static void oss_drop_expert_bias(unsigned char *buf, size_t *len)
{
    misname_tensor(buf, *len, "blk.0.ffn_down_exps.bias");
}

static void oss_more_experts(unsigned char *buf, size_t *len)
{
    set_u32_value(buf, *len, "gpt-oss.expert_count", 7);
}

/* A gpt-oss file that is inconsistent is refused, naming what (the
 * synthetic one ctest writes: 6 experts of 96, 2 used, window 8). */
static void test_oss_load_errors(void **state)
{
    (void)state;
    expect_load_error("no window", oss_no_window, CAIRN_EFORMAT,
                      "gpt-oss.attention.sliding_window");
    expect_load_error("missing sinks", oss_drop_sinks, CAIRN_EFORMAT, "blk.1.attn_sinks.weight");
    expect_load_error("missing expert bias", oss_drop_expert_bias, CAIRN_EFORMAT,
                      "blk.0.ffn_down_exps.bias");
    expect_load_error("wrong expert count", oss_more_experts, CAIRN_EFORMAT,
                      "blk.0.ffn_gate_inp.weight");
}

/* A CPU backend that claims no MXFP4 kernels (as the CUDA backend has
 * none): the loader must rewrite MXFP4 as Q5_0 for it. */
static cairn_backend_iface no_mxfp4_iface;
static const cairn_backend_iface *real_iface;

static int supports_no_mxfp4(const cairn_backend *be, cairn_type t)
{
    return t != CAIRN_TYPE_MXFP4 && real_iface->supports_type(be, t);
}

/* gpt-oss's MXFP4 experts, multiplied as they are and rewritten as Q5_0
 * (model.c, upload_mxfp4): the same integer block sums times the same
 * scales, so the logits are the same bits. */
static void test_mxfp4_native_equals_rewrite(void **state)
{
    fixture *f = *state;
    real_iface = f->be->iface;
    no_mxfp4_iface = *f->be->iface;
    no_mxfp4_iface.supports_type = supports_no_mxfp4;
    cairn_backend other = {.iface = &no_mxfp4_iface, .ctx = f->be->ctx};
    cairn_model *m2 = NULL;
    char err[256] = "";
    cairn_model_params p = {.max_batch_tokens = 64, .max_seqs = 4};
    if (cairn_model_load(model_path, &other, &p, &m2, err, sizeof err) != CAIRN_OK)
        fail_msg("load with the Q5_0 rewrite: %s", err);
    int32_t toks[N_ALL];
    all_tokens(toks);
    cairn_kv_layout kv;
    cairn_page_pool *pool = make_pool(f, 16, CAIRN_TYPE_F32, 4, &kv);
    int32_t pages[3] = {2, 0, 1};
    const size_t n = (size_t)N_ALL * f->n_vocab;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    uint8_t want[N_ALL];
    memset(want, 1, sizeof want);
    cairn_seq_batch sb = {.tokens = toks, .n_tokens = N_ALL, .pages = pages, .want = want};
    int n_out = 0;
    assert_int_equal(cairn_model_forward(f->m, cairn_page_pool_base(pool), &kv, &sb, 1, a, NULL,
                                         &n_out),
                     CAIRN_OK);
    assert_int_equal(cairn_model_forward(m2, cairn_page_pool_base(pool), &kv, &sb, 1, b, NULL,
                                         &n_out),
                     CAIRN_OK);
    KT_SAME_BYTES(a, b, n * sizeof(float), "MXFP4 native vs rewritten as Q5_0");
    free(a);
    free(b);
    cairn_page_pool_free(pool);
    cairn_model_free(m2);
}

/* general.name "llama" becomes "llamb": nothing computed changes */
static void rename_model(unsigned char *buf, size_t *len)
{
    unsigned char *key = find_bytes(buf, *len, "general.name");
    assert_non_null(key);
    unsigned char *val = find_bytes(key, *len - (size_t)(key - buf), "llama");
    assert_non_null(val);
    val[4] = 'b';
}

/* RoPE on 6 of the 8 dimensions of a head: the same weights, other K */
static void fewer_rotated_dims(unsigned char *buf, size_t *len)
{
    set_u32_value(buf, *len, "llama.rope.dimension_count", 6);
}

static void test_fingerprint(void **state)
{
    fixture *f = *state;
    uint8_t a[16], b[16], zero[16] = {0};
    cairn_model_fingerprint(f->m, a);
    assert_memory_not_equal(a, zero, 16);
    /* a second load of the same file gives the same fingerprint */
    cairn_model *m2;
    char err[256];
    assert_int_equal(cairn_model_load(model_path, f->be, NULL, &m2, err, sizeof err), CAIRN_OK);
    cairn_model_fingerprint(m2, b);
    assert_memory_equal(a, b, 16);
    cairn_model_free(m2);
    /* another name: the same pages */
    assert_int_equal(load_edited(rename_model, f->be, &m2, err, sizeof err), CAIRN_OK);
    cairn_model_fingerprint(m2, b);
    assert_memory_equal(a, b, 16);
    cairn_model_free(m2);
    /* the same tensors under other hyper-parameters compute other K/V: never
     * the same cached pages */
    assert_int_equal(load_edited(fewer_rotated_dims, f->be, &m2, err, sizeof err), CAIRN_OK);
    cairn_model_fingerprint(m2, b);
    assert_memory_not_equal(a, b, 16);
    cairn_model_free(m2);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PYTHON REF_SCRIPT [MODEL]\n", argv[0]);
        return 2;
    }
    python = argv[1];
    ref_script = argv[2];
    if (argc >= 4) {
        /* Another architecture: the reference comparison and the properties
         * that hold for any model (its prompt ids are valid in a vocabulary
         * of 512 and up). */
        model_path = argv[3];
        struct CMUnitTest any_model[] = {
            cmocka_unit_test(test_logits_match_reference),
            cmocka_unit_test(test_chunked_equals_whole),
            cmocka_unit_test(test_batch_of_sequences),
            /* the file's own load errors, last: at most one of them runs */
            cmocka_unit_test(test_window_load_errors),
            {0}, /* room for one test of the file's own (gpt-oss) */
        };
        size_t n = sizeof any_model / sizeof any_model[0] - 1;
        if (strstr(model_path, "qwen3moe"))
            any_model[n - 1] = (struct CMUnitTest)cmocka_unit_test(test_moe_load_errors);
        else if (strstr(model_path, "gptoss")) {
            any_model[n - 1] = (struct CMUnitTest)cmocka_unit_test(test_oss_load_errors);
            any_model[n++] = (struct CMUnitTest)cmocka_unit_test(test_mxfp4_native_equals_rewrite);
        }
        else if (!strstr(model_path, "gemma3"))
            n--;
        return _cmocka_run_group_tests("any_model", any_model, n, setup, teardown);
    }
    model_path = getenv("CAIRN_MODEL");
    if (!model_path) {
        fprintf(stderr, "CAIRN_MODEL is not set\n");
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_match_reference),
        cmocka_unit_test(test_greedy_continuation),
        cmocka_unit_test(test_chunked_equals_whole),
        cmocka_unit_test(test_batch_of_sequences),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_feature_layers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
