/*
 * fuzz/fuzz_ckpt.c — Hugging Face checkpoint folders (cairn_ckpt_open): a
 * tiny valid folder (fuzz/data/ckpt/, written by make_seeds.py) is copied
 * into a scratch directory once; each input replaces one of its files
 * (byte 0 picks model.safetensors, config.json, tokenizer.json or
 * tokenizer_config.json) with the rest of the input, opens the folder, and
 * on success walks what came out: every tensor, the vocabulary built from
 * the metadata (which then tokenizes a fixed text), and the model loaded on
 * the CPU backend (shapes checked against the hyper-parameters).
 *
 * Properties: the folder is refused with a terminated message, or every
 * tensor's bytes are readable end to end with the size its shape and type
 * imply; the vocabulary only emits its own ids.
 */
#include "fuzz_common.h"

#include "ckpt/ckpt.h"

#include <string.h>
#include <unistd.h>

static const char *const FILES[] = {"model.safetensors", "config.json", "tokenizer.json",
                                    "tokenizer_config.json"};
#define N_FILES (sizeof FILES / sizeof FILES[0])

static char scratch[256];
static unsigned char *base[N_FILES];
static size_t base_len[N_FILES];
static cairn_backend *cpu;

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

static void put(size_t which, const uint8_t *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", scratch, FILES[which]);
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f != NULL);
    FUZZ_CHECK(fwrite(data, 1, len, f) == len);
    fclose(f);
}

static void cleanup(void)
{
    for (size_t i = 0; i < N_FILES; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", scratch, FILES[i]);
        unlink(path);
    }
    rmdir(scratch);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    cairn_log_set_level(CAIRN_LOG_ERROR);
    snprintf(scratch, sizeof scratch, "/tmp/cairn-fuzz-ckpt-XXXXXX");
    FUZZ_CHECK(mkdtemp(scratch) != NULL);
    atexit(cleanup);
    for (size_t i = 0; i < N_FILES; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "fuzz/data/ckpt/%s", FILES[i]);
        base[i] = slurp(fuzz_path(rel), &base_len[i]);
        if (!base[i]) {
            fprintf(stderr, "fuzz: no %s (set CAIRN_FUZZ_ROOT)\n", fuzz_path(rel));
            exit(2);
        }
        put(i, base[i], base_len[i]);
    }
    FUZZ_CHECK(cairn_backend_cpu_create(1, &cpu) == CAIRN_OK);
    return 0;
}

static void walk(const cairn_gguf *g)
{
    for (int64_t i = 0; i < cairn_gguf_n_tensors(g); i++) {
        const cairn_gguf_tensor *t = cairn_gguf_tensor_at(g, i);
        FUZZ_CHECK(t && t->name && t->data);
        int64_t rows = 1;
        for (int d = 1; d < t->n_dims; d++)
            rows *= t->ne[d];
        FUZZ_CHECK(t->size == cairn_type_row_bytes(t->type, t->ne[0]) * (uint64_t)rows);
        if (t->size) {
            volatile uint8_t first = ((const uint8_t *)t->data)[0];
            volatile uint8_t last = ((const uint8_t *)t->data)[t->size - 1];
            (void)first;
            (void)last;
        }
    }
    cairn_vocab *v = NULL;
    char err[256];
    if (cairn_vocab_load(g, &v, err, sizeof err) == CAIRN_OK) {
        int32_t ids[64];
        const char text[] = "the cat <|endoftext|> 123";
        size_t n = 0;
        if (cairn_tokenize(v, text, sizeof text - 1, CAIRN_TOK_PARSE_SPECIAL, ids, 64, &n) ==
            CAIRN_OK)
            for (size_t i = 0; i < n; i++)
                FUZZ_CHECK(ids[i] >= 0 && ids[i] < cairn_vocab_n_tokens(v));
        cairn_vocab_free(v);
    }
    cairn_model_params mp = {.max_batch_tokens = 4, .max_seqs = 1};
    cairn_model *m = NULL;
    if (cairn_model_load_gguf(g, "fuzz", cpu, &mp, &m, err, sizeof err) == CAIRN_OK)
        cairn_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const size_t which = data[0] % N_FILES;
    put(which, data + 1, size - 1);
    cairn_gguf *g = NULL;
    char err[512];
    err[0] = '\0';
    if (cairn_ckpt_open(scratch, &g, err, sizeof err) == CAIRN_OK) {
        walk(g);
        cairn_gguf_close(g);
    } else {
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL && err[0] != '\0');
    }
    put(which, base[which], base_len[which]);
    return 0;
}
