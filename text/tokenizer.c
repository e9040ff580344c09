/*
 * engine/tokenizer.c — vocabularies, tokenization and detokenization.
 *
 * Two tokenizer families, as GGUF describes them:
 *
 *   SentencePiece BPE ("llama"): the text (with "▁" for spaces) starts as one
 *   symbol per character; the adjacent pair whose concatenation is the
 *   highest-scoring vocabulary entry is merged, repeatedly; what never becomes
 *   a token falls back to <0xNN> byte tokens.
 *
 *   Byte-level BPE ("gpt2"): a pre-tokenizer (tokenizer_pre.c) cuts the text
 *   into pieces; each piece starts as one symbol per byte (each byte has a
 *   printable stand-in character in the vocabulary) and pairs are merged by
 *   their rank in `tokenizer.ggml.merges`, lowest first.
 *
 * In both, ties go to the leftmost pair. Special tokens are cut out of the
 * text first (see find_special) and emitted as single ids.
 */
#include "text/text.h"
#include "text/tokenizer_impl.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum {
    TT_UNDEFINED = 0,
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6,
};

/* Vocabularies are far smaller; the cap keeps index arithmetic in int32. */
#define MAX_VOCAB (1 << 24)
/* Longest text one cairn_tokenize call accepts (symbol indices are int32). */
#define MAX_TEXT ((size_t)1 << 30)

/* ---- hash maps ---------------------------------------------------------- */

/* Token text -> id. Open addressing; slots hold id + 1 (0 = empty). */
typedef struct {
    uint32_t *slots;
    uint64_t mask;
} text_map;

/* (left id, right id) -> merge rank and merged id. */
typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} pair_slot;

typedef struct {
    pair_slot *slots;
    uint64_t mask;
} pair_map;

static uint64_t table_size_for(uint64_t n)
{
    uint64_t size = 16;
    while (size < n * 2)
        size <<= 1;
    return size;
}

/* ---- the vocabulary ----------------------------------------------------- */

struct cairn_vocab {
    cairn_vocab_kind kind;
    int32_t n;
    char *text_block;
    uint32_t *text_off, *text_len; /* [n] stored token text                   */
    char *piece_block;
    uint32_t *piece_off, *piece_len; /* [n] bytes the token stands for         */
    float *score;                  /* [n]                                     */
    uint8_t *type;                 /* [n] TT_*                                */
    uint8_t *eog;                  /* [n] 1 = ends generation                 */
    text_map by_text;

    int32_t bos, eos, eot, eom, unk;
    bool add_bos;
    bool add_space_prefix;

    /* special tokens cut out of the text, sorted by first byte then longest
     * first; special_first[b] .. special_first[b+1] are those starting with b */
    int32_t *special;
    uint32_t special_first[257];

    /* SPM: <0xNN> token per byte; BPE: the token of each byte's stand-in */
    int32_t byte_token[256];

    /* BPE */
    pair_map merges;
    tok_pretok *pretok;
    bool ignore_merges;
};

static const char *tok_text(const cairn_vocab *v, int32_t id) { return v->text_block + v->text_off[id]; }

static int32_t lookup_text(const cairn_vocab *v, const char *s, size_t len)
{
    uint64_t h = XXH3_64bits(s, len);
    for (uint64_t i = h & v->by_text.mask;; i = (i + 1) & v->by_text.mask) {
        uint32_t slot = v->by_text.slots[i];
        if (slot == 0)
            return -1;
        int32_t id = (int32_t)slot - 1;
        if (v->text_len[id] == len && memcmp(tok_text(v, id), s, len) == 0)
            return id;
    }
}

static bool pair_lookup(const pair_map *m, int32_t a, int32_t b, int32_t *rank, int32_t *result)
{
    if (!m->slots)
        return false;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = XXH3_64bits(&key, 8) & m->mask;; i = (i + 1) & m->mask) {
        const pair_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX)
            return false;
        if (s->key == key) {
            *rank = s->rank;
            *result = s->result;
            return true;
        }
    }
}

/* ---- GPT-2 byte <-> stand-in character mapping -------------------------- */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes are given
 * code points 256, 257, ... in byte order, so every byte is a visible char. */
static uint32_t byte_to_cp(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))
        return b;
    uint32_t k = 0;
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE)))
            k++;
    return 256 + k;
}

