/*
 * text/tokenizer_pre.c — byte-level BPE pre-tokenizers (text -> pieces).
 *
 * A model's tokenizer.json names a sequence of split regexes; the GGUF only
 * carries a short name of that sequence in `tokenizer.ggml.pre`. The table
 * below maps each name to its regexes, written for PCRE2 with UTF and UCP so
 * \p{L}, \p{N}, \p{P}, \s and case-insensitive groups follow Unicode, the way
 * the reference (Hugging Face tokenizers / Oniguruma) evaluates them.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "text/tokenizer_impl.h"

/* GPT-2's split: contractions, optionally space-led letter runs, digit runs,
 * other-symbol runs, and whitespace (a run before a word leaves its last
 * space to be that word's prefix). */
#define RE_GPT2 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* Llama 3 (tiktoken cl100k style): case-insensitive contractions, a letter run
 * that may take one leading non-letter/non-digit, digits in groups of at most
 * three, symbol runs that swallow following newlines, newline runs. */
#define RE_LLAMA3                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Qwen2: as Llama 3 but every digit is its own piece. */
#define RE_QWEN2                                                                             \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"     \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* GPT-4o's o200k (gpt-oss, Llama 4): a letter run is an optional
 * non-letter lead, then upper/title-case letters and then lower-case ones
 * (or the other way round), so "HelloWorld" splits at the case change and
 * a contraction clings to its word; digits in threes; symbol runs that
 * swallow newlines and slashes; newline runs. */
#define RE_GPT4O                                                                              \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"        \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"         \
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"        \
    "[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* CJK ideographs, the block below them, and Hangul syllables (DeepSeek). */
#define RE_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

/* DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee
 * and other cased scripts, listed as the explicit ranges its tokenizer uses
 * (not \p{L}: CJK and other uncased letters are split differently). */
#define RE_DEEPSEEK_LLM_LETTERS                                                                 \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"             \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"         \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}" \
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"  \
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"                 \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"                 \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"         \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"        \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"                 \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"         \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"                   \
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"         \
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"                  \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"                 \
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"                 \
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"           \
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"

#define MAX_PATTERNS 6

typedef struct {
    const char *names;  /* '|'-separated `tokenizer.ggml.pre` values */
    bool ignore_merges; /* a piece that is a whole token is taken as is */
    const char *patterns[MAX_PATTERNS];
} pretok_def;

static const pretok_def pretok_defs[] = {
    /* What the GGUF converters write when they do not recognise a tokenizer:
     * punctuation runs first, then GPT-2, then digit runs in threes. */
    {"default", false,
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"gpt-2|gpt2|mpt|olmo|phi-2|jais|trillion|jina-es|jina-de|jina-v1-en|jina-v2-es|"
     "jina-v2-de|jina-v2-code|roberta-bpe|gigachat|mellum|modern-bert|a.x-4.0",
     false,
     {RE_GPT2}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva", false,
     {"\\p{N}", RE_GPT2}},
    {"falcon", false, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    {"deepseek-coder", false,
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK, "\\p{N}"}},
    {"deepseek-llm", false,
     {"[\\r\\n]", RE_DEEPSEEK_LLM_LETTERS,
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", RE_CJK, "\\p{N}+"}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|dbrx|smaug-bpe|lfm2|midm-2.0", true,
     {RE_LLAMA3}},
    {"qwen2|deepseek-r1-qwen|stablelm2|hunyuan|kormo", false, {RE_QWEN2}},
    {"gpt-4o|llama4|kanana2|talkie", false, {RE_GPT4O}},
};

struct tok_pretok {
    int n;
    pcre2_code *re[MAX_PATTERNS];
};

static bool name_in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, name, n) == 0)
            return true;
        if (!bar)
            break;
        p = bar + 1;
    }
    return false;
}

void tok_pretok_free(tok_pretok *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        pcre2_code_free(p->re[i]);
    free(p);
}

