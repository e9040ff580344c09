/*
 * bench/gpu/gpu_bench.c — decode and prefill throughput of one model on one
 * backend, against the memory-bandwidth roofline measured on the same device.
 *
 *   gpu_bench MODEL [--device cuda|cpu] [--batches 1,8,32,64] [--gen N]
 *             [--prompt N] [--context N] [--reps N] [--logits 0|1]
 *             [--json PATH]
 *
 * Bandwidth: a device-to-device copy of 1 GiB through the backend's copy()
 * (cudaMemcpyAsync on CUDA), best of 5; a copy reads and writes every byte,
 * so bandwidth = 2 * bytes / time.
 *
 * Decode at batch B: B sequences, each prefilled with `context` tokens, then
 * `gen` steps in which every sequence adds one token in a single forward
 * call. A step must read every weight that takes part in a matmul once
 * (all of the file's tensors except the token embedding, which is only
 * gathered) plus each sequence's KV so far, so
 *     roofline tok/s = B * bandwidth / (weight bytes + B * KV bytes per seq)
 * and the fraction printed is measured / roofline. The logits stay on the
 * device during the timed steps (sampling on the device is the plan for
 * serving); --logits 1 downloads them every step as the engine does today.
 *
 * Prefill: one sequence of `prompt` tokens in one forward call (best of
 * reps); its roofline line is the same bytes over the time, which is far
 * from the limit by nature (prefill is compute-bound), so the TFLOP/s
 * achieved (2 * matmul parameters * tokens / time) is printed as well.
 *
 * Any weight type the backend takes is timed the same way: the roofline
 * counts the bytes the file really holds, so a Q4_K model's is ~3.6x a BF16
 * model's at the same shape; the "type" reported is the matmul weights'
 * dominant type (by bytes).
 *
 * KV: each sequence gets pages for context + warm + gen tokens (the warm
 * steps write KV too; one page short would spill into the next sequence's
 * first page, or past the table for the last one).
 *
 * Prints one human-readable line per measurement and a final JSON line;
 * --json PATH also writes that object, with every figure, to PATH.
 */
#include "ckpt/ckpt.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "store/store.h"
#include "tests/support/support.h"

static void usage_to(FILE *f)
{
    fprintf(f,
            "usage: gpu_bench MODEL [--device cuda|cpu] [--batches 1,8,32,64] [--gen N]\n"
            "                 [--prompt N] [--context N] [--reps N] [--logits 0|1] [--json PATH]\n"
            "  --batches  decode batch sizes, comma-separated (default 1,8,32,64; at most 8)\n"
            "  --gen      timed decode steps per batch (default 32; 2 warm-up steps before)\n"
            "  --prompt   prefill length in tokens (default 512)\n"
            "  --context  tokens prefilled per sequence before decoding (default 128)\n"
            "  --reps     prefill repetitions, best kept (default 3)\n"
            "  --logits   1: download the logits every decode step (default 0)\n"
            "  --json     also write every figure as one JSON object to PATH (copy bandwidth,\n"
            "             prefill tok/s, decode tok/s per batch, roofline fractions, model,\n"
            "             weight type)\n"
            "Any weight type works (BF16, F16, Q8_0, Q4_K, ...); the roofline uses the file's\n"
            "real weight bytes.\n");
}

static int usage(void)
{
    usage_to(stderr);
    return 2;
}

#define MAX_BATCHES 8
#define WARM_STEPS 2 /* decode steps before the clock starts */

static double measure_bandwidth(cairn_backend *be)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    if (be->iface->alloc(be, bytes, &a) != CAIRN_OK || be->iface->alloc(be, bytes, &b) != CAIRN_OK) {
        if (a)
            be->iface->free(be, a);
        return 0;
    }
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        cairn_backend_synchronize(be);
        double t0 = cairn_now();
        if (cairn_backend_copy(be, b, a, bytes) != CAIRN_OK ||
            cairn_backend_synchronize(be) != CAIRN_OK)
            break;
        double dt = cairn_now() - t0;
        if (r > 0 && dt < best) /* the first one warms up */
            best = dt;
    }
    be->iface->free(be, a);
    be->iface->free(be, b);
    return best < 1e30 ? 2.0 * (double)bytes / best : 0;
}

/* Bytes of every tensor that a forward step reads whole, and the type that
 * holds most of those bytes (*main_type). */
