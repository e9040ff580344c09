/*
 * tests/tokenizer/test_tokenizer_conformance.c — runs every case of
 * tests/data/tokenizer/ggml-vocab-NAME.gguf.inp/.out against cairn's
 * tokenizer. Usage: test_tokenizer_conformance NAME
 *
 * The .inp holds the texts separated by "\n__ggml_vocab_test__\n" (the file
 * ends with one, which closes the last case); the .out holds one line of ids
 * per case, from the reference tokenizer without special tokens. So texts are
 * tokenized without BOS and without parsing special tokens. Each case is also
 * decoded back: byte-level BPE and SentencePiece with byte fallback are
 * lossless, so the text must come back exactly (SentencePiece adds one space
 * in front, which the comparison allows for).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "text/text.h"

static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p)
        p[n] = '\0';
    *size = (size_t)n;
    return p;
}

static void print_escaped(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s VOCAB_NAME [MODEL.gguf]\n", argv[0]);
        return 2;
    }
    const char *dir = getenv("CAIRN_TESTDATA");
    char base[4096];
    snprintf(base, sizeof base, "%s/tokenizer/ggml-vocab-%s.gguf", dir ? dir : "tests/data",
             argv[1]);
    char path[4200];

    /* Families whose vocab-only GGUF is not in the test data (llama-bpe,
     * qwen2) are checked with the vocabulary inside a real model of that
     * family, given as the second argument. */
    const char *vocab_file = base;
    if (argc >= 3) {
        vocab_file = argv[2];
        if (access(vocab_file, R_OK) != 0) {
            printf("SKIP: %s: no model of this family at '%s' (scripts/get-model fetches the "
                   "Qwen2 one; set the path to a Llama 3 GGUF for llama-bpe)\n",
                   argv[1], vocab_file);
            return 77;
        }
    }

    char err[512] = "";
    cairn_gguf *g = NULL;
    if (cairn_ckpt_open(vocab_file, &g, err, sizeof err)) {
        fprintf(stderr, "FAIL: %s\n", err);
        return 1;
    }
    cairn_vocab *v = NULL;
    if (cairn_vocab_load(g, &v, err, sizeof err)) {
        fprintf(stderr, "FAIL: vocab: %s\n", err);
        return 1;
    }
    cairn_gguf_close(g); /* the vocab keeps its own copies */

    size_t inp_size, out_size;
    snprintf(path, sizeof path, "%s.inp", base);
    char *inp = read_file(path, &inp_size);
    snprintf(path, sizeof path, "%s.out", base);
    char *outp = read_file(path, &out_size);
    if (!inp || !outp) {
        fprintf(stderr, "FAIL: cannot read %s.inp/.out\n", base);
        return 1;
    }

    const char *sep = "\n__ggml_vocab_test__\n";
    const size_t sep_len = strlen(sep);
    int n_cases = 0, n_fail = 0;
    size_t pos = 0;
    char *line = outp;
    int32_t *ids = NULL, *want = NULL;
    size_t ids_cap = 0;
    while (pos < inp_size) {
        char *next = strstr(inp + pos, sep);
        size_t len = next ? (size_t)(next - (inp + pos)) : inp_size - pos;
        const char *text = inp + pos;
        pos = next ? pos + len + sep_len : inp_size;

        /* expected ids: one line of the .out */
        if (!line || !*line) {
            fprintf(stderr, "FAIL: .out has fewer lines than .inp has cases\n");
            return 1;
        }
        char *eol = strchr(line, '\n');
        if (eol)
            *eol = '\0';
        size_t n_want = 0;
        for (char *p = line;;) {
            while (*p == ' ')
                p++;
            if (!*p)
                break;
            char *end;
            long t = strtol(p, &end, 10);
            if (n_want + 1 > ids_cap || !want) {
                ids_cap = ids_cap ? ids_cap * 2 : 256;
                want = realloc(want, ids_cap * sizeof *want);
                ids = realloc(ids, ids_cap * sizeof *ids);
            }
            want[n_want++] = (int32_t)t;
            p = end;
        }
        line = eol ? eol + 1 : NULL;
        n_cases++;

        /* tokenize; the first call also proves the ERANGE retry contract */
        size_t n_got = 0;
        int rc = cairn_tokenize(v, text, len, 0, ids, 0, &n_got);
        if (rc != (n_got ? -7 /* CAIRN_ERANGE */ : 0)) {
            fprintf(stderr, "FAIL case %d: status %d with cap 0\n", n_cases, rc);
            n_fail++;
            continue;
        }
        if (n_got > ids_cap) {
            ids_cap = n_got;
            ids = realloc(ids, ids_cap * sizeof *ids);
            want = realloc(want, ids_cap * sizeof *want);
        }
        rc = cairn_tokenize(v, text, len, 0, ids, ids_cap, &n_got);
        bool same = rc == CAIRN_OK && n_got == n_want &&
                    (n_got == 0 || memcmp(ids, want, n_got * sizeof *ids) == 0);
        if (!same) {
            n_fail++;
            fprintf(stderr, "FAIL case %d: '", n_cases);
            print_escaped(stderr, text, len);
            fprintf(stderr, "'\n  want:");
            for (size_t i = 0; i < n_want; i++)
                fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n  got: ");
            for (size_t i = 0; i < n_got && i < ids_cap; i++)
                fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
            continue;
        }

        /* decode back through the streaming detokenizer */
        cairn_detok *d;
        cairn_detok_create(v, false, &d);
        size_t dcap = len * 3 + 16 + 260;
        char *dec = malloc(dcap);
        size_t dn = 0;
        for (size_t i = 0; i < n_got; i++) {
            size_t k;
            if (cairn_detok_push(d, ids[i], dec + dn, dcap - dn, &k)) {
                fprintf(stderr, "FAIL case %d: detok push\n", n_cases);
                n_fail++;
                break;
            }
            dn += k;
        }
        size_t k;
        cairn_detok_flush(d, dec + dn, dcap - dn, &k);
        dn += k;
        cairn_detok_free(d);
        const char *back = dec;
        if (cairn_vocab_kind_of(v) == CAIRN_VOCAB_SPM && cairn_vocab_add_space_prefix(v) &&
            dn > 0 && dec[0] == ' ')
            back++, dn--; /* the space prefix SentencePiece adds (Llama 2; not Gemma) */
        if (dn != len || memcmp(back, text, len) != 0) {
            n_fail++;
            fprintf(stderr, "FAIL case %d: round trip '", n_cases);
            print_escaped(stderr, text, len);
            fprintf(stderr, "' came back as '");
            print_escaped(stderr, back, dn);
            fprintf(stderr, "'\n");
        }
        free(dec);
    }
    if (line && *line) {
        fprintf(stderr, "FAIL: .out has more lines than .inp has cases\n");
        n_fail++;
    }
    printf("%s: %d cases, %d failed\n", argv[1], n_cases, n_fail);
    free(ids);
    free(want);
    free(inp);
    free(outp);
    cairn_vocab_free(v);
    return n_fail || n_cases == 0 ? 1 : 0;
}
