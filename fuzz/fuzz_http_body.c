/*
 * fuzz/fuzz_http_body.c — what the HTTP front ends do with a request body
 * before a request reaches the engine: JSON (cairn_api_json_parse, with its
 * rewrite of integers beyond int64) and the request rules of api/api.h for
 * each route's op.
 *
 * Input: one byte choosing the route (chat, completions, tokenize,
 * detokenize), then the body. Properties, for every input:
 *   - the body is JSON or refused with a terminated message;
 *   - a decoded request is honest: token ids inside the vocabulary, at most
 *     the context, 1..64 choices split evenly over its prompts, and every
 *     choice's own request (cairn_api_choice) the same;
 *   - a refused one carries a status the front end maps (EINVAL, ERANGE,
 *     EUNSUPPORTED, ENOMEM) and a terminated one-line message.
 */
#include "fuzz_common.h"
#include "api/api.h"

#include <string.h>

static cairn_vocab *g_vocab;
static cairn_api g_api;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_vocab = fuzz_load_vocab("models/stories260K.gguf");
    g_api = (cairn_api){.vocab = g_vocab, .n_vocab = cairn_vocab_n_tokens(g_vocab), .n_ctx = 512,
                        .max_tokenize = 1u << 16, .max_text_bytes = 1u << 20};
    return 0;
}

static void check_tokens(const int32_t *ids, size_t n, size_t limit)
{
    FUZZ_CHECK(n <= limit);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < g_api.n_vocab);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const cairn_api_op ops[] = {CAIRN_API_CHAT, CAIRN_API_COMPLETION, CAIRN_API_TOKENIZE,
                                       CAIRN_API_DETOKENIZE};
    const cairn_api_op op = ops[data[0] % 4];
    json_error_t jerr;
    json_t *root = cairn_api_json_parse((const char *)data + 1, size - 1, &jerr);
    if (!root) {
        FUZZ_CHECK(memchr(jerr.text, '\0', sizeof jerr.text) != NULL);
        return 0;
    }
    cairn_api_call call;
    cairn_api_error err;
    int rc = cairn_api_decode(&g_api, op, root, 42, NULL, NULL, &call, &err);
    if (rc != CAIRN_OK) {
        FUZZ_CHECK(rc == CAIRN_EINVAL || rc == CAIRN_ERANGE || rc == CAIRN_EUNSUPPORTED ||
                   rc == CAIRN_ENOMEM);
        FUZZ_CHECK(memchr(err.message, '\0', sizeof err.message) != NULL);
        FUZZ_CHECK(!strchr(err.message, '\n'));
        json_decref(root);
        return 0;
    }
    if (op == CAIRN_API_TOKENIZE) {
        check_tokens(call.tokens, call.n_tokens, g_api.max_tokenize);
    } else if (op == CAIRN_API_DETOKENIZE) {
        FUZZ_CHECK(call.text && call.text_len <= g_api.max_text_bytes);
        FUZZ_CHECK(fuzz_utf8_valid((const unsigned char *)call.text, call.text_len));
    } else {
        FUZZ_CHECK(call.req && call.n_choices >= 1 && call.n_choices <= CAIRN_API_MAX_CHOICES);
        check_tokens(call.req->tokens, call.req->n_tokens, (size_t)g_api.n_ctx);
        FUZZ_CHECK(call.req->n_tokens > 0);
        if (op == CAIRN_API_COMPLETION) {
            FUZZ_CHECK(call.n_prompts >= 1 && call.n_choices % call.n_prompts == 0);
            for (int i = 0; i < call.n_prompts; i++)
                FUZZ_CHECK(!call.echo || call.prompts[i].echo);
        }
        for (int i = 0; i < call.n_choices; i++) {
            cairn_request *r = NULL;
            if (cairn_api_choice(&call, i, &r) != CAIRN_OK)
                continue; /* out of memory */
            check_tokens(r->tokens, r->n_tokens, (size_t)g_api.n_ctx);
            FUZZ_CHECK(r->n_tokens > 0);
            cairn_request_free(r);
        }
    }
    cairn_api_call_clear(&call);
    json_decref(root);
    return 0;
}