static int matmul_bytes(const char *path, const cairn_hparams *hp, double *bytes, double *params,
                        cairn_type *main_type)
{
    cairn_gguf *g = NULL;
    char err[256];
    int rc = cairn_ckpt_open(path, &g, err, sizeof err);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return rc;
    }
    *bytes = 0;
    *params = 0;
    double by_type[CAIRN_TYPE_COUNT_] = {0};
    for (int64_t i = 0; i < cairn_gguf_n_tensors(g); i++) {
        const cairn_gguf_tensor *t = cairn_gguf_tensor_at(g, i);
        const int is_embd = strcmp(t->name, "token_embd.weight") == 0;
        if (is_embd && !hp->tied_embeddings)
            continue;
        *bytes += (double)t->size;
        if (t->n_dims == 2) {
            *params += (double)t->ne[0] * (double)t->ne[1];
            if ((int)t->type >= 0 && (int)t->type < CAIRN_TYPE_COUNT_)
                by_type[t->type] += (double)t->size;
        }
    }
    *main_type = CAIRN_TYPE_F32;
    for (int ti = 0; ti < CAIRN_TYPE_COUNT_; ti++)
        if (by_type[ti] > by_type[*main_type])
            *main_type = (cairn_type)ti;
    cairn_gguf_close(g);
    return CAIRN_OK;
}

/* s as the inside of a JSON string (quotes, backslashes and control bytes
 * escaped), truncated to fit out. */
