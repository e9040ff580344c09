/*
 * text/tokenizer_impl.h — internals shared by the tokenizer files: the
 * vocabulary's layout, the byte and UTF-8 helpers all of them use, and the
 * pre-tokenizer. Nothing outside text/ includes this.
 *
 *   vocab.c          building a cairn_vocab from GGUF metadata, accessors
 *   tokenizer.c      text -> ids (SentencePiece and byte-level BPE merging)
 *   tokenizer_pre.c  the byte-level BPE pre-tokenizers (PCRE2 regexes)
 *   detok.c          ids -> bytes, and streaming them as whole UTF-8
 * (text/chat_format.c includes it too, for tok_is_special_text.)
 */
#ifndef CAIRN_TEXT_TOKENIZER_IMPL_H
#define CAIRN_TEXT_TOKENIZER_IMPL_H

#include "text/text.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A byte range of the input text. */
typedef struct {
    size_t off, len;
} tok_span;

/* A growable list of spans. */
typedef struct {
    tok_span *v;
    size_t n, cap;
} tok_spans;

/* A byte-level BPE pre-tokenizer: an ordered list of PCRE2 regexes. Each regex
 * splits every current piece into its matches and the gaps between them (both
 * kept, in order); the next regex then works on those pieces, never looking
 * across a piece boundary. Compiled once; matching is safe from several
 * threads because match data is allocated per call. */
typedef struct tok_pretok tok_pretok;

/* Builds the pre-tokenizer named by `tokenizer.ggml.pre` (NULL or unknown names
 * get the "default" one, with *known = false). *ignore_merges is set for the
 * pre-tokenizers whose models look up a whole piece in the vocabulary before
 * merging (Llama 3). Returns CAIRN_OK, CAIRN_ENOMEM, or CAIRN_EUNSUPPORTED
 * when PCRE2 rejects a pattern (which would be a bug here). */
int tok_pretok_create(const char *name, tok_pretok **out, bool *known, bool *ignore_merges,
                      char *err, size_t err_len);
void tok_pretok_free(tok_pretok *p);

/* Splits text[0..len) into pieces, appended to *out (which is cleared first).
 * Invalid UTF-8 never fails: such bytes end up in pieces of their own or in
 * gaps. Returns CAIRN_OK or CAIRN_ENOMEM. */
int tok_pretok_split(const tok_pretok *p, const char *text, size_t len, tok_spans *out);

int tok_spans_push(tok_spans *s, size_t off, size_t len);
void tok_spans_free(tok_spans *s);

/* ---- the vocabulary ----------------------------------------------------- */

/* Token types, as tokenizer.ggml.token_type gives them. */
enum {
    TT_UNDEFINED = 0,
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6,
};

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
    uint8_t *shown;                /* NULL, or [n] 1 = a control token that
                                      detokenizes to its text even without
                                      `special` (harmony's message markers:
                                      the reply's structure, read back by
                                      the chat reply parser)                */
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

static inline const char *tok_text(const cairn_vocab *v, int32_t id)
{
    return v->text_block + v->text_off[id];
}

/* The id whose stored text is s[0..len) (a normal token when several share
 * it), or -1. Defined in vocab.c, as are the helpers below. */
int32_t tok_lookup_text(const cairn_vocab *v, const char *s, size_t len);

/* Is s[0..len) exactly the text of a token the tokenizer cuts out of text
 * as a whole (control, unknown or user-defined)? Chat formatting asks this
 * of its markers (text/chat_format.c). */
bool tok_is_special_text(const cairn_vocab *v, const char *s, size_t len);

/* GPT-2's byte-level mapping: the code point that stands for byte b. */
uint32_t tok_byte_to_cp(uint8_t b);
/* Writes cp as UTF-8 (1..4 bytes) to out; returns the length. */
size_t tok_cp_to_utf8(uint32_t cp, char *out);
/* Length of the valid UTF-8 character at s (n bytes available), or 0 when the
 * bytes there are not a complete, valid character. */
size_t tok_utf8_char_len(const uint8_t *s, size_t n);

#endif