static size_t cp_to_utf8(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 character at s (n bytes available), or 0 when the
 * bytes there are not a complete, valid character. */
static size_t utf8_char_len(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* no overlongs */
        if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F; /* <= U+10FFFF */
    } else
        return 0;
    if (n < len)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

static uint32_t utf8_decode(const uint8_t *s, size_t len)
{
    switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 |
               (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    }
}

/* ---- loading ------------------------------------------------------------ */

void cairn_vocab_free(cairn_vocab *v)
{
    if (!v)
        return;
    free(v->text_block);
    free(v->text_off);
    free(v->text_len);
    free(v->piece_block);
    free(v->piece_off);
    free(v->piece_len);
    free(v->score);
    free(v->type);
    free(v->eog);
    free(v->by_text.slots);
    free(v->special);
    free(v->merges.slots);
    tok_pretok_free(v->pretok);
    free(v);
}

/* Reads element i of a numeric GGUF array as int64 (integer types only). */
static bool arr_int(cairn_gguf_vtype t, const void *data, uint64_t i, int64_t *out)
{
    const uint8_t *p = data;
    switch (t) {
    case CAIRN_GGUF_INT8: { int8_t x; memcpy(&x, p + i, 1); *out = x; return true; }
    case CAIRN_GGUF_UINT8: { uint8_t x; memcpy(&x, p + i, 1); *out = x; return true; }
    case CAIRN_GGUF_INT16: { int16_t x; memcpy(&x, p + 2 * i, 2); *out = x; return true; }
    case CAIRN_GGUF_UINT16: { uint16_t x; memcpy(&x, p + 2 * i, 2); *out = x; return true; }
    case CAIRN_GGUF_INT32: { int32_t x; memcpy(&x, p + 4 * i, 4); *out = x; return true; }
    case CAIRN_GGUF_UINT32: { uint32_t x; memcpy(&x, p + 4 * i, 4); *out = x; return true; }
    case CAIRN_GGUF_INT64: { int64_t x; memcpy(&x, p + 8 * i, 8); *out = x; return true; }
    default: return false;
    }
}

/* An optional token id key: -1 when absent or out of range. */
static int32_t opt_id(const cairn_gguf *g, const char *key, int32_t n, int32_t dflt)
{
    uint32_t id;
    int rc = cairn_gguf_get_u32(g, key, &id);
    if (rc == CAIRN_ENOTFOUND)
        return dflt < n ? dflt : -1;
    if (rc != CAIRN_OK || id >= (uint32_t)n) {
        cairn_log(CAIRN_LOG_WARN, "vocab: ignoring %s (not a token id of this vocabulary)", key);
        return -1;
    }
    return (int32_t)id;
}

/* Texts that mark the end of a turn in the chat formats cairn knows. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<|end_of_text|>", "<EOT>", "<｜end▁of▁sentence｜>", "<|return|>", "<|call|>",
};

static const cairn_vocab *sort_vocab;

static int build_text_map(cairn_vocab *v)
{
    uint64_t size = table_size_for((uint64_t)v->n);
    v->by_text.slots = calloc(size, sizeof *v->by_text.slots);
    if (!v->by_text.slots)
        return CAIRN_ENOMEM;
    v->by_text.mask = size - 1;
    for (int32_t id = 0; id < v->n; id++) {
        const char *s = tok_text(v, id);
        uint64_t h = XXH3_64bits(s, v->text_len[id]);
        for (uint64_t i = h & v->by_text.mask;; i = (i + 1) & v->by_text.mask) {
            uint32_t slot = v->by_text.slots[i];
            if (slot == 0) {
                v->by_text.slots[i] = (uint32_t)id + 1;
                break;
            }
            int32_t other = (int32_t)slot - 1;
            if (v->text_len[other] == v->text_len[id] &&
                memcmp(tok_text(v, other), s, v->text_len[id]) == 0) {
                /* Duplicate text (an added token repeating a vocabulary
                 * entry, as DeepSeek's byte stand-ins do): lookups serve
                 * merging and byte fallback, which use the model's own
                 * normal token, so a normal token beats any other kind and
                 * otherwise the first id stays. Added tokens are matched
                 * by their id in find_special, not through this map. */
                if (v->type[other] != TT_NORMAL && v->type[id] == TT_NORMAL)
                    v->by_text.slots[i] = (uint32_t)id + 1;
                break;
            }
        }
    }
    return CAIRN_OK;
}

static int build_merges(cairn_vocab *v, const cairn_gguf *g, char *err, size_t err_len)
{
    cairn_gguf_vtype et;
    uint64_t n;
    const void *data;
    int rc = cairn_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &data);
    if (rc == CAIRN_ENOTFOUND) {
        cairn_errorf(err, err_len, 0, "vocab: byte-level BPE without tokenizer.ggml.merges");
        return CAIRN_EFORMAT;
    }
    if (rc != CAIRN_OK || et != CAIRN_GGUF_STRING || n > (uint64_t)INT32_MAX) {
        cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.merges is not an array of strings");
        return CAIRN_EFORMAT;
    }
    uint64_t size = table_size_for(n);
    v->merges.slots = malloc(size * sizeof *v->merges.slots);
    if (!v->merges.slots)
        return CAIRN_ENOMEM;
    for (uint64_t i = 0; i < size; i++)
        v->merges.slots[i].key = UINT64_MAX;
    v->merges.mask = size - 1;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    uint64_t skipped = 0;
    for (uint64_t r = 0; r < n; r++) {
        const char *s;
        size_t len;
        cairn_gguf_get_arr_str(g, "tokenizer.ggml.merges", r, &s, &len);
        /* "left right": the separator is the first space after the first byte
         * (a left part never is empty). */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            skipped++;
            continue;
        }
        size_t ll = (size_t)(sp - s), rl = len - ll - 1;
        int32_t a = lookup_text(v, s, ll), b = lookup_text(v, sp + 1, rl);
        if (len > tmp_cap) {
            tmp_cap = len * 2;
            char *t = realloc(tmp, tmp_cap);
            if (!t) {
                free(tmp);
                return CAIRN_ENOMEM;
            }
            tmp = t;
        }
        memcpy(tmp, s, ll);
        memcpy(tmp + ll, sp + 1, rl);
        int32_t res = lookup_text(v, tmp, ll + rl);
        if (a < 0 || b < 0 || res < 0) {
            skipped++; /* a merge into nothing the vocabulary has cannot apply */
            continue;
        }
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        for (uint64_t i = XXH3_64bits(&key, 8) & v->merges.mask;; i = (i + 1) & v->merges.mask) {
            pair_slot *ps = &v->merges.slots[i];
            if (ps->key == UINT64_MAX) {
                *ps = (pair_slot){key, (int32_t)r, res};
                break;
            }
            if (ps->key == key)
                break; /* the first (best) rank of a repeated pair wins */
        }
    }
    free(tmp);
    if (skipped)
        cairn_log(CAIRN_LOG_DEBUG, "vocab: %llu merges skipped", (unsigned long long)skipped);
    return CAIRN_OK;
}

