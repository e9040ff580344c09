/*
 * ckpt/tokenizer_json.c — a Hugging Face tokenizer.json (and
 * tokenizer_config.json, generation_config.json) as the tokenizer.ggml.*
 * keys of a converted GGUF:
 *
 *   model.vocab + added_tokens   -> tokens[id], token_type[id]
 *                                   (normal 1, control 3 for special added
 *                                   tokens, user-defined 4 for the others,
 *                                   unused 5 for ids the file leaves empty
 *                                   up to the embedding's rows, "[PAD<id>]")
 *   model.merges                 -> merges ("a b"; the list-of-pairs form too)
 *   pre_tokenizer's split regex  -> tokenizer.ggml.pre, by recognising the
 *                                   published regexes (Qwen2, Llama 3,
 *                                   GPT-4o/gpt-oss o200k, GPT-2): a regex
 *                                   cairn does not know is refused, since a
 *                                   wrong split would give other ids
 *                                   without any error
 *   tokenizer_config.json        -> bos/eos/padding ids, add_bos_token,
 *                                   chat_template
 *   generation_config.json       -> a second stop id (eot) when it lists one,
 *                                   and the recommended sampling settings
 *                                   (cairn.generation.temperature, top_p,
 *                                   top_k, min_p, repetition_penalty)
 *
 * Two kinds are read:
 *
 *   byte-level BPE (Qwen2/2.5/3, Llama 3,  -> tokenizer.ggml.model "gpt2"
 *     gpt-oss)
 *   SentencePiece-style BPE, byte_fallback -> tokenizer.ggml.model "llama"
 *     (Gemma, Llama 2, Mistral)
 *
 * The NFC normalizer Qwen ships is accepted and not applied, as the GGUF
 * converters do: text already in NFC (nearly all) is tokenized identically.
 *
 * A SentencePiece-style tokenizer.json is the converted form of an SPM model:
 * its merges are every split of a piece into two pieces, ordered by the
 * merged piece's SentencePiece score. cairn's SPM tokenizer merges the pair
 * whose concatenation has the highest score, so the scores are rebuilt from
 * the merge ranks (a piece's score is minus the rank of the first merge
 * that makes it), which picks the same merges. Its spaces are the
 * normalizer's (Replace " " -> U+2581, with a leading Prepend U+2581 when
 * the model adds a space prefix: Llama 2's legacy form) or a Metaspace
 * pre-tokenizer that does not split (prepend_scheme first/always/never);
 * anything else is refused by name, since it would cut text differently.
 */
#include "ckpt/ckpt_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TT_NORMAL 1
#define TT_CONTROL 3
#define TT_USER_DEFINED 4
#define TT_UNUSED 5
#define TT_BYTE 6

/* The split regexes as tokenizer.json spells them, and the GGUF
 * pre-tokenizer names cairn implements them under (text/tokenizer_pre.c). */
static const struct {
    const char *regex;
    const char *pre;
} KNOWN_SPLITS[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
     "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "qwen2"},
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
     "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "llama-bpe"},
    /* o200k: GPT-4o, gpt-oss, Llama 4 (a Sequence of this Split, Isolated,
     * and a ByteLevel without its own regex) */
    {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}"
     "\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}"
     "\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}|"
     " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     "gpt-4o"},
};

