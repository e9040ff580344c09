/*
 * tests/gpu/test_gpu_model.c — whole forward passes on the CUDA backend
 * against the CPU backend:
 *   - the logits of every row of a 37-token prompt (F32 and F16 KV);
 *   - greedy continuations of several prompts (strict mode only);
 *   - batches of 4, 9, 32 and 64 sequences decoding together equal each
 *     decoding alone (on the GPU): 9 is the first batch past one GEMV
 *     launch, 32 and 64 the serving sizes. Where the backend keeps matmul
 *     rows to themselves (matmul_invariant_rows >= 0: 16-bit and quantized
 *     weights on CUDA) the logits must be the same bytes; F32 weights, which
 *     cuBLAS multiplies with per-size kernels, within 1e-5 of the row's
 *     largest logit;
 *   - a decoding sequence beside prefills that make the step more than 64
 *     tokens, and a verified chain beside one, give the bytes they give
 *     alone (kernels/backend.h, "Batch invariance": the model keeps such
 *     rows on the backend's row-invariant path). The CPU harness stands in
 *     a matmul that rounds differently above 64 rows, as cuBLAS does.
 *
 * usage: test_gpu_model MODEL [loose]
 *   strict (default; the bundled F32 stories260K): logits within 1e-4 of the
 *     row's largest magnitude, greedy tokens identical.
 *   loose (synthetic 16-bit or quantized models with random weights, whose
 *     logits are near-ties everywhere): logits within LOOSE_RTOL = 1e-3 of
 *     the row's largest magnitude, no greedy comparison. The 37 tokens here
 *     stay on the GEMV, float arithmetic on both sides (the CPU in exact
 *     mode, BF16 without vdpbf16ps), so only the order of additions
 *     differs: ten times the strict bound for the deeper random models,
 *     not the 5e-2 of 16-bit activations, which no path here takes.
 * The CPU backend is created with CAIRN_CPU_EXACT_MATMUL=1 (float
 * semantics for quantized weights, as the CUDA kernels).
 *
 * Exits 77 (ctest: skipped) only when the CUDA runtime sees no device (and
 * CAIRN_GPU_REQUIRED is not 1); a device whose backend does not come up is
 * a failure (tests/gpu/gpu_probe.h). CAIRN_GPU_TEST_BACKEND=cpu runs the
 * harness on a scalar CPU backend.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "store/tiers.h"
#include "tests/gpu/gpu_probe.h"
#include "tests/support/support.h"

static const char *model_path;
static int loose;
static cairn_backend *cpu, *gpu;
static cairn_model *m_cpu, *m_gpu;
static int n_vocab;
/* the layers' matmul weight type, and the device's row-invariance bound
 * for it (cairn_backend_matmul_invariant_rows) */
static cairn_type layer_wtype;
static int exact_bound;

#define MAX_TOKENS 64
#define LOOSE_RTOL 1e-3
#define PAGE_SIZE 16
#define PAGES_PER_SEQ 8 /* 128 tokens */
#define N_SEQ 64        /* the largest batch tested */
#define MODEL_BATCH_TOKENS 128 /* room for a decode row beside a 100-token prefill */

/* A pool with room for N_SEQ sequences; sequence s owns pages
 * table[s][0..PAGES_PER_SEQ), scattered (interleaved, backwards). */
typedef struct {
    cairn_page_pool *pool;
    cairn_kv_layout kv;
    int32_t table[N_SEQ][PAGES_PER_SEQ];
} kv_cache;

static void kv_open(kv_cache *c, cairn_model *m, cairn_backend *be, cairn_type dtype)
{
    assert_int_equal(cairn_model_kv_layout(m, PAGE_SIZE, dtype, &c->kv), CAIRN_OK);
    const int n_pages = N_SEQ * PAGES_PER_SEQ;
    assert_int_equal(cairn_page_pool_create(be, &c->kv, (size_t)n_pages * c->kv.page_bytes,
                                            &c->pool),
                     CAIRN_OK);
    for (int s = 0; s < N_SEQ; s++)
        for (int p = 0; p < PAGES_PER_SEQ; p++)
            c->table[s][p] = n_pages - 1 - (p * N_SEQ + s);
}

