/*
 * text/vocab.c — a cairn_vocab built from a GGUF's `tokenizer.ggml.*`
 * metadata, and its accessors.
 *
 * Loading does all the work tokenizing would otherwise repeat: token texts
 * are hashed for lookup, byte-level BPE merges become a pair -> rank table,
 * every token's bytes are precomputed (detokenizing is a copy), and the
 * special tokens are sorted for leftmost-longest matching. After that the
 * vocabulary is read-only, which is what lets any number of threads share
 * one. The byte and UTF-8 helpers the tokenizer files share are here too.
 */
#include "text/text.h"
#include "text/tokenizer_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Vocabularies are far smaller; the cap keeps index arithmetic in int32. */
#define MAX_VOCAB (1 << 24)

/* ---- hash maps ---------------------------------------------------------- */
/* (Their layouts are in text/tokenizer_impl.h: the tokenizer probes them.) */

static uint64_t table_size_for(uint64_t n)
{
    uint64_t size = 16;
    while (size < n * 2)
        size <<= 1;
    return size;
}

int32_t tok_lookup_text(const cairn_vocab *v, const char *s, size_t len)
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

/* ---- GPT-2 byte <-> stand-in character mapping -------------------------- */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes are given
 * code points 256, 257, ... in byte order, so every byte is a visible char. */
uint32_t tok_byte_to_cp(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))
        return b;
    uint32_t k = 0;
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE)))
            k++;
    return 256 + k;
}

size_t tok_cp_to_utf8(uint32_t cp, char *out)
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
size_t tok_utf8_char_len(const uint8_t *s, size_t n)
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
    free(v->shown);
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
        int32_t a = tok_lookup_text(v, s, ll), b = tok_lookup_text(v, sp + 1, rl);
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
        int32_t res = tok_lookup_text(v, tmp, ll + rl);
        if (a < 0 || b < 0 || res < 0) {
            skipped++; /* a merge into nothing the vocabulary has cannot apply */
            continue;
        }
        if (v->type[res] == TT_CONTROL || v->type[res] == TT_UNKNOWN || v->type[res] == TT_UNUSED) {
            skipped++; /* merging text must never spell a control token */
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
        cp_byte[tok_byte_to_cp((uint8_t)b)] = (int16_t)b;

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
                    size_t cl = tok_utf8_char_len(s + i, len - i);
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

/* tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE). */
static int read_kind(const cairn_gguf *g, cairn_vocab_kind *kind, char *err, size_t err_len)
{
    const char *model;
    int rc = cairn_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);
    if (rc != CAIRN_OK) {
        cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.model is %s",
                rc == CAIRN_ENOTFOUND ? "missing" : "not a string");
        return rc == CAIRN_ENOTFOUND ? CAIRN_EFORMAT : rc;
    }
    if (strcmp(model, "llama") == 0)
        *kind = CAIRN_VOCAB_SPM;
    else if (strcmp(model, "gpt2") == 0)
        *kind = CAIRN_VOCAB_BPE;
    else {
        cairn_errorf(err, err_len, 0, "vocab: tokenizer model '%s' is not supported (only llama, gpt2)",
                model);
        return CAIRN_EUNSUPPORTED;
    }
    return CAIRN_OK;
}

/* How many tokens tokenizer.ggml.tokens holds (1 .. MAX_VOCAB). */
static int read_size(const cairn_gguf *g, uint64_t *n, char *err, size_t err_len)
{
    cairn_gguf_vtype et;
    const void *data;
    int rc = cairn_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, n, &data);
    if (rc != CAIRN_OK || et != CAIRN_GGUF_STRING || *n == 0 || *n > MAX_VOCAB) {
        cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.tokens is %s",
                rc == CAIRN_ENOTFOUND ? "missing" : "not a non-empty array of strings");
        return CAIRN_EFORMAT;
    }
    return CAIRN_OK;
}