/* Precomputes every token's bytes (the form with special = true). */
static int build_pieces(cairn_vocab *v)
{
    size_t total = 0;
    for (int32_t id = 0; id < v->n; id++)
        total += v->text_len[id];
    v->piece_block = malloc(total ? total : 1);
    v->piece_off = malloc((size_t)v->n * sizeof *v->piece_off);
    v->piece_len = malloc((size_t)v->n * sizeof *v->piece_len);
    if (!v->piece_block || !v->piece_off || !v->piece_len)
        return CAIRN_ENOMEM;
    /* inverse of byte_to_cp for the 512 code points it uses */
    int16_t cp_byte[512];
    for (int i = 0; i < 512; i++)
        cp_byte[i] = -1;
    for (int b = 0; b < 256; b++)
        cp_byte[byte_to_cp((uint8_t)b)] = (int16_t)b;

    size_t pos = 0;
    for (int32_t id = 0; id < v->n; id++) {
        const uint8_t *s = (const uint8_t *)tok_text(v, id);
        size_t len = v->text_len[id];
        char *out = v->piece_block + pos;
        size_t m = 0;
        uint8_t t = v->type[id];
        unsigned byte;
        if (t == TT_BYTE && len == 6 && sscanf((const char *)s, "<0x%2X>", &byte) == 1) {
            out[m++] = (char)byte;
        } else if (t == TT_NORMAL || t == TT_UNDEFINED) {
            if (v->kind == CAIRN_VOCAB_SPM) {
                for (size_t i = 0; i < len;) {
                    if (i + 3 <= len && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
                        out[m++] = ' ';
                        i += 3;
                    } else {
                        out[m++] = (char)s[i++];
                    }
                }
            } else {
                for (size_t i = 0; i < len;) {
                    size_t cl = utf8_char_len(s + i, len - i);
                    if (cl == 0) {
                        out[m++] = (char)s[i++];
                        continue;
                    }
                    uint32_t cp = utf8_decode(s + i, cl);
                    if (cp < 512 && cp_byte[cp] >= 0) {
                        out[m++] = (char)cp_byte[cp];
                    } else { /* not a stand-in: keep the character as is */
                        memcpy(out + m, s + i, cl);
                        m += cl;
                    }
                    i += cl;
                }
            }
        } else {
            memcpy(out, s, len);
            m = len;
        }
        v->piece_off[id] = (uint32_t)pos;
        v->piece_len[id] = (uint32_t)m;
        pos += m; /* pieces are never longer than their text */
    }
    return CAIRN_OK;
}