static void kv_close(kv_cache *c)
{
    cairn_page_pool_free(c->pool);
}

/* Rows of logits: |got - want| <= rtol * max|want row| for every entry. */
static void expect_rows_close(const float *got, const float *want, int rows, double rtol,
                              const char *what)
{
    for (int r = 0; r < rows; r++) {
        const float *g = got + (size_t)r * n_vocab, *w = want + (size_t)r * n_vocab;
        double scale = 1e-6;
        for (int i = 0; i < n_vocab; i++)
            scale = fmax(scale, fabs(w[i]));
        for (int i = 0; i < n_vocab; i++)
            if (!(fabs(g[i] - w[i]) <= rtol * scale))
                fail_msg("%s: row %d logit %d: gpu %.7g cpu %.7g (row scale %.4g, rtol %.1g)", what,
                         r, i, g[i], w[i], scale, rtol);
    }
}

/* A deterministic prompt: BOS then tokens drawn from a small LCG. */
static int make_prompt(int which, int32_t *out)
{
    static const int32_t story[] = {1, 403, 407, 261, 378}; /* "Once upon a time" */
    if (which == 0 && n_vocab > 403) {
        memcpy(out, story, sizeof story);
        return 5;
    }
    uint32_t state = 12345u + 7919u * (uint32_t)which;
    const int n = 3 + (4 * which) % 29; /* 3 .. 31 tokens */
    out[0] = 1;
    for (int i = 1; i < n; i++)
        out[i] = 3 + (int32_t)((support_lcg32(&state) >> 8) % (uint32_t)(n_vocab - 3));
    return n;
}

static void forward(cairn_model *m, kv_cache *c, const cairn_seq_batch *sb, int n_seqs,
                    float *logits)
{
    int n_out = 0;
    assert_int_equal(
        cairn_model_forward(m, cairn_page_pool_base(c->pool), &c->kv, sb, n_seqs, logits, NULL, &n_out),
        CAIRN_OK);
}

/* ---- logits of a whole prompt ---------------------------------------------------- */

static void check_prompt_logits(cairn_type dtype)
{
    int32_t toks[37];
    for (int i = 0; i < 37; i++)
        toks[i] = i == 0 ? 1 : 3 + (int32_t)((i * 2654435761u) % (uint32_t)(n_vocab - 3));
    uint8_t want[37];
    memset(want, 1, sizeof want);
    float *lc = malloc((size_t)37 * n_vocab * sizeof(float));
    float *lg = malloc((size_t)37 * n_vocab * sizeof(float));
    assert_non_null(lc);
    assert_non_null(lg);
    kv_cache cc, cg;
    kv_open(&cc, m_cpu, cpu, dtype);
    kv_open(&cg, m_gpu, gpu, dtype);
    cairn_seq_batch sbc = {.tokens = toks, .n_tokens = 37, .pages = cc.table[0], .want = want};
    cairn_seq_batch sbg = sbc;
    sbg.pages = cg.table[0];
    forward(m_cpu, &cc, &sbc, 1, lc);
    forward(m_gpu, &cg, &sbg, 1, lg);
    expect_rows_close(lg, lc, 37, loose ? LOOSE_RTOL : 1e-4,
                      dtype == CAIRN_TYPE_F16 ? "prompt logits (f16 KV)" : "prompt logits (f32 KV)");
    /* then the same 37 tokens as a prefill of 30 and 7 single decode steps */
    kv_cache cg2;
    kv_open(&cg2, m_gpu, gpu, dtype);
    sbg = (cairn_seq_batch){.tokens = toks, .n_tokens = 30, .pages = cg2.table[0]};
    forward(m_gpu, &cg2, &sbg, 1, lg);
    for (int i = 30; i < 37; i++) {
        sbg = (cairn_seq_batch){.tokens = toks + i, .n_tokens = 1, .kv_start = i,
                                .pages = cg2.table[0]};
        forward(m_gpu, &cg2, &sbg, 1, lg);
        expect_rows_close(lg, lc + (size_t)i * n_vocab, 1, loose ? LOOSE_RTOL : 1e-4,
                          "incremental decode vs cpu prompt");
    }
    kv_close(&cc);
    kv_close(&cg);
    kv_close(&cg2);
    free(lc);
    free(lg);
}