/* Copies every token's text into one block (NUL-terminated each) and
 * allocates the per-token arrays the later steps fill. CAIRN_ENOMEM, or
 * CAIRN_EFORMAT (message in err) for texts too long to index. */
static int load_texts(cairn_vocab *v, const cairn_gguf *g, char *err, size_t err_len)
{
    uint64_t n = (uint64_t)v->n;
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        cairn_gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len);
        if (len > UINT32_MAX / 2) {
            cairn_errorf(err, err_len, 0, "vocab: token %llu is too long", (unsigned long long)i);
            return CAIRN_EFORMAT;
        }
        total += len + 1;
    }
    if (total > UINT32_MAX) {
        cairn_errorf(err, err_len, 0, "vocab: token texts too large");
        return CAIRN_EFORMAT;
    }
    v->text_block = malloc(total);
    v->text_off = malloc(n * sizeof *v->text_off);
    v->text_len = malloc(n * sizeof *v->text_len);
    v->score = calloc(n, sizeof *v->score);
    v->type = malloc(n);
    v->eog = calloc(n, 1);
    if (!v->text_block || !v->text_off || !v->text_len || !v->score || !v->type || !v->eog)
        return CAIRN_ENOMEM;
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
    return CAIRN_OK;
}

/* Scores (SentencePiece merge priority); absent: all 0. */
static int load_scores(cairn_vocab *v, const cairn_gguf *g, char *err, size_t err_len)
{
    cairn_gguf_vtype et;
    uint64_t n;
    const void *data;
    int rc = cairn_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &data);
    if (rc == CAIRN_OK) {
        if (n != (uint64_t)v->n || (et != CAIRN_GGUF_FLOAT32 && et != CAIRN_GGUF_FLOAT64)) {
            cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.scores must be %d floats", v->n);
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
    } else if (v->kind == CAIRN_VOCAB_SPM) {
        cairn_log(CAIRN_LOG_WARN, "vocab: no tokenizer.ggml.scores; all merges rank equal");
    }
    return CAIRN_OK;
}

/* Token types (TT_*); absent: all normal. */
static int load_types(cairn_vocab *v, const cairn_gguf *g, char *err, size_t err_len)
{
    cairn_gguf_vtype et;
    uint64_t n;
    const void *data;
    memset(v->type, TT_NORMAL, (size_t)v->n);
    int rc = cairn_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &data);
    if (rc == CAIRN_OK) {
        int64_t t;
        if (n != (uint64_t)v->n || !arr_int(et, data, 0, &t)) {
            cairn_errorf(err, err_len, 0, "vocab: tokenizer.ggml.token_type must be %d integers", v->n);
            return CAIRN_EFORMAT;
        }
        for (int32_t i = 0; i < v->n; i++) {
            arr_int(et, data, (uint64_t)i, &t);
            v->type[i] = (t >= TT_NORMAL && t <= TT_BYTE) ? (uint8_t)t : TT_UNDEFINED;
        }
    }
    return CAIRN_OK;
}

/* Special ids and flags; SentencePiece models default to <unk>=0 <s>=1 </s>=2 */
static void load_special_ids(cairn_vocab *v, const cairn_gguf *g)
{
    bool spm = v->kind == CAIRN_VOCAB_SPM;
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
}

/* OpenAI's harmony vocabulary (o200k_harmony, gpt-oss): a reply is a run of
 * messages "<|channel|>analysis<|message|>...<|end|><|start|>assistant
 * <|channel|>final<|message|>..." that ends at <|return|> (an answer) or
 * <|call|> (a tool call). Told by having both of those. */
static bool is_harmony(const cairn_vocab *v)
{
    return tok_lookup_text(v, "<|return|>", 10) >= 0 && tok_lookup_text(v, "<|call|>", 8) >= 0;
}

/* End of generation: the declared ids, and end-of-turn markers found by
 * their text. Those markers are control tokens whatever the file says,
 * so user text can never produce them without PARSE_SPECIAL. */
