/*
 * tests/tokenizer/test_special_text.c — plain text never produces a special
 * token, on real vocabularies. Usage: test_special_text FILE.gguf...
 *
 * For every token a vocabulary must keep out of plain text — what the GGUF
 * types CONTROL, UNKNOWN or UNUSED, the special ids it names
 * (tokenizer.ggml.*_token_id) when they are added tokens, and added
 * (USER_DEFINED) tokens that look like control markers — its text is
 * tokenized without PARSE_SPECIAL, alone and inside other text, and no
 * special token may come out. With PARSE_SPECIAL the same text must give
 * that one token, and without `special` the token must detokenize to
 * nothing. The set is worked out here from the raw GGUF types, not from the
 * tokenizer's own classification, so a token the tokenizer forgets to treat
 * as control shows up. Added tokens that are not markers (Qwen's
 * <tool_call>, mpt's runs of spaces) must still be matched in plain text.
 *
 * A file that is absent makes the run skip (77) — the real model is not in
 * git; a vocabulary cairn does not support (WordPiece: bert-bge, the list
 * expected_unsupported) is reported and passed over.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/text.h"

enum { T_UNDEFINED, T_NORMAL, T_UNKNOWN, T_CONTROL, T_USER_DEFINED, T_UNUSED, T_BYTE };

static int failures;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

static bool has_prefix(const char *s, size_t len, const char *p)
{
    size_t n = strlen(p);
    return len >= n && memcmp(s, p, n) == 0;
}

static bool has_suffix(const char *s, size_t len, const char *p)
{
    size_t n = strlen(p);
    return len >= n && memcmp(s + len - n, p, n) == 0;
}

/* Control markers by the chat and code formats that use them: what an added
 * token must not be matched as in plain text. */
static bool marker_like(const char *s, size_t len)
{
    static const char *const named[] = {
        /* sentence and padding markers */
        "<s>", "</s>", "<unk>", "<pad>", "<mask>", "<bos>", "<eos>", "<sep>", "<cls>",
        /* turns: Gemma, SmolDocling, CodeLlama */
        "<start_of_turn>", "<end_of_turn>", "<end_of_utterance>", "<EOT>", "_<EOT>",
        /* fill-in-the-middle */
        "<PRE>", "<SUF>", "<MID>", "<PAD>", "<REPO>", "<fim_prefix>", "<fim_suffix>",
        "<fim_middle>", "<fim_pad>", "<fim-prefix>", "<fim-suffix>", "<fim-middle>", "<fim-pad>",
        "<fim-repo>", "<reponame>", "<repo_name>", "<file_sep>", "<filename>",
    };
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        size_t n = strlen(named[i]);
        if (len == n && memcmp(s, named[i], n) == 0)
            return true;
        /* SentencePiece's word-start form of the same marker */
        if (len == n + 3 && has_prefix(s, len, "\xE2\x96\x81") && memcmp(s + 3, named[i], n) == 0)
            return true;
    }
    /* ChatML, Llama 3, Phi-3, DeepSeek (ASCII and full-width bars) */
    if (len > 4 && has_prefix(s, len, "<|") && has_suffix(s, len, "|>"))
        return true;
    if (len > 8 && has_prefix(s, len, "<\xEF\xBD\x9C") && has_suffix(s, len, "\xEF\xBD\x9C>"))
        return true;
    /* Mistral's [INST]/[/INST]/[TOOL_CALLS], BERT's [CLS], vocabulary
     * fillers [PAD123] */
    if (len >= 3 && s[0] == '[' && s[len - 1] == ']') {
        size_t i = s[1] == '/' ? 2 : 1;
        bool any = false;
        for (; i + 1 < len; i++) {
            char c = s[i];
            if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
                return false;
            any = true;
        }
        return any;
    }
    return false;
}

typedef struct {
    const char *path;
    int32_t n;
    const char **text;
    size_t *len;
    uint8_t *type;
    bool *special; /* must stay out of plain text */
    cairn_vocab *v;
} vocab_case;

static void case_free(vocab_case *c)
{
    free(c->text);
    free(c->len);
    free(c->type);
    free(c->special);
    cairn_vocab_free(c->v);
}

