/*
 * tests/support/support.h — helpers the C tests share, so that no test
 * writes its own copy: a service with a runtime of its own (service.c).
 *
 * Everything here is test code: it aborts the test (cmocka's fail_msg) or
 * returns a status, never hides a failure, and asserts nothing of its own
 * about the code under test.
 */
#ifndef CAIRN_TESTS_SUPPORT_H
#define CAIRN_TESTS_SUPPORT_H

#include "session/session.h"

/* Open a CPU runtime over model_path (n_threads, draft_path: an EAGLE head
 * or NULL) sized for cfg's batch, and start a service on it with cfg (whose
 * `runtime` is filled in). On failure nothing is left open. */
int support_service_start(const char *model_path, int n_threads, const char *draft_path,
                          cairn_service_config *cfg, cairn_service **out, char *err,
                          size_t err_len);
/* Stop the service and close the runtime it was started on. NULL: no-op. */
void support_service_stop(cairn_service *svc);

/* ====================================================================== *
 * The sections below: random generators (rng.c), a GGUF writer
 * (gguf_writer.c), reference math and tolerance checks (refmath.c), and
 * buffers and backends of the kernel tests (backends.c), and a reference
 * model of a prefix cache (prefix_model.c). The kt_ names
 * are the kernel tests' (tests/kernels, tests/gpu); KT_CLOSE and
 * KT_SAME_BYTES expand to cmocka's fail_msg, fabs and memcmp, so a file
 * that uses them includes <cmocka.h>, <math.h> and <string.h>.
 * ====================================================================== */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "kernels/backend.h"

/* ---- skips (skips.c) --------------------------------------------------
 * cmocka's skip() ends a test as "skipped" but its group still returns 0,
 * so ctest would count the file as passed although a check never ran. A
 * test that cannot run here calls KT_SKIP("why", ...) instead, and main
 * returns kt_exit_code(cmocka_run_group_tests(...)): failures as before,
 * else 77 when anything was skipped (every test has SKIP_RETURN_CODE 77,
 * tests/CMakeLists.txt), with the reasons printed. */
extern int kt_n_skipped;
void kt_note_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int kt_exit_code(int failed);
#define KT_SKIP(...)                                                                               \
    do {                                                                                           \
        kt_note_skip(__VA_ARGS__);                                                                 \
        skip();                                                                                    \
    } while (0)

/* A ctest entry that runs part of a group (a real-model part registered
 * apart, labelled realmodel, so the rest runs and passes where the model is
 * absent): kt_select_tests(), called before cmocka_run_group_tests, reads
 * CAIRN_TEST_ONLY=PATTERN (run only the tests whose name matches) and
 * CAIRN_TEST_EXCEPT=PATTERN (leave out those that match), cmocka's test and
 * skip filters ('*' and '?' wildcards). A test left out is not a skip.
 * harness.main reads CAIRN_TEST_EXCEPT the same way. */
void kt_select_tests(void);

/* ---- random generators (rng.c) ----------------------------------------
 * Each keeps the exact sequence of the copy it replaced: a test's random
 * data does not change with the move. */

/* splitmix64's output function: a 64-bit mix (no state). */
uint64_t support_mix64(uint64_t z);
/* splitmix64: *state += 0x9e3779b97f4a7c15, returns its mix (test_gguf's
 * corruptions, the sampler test's reference of the engine's seeding, and
 * kt_next below). */
uint64_t support_splitmix64(uint64_t *state);
/* Marsaglia's xorshift64 (shifts 13, 7, 17): steps *state (nonzero) and
 * returns the new state (the EAGLE test's prompts). */
uint64_t support_xorshift64(uint64_t *state);
/* Knuth's 64-bit LCG (6364136223846793005, 1442695040888963407): steps
 * *state and returns its top 31 bits, state >> 33 (the tokenizer test's
 * random text, gpu_bench's random tokens). */
uint32_t support_lcg64(uint64_t *state);
/* The 32-bit LCG of Numerical Recipes (1664525, 1013904223): steps *state
 * and returns the new state (the sampler test's logits, the GPU model
 * test's prompts). */
uint32_t support_lcg32(uint32_t *state);

/* The kernel tests' seeded streams. Every run draws a fresh seed (time and
 * pid) unless CAIRN_TEST_SEED is set, prints it, and repeats it in every
 * failure message, so a failing run can be replayed exactly with
 * CAIRN_TEST_SEED=<seed>. Each test derives its own stream from the seed
 * and its name, so tests do not depend on the order they run in. */