static const char *json_str(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[n++] = '\\';
            out[n++] = (char)ch;
        } else if (ch < 0x20) {
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", ch);
        } else {
            out[n++] = (char)ch;
        }
    }
    out[n] = '\0';
    return out;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static int32_t random_token(int n_vocab)
{
    return 3 + (int32_t)(support_lcg64(&rng_state) % (uint64_t)(n_vocab - 3));
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage();
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage_to(stdout);
            return 0;
        }
    const char *path = argv[1], *device = "cuda", *json_path = NULL;
    int batches[MAX_BATCHES] = {1, 8, 32, 64}, n_batches = 4;
    int gen = 32, prompt = 512, context = 128, reps = 3, download_logits = 0;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val)
            return usage();
        i++;
        if (strcmp(arg, "--json") == 0) {
            json_path = val;
        } else if (strcmp(arg, "--device") == 0) {
            device = val;
        } else if (strcmp(arg, "--batches") == 0) {
            n_batches = 0;
            for (const char *p = val; *p && n_batches < MAX_BATCHES;) {
                batches[n_batches++] = atoi(p);
                p = strchr(p, ',');
                if (!p)
                    break;
                p++;
            }
        } else if (strcmp(arg, "--gen") == 0) {
            gen = atoi(val);
        } else if (strcmp(arg, "--prompt") == 0) {
            prompt = atoi(val);
        } else if (strcmp(arg, "--context") == 0) {
            context = atoi(val);
        } else if (strcmp(arg, "--reps") == 0) {
            reps = atoi(val);
        } else if (strcmp(arg, "--logits") == 0) {
            download_logits = atoi(val) != 0;
        } else {
            return usage();
        }
    }
    int max_b = 1;
    for (int i = 0; i < n_batches; i++) {
        if (batches[i] <= 0)
            return usage();
        max_b = batches[i] > max_b ? batches[i] : max_b;
    }
    if (gen <= 0 || prompt <= 0 || context <= 0 || reps <= 0)
        return usage();

    cairn_backend *be = NULL;
    int rc = strcmp(device, "cpu") == 0 ? cairn_backend_cpu_create(0, &be)
                                        : cairn_backend_cuda_create(0, &be);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "gpu_bench: cannot create the %s backend: %s\n", device, cairn_strerror(rc));
        return 1;
    }
    const double bw = measure_bandwidth(be);
    printf("device %s: copy bandwidth %.1f GB/s (1 GiB device-to-device, read + write)\n",
           be->iface->name, bw / 1e9);

    const int max_tokens = prompt > context * 1 ? prompt : context;
    cairn_model_params mp = {.max_batch_tokens = max_tokens > max_b ? max_tokens : max_b,
                             .max_seqs = max_b};
    cairn_model *m = NULL;
    char err[256] = "";
    double t0 = cairn_now();
    if ((rc = cairn_model_load(path, be, &mp, &m, err, sizeof err)) != CAIRN_OK) {
        fprintf(stderr, "gpu_bench: load %s: %s\n", path, err[0] ? err : cairn_strerror(rc));
        return 1;
    }
    const cairn_hparams *hp = cairn_model_hparams(m);
    double wbytes = 0, params = 0;
    cairn_type wtype = CAIRN_TYPE_F32;
    if (matmul_bytes(path, hp, &wbytes, &params, &wtype) != CAIRN_OK)
        return 1;
    const char *wtype_name = cairn_type_get(wtype) ? cairn_type_get(wtype)->name : "?";
    printf("model %s: dim %d, %d layers, %d/%d heads, ffn %d, vocab %d; %.2f GB of matmul "
           "weights (%.2f B params, mostly %s); loaded in %.1f s\n",
           hp->name, hp->dim, hp->n_layer, hp->n_head, hp->n_kv_head, hp->ffn_dim, hp->n_vocab,
           wbytes / 1e9, params / 1e9, wtype_name, cairn_now() - t0);

    /* KV: max_b sequences of context + gen tokens, or one of `prompt` */
    const int page_size = 16;
    cairn_kv_layout kv;
    if ((rc = cairn_model_kv_layout(m, page_size, CAIRN_TYPE_F16, &kv)) != CAIRN_OK)
        return 1;
    /* decode writes KV indices context .. context + WARM_STEPS + gen - 1 */
    const int seq_tokens = context + WARM_STEPS + gen;
    const int pages_per_seq = (seq_tokens + page_size - 1) / page_size;
    const int prompt_pages = (prompt + page_size - 1) / page_size;
    int n_pages = max_b * pages_per_seq;
    if (n_pages < prompt_pages)
        n_pages = prompt_pages;
    /* The cache's device tier, used as a plain arena: the bench lays out
     * page ids itself (nothing is allocated from it or cached in it). */
    cairn_kvcache *cache = NULL;
    cairn_kvcache_config kc = {.backend = be, .layout = kv,
                               .device_bytes = (size_t)n_pages * kv.page_bytes};
    if ((rc = cairn_kvcache_create(&kc, &cache, NULL, 0)) != CAIRN_OK) {
        fprintf(stderr, "gpu_bench: KV pool of %d pages: %s\n", n_pages, cairn_strerror(rc));
        return 1;
    }
    void *base = cairn_kvcache_kv_base(cache);
    int32_t *table = malloc((size_t)n_pages * sizeof *table);
    /* context prefills start at tokens + s % 7: room for 7 more */
    const int n_tok = max_tokens + max_b + 7;
    int32_t *tokens = malloc((size_t)n_tok * sizeof *tokens);
    float *logits = malloc((size_t)max_b * hp->n_vocab * sizeof(float));
    cairn_seq_batch *sb = malloc((size_t)max_b * sizeof *sb);
    int32_t *next = malloc((size_t)max_b * sizeof *next);
    if (!table || !tokens || !logits || !sb || !next)
        return 1;
    for (int i = 0; i < n_pages; i++)
        table[i] = i;
    for (int i = 0; i < n_tok; i++)
        tokens[i] = random_token(hp->n_vocab);
    int n_out;

    /* ---- prefill ---- */
    double pf_best = 1e30;
    for (int r = 0; r <= reps; r++) {
        cairn_seq_batch one = {.tokens = tokens, .n_tokens = prompt, .pages = table};
        cairn_backend_synchronize(be);
        double ts = cairn_now();
        if ((rc = cairn_model_forward(m, base, &kv, &one, 1, logits, NULL, &n_out)) != CAIRN_OK) {
            fprintf(stderr, "gpu_bench: prefill failed: %s\n", cairn_strerror(rc));
            return 1;
        }
        double dt = cairn_now() - ts;
        if (r > 0 && dt < pf_best)
            pf_best = dt;
    }
    const double pf_tps = prompt / pf_best;
    const double pf_frac = bw > 0 ? (wbytes / pf_best) / bw : 0;
    printf("prefill %4d tokens: %9.1f tok/s  (%.3f s; weights streamed at %.3f of roofline; "
           "%.1f TFLOP/s)\n",
           prompt, pf_tps, pf_best, pf_frac, 2.0 * params * prompt / pf_best / 1e12);

    /* ---- decode at each batch size ---- */
    double dec_tps[MAX_BATCHES], dec_frac[MAX_BATCHES];
    const double kv_per_token = (double)kv.row_bytes * 2 * hp->n_layer; /* K and V, all layers */
    for (int bi = 0; bi < n_batches; bi++) {
        const int B = batches[bi];
        /* prefill each sequence's context (its own pages) */
        for (int s = 0; s < B; s++) {
            cairn_seq_batch one = {.tokens = tokens + s % 7, .n_tokens = context,
                                   .pages = table + (size_t)s * pages_per_seq};
            if ((rc = cairn_model_forward(m, base, &kv, &one, 1, logits, NULL, &n_out)) != CAIRN_OK) {
                fprintf(stderr, "gpu_bench: context prefill failed: %s\n", cairn_strerror(rc));
                return 1;
            }
            next[s] = random_token(hp->n_vocab);
        }
        const int warm = WARM_STEPS;
        double ts = 0;
        for (int step = 0; step < warm + gen; step++) {
            if (step == warm) {
                cairn_backend_synchronize(be);
                ts = cairn_now();
            }
            for (int s = 0; s < B; s++)
                sb[s] = (cairn_seq_batch){.tokens = &next[s], .n_tokens = 1,
                                          .kv_start = context + step,
                                          .pages = table + (size_t)s * pages_per_seq};
            if ((rc = cairn_model_forward(m, base, &kv, sb, B, download_logits ? logits : NULL,
                                          NULL, &n_out)) != CAIRN_OK) {
                fprintf(stderr, "gpu_bench: decode failed: %s\n", cairn_strerror(rc));
                return 1;
            }
            for (int s = 0; s < B; s++)
                next[s] = (next[s] * 31 + step) % hp->n_vocab;
        }
        const double dt = cairn_now() - ts;
        dec_tps[bi] = (double)B * gen / dt;
        const double avg_ctx = context + warm + gen / 2.0;
        const double step_bytes = wbytes + (double)B * avg_ctx * kv_per_token;
        const double roof = bw > 0 ? (double)B * bw / step_bytes : 0;
        dec_frac[bi] = roof > 0 ? dec_tps[bi] / roof : 0;
        printf("decode batch %3d: %9.1f tok/s  (%.2f ms/step; roofline %.1f tok/s; %.3f of "
               "roofline)\n",
               B, dec_tps[bi], 1e3 * dt / gen, roof, dec_frac[bi]);
    }

    /* One JSON object with every figure: on stdout, and in --json PATH. */
    char json[8192], jname[256], jpath[2048];
    size_t jl = 0;
