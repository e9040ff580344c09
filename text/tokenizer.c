/*
 * text/tokenizer.c — tokenization: UTF-8 text to token ids, with a
 * vocabulary built by text/vocab.c.
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
 * text first (see find_special) and emitted as single ids. All state lives
 * in one call's tok_state, so a shared vocabulary needs no locking.
 */
#include "text/text.h"
#include "text/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Longest text one cairn_tokenize call accepts (symbol indices are int32). */
#define MAX_TEXT ((size_t)1 << 30)

/* The merge of tokens a and b (vocab.c builds the table): its rank and the
 * merged token; false when they do not merge. */
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
    int32_t id = tok_lookup_text(st->v, text + a->off, size);
    if (id < 0 || !spm_mergeable(st->v, id))
        return CAIRN_OK;
    return heap_push(&st->heap, (bigram){-(double)st->v->score[id], l, r, id, size});
}

/* Emits byte tokens for the bytes of a span no token covers: the unknown
 * token where a byte has none (SentencePiece without byte fallback), or
 * nothing when that token would end generation. */
static int emit_bytes(tok_state *st, const uint8_t *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        int32_t id = st->v->byte_token[s[i]];
        if (id < 0 && st->v->unk >= 0 && !st->v->eog[st->v->unk])
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
        size_t cl = tok_utf8_char_len((const uint8_t *)text + i, m - i);
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
            id = tok_lookup_text(v, text + s->off, s->len);
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
            m += tok_cp_to_utf8(tok_byte_to_cp(s[i]), st->buf + m);
        int32_t id = tok_lookup_text(v, st->buf, m);
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
 * reference tokenizers do — the added tokens that are really markers were
 * retyped as control when the vocabulary was loaded (vocab.c, mark_control;
 * the rule is in text/text.h). */
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