/* Reads the raw types and the special set from the GGUF. */
static int case_load(vocab_case *c, const cairn_gguf *g)
{
    cairn_gguf_vtype et;
    uint64_t n;
    const void *data;
    if (cairn_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data) != CAIRN_OK)
        return -1;
    c->n = (int32_t)n;
    c->text = calloc(n, sizeof *c->text);
    c->len = calloc(n, sizeof *c->len);
    c->type = calloc(n, 1);
    c->special = calloc(n, sizeof *c->special);
    if (!c->text || !c->len || !c->type || !c->special)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &c->text[i], &c->len[i]);
    memset(c->type, T_NORMAL, n);
    uint64_t nt;
    if (cairn_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &nt, &data) == CAIRN_OK) {
        if (nt != n || et != CAIRN_GGUF_INT32)
            return -1; /* every converter writes int32; anything else is not read here */
        for (uint64_t i = 0; i < n; i++) {
            int32_t t;
            memcpy(&t, (const uint8_t *)data + 4 * i, 4);
            c->type[i] = (uint8_t)t;
        }
    }
    for (int32_t i = 0; i < c->n; i++) {
        uint8_t t = c->type[i];
        c->special[i] = t == T_CONTROL || t == T_UNKNOWN || t == T_UNUSED ||
                        ((t == T_USER_DEFINED || t == T_UNDEFINED) &&
                         marker_like(c->text[i], c->len[i]));
    }
    /* every special id the file names, when it is an added token */
    for (int64_t k = 0; k < cairn_gguf_n_kv(g); k++) {
        const char *key = cairn_gguf_key(g, k);
        size_t kl = strlen(key);
        uint32_t id;
        if (has_prefix(key, kl, "tokenizer.ggml.") && has_suffix(key, kl, "_token_id") &&
            cairn_gguf_get_u32(g, key, &id) == CAIRN_OK && id < (uint32_t)c->n &&
            (c->type[id] == T_USER_DEFINED || c->type[id] == T_UNDEFINED))
            c->special[id] = true;
    }
    return 0;
}

static int32_t find_text(const vocab_case *c, const char *s)
{
    for (int32_t i = 0; i < c->n; i++)
        if (c->len[i] == strlen(s) && memcmp(c->text[i], s, c->len[i]) == 0)
            return i;
    return -1;
}

static size_t tokenize(const vocab_case *c, const char *s, size_t len, int flags, int32_t *ids,
                       size_t cap)
{
    size_t n = 0;
    int rc = cairn_tokenize(c->v, s, len, flags, ids, cap, &n);
    CHECK(rc == CAIRN_OK, "%s: tokenize failed: %s", c->path, cairn_strerror(rc));
    return rc == CAIRN_OK ? n : 0;
}

/* The token's text, alone and between other text, in plain mode. */
static void check_plain(const vocab_case *c, int32_t tok, int32_t *ids, size_t cap)
{
    char buf[600];
    size_t l = c->len[tok];
    if (l + 8 > sizeof buf)
        return;
    const char *forms[][2] = {{"", ""}, {"a ", " b"}, {"x", "y"}};
    for (size_t f = 0; f < 3; f++) {
        size_t m = (size_t)snprintf(buf, sizeof buf, "%s", forms[f][0]);
        memcpy(buf + m, c->text[tok], l);
        m += l;
        m += (size_t)snprintf(buf + m, sizeof buf - m, "%s", forms[f][1]);
        size_t n = tokenize(c, buf, m, 0, ids, cap);
        for (size_t i = 0; i < n && i < cap; i++) {
            CHECK(!c->special[ids[i]] && !cairn_vocab_is_eog(c->v, ids[i]),
                  "%s: plain text \"%s%s%s\" gave special token %d '%s' (type %d)", c->path,
                  forms[f][0], c->text[tok], forms[f][1], ids[i], c->text[ids[i]],
                  c->type[ids[i]]);
        }
    }
}

/* With PARSE_SPECIAL the text is that one token (or one of the same text);
 * without `special` it detokenizes to nothing. */
static void check_special(const vocab_case *c, int32_t tok, int32_t *ids, size_t cap)
{
    char piece[600];
    size_t pn = 0;
    int rc = cairn_token_to_piece(c->v, tok, false, piece, sizeof piece, &pn);
    CHECK(rc == CAIRN_OK && pn == 0, "%s: special token %d '%s' detokenizes to %zu bytes",
          c->path, tok, c->text[tok], pn);
    if (c->type[tok] == T_UNUSED)
        return; /* unused slots are matched in no mode */
    size_t n = tokenize(c, c->text[tok], c->len[tok], CAIRN_TOK_PARSE_SPECIAL, ids, cap);
    CHECK(n == 1 && c->len[ids[0]] == c->len[tok] &&
              memcmp(c->text[ids[0]], c->text[tok], c->len[tok]) == 0,
          "%s: with parse_special '%s' gives %zu tokens (first %d), not token %d", c->path,
          c->text[tok], n, n ? ids[0] : -1, tok);
}