static int cmp_special(const void *a, const void *b)
{
    const cairn_vocab *v = sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint8_t fx = (uint8_t)tok_text(v, x)[0], fy = (uint8_t)tok_text(v, y)[0];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (v->text_len[x] != v->text_len[y])
        return v->text_len[x] > v->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static bool is_special_type(uint8_t t)
{
    return t == TT_CONTROL || t == TT_USER_DEFINED || t == TT_UNKNOWN;
}

static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;

static int build_specials(cairn_vocab *v)
{
    int32_t count = 0;
    for (int32_t id = 0; id < v->n; id++)
        if (is_special_type(v->type[id]) && v->text_len[id] > 0)
            count++;
    v->special = malloc((size_t)(count ? count : 1) * sizeof *v->special);
    if (!v->special)
        return CAIRN_ENOMEM;
    int32_t k = 0;
    for (int32_t id = 0; id < v->n; id++)
        if (is_special_type(v->type[id]) && v->text_len[id] > 0)
            v->special[k++] = id;
    /* qsort has no context argument in C11 */
    pthread_mutex_lock(&sort_lock);
    sort_vocab = v;
    qsort(v->special, (size_t)count, sizeof *v->special, cmp_special);
    sort_vocab = NULL;
    pthread_mutex_unlock(&sort_lock);
    uint32_t i = 0;
    for (int b = 0; b < 256; b++) {
        v->special_first[b] = i;
        while (i < (uint32_t)count && (uint8_t)tok_text(v, v->special[i])[0] == b)
            i++;
    }
    v->special_first[256] = (uint32_t)count;
    return CAIRN_OK;
}

int cairn_vocab_load(const cairn_gguf *g, cairn_vocab **out, char *err, size_t err_len)
{
    if (!g || !out) {
        cairn_errorf(err, err_len, 0, "invalid argument");
        return CAIRN_EINVAL;
    }
    const char *model;
    int rc = cairn_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);
    if (rc != CAIRN_OK) {
        cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.model is %s",
                rc == CAIRN_ENOTFOUND ? "missing" : "not a string");
        return rc == CAIRN_ENOTFOUND ? CAIRN_EFORMAT : rc;
    }
    cairn_vocab_kind kind;
    if (strcmp(model, "llama") == 0)
        kind = CAIRN_VOCAB_SPM;
    else if (strcmp(model, "gpt2") == 0)
        kind = CAIRN_VOCAB_BPE;
    else {
        cairn_errorf(err, err_len, 0, "vocab: tokenizer model '%s' is not supported (only llama, gpt2)",
                model);
        return CAIRN_EUNSUPPORTED;
    }

    cairn_gguf_vtype et;
    uint64_t n;
    const void *data;
    rc = cairn_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data);
    if (rc != CAIRN_OK || et != CAIRN_GGUF_STRING || n == 0 || n > MAX_VOCAB) {
        cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.tokens is %s",
                rc == CAIRN_ENOTFOUND ? "missing" : "not a non-empty array of strings");
        return CAIRN_EFORMAT;
    }

    cairn_vocab *v = calloc(1, sizeof *v);
    if (!v)
        goto oom;
    v->kind = kind;
    v->n = (int32_t)n;
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len);
        if (len > UINT32_MAX / 2) {
            cairn_errorf(err, err_len, 0, "vocab: token %llu is too long", (unsigned long long)i);
            cairn_vocab_free(v);
            return CAIRN_EFORMAT;
        }
        total += len + 1;
    }
    if (total > UINT32_MAX) {
        cairn_errorf(err, err_len, 0, "vocab: token texts too large");
        cairn_vocab_free(v);
        return CAIRN_EFORMAT;
    }
    v->text_block = malloc(total);
    v->text_off = malloc(n * sizeof *v->text_off);
    v->text_len = malloc(n * sizeof *v->text_len);
    v->score = calloc(n, sizeof *v->score);
    v->type = malloc(n);
    v->eog = calloc(n, 1);
    if (!v->text_block || !v->text_off || !v->text_len || !v->score || !v->type || !v->eog)
        goto oom;
    size_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len);
        memcpy(v->text_block + pos, s, len + 1);
        v->text_off[i] = (uint32_t)pos;
        v->text_len[i] = (uint32_t)len;
        pos += len + 1;
    }

    /* scores (SentencePiece merge priority) */
    rc = cairn_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data);
    if (rc == CAIRN_OK) {
        if (n != (uint64_t)v->n || (et != CAIRN_GGUF_FLOAT32 && et != CAIRN_GGUF_FLOAT64)) {
            cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.scores must be %d floats", v->n);
            cairn_vocab_free(v);
            return CAIRN_EFORMAT;
        }
        for (int32_t i = 0; i < v->n; i++) {
            if (et == CAIRN_GGUF_FLOAT32) {
                memcpy(&v->score[i], (const uint8_t *)data + 4 * (size_t)i, 4);
            } else {
                double d;
                memcpy(&d, (const uint8_t *)data + 8 * (size_t)i, 8);
                v->score[i] = (float)d;
            }
        }
    } else if (kind == CAIRN_VOCAB_SPM) {
        cairn_log(CAIRN_LOG_WARN, "vocab: no tokenizer.ggml.scores; all merges rank equal");
    }

    /* token types */
    memset(v->type, TT_NORMAL, (size_t)v->n);
    rc = cairn_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data);
    if (rc == CAIRN_OK) {
        int64_t t;
        if (n != (uint64_t)v->n || !arr_int(et, data, 0, &t)) {
            cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.token_type must be %d integers", v->n);
            cairn_vocab_free(v);
            return CAIRN_EFORMAT;
        }
        for (int32_t i = 0; i < v->n; i++) {
            arr_int(et, data, (uint64_t)i, &t);
            v->type[i] = (t >= TT_NORMAL && t <= TT_BYTE) ? (uint8_t)t : TT_UNDEFINED;
        }
    }

    if (build_text_map(v))
        goto oom;

    /* special ids and flags; SentencePiece models default to <unk>=0 <s>=1 </s>=2 */
    bool spm = kind == CAIRN_VOCAB_SPM;
    v->bos = opt_id(g, "tokenizer.ggml.bos_token_id", v->n, spm ? 1 : INT32_MAX);
    v->eos = opt_id(g, "tokenizer.ggml.eos_token_id", v->n, spm ? 2 : INT32_MAX);
    v->unk = opt_id(g, "tokenizer.ggml.unknown_token_id", v->n, spm ? 0 : INT32_MAX);
    v->eot = opt_id(g, "tokenizer.ggml.eot_token_id", v->n, INT32_MAX);
    v->eom = opt_id(g, "tokenizer.ggml.eom_token_id", v->n, INT32_MAX);
    bool flag;
    v->add_bos = spm;
    if (cairn_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &flag) == CAIRN_OK)
        v->add_bos = flag;
    if (v->bos < 0)
        v->add_bos = false;
    v->add_space_prefix = spm;
    if (cairn_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &flag) == CAIRN_OK)
        v->add_space_prefix = flag;

    /* End of generation: the declared ids, and end-of-turn markers found by
     * their text. Those markers are control tokens whatever the file says,
     * so user text can never produce them without PARSE_SPECIAL. */
    int32_t declared[] = {v->eos, v->eot, v->eom};
    for (int i = 0; i < 3; i++)
        if (declared[i] >= 0)
            v->eog[declared[i]] = 1;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = lookup_text(v, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0) {
            v->eog[id] = 1;
            if (v->type[id] == TT_NORMAL || v->type[id] == TT_USER_DEFINED ||
                v->type[id] == TT_UNDEFINED)
                v->type[id] = TT_CONTROL;
            if (v->eot < 0)
                v->eot = id;
        }
    }

    /* byte tokens */
    for (int b = 0; b < 256; b++) {
        char buf[8];
        size_t len;
        if (spm) {
            len = (size_t)snprintf(buf, sizeof buf, "<0x%02X>", b);
        } else {
            len = cp_to_utf8(byte_to_cp((uint8_t)b), buf);
        }
        v->byte_token[b] = lookup_text(v, buf, len);
    }

    if (kind == CAIRN_VOCAB_BPE) {
        if ((rc = build_merges(v, g, err, err_len))) {
            cairn_vocab_free(v);
            if (rc == CAIRN_ENOMEM)
                cairn_errorf(err, err_len, 0, "out of memory");
            return rc;
        }
        const char *pre = NULL;
        cairn_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL);
        bool known;
        rc = tok_pretok_create(pre, &v->pretok, &known, &v->ignore_merges, err, err_len);
        if (rc) {
            cairn_vocab_free(v);
            return rc;
        }
        if (pre && !known)
            cairn_log(CAIRN_LOG_WARN, "vocab: unknown pre-tokenizer '%s', using the default",
                      pre);
    }
    if (build_pieces(v) || build_specials(v))
        goto oom;
    *out = v;
    return CAIRN_OK;