int tok_pretok_create(const char *name, tok_pretok **out, bool *known, bool *ignore_merges,
                      char *err, size_t err_len)
{
    const pretok_def *def = &pretok_defs[0];
    *known = false;
    if (name) {
        for (size_t i = 0; i < sizeof pretok_defs / sizeof pretok_defs[0]; i++)
            if (name_in_list(pretok_defs[i].names, name)) {
                def = &pretok_defs[i];
                *known = true;
                break;
            }
    }
    *ignore_merges = def->ignore_merges;
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p)
        return CAIRN_ENOMEM;
    for (int i = 0; i < MAX_PATTERNS && def->patterns[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        /* MATCH_INVALID_UTF: tokenizer input is never rejected; invalid
         * bytes simply match nothing and fall into gap pieces.
         * DOLLAR_ENDONLY: `$` means the end of the piece, not "before a final
         * newline". */
        p->re[i] = pcre2_compile((PCRE2_SPTR)def->patterns[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF |
                                     PCRE2_DOLLAR_ENDONLY,
                                 &ec, &eo, NULL);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            if (err && err_len)
                snprintf(err, err_len, "pre-tokenizer '%s' pattern %d: %s at %zu",
                         name ? name : "default", i, (const char *)msg, (size_t)eo);
            tok_pretok_free(p);
            return CAIRN_EUNSUPPORTED;
        }
        p->n = i + 1;
        /* JIT is only a speed-up: if it is unavailable the interpreter runs. */
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);
    }
    *out = p;
    return CAIRN_OK;
}

int tok_spans_push(tok_spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        tok_span *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return CAIRN_ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (tok_span){off, len};
    return CAIRN_OK;
}

void tok_spans_free(tok_spans *s)
{
    free(s->v);
    *s = (tok_spans){0};
}

/* Splits one piece with one regex: matches and the gaps between them. */
static int split_piece(const pcre2_code *re, pcre2_match_data *md, const char *text,
                       tok_span piece, tok_spans *out)
{
    const PCRE2_SPTR subject = (PCRE2_SPTR)(text + piece.off);
    size_t start = 0, gap_start = 0;
    while (start < piece.len) {
        int rc = pcre2_match(re, subject, piece.len, start, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            /* Resource limits on a hostile input: keep the rest as one piece
             * rather than fail; it is still tokenized, only split coarser. */
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match (not produced by the table's patterns) must not
             * stall the loop: move on by one character. */
            start = ms + 1;
            while (start < piece.len && (subject[start] & 0xC0) == 0x80)
                start++;
            continue;
        }
        if (ms > gap_start && tok_spans_push(out, piece.off + gap_start, ms - gap_start))
            return CAIRN_ENOMEM;
        if (tok_spans_push(out, piece.off + ms, me - ms))
            return CAIRN_ENOMEM;
        start = gap_start = me;
    }
    if (gap_start < piece.len && tok_spans_push(out, piece.off + gap_start, piece.len - gap_start))
        return CAIRN_ENOMEM;
    return CAIRN_OK;
}

int tok_pretok_split(const tok_pretok *p, const char *text, size_t len, tok_spans *out)
{
    out->n = 0;
    if (len == 0)
        return CAIRN_OK;
    tok_spans cur = {0};
    if (tok_spans_push(&cur, 0, len))
        return CAIRN_ENOMEM;
    int rc = CAIRN_OK;
    pcre2_match_data *md = NULL;
    for (int i = 0; i < p->n; i++) {
        md = pcre2_match_data_create_from_pattern(p->re[i], NULL);
        if (!md) {
            rc = CAIRN_ENOMEM;
            break;
        }
        out->n = 0;
        for (size_t k = 0; k < cur.n && rc == CAIRN_OK; k++)
            rc = split_piece(p->re[i], md, text, cur.v[k], out);
        pcre2_match_data_free(md);
        md = NULL;
        if (rc)
            break;
        /* the output of this regex is the input of the next */
        tok_spans t = cur;
        cur = *out;
        *out = t;
    }
    if (rc == CAIRN_OK) {
        tok_spans t = cur;
        cur = *out;
        *out = t;
    }
    tok_spans_free(&cur);
    return rc;
}