static const char *str_of(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Which pre-tokenizer: the Split regexes of the pre_tokenizer (alone or in
 * a Sequence), or ByteLevel's own GPT-2 regex. */
static int detect_pre(json_t *pt, const char **pre, char *err, size_t err_len)
{
    json_t *list = json_object_get(pt, "pretokenizers");
    json_t *one = json_array();
    if (!one)
        return CAIRN_ENOMEM;
    if (!json_is_array(list)) {
        json_array_append(one, pt);
        list = one;
    }
    const char *regex = NULL;
    bool byte_level = false, byte_level_regex = false;
    int n_split = 0;
    size_t i;
    json_t *p;
    int rc = CAIRN_OK;
    json_array_foreach(list, i, p)
    {
        const char *type = str_of(p, "type");
        if (!type)
            continue;
        if (strcmp(type, "Split") == 0) {
            json_t *pat = json_object_get(p, "pattern");
            regex = str_of(pat, "Regex");
            n_split++;
        } else if (strcmp(type, "ByteLevel") == 0) {
            byte_level = true;
            json_t *ur = json_object_get(p, "use_regex");
            byte_level_regex = !json_is_boolean(ur) || json_is_true(ur);
        } else {
            rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                              "tokenizer.json: pre-tokenizer '%s' is not supported", type);
        }
    }
    json_decref(one);
    if (rc)
        return rc;
    if (!byte_level)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "tokenizer.json: not a byte-level BPE tokenizer (no ByteLevel "
                            "pre-tokenizer)");
    if (n_split == 0 && byte_level_regex) {
        *pre = "gpt2";
        return CAIRN_OK;
    }
    if (n_split == 1 && regex && !byte_level_regex)
        for (size_t k = 0; k < sizeof KNOWN_SPLITS / sizeof KNOWN_SPLITS[0]; k++)
            if (strcmp(regex, KNOWN_SPLITS[k].regex) == 0) {
                *pre = KNOWN_SPLITS[k].pre;
                return CAIRN_OK;
            }
    return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                        "tokenizer.json: the pre-tokenizer's split regex is not one cairn knows "
                        "(Qwen2, Llama 3, GPT-4o, GPT-2); refusing rather than splitting text "
                        "differently");
}

/* Whether a post_processor (a TemplateProcessing, alone or in a Sequence)
 * starts a single sequence with the special token `first`. */
static bool post_processor_adds(json_t *pp, const char *first)
{
    const char *type = str_of(pp, "type");
    if (!type || !first)
        return false;
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *p;
        json_t *list = json_object_get(pp, "processors");
        json_array_foreach(list, i, p)
        {
            if (post_processor_adds(p, first))
                return true;
        }
        return false;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return false;
    json_t *head = json_array_get(json_object_get(pp, "single"), 0);
    const char *id = str_of(json_object_get(head, "SpecialToken"), "id");
    return id && strcmp(id, first) == 0;
}

/* A special token named in tokenizer_config.json: a string or an
 * AddedToken object {"content": ...}. */
static const char *token_text(json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    return json_is_object(v) ? str_of(v, "content") : NULL;
}