oom:
    cairn_vocab_free(v);
    cairn_errorf(err, err_len, 0, "out of memory loading the vocabulary");
    return CAIRN_ENOMEM;
}

/* ---- accessors ---------------------------------------------------------- */

cairn_vocab_kind cairn_vocab_kind_of(const cairn_vocab *v) { return v->kind; }
int32_t cairn_vocab_n_tokens(const cairn_vocab *v) { return v->n; }
int32_t cairn_vocab_bos(const cairn_vocab *v) { return v->bos; }
int32_t cairn_vocab_eos(const cairn_vocab *v) { return v->eos; }
bool cairn_vocab_add_bos(const cairn_vocab *v) { return v->add_bos; }

bool cairn_vocab_is_eog(const cairn_vocab *v, int32_t token)
{
    return token >= 0 && token < v->n && v->eog[token];
}

const char *cairn_vocab_token_text(const cairn_vocab *v, int32_t token)
{
    return (token >= 0 && token < v->n) ? tok_text(v, token) : NULL;
}

/* ---- tokenization ------------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} id_list;

static int ids_push(id_list *l, int32_t id)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        int32_t *p = realloc(l->v, cap * sizeof *p);
        if (!p)
            return CAIRN_ENOMEM;
        l->v = p;
        l->cap = cap;
    }
    l->v[l->n++] = id;
    return CAIRN_OK;
}

/* A symbol is a contiguous byte span of the text being merged. */
typedef struct {
    int32_t prev, next;
    uint32_t off, len; /* len 0 = merged into its left neighbour */
    int32_t id;        /* its token, or -1 */
} symbol;

/* A candidate merge of symbols left and right+. Smaller key first; ties to
 * the smaller left index. */
typedef struct {
    double key;
    int32_t left, right;
    int32_t id;    /* token of the merged span */
    uint32_t size; /* bytes of the merged span, to detect stale entries */
} bigram;

typedef struct {
    bigram *v;
    size_t n, cap;
} heap;

static bool bigram_before(const bigram *a, const bigram *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(heap *h, bigram b)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        bigram *p = realloc(h->v, cap * sizeof *p);
        if (!p)
            return CAIRN_ENOMEM;
        h->v = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &h->v[parent]))
            break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = b;
    return CAIRN_OK;
}

static bigram heap_pop(heap *h)
{
    bigram top = h->v[0];
    bigram last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && bigram_before(&h->v[c + 1], &h->v[c]))
            c++;
        if (!bigram_before(&h->v[c], &last))
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

typedef struct {
    const cairn_vocab *v;
    symbol *sym;
    size_t sym_cap;
    heap heap;
    char *buf; /* SPM: the escaped fragment; BPE: the stand-in text of a piece */
    size_t buf_cap;
    tok_spans pieces;
    id_list out;
} tok_state;

static int ensure_syms(tok_state *st, size_t n)
{
    if (n <= st->sym_cap)
        return CAIRN_OK;
    symbol *p = realloc(st->sym, n * sizeof *p);
    if (!p)
        return CAIRN_ENOMEM;
    st->sym = p;
    st->sym_cap = n;
    return CAIRN_OK;
}

static int ensure_buf(tok_state *st, size_t n)
{
    if (n <= st->buf_cap)
        return CAIRN_OK;
    char *p = realloc(st->buf, n);
    if (!p)
        return CAIRN_ENOMEM;
    st->buf = p;
    st->buf_cap = n;
    return CAIRN_OK;
}