static void mark_eog(cairn_vocab *v)
{
    int32_t declared[] = {v->eos, v->eot, v->eom};
    for (int i = 0; i < 3; i++)
        if (declared[i] >= 0)
            v->eog[declared[i]] = 1;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = tok_lookup_text(v, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0) {
            v->eog[id] = 1;
            if (v->type[id] == TT_NORMAL || v->type[id] == TT_USER_DEFINED ||
                v->type[id] == TT_UNDEFINED)
                v->type[id] = TT_CONTROL;
            if (v->eot < 0)
                v->eot = id;
        }
    }
}

/* Harmony's message markers. <|end|> closes a message inside the reply (the
 * reasoning before the answer), not the reply: it never ends generation
 * here, even when the file declares it (so does llama.cpp), and the end of
 * a turn is <|return|>. The markers stay control tokens, so that plain text
 * cannot forge them, but detokenize to their text: a reply's channels are
 * told apart by them (text/tool_calls.c, cairn_chat_parse_reply). */
static int mark_harmony(cairn_vocab *v)
{
    if (!is_harmony(v))
        return CAIRN_OK;
    static const char *const markers[] = {"<|start|>", "<|channel|>", "<|message|>",
                                          "<|constrain|>", "<|end|>"};
    v->shown = calloc((size_t)v->n, 1);
    if (!v->shown)
        return CAIRN_ENOMEM;
    int32_t end = tok_lookup_text(v, "<|end|>", 7);
    if (end >= 0 && v->eog[end]) {
        v->eog[end] = 0;
        if (v->eot == end)
            v->eot = tok_lookup_text(v, "<|return|>", 10);
    }
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) {
        int32_t id = tok_lookup_text(v, markers[i], strlen(markers[i]));
        if (id >= 0 && v->type[id] == TT_CONTROL)
            v->shown[id] = 1;
    }
    return CAIRN_OK;
}

/* ---- which added tokens count as control --------------------------------- */
/* The rule is stated in text/text.h (Vocabulary and tokenizer). Added
 * (user-defined) tokens are matched in plain text; these are the ones that
 * must not be, because they are markers the model reads as structure. */

/* Special ids a GGUF may name besides bos/eos/eot/eom/unk (read above). */
static const char *const named_id_keys[] = {
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.separator_token_id", "tokenizer.ggml.cls_token_id",
    "tokenizer.ggml.mask_token_id", "tokenizer.ggml.prefix_token_id",
    "tokenizer.ggml.suffix_token_id", "tokenizer.ggml.middle_token_id",
    "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
    "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.fim_pad_token_id",
    "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id",
};

/* Marker texts without a telling shape: sentence markers of SentencePiece
 * vocabularies, turn markers and the fill-in-the-middle markers of code
 * models. (<|...|>, <｜...｜> and [NAME] are caught by their shape.) */
static const char *const marker_texts[] = {
    "<s>", "</s>", "<unk>", "<pad>", "<mask>", "<bos>", "<eos>", "<sep>", "<cls>",
    "<start_of_turn>", "<end_of_turn>", "<end_of_utterance>", "<EOT>", "_<EOT>",
    "\xE2\x96\x81<EOT>", "<PRE>", "<SUF>", "<MID>", "\xE2\x96\x81<PRE>", "\xE2\x96\x81<SUF>",
    "\xE2\x96\x81<MID>", "<PAD>", "<REPO>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
    "<fim_pad>", "<fim-prefix>", "<fim-suffix>", "<fim-middle>", "<fim-pad>", "<fim-repo>",
    "<reponame>", "<repo_name>", "<file_sep>", "<filename>",
};

/* s[0..len) is open + at least one byte + close. */
static bool wrapped_in(const char *s, size_t len, const char *open, const char *close)
{
    size_t lo = strlen(open), lc = strlen(close);
    return len > lo + lc && memcmp(s, open, lo) == 0 && memcmp(s + len - lc, close, lc) == 0;
}