static int64_t id_of(json_t *vocab, json_t *added_by_text, const char *text)
{
    if (!text)
        return -1;
    json_t *v = json_object_get(added_by_text, text);
    if (!v)
        v = json_object_get(vocab, text);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static bool is_u2581(const char *s) { return s && strcmp(s, "\xe2\x96\x81") == 0; }

/* A Replace normalizer of " " by U+2581. */
static bool replaces_spaces(json_t *n)
{
    const char *type = str_of(n, "type");
    const char *from = str_of(json_object_get(n, "pattern"), "String");
    return type && strcmp(type, "Replace") == 0 && from && strcmp(from, " ") == 0 &&
           is_u2581(str_of(n, "content"));
}

/* How a SentencePiece-style tokenizer.json turns spaces into U+2581 and
 * whether it adds one in front (*space_prefix). */
static int detect_spm_spaces(json_t *tok, bool *space_prefix, char *err, size_t err_len)
{
    json_t *norm = json_object_get(tok, "normalizer");
    json_t *pt = json_object_get(tok, "pre_tokenizer");
    const bool no_norm = !norm || json_is_null(norm), no_pt = !pt || json_is_null(pt);
    const char *ntype = no_norm ? NULL : str_of(norm, "type");
    if (no_pt && ntype && strcmp(ntype, "Sequence") == 0) {
        /* Llama 2's legacy form: Prepend U+2581, then Replace */
        json_t *list = json_object_get(norm, "normalizers");
        json_t *first = json_array_get(list, 0);
        const char *ftype = str_of(first, "type");
        if (json_array_size(list) == 2 && ftype && strcmp(ftype, "Prepend") == 0 &&
            is_u2581(str_of(first, "prepend")) && replaces_spaces(json_array_get(list, 1))) {
            *space_prefix = true;
            return CAIRN_OK;
        }
    } else if (no_pt && replaces_spaces(norm)) { /* Gemma: no prefix */
        *space_prefix = false;
        return CAIRN_OK;
    } else if (no_norm && !no_pt) {
        const char *ptype = str_of(pt, "type"), *scheme = str_of(pt, "prepend_scheme");
        if (ptype && strcmp(ptype, "Metaspace") == 0 && is_u2581(str_of(pt, "replacement")) &&
            !json_is_true(json_object_get(pt, "split")) &&
            (!scheme || strcmp(scheme, "first") == 0 || strcmp(scheme, "always") == 0 ||
             strcmp(scheme, "never") == 0)) {
            *space_prefix = !scheme || strcmp(scheme, "never") != 0;
            return CAIRN_OK;
        }
    }
    return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                        "tokenizer.json: a byte_fallback BPE whose normalizer '%s' and "
                        "pre-tokenizer '%s' are not SentencePiece's space handling (Replace ' ' "
                        "by U+2581, optionally after Prepend U+2581; or a non-splitting "
                        "Metaspace)", ntype ? ntype : "none",
                        no_pt ? "none" : str_of(pt, "type") ? str_of(pt, "type") : "?");
}

/* SentencePiece scores from merge ranks: minus the rank of the first merge
 * that makes each piece; pieces no merge makes get the lowest score. The
 * merges are read as pairs: a piece may hold a space (Gemma's do), which the
 * "a b" string form cannot say; that form is split at its first space, as
 * HF reads it. */
static int spm_scores(json_t *vocab, json_t *mlist, int64_t n, float **out)
{
    const size_t n_merges = json_array_size(mlist);
    float *score = malloc((size_t)n * sizeof *score);
    bool *made = calloc((size_t)n ? (size_t)n : 1, 1);
    cairn_strbuf piece = {0};
    if (!score || !made) {
        free(score);
        free(made);
        return CAIRN_ENOMEM;
    }
    for (int64_t id = 0; id < n; id++)
        score[id] = -(float)n_merges - 1.0f;
    size_t r;
    json_t *m;
    json_array_foreach(mlist, r, m)
    {
        piece.len = 0;
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp)
                continue;
            cairn_strbuf_add(&piece, s, (size_t)(sp - s));
            cairn_strbuf_add(&piece, sp + 1, strlen(sp + 1));
        } else {
            for (int k = 0; k < 2; k++)
                cairn_strbuf_add(&piece, json_string_value(json_array_get(m, k)),
                                 json_string_length(json_array_get(m, k)));
        }
        if (piece.oom) {
            cairn_strbuf_free(&piece);
            free(score);
            free(made);
            return CAIRN_ENOMEM;
        }
        json_t *v = piece.data ? json_object_getn(vocab, piece.data, piece.len) : NULL;
        const int64_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id >= 0 && id < n && !made[id]) {
            made[id] = true;
            score[id] = -(float)r;
        }
    }
    cairn_strbuf_free(&piece);
    free(made);
    *out = score;
    return CAIRN_OK;
}