/* May a SentencePiece merge produce this token? Control, byte and unused
 * pieces only ever come from their own rules, never from merging text. */
static bool spm_mergeable(const cairn_vocab *v, int32_t id)
{
    uint8_t t = v->type[id];
    return t == TT_NORMAL || t == TT_USER_DEFINED || t == TT_UNDEFINED;
}

static int spm_try_pair(tok_state *st, const char *text, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return CAIRN_OK;
    const symbol *a = &st->sym[l], *b = &st->sym[r];
    uint32_t size = a->len + b->len;
    int32_t id = lookup_text(st->v, text + a->off, size);
    if (id < 0 || !spm_mergeable(st->v, id))
        return CAIRN_OK;
    return heap_push(&st->heap, (bigram){-(double)st->v->score[id], l, r, id, size});
}

/* Emits byte tokens for the bytes of a span no token covers. */
static int emit_bytes(tok_state *st, const uint8_t *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        int32_t id = st->v->byte_token[s[i]];
        if (id < 0)
            id = st->v->unk;
        if (id >= 0 && ids_push(&st->out, id))
            return CAIRN_ENOMEM;
    }
    return CAIRN_OK;
}

/* SentencePiece BPE over one raw fragment. */
static int spm_fragment(tok_state *st, const char *frag, size_t len, bool space_prefix)
{
    const cairn_vocab *v = st->v;
    /* Escape: optional leading space, every ' ' -> U+2581 (3 bytes). */
    size_t need = 3 * (len + 1);
    if (ensure_buf(st, need))
        return CAIRN_ENOMEM;
    size_t m = 0;
    if (space_prefix) {
        memcpy(st->buf, "\xE2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (frag[i] == ' ') {
            memcpy(st->buf + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            st->buf[m++] = frag[i];
        }
    }
    if (m == 0)
        return CAIRN_OK;
    const char *text = st->buf;
    /* one symbol per character; an invalid byte is a character of its own */
    if (ensure_syms(st, m))
        return CAIRN_ENOMEM;
    int32_t n = 0;
    for (size_t i = 0; i < m;) {
        size_t cl = utf8_char_len((const uint8_t *)text + i, m - i);
        if (cl == 0)
            cl = 1;
        st->sym[n] = (symbol){n - 1, -1, (uint32_t)i, (uint32_t)cl, -1};
        if (n > 0)
            st->sym[n - 1].next = n;
        n++;
        i += cl;
    }
    st->heap.n = 0;
    for (int32_t i = 1; i < n; i++)
        if (spm_try_pair(st, text, i - 1, i))
            return CAIRN_ENOMEM;
    while (st->heap.n) {
        bigram bg = heap_pop(&st->heap);
        symbol *a = &st->sym[bg.left], *b = &st->sym[bg.right];
        if (a->len == 0 || b->len == 0 || a->next != bg.right || a->len + b->len != bg.size)
            continue; /* stale: one side has changed since this was queued */
        a->len += b->len;
        a->id = bg.id;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0)
            st->sym[b->next].prev = bg.left;
        if (spm_try_pair(st, text, a->prev, bg.left) || spm_try_pair(st, text, bg.left, a->next))
            return CAIRN_ENOMEM;
    }
    for (int32_t i = 0; i != -1; i = st->sym[i].next) {
        const symbol *s = &st->sym[i];
        int32_t id = s->id;
        if (id < 0) {
            /* an unmerged character: a token if the vocabulary has it */
            id = lookup_text(v, text + s->off, s->len);
            if (id >= 0 && !spm_mergeable(v, id))
                id = -1;
        }
        if (id >= 0) {
            if (ids_push(&st->out, id))
                return CAIRN_ENOMEM;
        } else if (emit_bytes(st, (const uint8_t *)text + s->off, s->len)) {
            return CAIRN_ENOMEM;
        }
    }
    return CAIRN_OK;
}

static int bpe_try_pair(tok_state *st, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return CAIRN_OK;
    const symbol *a = &st->sym[l], *b = &st->sym[r];
    int32_t rank, res;
    if (a->id < 0 || b->id < 0 || !pair_lookup(&st->v->merges, a->id, b->id, &rank, &res))
        return CAIRN_OK;
    return heap_push(&st->heap, (bigram){(double)rank, l, r, res, a->len + b->len});
}

