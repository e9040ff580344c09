/*
 * fuzz/fuzz_tokenizer.c — tokenization and detokenization of arbitrary
 * bytes with real vocabularies (fixed; the text is what is fuzzed).
 *
 * Input: byte 0 picks the vocabulary, byte 1 the flags (bit 0 ADD_BOS, bit 1
 * PARSE_SPECIAL), the rest is the text.
 *
 * Properties, for every text:
 *   - tokenization succeeds; ids lie inside the vocabulary; the size
 *     contract holds (a short buffer gives CAIRN_ERANGE and the same count);
 *     ADD_BOS puts the vocabulary's BOS first when it has one;
 *   - the streaming detokenizer emits only well-formed UTF-8;
 *   - byte-level BPE is lossless: without PARSE_SPECIAL the pieces of the
 *     tokens (after a BOS we asked for) are exactly the input bytes, for
 *     texts whose every byte has a token in the vocabulary.
 */
#include "fuzz_common.h"

#include <string.h>

static const char *const vocab_files[] = {
    "models/stories260K.gguf",
    "tests/data/tokenizer/ggml-vocab-llama-spm.gguf",
    "tests/data/tokenizer/ggml-vocab-phi-3.gguf",
    "tests/data/tokenizer/ggml-vocab-gpt-2.gguf",
    "tests/data/tokenizer/ggml-vocab-mpt.gguf",
    "tests/data/tokenizer/ggml-vocab-refact.gguf",
    "tests/data/tokenizer/ggml-vocab-starcoder.gguf",
    "tests/data/tokenizer/ggml-vocab-falcon.gguf",
    "tests/data/tokenizer/ggml-vocab-deepseek-coder.gguf",
    "tests/data/tokenizer/ggml-vocab-deepseek-llm.gguf",
};
#define N_VOCABS (sizeof vocab_files / sizeof vocab_files[0])
static cairn_vocab *g_vocabs[N_VOCABS];
/* Whether the vocabulary has a token for each single byte (byte-level BPE
 * vocabularies often leave out bytes that never occur in UTF-8 text, such as
 * 0xc0, 0xc1 and 0xf5..0xff, and some leave out control characters too).
 * Such a byte becomes a harmless unknown token, U+FFFD (three byte tokens) or
 * nothing, so the round trip only holds for texts without them. */
static bool g_has_byte[N_VOCABS][256];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (size_t i = 0; i < N_VOCABS; i++) {
        g_vocabs[i] = fuzz_load_vocab(vocab_files[i]);
        for (int b = 0; b < 256; b++) {
            char c = (char)b, piece[512];
            int32_t id[4];
            size_t n = 0, got = 0;
            g_has_byte[i][b] = cairn_tokenize(g_vocabs[i], &c, 1, 0, id, 4, &n) == CAIRN_OK &&
                               n == 1 &&
                               cairn_token_to_piece(g_vocabs[i], id[0], true, piece,
                                                    sizeof piece, &got) == CAIRN_OK &&
                               got == 1 && (uint8_t)piece[0] == b;
        }
    }
    return 0;
}

#define MAX_TEXT 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > MAX_TEXT + 2)
        return 0;
    const size_t which = data[0] % N_VOCABS;
    const cairn_vocab *v = g_vocabs[which];
    const int flags = data[1] & (CAIRN_TOK_ADD_BOS | CAIRN_TOK_PARSE_SPECIAL);
    const char *text = (const char *)data + 2;
    const size_t len = size - 2;
    const int32_t n_vocab = cairn_vocab_n_tokens(v);

    /* A byte gives at most three tokens (U+FFFD for a byte the vocabulary
     * cannot spell), plus BOS and a space prefix. */
    static int32_t ids[3 * MAX_TEXT + 8];
    size_t n = 0, n_short = 0;
    FUZZ_CHECK(cairn_tokenize(v, text, len, flags, ids, 3 * MAX_TEXT + 8, &n) == CAIRN_OK);
    FUZZ_CHECK(n <= 3 * len + 2); /* + BOS and a SentencePiece space prefix */
    if (n > 0) {
        int32_t few[1];
        FUZZ_CHECK(cairn_tokenize(v, text, len, flags, few, 0, &n_short) == CAIRN_ERANGE);
        FUZZ_CHECK(n_short == n);
        (void)few;
    }
    const bool bos_first = (flags & CAIRN_TOK_ADD_BOS) && cairn_vocab_bos(v) >= 0;
    if (bos_first)
        FUZZ_CHECK(n >= 1 && ids[0] == cairn_vocab_bos(v));
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab);
        /* plain text never ends a turn (the BOS asked for may be one: gpt-2
         * style vocabularies use <|endoftext|> for both) */
        if (!(flags & CAIRN_TOK_PARSE_SPECIAL) && !(bos_first && i == 0))
            FUZZ_CHECK(!cairn_vocab_is_eog(v, ids[i]));
    }

    /* Streaming detokenizer: only whole characters come out. */
    static char text_out[8 * MAX_TEXT + 1024];
    size_t out_len = 0;
    cairn_detok *d = NULL;
    FUZZ_CHECK(cairn_detok_create(v, (flags & CAIRN_TOK_PARSE_SPECIAL) != 0, &d) == CAIRN_OK);
    for (size_t i = 0; i <= n; i++) {
        size_t got = 0;
        char *dst = text_out + out_len;
        size_t cap = sizeof text_out - out_len;
        FUZZ_CHECK(cap >= 260);
        int rc = i < n ? cairn_detok_push(d, ids[i], dst, cap, &got)
                       : cairn_detok_flush(d, dst, cap, &got);
        FUZZ_CHECK(rc == CAIRN_OK);
        FUZZ_CHECK(got <= cap);
        FUZZ_CHECK(fuzz_utf8_valid((const unsigned char *)dst, got));
        out_len += got;
        if (sizeof text_out - out_len < 260)
            break; /* cannot happen for honest pieces; the check above guards */
    }
    cairn_detok_free(d);

    /* Byte-level BPE loses nothing (when every byte has its token). */
    bool all_bytes = true;
    for (size_t i = 0; i < len && all_bytes; i++)
        all_bytes = g_has_byte[which][(uint8_t)text[i]];
    if (cairn_vocab_kind_of(v) == CAIRN_VOCAB_BPE && !(flags & CAIRN_TOK_PARSE_SPECIAL) &&
        all_bytes) {
        size_t at = 0;
        bool same = true;
        char piece[512];
        for (size_t i = bos_first ? 1 : 0; i < n && same; i++) {
            size_t got = 0;
            FUZZ_CHECK(cairn_token_to_piece(v, ids[i], true, piece, sizeof piece, &got) ==
                       CAIRN_OK);
            same = got <= len - at && memcmp(text + at, piece, got) == 0;
            at += got;
        }
        if (!same || at != len) {
            fprintf(stderr, "round trip differs at byte %zu of %zu\n", at, len);
            FUZZ_CHECK(!"byte-level BPE round trip");
        }
    }
    return 0;
}
