/*
 * text/detok.c — detokenization: token ids back to bytes, and a streaming
 * detokenizer that only ever hands out whole UTF-8.
 *
 * A token's bytes were precomputed when the vocabulary was loaded
 * (text/vocab.c), so a piece is a copy. Byte-level and byte-fallback
 * vocabularies split characters across tokens, though, so a stream of
 * pieces is not valid UTF-8 piece by piece: cairn_detok holds the bytes of an
 * unfinished character until it completes, and turns what can never
 * complete into U+FFFD, so every string it gives out is valid UTF-8.
 */
#include "text/text.h"
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* The bytes of a token; control-like tokens are empty unless `special` or
 * shown (text/vocab.c, mark_harmony). */
static void piece_of(const cairn_vocab *v, int32_t token, bool special, const char **s,
                     size_t *len)
{
    uint8_t t = v->type[token];
    if (!special && (t == TT_CONTROL || t == TT_UNKNOWN || t == TT_UNUSED) &&
        !(v->shown && v->shown[token])) {
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
        size_t cl = tok_utf8_char_len(s + i, n - i);
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