/* Byte-level BPE over one pre-tokenized piece. */
static int bpe_piece(tok_state *st, const uint8_t *s, size_t len)
{
    const cairn_vocab *v = st->v;
    if (v->ignore_merges) {
        /* Models trained this way map a piece that is a whole token straight
         * to it, even where merging would end elsewhere. */
        if (ensure_buf(st, 2 * len))
            return CAIRN_ENOMEM;
        size_t m = 0;
        for (size_t i = 0; i < len; i++)
            m += cp_to_utf8(byte_to_cp(s[i]), st->buf + m);
        int32_t id = lookup_text(v, st->buf, m);
        if (id >= 0 && v->type[id] == TT_NORMAL)
            return ids_push(&st->out, id);
    }
    if (ensure_syms(st, len))
        return CAIRN_ENOMEM;
    int32_t n = (int32_t)len;
    for (int32_t i = 0; i < n; i++)
        st->sym[i] = (symbol){i - 1, i + 1 < n ? i + 1 : -1, (uint32_t)i, 1, v->byte_token[s[i]]};
    st->heap.n = 0;
    for (int32_t i = 1; i < n; i++)
        if (bpe_try_pair(st, i - 1, i))
            return CAIRN_ENOMEM;
    while (st->heap.n) {
        bigram bg = heap_pop(&st->heap);
        symbol *a = &st->sym[bg.left], *b = &st->sym[bg.right];
        if (a->len == 0 || b->len == 0 || a->next != bg.right || a->len + b->len != bg.size)
            continue;
        a->len += b->len;
        a->id = bg.id;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0)
            st->sym[b->next].prev = bg.left;
        if (bpe_try_pair(st, a->prev, bg.left) || bpe_try_pair(st, bg.left, a->next))
            return CAIRN_ENOMEM;
    }
    for (int32_t i = 0; i != -1; i = st->sym[i].next) {
        int32_t id = st->sym[i].id;
        if (id >= 0) {
            if (ids_push(&st->out, id))
                return CAIRN_ENOMEM;
            continue;
        }
        /* A byte without a stand-in token (the vocab is incomplete; only
         * invalid UTF-8 reaches here). Its unknown token is often a control
         * token such as <|endoftext|> — emitting it would let plain text end
         * a turn — so such a byte becomes U+FFFD, or nothing if even that
         * cannot be spelled. A harmless unknown token is used as is. */
        if (id < 0 && v->unk >= 0 && v->unk < v->n && v->type[v->unk] != TT_CONTROL &&
            !v->eog[v->unk]) {
            if (ids_push(&st->out, v->unk))
                return CAIRN_ENOMEM;
            continue;
        }
        static const uint8_t replacement[3] = {0xEF, 0xBF, 0xBD};
        if (v->byte_token[0xEF] >= 0 && v->byte_token[0xBF] >= 0 && v->byte_token[0xBD] >= 0)
            for (int k = 0; k < 3; k++)
                if (ids_push(&st->out, v->byte_token[replacement[k]]))
                    return CAIRN_ENOMEM;
    }
    return CAIRN_OK;
}

static int bpe_fragment(tok_state *st, const char *frag, size_t len)
{
    if (len == 0)
        return CAIRN_OK;
    int rc = tok_pretok_split(st->v->pretok, frag, len, &st->pieces);
    if (rc)
        return rc;
    for (size_t i = 0; i < st->pieces.n; i++) {
        const tok_span *p = &st->pieces.v[i];
        if (p->len && (rc = bpe_piece(st, (const uint8_t *)frag + p->off, p->len)))
            return rc;
    }
    return CAIRN_OK;
}

/* Finds the leftmost special token in text[from..len), longest first at a
 * given position. Only control/unknown tokens need PARSE_SPECIAL; user-defined
 * tokens (added words such as runs of spaces) are always matched, as the
 * reference tokenizers do. */
static bool find_special(const cairn_vocab *v, const char *text, size_t len, size_t from,
                         bool parse_special, size_t *at, int32_t *id)
{
    for (size_t i = from; i < len; i++) {
        uint8_t b = (uint8_t)text[i];
        for (uint32_t k = v->special_first[b]; k < v->special_first[b + 1]; k++) {
            int32_t t = v->special[k];
            if (!parse_special && v->type[t] != TT_USER_DEFINED)
                continue;
            uint32_t tl = v->text_len[t];
            if (tl <= len - i && memcmp(text + i, tok_text(v, t), tl) == 0) {
                *at = i;
                *id = t;
                return true;
            }
        }
    }
    return false;
}

static int tokenize_all(tok_state *st, const char *text, size_t len, int flags)
{
    const cairn_vocab *v = st->v;
    bool parse_special = (flags & CAIRN_TOK_PARSE_SPECIAL) != 0;
    int rc;
    if ((flags & CAIRN_TOK_ADD_BOS) && v->bos >= 0 && (rc = ids_push(&st->out, v->bos)))
        return rc;
    bool prev_special = true; /* SPM: the first fragment gets the space prefix */
    size_t pos = 0;
    while (pos < len) {
        size_t at = len;
        int32_t sid = -1;
        if (!find_special(v, text, len, pos, parse_special, &at, &sid))
            at = len;
        if (at > pos) {
            if (v->kind == CAIRN_VOCAB_SPM)
                rc = spm_fragment(st, text + pos, at - pos, v->add_space_prefix && prev_special);
            else
                rc = bpe_fragment(st, text + pos, at - pos);
            if (rc)
                return rc;
            prev_special = false;
        }
        if (sid >= 0) {
            if ((rc = ids_push(&st->out, sid)))
                return rc;
            prev_special = true;
            pos = at + v->text_len[sid];
        } else {
            pos = at;
        }
    }
    return CAIRN_OK;
}

int cairn_tokenize(const cairn_vocab *v, const char *text, size_t len, int flags, int32_t *out,
                   size_t cap, size_t *n_out)
{
    if (!v || (!text && len) || (!out && cap) || !n_out)
        return CAIRN_EINVAL;
    if (len > MAX_TEXT)
        return CAIRN_ERANGE;
    tok_state st = {.v = v};
    int rc = tokenize_all(&st, text, len, flags);
    if (rc == CAIRN_OK) {
        *n_out = st.out.n;
        size_t k = st.out.n < cap ? st.out.n : cap;
        if (k)
            memcpy(out, st.out.v, k * sizeof *out);
        if (st.out.n > cap)
            rc = CAIRN_ERANGE;
    }
    free(st.sym);
    free(st.heap.v);
    free(st.buf);
    tok_spans_free(&st.pieces);
    free(st.out.v);
    return rc;
}

