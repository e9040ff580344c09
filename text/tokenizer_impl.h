/*
 * engine/tokenizer_impl.h — internals shared by engine/tokenizer*.c only.
 * Nothing outside text/ includes this.
 */
#ifndef CAIRN_ENGINE_TOKENIZER_IMPL_H
#define CAIRN_ENGINE_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>

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

#endif