/* Does an added token's text look like a control marker? */
static bool control_looking(const char *s, size_t len)
{
    /* <|im_start|>, <|User|>, <|EOT|>, ...: no prose or markup writes these,
     * and every chat format that does uses them as markers. The full-width
     * bar form is DeepSeek's (<｜User｜>, <｜fim▁begin｜>). */
    if (wrapped_in(s, len, "<|", "|>") || wrapped_in(s, len, "<\xEF\xBD\x9C", "\xEF\xBD\x9C>"))
        return true;
    /* [INST], [/INST], [TOOL_CALLS], [CLS], and the [PAD123] fillers that
     * converters add to round a vocabulary up: an upper-case name in
     * brackets. */
    if (len >= 3 && s[0] == '[' && s[len - 1] == ']') {
        size_t i = s[1] == '/' ? 2 : 1;
        if (i == len - 1)
            return false;
        for (; i < len - 1; i++)
            if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
                return false;
        return true;
    }
    for (size_t i = 0; i < sizeof marker_texts / sizeof marker_texts[0]; i++)
        if (strlen(marker_texts[i]) == len && memcmp(marker_texts[i], s, len) == 0)
            return true;
    return false;
}

/* Added tokens that are special ids or look like markers become control
 * tokens: matched in the text only with PARSE_SPECIAL, never produced by
 * merging, and empty when detokenized without `special`. Only added and
 * untyped tokens are looked at: a normal token is the model's own text
 * (a BPE vocabulary may well have "<s>" or "[A]" as ordinary text). */
static void mark_control(cairn_vocab *v, const cairn_gguf *g)
{
    int32_t named[5 + sizeof named_id_keys / sizeof named_id_keys[0]];
    size_t n_named = 0;
    int32_t read[] = {v->bos, v->eos, v->eot, v->eom, v->unk};
    for (size_t i = 0; i < 5; i++)
        named[n_named++] = read[i];
    for (size_t i = 0; i < sizeof named_id_keys / sizeof named_id_keys[0]; i++) {
        /* absent or out of range (stories260K writes UINT32_MAX for "none"):
         * nothing to mark, and nothing to warn about */
        uint32_t id;
        bool ok = cairn_gguf_get_u32(g, named_id_keys[i], &id) == CAIRN_OK && id < (uint32_t)v->n;
        named[n_named++] = ok ? (int32_t)id : -1;
    }
    for (size_t i = 0; i < n_named; i++) {
        int32_t id = named[i];
        if (id >= 0 && (v->type[id] == TT_USER_DEFINED || v->type[id] == TT_UNDEFINED))
            v->type[id] = TT_CONTROL;
    }
    int32_t retyped = 0;
    for (int32_t id = 0; id < v->n; id++) {
        if ((v->type[id] == TT_USER_DEFINED || v->type[id] == TT_UNDEFINED) &&
            control_looking(tok_text(v, id), v->text_len[id])) {
            v->type[id] = TT_CONTROL;
            retyped++;
        }
    }
    if (retyped)
        cairn_log(CAIRN_LOG_DEBUG, "vocab: %d added tokens look like control tokens and are "
                  "treated as such", retyped);
}

/* The token of each byte: <0xNN> for SentencePiece, the byte's stand-in
 * character for byte-level BPE; -1 when the vocabulary has none. */
static void find_byte_tokens(cairn_vocab *v)
{
    bool spm = v->kind == CAIRN_VOCAB_SPM;
    for (int b = 0; b < 256; b++) {
        char buf[8];
        size_t len;
        if (spm) {
            len = (size_t)snprintf(buf, sizeof buf, "<0x%02X>", b);
        } else {
            len = tok_cp_to_utf8(tok_byte_to_cp((uint8_t)b), buf);
        }
        v->byte_token[b] = tok_lookup_text(v, buf, len);
    }
}