/* What must hold of particular vocabularies, so that a marker predicate gone
 * wrong cannot pass quietly. */
static void check_known(const vocab_case *c, int32_t *ids, size_t cap)
{
    const char *base = strrchr(c->path, '/');
    base = base ? base + 1 : c->path;
    if (strstr(base, "phi-3")) {
        /* the user report: </s> is typed USER_DEFINED there */
        int32_t s = find_text(c, "</s>");
        CHECK(s == 2 && c->type[s] == T_USER_DEFINED && c->special[s],
              "%s: </s> should be the added token 2", c->path);
    }
    if (strstr(base, "deepseek-coder")) {
        static const char *const m[] = {"<|User|>", "<|Assistant|>", "<|EOT|>", "<pad>",
                                        "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>"};
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
            int32_t t = find_text(c, m[i]);
            CHECK(t >= 0 && c->type[t] == T_USER_DEFINED && c->special[t],
                  "%s: '%s' should be an added marker", c->path, m[i]);
        }
    }
    if (strstr(base, "qwen")) {
        /* Qwen's tool-call tags are added words the model reads as text */
        int32_t t = find_text(c, "<tool_call>");
        CHECK(t >= 0 && !c->special[t], "%s: <tool_call> should be a plain added token", c->path);
        size_t n = tokenize(c, "<tool_call>", 11, 0, ids, cap);
        CHECK(n == 1 && ids[0] == t, "%s: plain <tool_call> should be token %d", c->path, t);
    }
    if (strstr(base, "mpt")) {
        int32_t t = find_text(c, "    ");
        CHECK(t >= 0 && !c->special[t], "%s: 4 spaces should be a plain added token", c->path);
        size_t n = tokenize(c, "a    b", 6, 0, ids, cap);
        bool seen = false;
        for (size_t i = 0; i < n; i++)
            seen |= ids[i] == t;
        CHECK(seen, "%s: the added run of spaces is not matched in plain text", c->path);
    }
}

/* The vocabularies cairn does not tokenize (WordPiece), by file name: these,
 * and only these, load as CAIRN_EUNSUPPORTED. A listed one that loads, or an
 * unlisted one that is refused, is a failure. */
static const char *const expected_unsupported[] = {"ggml-vocab-bert-bge.gguf"};

static bool is_expected_unsupported(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0; i < sizeof expected_unsupported / sizeof expected_unsupported[0]; i++)
        if (strcmp(base, expected_unsupported[i]) == 0)
            return true;
    return false;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE.gguf...\n", argv[0]);
        return 2;
    }
    enum { CAP = 4096 };
    static int32_t ids[CAP];
    int checked = 0;
    for (int a = 1; a < argc; a++) {
        const char *path = argv[a];
        if (access(path, R_OK) != 0) {
            printf("skip: %s is absent\n", path);
            return 77;
        }
        char err[256] = "";
        cairn_gguf *g = NULL;
        if (cairn_gguf_open(path, &g, err, sizeof err) != CAIRN_OK) {
            CHECK(false, "%s: %s", path, err);
            continue;
        }
        vocab_case c = {.path = path};
        int rc = cairn_vocab_load(g, &c.v, err, sizeof err);
        if (rc == CAIRN_EUNSUPPORTED) {
            CHECK(is_expected_unsupported(path), "%s: refused as unsupported (%s)", path, err);
            printf("%s: not a vocabulary cairn tokenizes (%s); passed over\n", path, err);
            cairn_gguf_close(g);
            continue;
        }
        CHECK(!is_expected_unsupported(path) || rc != CAIRN_OK,
              "%s: loads, but is listed as unsupported", path);
        if (rc != CAIRN_OK || case_load(&c, g) != 0) {
            CHECK(false, "%s: cannot load: %s", path, err);
            cairn_gguf_close(g);
            case_free(&c);
            continue;
        }
        int before = failures, n_special = 0;
        for (int32_t t = 0; t < c.n; t++) {
            if (!c.special[t] || c.len[t] == 0)
                continue;
            n_special++;
            check_plain(&c, t, ids, CAP);
            check_special(&c, t, ids, CAP);
        }
        check_known(&c, ids, CAP);
        printf("%s: %d special tokens, %d failures\n", path, n_special, failures - before);
        checked++;
        case_free(&c);
        cairn_gguf_close(g); /* the token texts point into it */
    }
    if (checked == 0) {
        fprintf(stderr, "no vocabulary checked\n");
        return 1;
    }
    return failures ? 1 : 0;
}
