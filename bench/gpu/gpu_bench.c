/*
 * bench/gpu/gpu_bench.c — decode and prefill throughput of one model on one
 * backend, against the memory-bandwidth roofline measured on the same device.
 *
 *   gpu_bench MODEL [--device cuda|cpu] [--batches 1,8,32] [--gen N]
 *             [--prompt N] [--context N] [--reps N] [--logits 0|1]
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
 * Prints one human-readable line per measurement and a final JSON line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "store/store.h"
#include "tests/support/support.h"

static int usage(void)
{
    fprintf(stderr, "usage: gpu_bench MODEL [--device cuda|cpu] [--batches 1,8,32] [--gen N] "
                    "[--prompt N] [--context N] [--reps N] [--logits 0|1]\n");
    return 2;
}

#define MAX_BATCHES 8

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

/* Bytes of every tensor that a forward step reads whole. */
static int matmul_bytes(const char *path, const cairn_hparams *hp, double *bytes, double *params)
{
    cairn_gguf *g = NULL;
    char err[256];
    int rc = cairn_gguf_open(path, &g, err, sizeof err);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "gpu_bench: %s\n", err);
        return rc;
    }
    *bytes = 0;
    *params = 0;
    for (int64_t i = 0; i < cairn_gguf_n_tensors(g); i++) {
        const cairn_gguf_tensor *t = cairn_gguf_tensor_at(g, i);
        const int is_embd = strcmp(t->name, "token_embd.weight") == 0;
        if (is_embd && !hp->tied_embeddings)
            continue;
        *bytes += (double)t->size;
        if (t->n_dims == 2)
            *params += (double)t->ne[0] * (double)t->ne[1];
    }
    cairn_gguf_close(g);
    return CAIRN_OK;
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
    const char *path = argv[1], *device = "cuda";
    int batches[MAX_BATCHES] = {1, 8, 32}, n_batches = 3;
    int gen = 32, prompt = 512, context = 128, reps = 3, download_logits = 0;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val)
            return usage();
        i++;
        if (strcmp(arg, "--device") == 0) {
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
    if (matmul_bytes(path, hp, &wbytes, &params) != CAIRN_OK)
        return 1;
    printf("model %s: dim %d, %d layers, %d/%d heads, ffn %d, vocab %d; %.2f GB of matmul "
           "weights (%.2f B params); loaded in %.1f s\n",
           hp->name, hp->dim, hp->n_layer, hp->n_head, hp->n_kv_head, hp->ffn_dim, hp->n_vocab,
           wbytes / 1e9, params / 1e9, cairn_now() - t0);

    /* KV: max_b sequences of context + gen tokens, or one of `prompt` */
    const int page_size = 16;
    cairn_kv_layout kv;
    if ((rc = cairn_model_kv_layout(m, page_size, CAIRN_TYPE_F16, &kv)) != CAIRN_OK)
        return 1;
    const int seq_tokens = context + gen + 1;
    const int pages_per_seq = (seq_tokens + page_size - 1) / page_size;
    const int prompt_pages = (prompt + page_size - 1) / page_size;
    int n_pages = max_b * pages_per_seq;
    if (n_pages < prompt_pages)
        n_pages = prompt_pages;
    cairn_page_pool *pool = NULL;
    if ((rc = cairn_page_pool_create(be, &kv, (size_t)n_pages * kv.page_bytes, &pool)) != CAIRN_OK) {
        fprintf(stderr, "gpu_bench: KV pool of %d pages: %s\n", n_pages, cairn_strerror(rc));
        return 1;
    }
    void *base = cairn_page_pool_base(pool);
    int32_t *table = malloc((size_t)n_pages * sizeof *table);
    int32_t *tokens = malloc((size_t)(max_tokens + max_b) * sizeof *tokens);
    float *logits = malloc((size_t)max_b * hp->n_vocab * sizeof(float));
    cairn_seq_batch *sb = malloc((size_t)max_b * sizeof *sb);
    int32_t *next = malloc((size_t)max_b * sizeof *next);
    if (!table || !tokens || !logits || !sb || !next)
        return 1;
    for (int i = 0; i < n_pages; i++)
        table[i] = i;
    for (int i = 0; i < max_tokens + max_b; i++)
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
        const int warm = 2;
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

    printf("{\"device\": \"%s\", \"bandwidth_gbs\": %.1f, \"weight_gb\": %.3f, \"prefill_tps\": "
           "%.1f, \"prefill_roofline_frac\": %.4f",
           be->iface->name, bw / 1e9, wbytes / 1e9, pf_tps, pf_frac);
    for (int bi = 0; bi < n_batches; bi++)
        printf(", \"decode_b%d_tps\": %.1f, \"decode_b%d_roofline_frac\": %.4f", batches[bi],
               dec_tps[bi], batches[bi], dec_frac[bi]);
    printf("}\n");

    free(table);
    free(tokens);
    free(logits);
    free(sb);
    free(next);
    cairn_page_pool_free(pool);
    cairn_model_free(m);
    cairn_backend_destroy(be);
    return 0;
}