extern uint64_t kt_seed;
/* Set kt_seed (CAIRN_TEST_SEED or fresh) and print it, naming `suite`. */
void kt_init_seed(const char *suite);
/* A splitmix64 stream. */
typedef struct {
    uint64_t state;
} kt_rng;
/* The stream's next 64 bits. */
uint64_t kt_next(kt_rng *r);
/* A stream for one test: the run's seed mixed with the test's name. */
kt_rng kt_rng_for(const char *name);
/* Uniform in [lo, hi). */
float kt_uniform(kt_rng *r, float lo, float hi);
/* Uniform integer in [0, n). */
int kt_below(kt_rng *r, int n);
/* Random permutation of 0..n-1 into p. */
void kt_permutation(kt_rng *r, int32_t *p, int n);

/* ---- a GGUF writer (gguf_writer.c) -------------------------------------
 * Builds GGUF images in memory, field by field (little-endian, as GGUF),
 * for the tests that write their own files, valid or crafted to be bad
 * (tests/gguf, tests/tokenizer). Aborts the test when memory runs out. */
typedef struct {
    uint8_t *p; /* the image (free() it) */
    size_t n, cap;
} gw_buf;
/* Append n raw bytes. */
void gw_put(gw_buf *b, const void *src, size_t n);
/* Append one value of each scalar width. */
void gw_u8(gw_buf *b, uint8_t v);
void gw_u16(gw_buf *b, uint16_t v);
void gw_u32(gw_buf *b, uint32_t v);
void gw_u64(gw_buf *b, uint64_t v);
void gw_f32(gw_buf *b, float v);
void gw_f64(gw_buf *b, double v);
/* Append a GGUF string: u64 length, then the bytes (no NUL). */
void gw_str(gw_buf *b, const char *s);
/* Append n copies of `byte`. */
void gw_fill(gw_buf *b, uint8_t byte, size_t n);
/* Append zeros up to the next multiple of `align`. */
void gw_pad(gw_buf *b, size_t align);
/* The header: "GGUF", u32 version, u64 tensor count, u64 metadata count. */
void gw_header(gw_buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
/* A metadata key and its value type; the value follows. */
void gw_kv(gw_buf *b, const char *key, uint32_t type);
/* A tensor info: name, n_dims, ne[0..n_dims), type, data offset. */
void gw_tensor_info(gw_buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                    uint32_t type, uint64_t offset);

/* ---- reference math and checks (refmath.c) ----------------------------- */

/* The 0.999 quantile of chi-squared with df degrees of freedom
 * (Wilson-Hilferty; within 2% of the exact value for df >= 1): the
 * critical value of the sampling tests' goodness-of-fit checks. */
double support_chi2_critical(int df);

/* Fail (naming the seed) unless |got - want| <= tol. NaN always fails. */
#define KT_CLOSE(got, want, tol, what, idx)                                                     \
    do {                                                                                        \
        double kt_g_ = (got), kt_w_ = (want), kt_t_ = (tol);                                    \
        if (!(fabs(kt_g_ - kt_w_) <= kt_t_))                                                    \
            fail_msg("seed %llu: %s [%lld]: got %.9g, want %.9g, |diff| %.3g > tol %.3g",        \
                     (unsigned long long)kt_seed, (what), (long long)(idx), kt_g_, kt_w_,       \
                     fabs(kt_g_ - kt_w_), kt_t_);                                               \
    } while (0)

/* Fail (naming the seed) unless two buffers are bitwise equal. */
#define KT_SAME_BYTES(a, b, n, what)                                                            \
    do {                                                                                        \
        if (memcmp((a), (b), (n)) != 0)                                                         \
            fail_msg("seed %llu: %s: results differ", (unsigned long long)kt_seed, (what));     \
    } while (0)

/* x[0..n) uniform in [lo, hi), drawn in order. */
void kt_fill(kt_rng *r, float *x, size_t n, float lo, float hi);
/* The index of the largest of x[0..n), the first of equals (greedy
 * decoding in the engine, EAGLE and GPU model tests). */
int support_argmax(const float *x, int n);
/* rows x n random weights in `type` (fresh host bytes, row after row): each
 * row drawn by kt_fill in [lo, hi) and quantized. With values non-NULL,
 * also their exact float values [rows][n] (dequantized; fresh memory). */
uint8_t *kt_random_weights(kt_rng *r, cairn_type type, int rows, int n, float lo, float hi,
                           float **values);
/* The CPU matmul's documented activation rule (kernels/cpu/cpu_impl.h) on
 * one block of 32: d = max|x| / 127 in float, q = x * (1/d) rounded to
 * nearest even; deq = d * q. */
void kt_quantize_act_block(const float *x, float *deq);
/* sum w[i] x[i] in double, and through *abs_sum the sum of |terms|; with
 * w_off non-NULL, of (|w[i]| + w_off[i]) |x[i]| instead (weights whose
 * kernels subtract an offset term separately). */
double kt_ref_dot(const float *w, const float *x, int n, const float *w_off, double *abs_sum);
/* Check got [T][n_out] = x [T][n_in] times W [n_out][n_in] transposed
 * against the double reference, within (n_in + 2) FLT_EPSILON sum|terms|
 * (the float-rounding bound derived in tests/kernels/test_cpu_ops.c);
 * w_off as kt_ref_dot (NULL: none). */
void kt_expect_matmul(const float *got, const float *W, const float *w_off, const float *x, int T,
                      int n_in, int n_out, const char *what);

/* ---- buffers and backends (backends.c) --------------------------------- */

/* calloc that aborts the test on failure (n = 0 allowed). */
void *kt_xmalloc(size_t n);
/* A backend buffer holding a copy of `bytes` bytes of host data (or zeroed
 * when host is NULL). */
void *kt_dev(cairn_backend *be, const void *host, size_t bytes);
/* Download a backend buffer into fresh host memory. */
void *kt_host(cairn_backend *be, const void *dev, size_t bytes);
/* A CPU backend with n_threads threads. */
cairn_backend *kt_cpu(int n_threads);
/* A CPU backend at instruction-set level `isa` (CAIRN_CPU_ISA: "scalar",
 * "avx2", "avx512"; it only ever lowers the detected level), in exact-matmul
 * mode (CAIRN_CPU_EXACT_MATMUL) when `exact`. */
cairn_backend *kt_cpu_isa(const char *isa, int threads, int exact);
/* y = x W^T on `be` (host x [T][n_in], host W: n_out rows of rb bytes in
 * `type`), through backend buffers; returns y [T][n_out] (fresh memory). */
float *kt_run_matmul(cairn_backend *be, cairn_type type, const uint8_t *W, size_t rb,
                     const float *x, int T, int n_in, int n_out);
/* kt_run_matmul on a 1- and a 3-thread kt_cpu_isa backend, which must agree
 * bitwise (naming `what`); returns the 1-thread result (fresh memory). */
float *kt_matmul_1_3(const char *isa, int exact, cairn_type type, const uint8_t *W, size_t rb,
                     const float *x, int T, int n_in, int n_out, const char *what);
/* The backend the GPU tests check: CUDA device 0, or with
 * CAIRN_GPU_TEST_BACKEND=cpu a 1-thread scalar CPU backend in its place (to
 * check the harness without a GPU). Sets CAIRN_CPU_EXACT_MATMUL=1 for the
 * process, so CPU backends created later multiply quantized weights with the
 * float semantics of the CUDA kernels. Returns the status. */
int kt_open_device(cairn_backend **out);

/* ---- a reference model of a prefix cache (prefix_model.c) -------------
 * What the radix and store property tests compare a tree with: every
 * sequence ever inserted, page-aligned, in a plain list. The longest cached
 * prefix of a query is its longest whole-page common prefix with any of
 * them; dropping a subtree cuts the sequences that ran through it. Needs
 * only radix/ (the store's sanitizer build links it without cairn_lib). */
typedef struct {
    size_t page_size; /* tokens per page                      */
    size_t max_pages; /* pages per sequence at most           */
    size_t cap;       /* sequences at most                    */
    size_t n;         /* sequences held                       */
    int32_t *tok;     /* [cap][max_pages * page_size]         */
    size_t *n_pages;  /* [cap] pages of each sequence         */
} pm_model;
/* Allocate an empty model (aborts the test when memory runs out). */
void pm_init(pm_model *m, size_t page_size, size_t max_pages, size_t cap);
void pm_free(pm_model *m);
/* Remember tok[0, np pages). False (nothing kept) when the model is full. */
bool pm_add(pm_model *m, const int32_t *tok, size_t np);
/* The longest prefix of tok[0, np pages) the model holds, in pages. */
size_t pm_match(const pm_model *m, const int32_t *tok, size_t np);
/* A query of 1..max_pages pages into tok (*np): usually (all but one in
 * `fresh_one_in`) some of a held sequence, then tokens from {0, 1, 2} so
 * that queries share prefixes. Draws from xorshift64 *rng. */
void pm_query(const pm_model *m, uint64_t *rng, unsigned fresh_one_in, int32_t *tok,
              size_t *np);
/* A subtree of `depth` pages along path tok was dropped, keeping its first
 * `start` pages: every sequence sharing more than `start` pages with it is
 * cut to `start`. */
void pm_forget(pm_model *m, const int32_t *tok, size_t depth, size_t start);

#include "radix/radix.h"
/* The tokens of node (at `depth` pages from the root), rebuilt from its
 * ancestors into tok [depth * page_size]. */
void pm_node_tokens(cairn_radix_node *node, size_t depth, size_t page_size,
                    int32_t *tok);

#endif /* CAIRN_TESTS_SUPPORT_H */