/* Byte-level BPE: the merge table and the pre-tokenizer `tokenizer.ggml.pre`
 * names (the default one, with a warning, for a name cairn does not know). */
static int load_bpe(cairn_vocab *v, const cairn_gguf *g, char *err, size_t err_len)
{
    int rc;
    if ((rc = build_merges(v, g, err, err_len))) {
        if (rc == CAIRN_ENOMEM)
            cairn_errorf(err, err_len, 0, "out of memory");
        return rc;
    }
    const char *pre = NULL;
    cairn_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL);
    bool known;
    rc = tok_pretok_create(pre, &v->pretok, &known, &v->ignore_merges, err, err_len);
    if (rc)
        return rc;
    if (pre && !known)
        cairn_log(CAIRN_LOG_WARN, "vocab: unknown pre-tokenizer '%s', using the default",
                  pre);
    return CAIRN_OK;
}

/* The steps depend on each other's results, hence this order: the text map
 * prefers normal tokens (it reads the types); EOG markers, byte tokens and
 * merges are found through the text map; merges, pieces and the
 * special-token list read the types as EOG and control marking leave them. */
int cairn_vocab_load(const cairn_gguf *g, cairn_vocab **out, char *err, size_t err_len)
{
    if (!g || !out) {
        cairn_errorf(err, err_len, 0, "invalid argument");
        return CAIRN_EINVAL;
    }
    cairn_vocab_kind kind;
    uint64_t n = 0;
    int rc = read_kind(g, &kind, err, err_len);
    if (rc == CAIRN_OK)
        rc = read_size(g, &n, err, err_len);
    if (rc != CAIRN_OK)
        return rc;

    cairn_vocab *v = calloc(1, sizeof *v);
    if (!v)
        goto oom;
    v->kind = kind;
    v->n = (int32_t)n;
    rc = load_texts(v, g, err, err_len);
    if (rc == CAIRN_OK)
        rc = load_scores(v, g, err, err_len);
    if (rc == CAIRN_OK)
        rc = load_types(v, g, err, err_len);
    if (rc == CAIRN_ENOMEM || (rc == CAIRN_OK && build_text_map(v)))
        goto oom;
    if (rc != CAIRN_OK) {
        cairn_vocab_free(v);
        return rc;
    }
    load_special_ids(v, g);
    mark_eog(v);
    mark_control(v, g);
    if (mark_harmony(v))
        goto oom;
    find_byte_tokens(v);
    if (kind == CAIRN_VOCAB_BPE && (rc = load_bpe(v, g, err, err_len))) {
        cairn_vocab_free(v);
        return rc;
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

bool tok_is_special_text(const cairn_vocab *v, const char *s, size_t len)
{
    if (len == 0)
        return false;
    uint8_t b = (uint8_t)s[0];
    for (uint32_t k = v->special_first[b]; k < v->special_first[b + 1]; k++) {
        int32_t t = v->special[k];
        if (v->text_len[t] == len && memcmp(tok_text(v, t), s, len) == 0)
            return true;
    }
    return false;
}

cairn_vocab_kind cairn_vocab_kind_of(const cairn_vocab *v) { return v->kind; }
int32_t cairn_vocab_n_tokens(const cairn_vocab *v) { return v->n; }
int32_t cairn_vocab_bos(const cairn_vocab *v) { return v->bos; }
int32_t cairn_vocab_eos(const cairn_vocab *v) { return v->eos; }
bool cairn_vocab_add_bos(const cairn_vocab *v) { return v->add_bos; }

bool cairn_vocab_add_space_prefix(const cairn_vocab *v) { return v->add_space_prefix; }

bool cairn_vocab_is_eog(const cairn_vocab *v, int32_t token)
{
    return token >= 0 && token < v->n && v->eog[token];
}

const char *cairn_vocab_token_text(const cairn_vocab *v, int32_t token)
{
    return (token >= 0 && token < v->n) ? tok_text(v, token) : NULL;
}