static void test_prompt_logits_f32_kv(void **state)
{
    (void)state;
    check_prompt_logits(CAIRN_TYPE_F32);
}

static void test_prompt_logits_f16_kv(void **state)
{
    (void)state;
    check_prompt_logits(CAIRN_TYPE_F16);
}

/* ---- greedy decoding ---------------------------------------------------------------- */

static void greedy(cairn_model *m, cairn_backend *be, const int32_t *prompt, int n_prompt,
                   int n_gen, int32_t *out)
{
    kv_cache c;
    kv_open(&c, m, be, CAIRN_TYPE_F16);
    float *logits = malloc((size_t)n_vocab * sizeof(float));
    assert_non_null(logits);
    cairn_seq_batch sb = {.tokens = prompt, .n_tokens = n_prompt, .pages = c.table[0]};
    forward(m, &c, &sb, 1, logits);
    for (int i = 0; i < n_gen; i++) {
        out[i] = support_argmax(logits, n_vocab);
        sb = (cairn_seq_batch){.tokens = &out[i], .n_tokens = 1, .kv_start = n_prompt + i,
                               .pages = c.table[0]};
        forward(m, &c, &sb, 1, logits);
    }
    free(logits);
    kv_close(&c);
}

static void test_greedy_equal(void **state)
{
    (void)state;
    if (loose) { /* not a skip: loose mode never compares greedy tokens (near-ties) */
        printf("greedy: not compared in loose mode\n");
        return;
    }
    for (int p = 0; p < 4; p++) {
        int32_t prompt[MAX_TOKENS], a[32], b[32];
        const int n = make_prompt(p, prompt);
        greedy(m_cpu, cpu, prompt, n, 32, a);
        greedy(m_gpu, gpu, prompt, n, 32, b);
        for (int i = 0; i < 32; i++)
            if (a[i] != b[i])
                fail_msg("prompt %d: greedy token %d differs: cpu %d, gpu %d", p, i, a[i], b[i]);
    }
}

/* ---- batched decode = single --------------------------------------------------------- */