int ckpt_tokenizer_read(const char *dir, const ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                        size_t err_len)
{
    const int n_vocab = cfg->n_vocab;
    json_t *tok = NULL, *tcfg = NULL, *gen = NULL, *added_by_text = NULL;
    char **texts = NULL;
    int32_t *types = NULL;
    const char **merges = NULL;
    char *merge_block = NULL;
    float *scores = NULL;
    int64_t n = 0;
    int rc = ckpt_read_json(dir, "tokenizer.json", false, &tok, err, err_len);
    if (rc)
        return rc;
    if ((rc = ckpt_read_json(dir, "tokenizer_config.json", true, &tcfg, err, err_len)) &&
        rc != CAIRN_ENOTFOUND)
        goto out;
    if ((rc = ckpt_read_json(dir, "generation_config.json", true, &gen, err, err_len)) &&
        rc != CAIRN_ENOTFOUND)
        goto out;

    json_t *model = json_object_get(tok, "model");
    const char *mtype = str_of(model, "type");
    json_t *vocab = json_object_get(model, "vocab"), *mlist = json_object_get(model, "merges");
    if (!mtype || strcmp(mtype, "BPE") != 0 || !json_is_object(vocab) || !json_is_array(mlist)) {
        rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                          "tokenizer.json: model type '%s' is not supported (byte-level BPE "
                          "with vocab and merges)", mtype ? mtype : "?");
        goto out;
    }
    const bool spm = json_is_true(json_object_get(model, "byte_fallback"));
    bool space_prefix = false;
    const char *pre = NULL;
    if (spm) {
        if ((rc = detect_spm_spaces(tok, &space_prefix, err, err_len)))
            goto out;
    } else {
        json_t *norm = json_object_get(tok, "normalizer");
        const char *ntype = norm && !json_is_null(norm) ? str_of(norm, "type") : NULL;
        if (norm && !json_is_null(norm) && (!ntype || strcmp(ntype, "NFC") != 0)) {
            rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                              "tokenizer.json: normalizer '%s' is not supported",
                              ntype ? ntype : "?");
            goto out;
        }
        if ((rc = detect_pre(json_object_get(tok, "pre_tokenizer"), &pre, err, err_len)))
            goto out;
    }

    /* ids: the vocabulary's, the added tokens', up to the embedding rows */
    json_t *added = json_object_get(tok, "added_tokens");
    n = n_vocab;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= n_vocab) {
            rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                              "tokenizer.json: token '%s' has id %lld outside the model's %d "
                              "embedding rows", key, (long long)json_integer_value(v), n_vocab);
            goto out;
        }
    }
    texts = calloc((size_t)n, sizeof *texts);
    types = calloc((size_t)n, sizeof *types);
    added_by_text = json_object();
    if (!texts || !types || !added_by_text) {
        rc = CAIRN_ENOMEM;
        goto out;
    }
    json_object_foreach(vocab, key, v)
    {
        const int64_t id = json_integer_value(v);
        if (texts[id]) {
            rc = cairn_errorf(err, err_len, CAIRN_EFORMAT, "tokenizer.json: id %lld used twice",
                              (long long)id);
            goto out;
        }
        if (!(texts[id] = strdup(key))) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        /* SentencePiece's byte pieces <0x00>..<0xFF> */
        unsigned byte;
        char tail;
        types[id] = spm && strlen(key) == 6 && sscanf(key, "<0x%2X>%c", &byte, &tail) == 1
                        ? TT_BYTE
                        : TT_NORMAL;
    }
    size_t i;
    json_array_foreach(added, i, v)
    {
        json_t *jid = json_object_get(v, "id");
        const char *content = str_of(v, "content");
        if (!json_is_integer(jid) || !content || json_integer_value(jid) < 0 ||
            json_integer_value(jid) >= n_vocab) {
            rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                              "tokenizer.json: added token %zu has no content or an id outside "
                              "the model's %d rows", i, n_vocab);
            goto out;
        }
        const int64_t id = json_integer_value(jid);
        if (texts[id] && strcmp(texts[id], content) != 0) {
            rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                              "tokenizer.json: added token '%s' reuses id %lld of '%s'", content,
                              (long long)id, texts[id]);
            goto out;
        }
        if (!texts[id] && !(texts[id] = strdup(content))) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        types[id] = json_is_true(json_object_get(v, "special")) ? TT_CONTROL : TT_USER_DEFINED;
        json_object_set_new(added_by_text, content, json_integer(id));
    }
    for (int64_t id = 0; id < n; id++) {
        if (texts[id])
            continue;
        char pad[32];
        snprintf(pad, sizeof pad, "[PAD%lld]", (long long)id);
        if (!(texts[id] = strdup(pad))) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        types[id] = TT_UNUSED;
    }

    /* merges: "a b", or ["a", "b"] (tokenizers >= 0.20) */
    const size_t n_merges = json_array_size(mlist);
    size_t block = 0;
    json_array_foreach(mlist, i, v)
    {
        if (json_is_string(v))
            block += json_string_length(v) + 1;
        else if (json_is_array(v) && json_array_size(v) == 2 &&
                 json_is_string(json_array_get(v, 0)) && json_is_string(json_array_get(v, 1)))
            block += json_string_length(json_array_get(v, 0)) +
                     json_string_length(json_array_get(v, 1)) + 2;
        else {
            rc = cairn_errorf(err, err_len, CAIRN_EFORMAT, "tokenizer.json: merge %zu is malformed",
                              i);
            goto out;
        }
    }
    /* the "a b" strings GGUF's merges key holds: byte-level BPE only (a
     * SentencePiece vocabulary keeps its scores instead, spm_scores) */
    if (!spm) {
        merges = calloc(n_merges ? n_merges : 1, sizeof *merges);
        merge_block = malloc(block ? block : 1);
        if (!merges || !merge_block) {
            rc = CAIRN_ENOMEM;
            goto out;
        }
        size_t at = 0;
        json_array_foreach(mlist, i, v)
        {
            merges[i] = merge_block + at;
            if (json_is_string(v)) {
                memcpy(merge_block + at, json_string_value(v), json_string_length(v) + 1);
                at += json_string_length(v) + 1;
            } else {
                at += (size_t)sprintf(merge_block + at, "%s %s",
                                      json_string_value(json_array_get(v, 0)),
                                      json_string_value(json_array_get(v, 1))) + 1;
            }
        }
    }

    cairn_gguf_builder_set_arr_str(b, "tokenizer.ggml.tokens", (const char *const *)texts, NULL,
                                   (uint64_t)n);
    cairn_gguf_builder_set_arr(b, "tokenizer.ggml.token_type", CAIRN_GGUF_INT32, types,
                               (uint64_t)n);
    if (spm) {
        if ((rc = spm_scores(vocab, mlist, n, &scores)))
            goto out;
        cairn_gguf_builder_set_str(b, "tokenizer.ggml.model", "llama");
        cairn_gguf_builder_set_arr(b, "tokenizer.ggml.scores", CAIRN_GGUF_FLOAT32, scores,
                                   (uint64_t)n);
        cairn_gguf_builder_set_bool(b, "tokenizer.ggml.add_space_prefix", space_prefix);
    } else {
        cairn_gguf_builder_set_str(b, "tokenizer.ggml.model", "gpt2");
        cairn_gguf_builder_set_str(b, "tokenizer.ggml.pre", pre);
        cairn_gguf_builder_set_arr_str(b, "tokenizer.ggml.merges", merges, NULL, n_merges);
    }

    /* special ids: tokenizer_config's names first, then the config files' ids */
    int64_t bos = id_of(vocab, added_by_text, token_text(json_object_get(tcfg, "bos_token")));
    int64_t eos = id_of(vocab, added_by_text, token_text(json_object_get(tcfg, "eos_token")));
    int64_t pad = id_of(vocab, added_by_text, token_text(json_object_get(tcfg, "pad_token")));
    int64_t unk = id_of(vocab, added_by_text, token_text(json_object_get(tcfg, "unk_token")));
    if (unk < 0) /* the BPE model's own, what byte_fallback falls back from */
        unk = id_of(vocab, added_by_text, str_of(model, "unk_token"));
    if (bos < 0)
        bos = ckpt_json_id(gen, "bos_token_id", 0) >= 0 ? ckpt_json_id(gen, "bos_token_id", 0)
                                                         : cfg->bos_id;
    if (eos < 0)
        eos = ckpt_json_id(gen, "eos_token_id", 0) >= 0 ? ckpt_json_id(gen, "eos_token_id", 0)
                                                         : cfg->eos_id;
    /* a second stop id (Qwen's generation_config: [<|im_end|>, <|endoftext|>]) */
    int64_t eot = -1;
    for (int k = 0; k < 4 && eot < 0; k++) {
        const int64_t id = ckpt_json_id(gen, "eos_token_id", k);
        if (id >= 0 && id != eos)
            eot = id;
    }
    const struct {
        const char *key;
        int64_t id;
    } ids[] = {{"tokenizer.ggml.bos_token_id", bos},
               {"tokenizer.ggml.eos_token_id", eos},
               {"tokenizer.ggml.eot_token_id", eot},
               {"tokenizer.ggml.padding_token_id", pad},
               {"tokenizer.ggml.unknown_token_id", unk}};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++)
        if (ids[k].id >= 0 && ids[k].id < n)
            cairn_gguf_builder_set_u32(b, ids[k].key, (uint32_t)ids[k].id);
    /* generation_config's recommended sampling: what vLLM and SGLang use for
     * the fields a request leaves out (cairn_runtime_sampling_defaults) */
    for (int k = 0; gen && k < CAIRN_CKPT_N_GENERATION; k++) {
        json_t *g = json_object_get(gen, cairn_ckpt_generation_keys[k]);
        char key[64];
        snprintf(key, sizeof key, "cairn.generation.%s", cairn_ckpt_generation_keys[k]);
        if (json_is_number(g) && json_number_value(g) >= 0 && json_number_value(g) < 1e6)
            cairn_gguf_builder_set_f32(b, key, (float)json_number_value(g));
    }
    /* BOS: tokenizer_config's add_bos_token, else whether the post-processor
     * puts the BOS token first (Llama 3 ships only that) */
    json_t *add_bos = json_object_get(tcfg, "add_bos_token");
    const bool bos_first = json_is_boolean(add_bos)
                               ? json_is_true(add_bos)
                               : bos >= 0 && post_processor_adds(json_object_get(tok,
                                                                                 "post_processor"),
                                                                 texts[bos]);
    cairn_gguf_builder_set_bool(b, "tokenizer.ggml.add_bos_token", bos_first);

    /* the chat template: a string, or a list of {name, template} */
    json_t *tmpl = json_object_get(tcfg, "chat_template");
    const char *chat = json_is_string(tmpl) ? json_string_value(tmpl) : NULL;
    if (json_is_array(tmpl)) {
        json_array_foreach(tmpl, i, v)
        {
            const char *name = str_of(v, "name");
            if (!chat || (name && strcmp(name, "default") == 0))
                chat = str_of(v, "template");
        }
    }
    if (!chat) {
        /* newer checkpoints ship it beside: chat_template.jinja */
        char path[4096];
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        FILE *f = fopen(path, "rb");
        if (f) {
            cairn_strbuf s = {0};
            char buf[4096];
            size_t got;
            while ((got = fread(buf, 1, sizeof buf, f)) > 0 && s.len < (1u << 20))
                cairn_strbuf_add(&s, buf, got);
            fclose(f);
            if (s.data)
                cairn_gguf_builder_set_str(b, "tokenizer.chat_template", s.data);
            cairn_strbuf_free(&s);
        }
    } else {
        cairn_gguf_builder_set_str(b, "tokenizer.chat_template", chat);
    }
    rc = CAIRN_OK;
out:
    if (rc == CAIRN_ENOMEM)
        cairn_errorf(err, err_len, rc, "out of memory reading tokenizer.json");
    if (texts)
        for (int64_t id = 0; id < n; id++)
            free(texts[id]);
    free(texts);
    free(types);
    free(merges);
    free(merge_block);
    free(scores);
    json_decref(added_by_text);
    json_decref(tok);
    json_decref(tcfg);
    json_decref(gen);
    return rc;
}