/* ---- detokenization ----------------------------------------------------- */

/* The bytes of a token; control-like tokens are empty unless `special`. */
static void piece_of(const cairn_vocab *v, int32_t token, bool special, const char **s,
                     size_t *len)
{
    uint8_t t = v->type[token];
    if (!special && (t == TT_CONTROL || t == TT_UNKNOWN || t == TT_UNUSED)) {
        *s = "";
        *len = 0;
        return;
    }
    *s = v->piece_block + v->piece_off[token];
    *len = v->piece_len[token];
}

int cairn_token_to_piece(const cairn_vocab *v, int32_t token, bool special, char *out,
                         size_t cap, size_t *n_out)
{
    if (!v || (!out && cap) || !n_out)
        return CAIRN_EINVAL;
    if (token < 0 || token >= v->n)
        return CAIRN_EINVAL;
    const char *s;
    size_t len;
    piece_of(v, token, special, &s, &len);
    *n_out = len;
    if (len > cap) {
        memcpy(out, s, cap);
        return CAIRN_ERANGE;
    }
    memcpy(out, s, len);
    return CAIRN_OK;
}

struct cairn_detok {
    const cairn_vocab *v;
    bool special;
    uint8_t held[4];
    size_t n_held;
};

int cairn_detok_create(const cairn_vocab *v, bool special, cairn_detok **out)
{
    if (!v || !out)
        return CAIRN_EINVAL;
    cairn_detok *d = calloc(1, sizeof *d);
    if (!d)
        return CAIRN_ENOMEM;
    d->v = v;
    d->special = special;
    *out = d;
    return CAIRN_OK;
}

void cairn_detok_free(cairn_detok *d) { free(d); }

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* Length of the longest prefix of s[0..n) that could still start a valid
 * character (the lead byte and the continuation bytes so far are right). */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    size_t k = 1;
    while (k < need && k < n) {
        uint8_t x = s[k];
        if (k == 1 ? (x < lo || x > hi) : ((x & 0xC0) != 0x80))
            break;
        k++;
    }
    return k; /* == need: complete; k < need and k == n: may still complete */
}

/* Converts bytes to valid UTF-8, writing to out (NULL = only count). Bytes
 * of an unfinished character at the end are held when `hold`; every maximal
 * invalid sequence becomes one U+FFFD. Returns bytes written; *consumed. */
static size_t sanitize(const uint8_t *s, size_t n, bool hold, char *out, size_t *consumed)
{
    size_t i = 0, m = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            if (out)
                out[m] = (char)s[i];
            m++;
            i++;
            continue;
        }
        size_t cl = utf8_char_len(s + i, n - i);
        if (cl) {
            if (out)
                memcpy(out + m, s + i, cl);
            m += cl;
            i += cl;
            continue;
        }
        size_t k = utf8_valid_prefix(s + i, n - i);
        if (k > 0 && i + k == n && hold)
            break; /* may complete with the next token */
        if (out)
            memcpy(out + m, replacement, 3);
        m += 3;
        i += k ? k : 1;
    }
    *consumed = i;
    return m;
}

static int detok_emit(cairn_detok *d, const char *piece, size_t plen, bool hold, char *out,
                      size_t cap, size_t *n_out)
{
    uint8_t stackbuf[512];
    size_t total = d->n_held + plen;
    uint8_t *buf = total <= sizeof stackbuf ? stackbuf : malloc(total);
    if (!buf)
        return CAIRN_ENOMEM;
    memcpy(buf, d->held, d->n_held);
    if (plen)
        memcpy(buf + d->n_held, piece, plen);
    size_t consumed;
    size_t need = sanitize(buf, total, hold, NULL, &consumed);
    *n_out = need;
    if (need > cap) {
        if (buf != stackbuf)
            free(buf);
        return CAIRN_ERANGE; /* nothing consumed: the caller may retry */
    }
    sanitize(buf, total, hold, out, &consumed);
    d->n_held = total - consumed; /* at most 3: a valid prefix of one char */
    memcpy(d->held, buf + consumed, d->n_held);
    if (buf != stackbuf)
        free(buf);
    return CAIRN_OK;
}

int cairn_detok_push(cairn_detok *d, int32_t token, char *out, size_t cap, size_t *n_out)
{
    if (!d || (!out && cap) || !n_out)
        return CAIRN_EINVAL;
    if (token < 0 || token >= d->v->n)
        return CAIRN_EINVAL;
    const char *s;
    size_t len;
    piece_of(d->v, token, d->special, &s, &len);
    return detok_emit(d, s, len, true, out, cap, n_out);
}

int cairn_detok_flush(cairn_detok *d, char *out, size_t cap, size_t *n_out)
{
    if (!d || (!out && cap) || !n_out)
        return CAIRN_EINVAL;
    return detok_emit(d, NULL, 0, false, out, cap, n_out);
}