static void check_batched_equals_single(int B, int steps)
{
    kv_cache together, alone;
    kv_open(&together, m_gpu, gpu, CAIRN_TYPE_F16);
    kv_open(&alone, m_gpu, gpu, CAIRN_TYPE_F16);
    static int32_t prompts[N_SEQ][MAX_TOKENS];
    int len[N_SEQ];
    float *lt = malloc((size_t)B * n_vocab * sizeof(float));
    float *la = malloc((size_t)B * n_vocab * sizeof(float));
    assert_non_null(lt);
    assert_non_null(la);
    /* prefill each sequence on its own, in both caches */
    for (int s = 0; s < B; s++) {
        len[s] = make_prompt(s, prompts[s]);
        cairn_seq_batch sb = {.tokens = prompts[s], .n_tokens = len[s], .pages = together.table[s]};
        forward(m_gpu, &together, &sb, 1, lt + (size_t)s * n_vocab);
        sb.pages = alone.table[s];
        forward(m_gpu, &alone, &sb, 1, la + (size_t)s * n_vocab);
    }
    int32_t next[N_SEQ];
    for (int s = 0; s < B; s++)
        next[s] = support_argmax(lt + (size_t)s * n_vocab, n_vocab);
    for (int step = 0; step < steps; step++) {
        cairn_seq_batch sb[N_SEQ];
        for (int s = 0; s < B; s++)
            sb[s] = (cairn_seq_batch){.tokens = &next[s], .n_tokens = 1,
                                      .kv_start = len[s] + step, .pages = together.table[s]};
        forward(m_gpu, &together, sb, B, lt);
        for (int s = 0; s < B; s++) {
            cairn_seq_batch one = sb[s];
            one.pages = alone.table[s];
            forward(m_gpu, &alone, &one, 1, la + (size_t)s * n_vocab);
        }
        char what[64];
        snprintf(what, sizeof what, "batch %d vs single, step %d", B, step);
        if (exact_bound >= 0)
            for (int s = 0; s < B; s++)
                KT_SAME_BYTES(lt + (size_t)s * n_vocab, la + (size_t)s * n_vocab,
                              (size_t)n_vocab * sizeof(float), what);
        else
            expect_rows_close(lt, la, B, 1e-5, what);
        for (int s = 0; s < B; s++) {
            const int a = support_argmax(lt + (size_t)s * n_vocab, n_vocab);
            const int b = support_argmax(la + (size_t)s * n_vocab, n_vocab);
            if (!loose && a != b)
                fail_msg("batch %d, step %d seq %d: batched picks %d, single %d", B, step, s, a, b);
            next[s] = a;
        }
    }
    free(lt);
    free(la);
    kv_close(&together);
    kv_close(&alone);
}

static void test_batched_equals_single(void **state)
{
    (void)state;
    check_batched_equals_single(4, 16);
    check_batched_equals_single(9, 6);
    check_batched_equals_single(32, 4);
    check_batched_equals_single(N_SEQ, 4);
}

/* ---- decode rows beside prefills ------------------------------------------------------ */

/* n deterministic tokens (no BOS) for the prefilling sequences */
static void filler(int32_t *out, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++)
        out[i] = 3 + (int32_t)((support_lcg32(&seed) >> 8) % (uint32_t)(n_vocab - 3));
}

static void test_decode_beside_prefill(void **state)
{
    (void)state;
    if (exact_bound < 0) {
        printf("decode beside prefill: not checked to the bit: %s weights go to a library "
               "GEMM per shape at every T on this backend (docs/cuda.md)\n",
               cairn_type_get(layer_wtype)->name);
        return;
    }
    kv_cache mixed, alone;
    kv_open(&mixed, m_gpu, gpu, CAIRN_TYPE_F16);
    kv_open(&alone, m_gpu, gpu, CAIRN_TYPE_F16);
    int32_t prompt[MAX_TOKENS];
    const int n = make_prompt(3, prompt);
    float *lm = malloc((size_t)8 * n_vocab * sizeof(float));
    float *la = malloc((size_t)8 * n_vocab * sizeof(float));
    assert_non_null(lm);
    assert_non_null(la);
    /* sequence 0 decodes; 1, 2, 3 prefill beside it */
    cairn_seq_batch sb = {.tokens = prompt, .n_tokens = n, .pages = mixed.table[0]};
    forward(m_gpu, &mixed, &sb, 1, lm);
    sb.pages = alone.table[0];
    forward(m_gpu, &alone, &sb, 1, la);
    int32_t tok[4] = {support_argmax(la, n_vocab)}, fill[3][100];
    int kv = n;
    static const int fill_len[3] = {100, 80, 70};
    for (int step = 0; step < 3; step++) {
        filler(fill[step], fill_len[step], 977u * (uint32_t)(step + 1));
        /* steps 0 and 1: one decode token (after the prefill, then before
         * it); step 2: a chain of 3 rows that all want logits, as a
         * verification */
        const int rows = step == 2 ? 3 : 1;
        uint8_t want[3] = {1, 1, 1};
        for (int i = 1; i < rows; i++)
            tok[i] = 3 + (tok[i - 1] * 7 + 11) % (n_vocab - 3);
        const cairn_seq_batch dec = {.tokens = tok, .n_tokens = rows, .kv_start = kv,
                                     .pages = mixed.table[0], .want = rows > 1 ? want : NULL};
        const cairn_seq_batch pre = {.tokens = fill[step], .n_tokens = fill_len[step],
                                     .pages = mixed.table[1 + step]};
        cairn_seq_batch both[2];
        both[step == 0 ? 1 : 0] = dec;
        both[step == 0 ? 0 : 1] = pre;
        forward(m_gpu, &mixed, both, 2, lm);
        const float *dec_rows = lm + (step == 0 ? (size_t)n_vocab : 0); /* caller's order */
        cairn_seq_batch one = dec;
        one.pages = alone.table[0];
        forward(m_gpu, &alone, &one, 1, la);
        char what[96];
        snprintf(what, sizeof what, "step %d: %d decode row(s) beside a %d-token prefill vs alone",
                 step, rows, fill_len[step]);
        KT_SAME_BYTES(dec_rows, la, (size_t)rows * n_vocab * sizeof(float), what);
        kv += rows;
        tok[0] = support_argmax(la + (size_t)(rows - 1) * n_vocab, n_vocab);
    }
    free(lm);
    free(la);
    kv_close(&mixed);
    kv_close(&alone);
}