#define JSON_ADD(...)                                                                              \
    do {                                                                                           \
        if (jl < sizeof json)                                                                      \
            jl += (size_t)snprintf(json + jl, sizeof json - jl, __VA_ARGS__);                      \
    } while (0)
    JSON_ADD("{\"device\": \"%s\", \"model\": \"%s\", \"model_path\": \"%s\", \"type\": \"%s\", "
             "\"n_layer\": %d, \"dim\": %d, \"weight_gb\": %.3f, \"params_b\": %.3f, "
             "\"bandwidth_gbs\": %.1f, \"context\": %d, \"gen\": %d, \"logits\": %d, "
             "\"prefill_tokens\": %d, \"prefill_tps\": %.1f, \"prefill_s\": %.4f, "
             "\"prefill_roofline_frac\": %.4f, \"prefill_tflops\": %.2f, \"decode\": [",
             be->iface->name, json_str(hp->name, jname, sizeof jname),
             json_str(path, jpath, sizeof jpath), wtype_name, hp->n_layer, hp->dim, wbytes / 1e9,
             params / 1e9, bw / 1e9, context, gen, download_logits, prompt, pf_tps, pf_best,
             pf_frac, 2.0 * params * prompt / pf_best / 1e12);
    for (int bi = 0; bi < n_batches; bi++)
        JSON_ADD("%s{\"batch\": %d, \"tps\": %.1f, \"roofline_frac\": %.4f}", bi ? ", " : "",
                 batches[bi], dec_tps[bi], dec_frac[bi]);
    JSON_ADD("]");
    /* the flat keys of earlier runs, so old parsers keep working */
    for (int bi = 0; bi < n_batches; bi++)
        JSON_ADD(", \"decode_b%d_tps\": %.1f, \"decode_b%d_roofline_frac\": %.4f", batches[bi],
                 dec_tps[bi], batches[bi], dec_frac[bi]);
    JSON_ADD("}");
#undef JSON_ADD
    if (jl >= sizeof json) {
        fprintf(stderr, "gpu_bench: JSON summary too long\n");
        return 1;
    }
    printf("%s\n", json);
    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f || fprintf(f, "%s\n", json) < 0 || fclose(f) != 0) {
            fprintf(stderr, "gpu_bench: cannot write %s\n", json_path);
            return 1;
        }
    }

    free(table);
    free(tokens);
    free(logits);
    free(sb);
    free(next);
    cairn_kvcache_free(cache);
    cairn_model_free(m);
    cairn_backend_destroy(be);
    return 0;
}