static int load(cairn_backend *be, cairn_model **m)
{
    char err[256] = "";
    cairn_model_params p = {.max_batch_tokens = MODEL_BATCH_TOKENS, .max_seqs = N_SEQ};
    int rc = cairn_model_load(model_path, be, &p, m, err, sizeof err);
    if (rc != CAIRN_OK)
        fprintf(stderr, "load %s: %s\n", model_path, err[0] ? err : cairn_strerror(rc));
    return rc;
}

int main(int argc, char **argv)
{
    model_path = argc > 1 ? argv[1] : getenv("CAIRN_MODEL");
    loose = argc > 2 && strcmp(argv[2], "loose") == 0;
    if (!model_path) {
        fprintf(stderr, "usage: test_gpu_model MODEL [loose] (or set CAIRN_MODEL)\n");
        return 1;
    }
    const int open_rc = gpu_test_open(&gpu, "gpu_model");
    if (open_rc != 0)
        return open_rc;
    if (cairn_backend_cpu_create(2, &cpu) != CAIRN_OK || load(cpu, &m_cpu) != CAIRN_OK ||
        load(gpu, &m_gpu) != CAIRN_OK)
        return 1;
    n_vocab = cairn_model_hparams(m_cpu)->n_vocab;
    cairn_gguf *g = NULL;
    const cairn_gguf_tensor *wt = NULL;
    /* the layer weights' type: a dense FFN's, or a mixture of experts' */
    if (cairn_gguf_open(model_path, &g, NULL, 0) != CAIRN_OK ||
        (!(wt = cairn_gguf_find_tensor(g, "blk.0.ffn_up.weight")) &&
         !(wt = cairn_gguf_find_tensor(g, "blk.0.ffn_up_exps.weight")))) {
        fprintf(stderr, "%s: cannot read blk.0.ffn_up(_exps).weight's type\n", model_path);
        return 1;
    }
    layer_wtype = wt->type;
    cairn_gguf_close(g);
    exact_bound = cairn_backend_matmul_invariant_rows(gpu, layer_wtype);
    printf("model %s (%s mode), %s layer weights, matmul rows invariant up to %d (0: any, -1: "
           "none)\n",
           model_path, loose ? "loose" : "strict", cairn_type_get(layer_wtype)->name, exact_bound);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_logits_f32_kv),
        cmocka_unit_test(test_prompt_logits_f16_kv),
        cmocka_unit_test(test_greedy_equal),
        cmocka_unit_test(test_batched_equals_single),
        cmocka_unit_test(test_decode_beside_prefill),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cairn_model_free(m_cpu);
    cairn_model_free(m_gpu);
    cairn_backend_destroy(cpu);
    cairn_backend_destroy(gpu);
    return failed;
}
