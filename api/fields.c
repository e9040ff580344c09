/*
 * api/fields.c — the generation fields of every protocol: one table of
 * names, types and ranges (docs/api.md prints the same table), the
 * dialects' defaults, and the typed reads the other files use.
 */
#include "api/api_impl.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors and typed reads --------------------------------------------------- */

int api_fail(cairn_api_error *e, int code, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* A message is one line of text, whatever a client's string held: it
     * goes into a JSON body, a log line and a msgpack error. */
    for (char *c = e->message; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = ' ';
    e->code = code;
    e->field = field;
    return code;
}

int api_oom(cairn_api_error *e) { return api_fail(e, CAIRN_ENOMEM, NULL, "out of memory"); }

json_t *api_field(const json_t *params, const char *name)
{
    json_t *v = params ? json_object_get(params, name) : NULL;
    return json_is_null(v) ? NULL : v;
}

bool api_json_int(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    double d = json_is_real(v) ? json_real_value(v) : NAN;
    if (!(d == floor(d) && fabs(d) <= 9007199254740992.0)) /* 2^53: exact */
        return false;
    *out = (int64_t)d;
    return true;
}

int api_get_bool(const json_t *params, const char *name, bool *out, cairn_api_error *e)
{
    json_t *v = api_field(params, name);
    if (!v)
        return CAIRN_OK;
    if (!json_is_boolean(v))
        return api_fail(e, CAIRN_EINVAL, name, "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return CAIRN_OK;
}

int api_get_int(const json_t *params, const char *name, int64_t lo, int64_t hi, int64_t *out,
                cairn_api_error *e)
{
    json_t *v = api_field(params, name);
    if (!v)
        return CAIRN_OK;
    int64_t x;
    if (!api_json_int(v, &x) || x < lo || x > hi)
        return api_fail(e, CAIRN_EINVAL, name, "'%s' must be an integer in [%lld, %lld]", name,
                        (long long)lo, (long long)hi);
    *out = x;
    return CAIRN_OK;
}

int api_get_str(const json_t *params, const char *name, const char **s, size_t *len,
                cairn_api_error *e)
{
    json_t *v = api_field(params, name);
    if (!json_is_string(v))
        return api_fail(e, CAIRN_EINVAL, name, "'%s' must be a string", name);
    *s = json_string_value(v);
    *len = json_string_length(v);
    if (strlen(*s) != *len)
        return api_fail(e, CAIRN_EINVAL, name, "'%s' holds a NUL character", name);
    return CAIRN_OK;
}

/* ---- the table ------------------------------------------------------------------ *
 *
 * The numeric sampling fields, the same for every protocol. Ranges are
 * OpenAI's where it has the field (a client written for it sends nothing
 * else), llama.cpp's meaning otherwise; docs/api.md lists them. */

typedef enum { NUM_REAL, NUM_INT } num_kind;

static const struct {
    const char *name;
    num_kind kind;
    double lo, hi;
    bool lo_open;   /* (lo, hi]: lo itself is refused (top_p 0 keeps nothing) */
    size_t offset;  /* in cairn_sampling_params                            */
} sampling_table[] = {
    {"temperature", NUM_REAL, 0, 2, false, offsetof(cairn_sampling_params, temperature)},
    {"top_p", NUM_REAL, 0, 1, true, offsetof(cairn_sampling_params, top_p)},
    {"top_k", NUM_INT, 0, 2147483647.0, false, offsetof(cairn_sampling_params, top_k)},
    {"min_p", NUM_REAL, 0, 1, false, offsetof(cairn_sampling_params, min_p)},
    {"repeat_penalty", NUM_REAL, 1e-3, 100, false, offsetof(cairn_sampling_params, repeat_penalty)},
    {"frequency_penalty", NUM_REAL, -2, 2, false,
     offsetof(cairn_sampling_params, frequency_penalty)},
    {"presence_penalty", NUM_REAL, -2, 2, false,
     offsetof(cairn_sampling_params, presence_penalty)},
};

static int sampling_numbers(const json_t *params, cairn_sampling_params *sp, cairn_api_error *e)
{
    for (size_t i = 0; i < sizeof sampling_table / sizeof sampling_table[0]; i++) {
        const char *name = sampling_table[i].name;
        json_t *v = api_field(params, name);
        if (!v)
            continue;
        const double lo = sampling_table[i].lo, hi = sampling_table[i].hi;
        char *at = (char *)sp + sampling_table[i].offset;
        if (sampling_table[i].kind == NUM_INT) {
            int64_t x;
            if (!api_json_int(v, &x) || x < lo || x > hi)
                return api_fail(e, CAIRN_EINVAL, name, "'%s' must be an integer in [%g, %g]",
                                name, lo, hi);
            *(int *)at = (int)x;
            continue;
        }
        double d = json_number_value(v);
        bool ok = json_is_number(v) && isfinite(d) && d <= hi &&
                  (sampling_table[i].lo_open ? d > lo : d >= lo);
        /* a value that rounds to the open end as a float is refused too */
        if (ok && sampling_table[i].lo_open && !((float)d > (float)lo))
            ok = false;
        if (!ok)
            return api_fail(e, CAIRN_EINVAL, name, "'%s' must be a number in %c%g, %g]", name,
                            sampling_table[i].lo_open ? '(' : '[', lo, hi);
        *(float *)at = (float)d;
    }
    return CAIRN_OK;
}

/* max_tokens (chat: also max_completion_tokens, which wins): [0, n_ctx]
 * ([1, n_ctx] on OpenAI's routes). */
static int max_tokens_field(const cairn_api *api, cairn_api_op op, const json_t *params,
                            cairn_gen_params *g, cairn_api_error *e)
{
    const char *name = op == CAIRN_API_CHAT && api_field(params, "max_completion_tokens")
                           ? "max_completion_tokens" : "max_tokens";
    json_t *v = api_field(params, name);
    if (!v)
        return CAIRN_OK;
    int64_t x;
    if (!api_json_int(v, &x) || x < 0)
        return api_fail(e, CAIRN_EINVAL, name, "'%s' must be a non-negative integer", name);
    /* OpenAI's routes: at least one token, as OpenAI and vLLM ask (the
     * native protocol keeps 0: a prefill without a reply) */
    if (x == 0 && (op == CAIRN_API_CHAT || op == CAIRN_API_COMPLETION))
        return api_fail(e, CAIRN_EINVAL, name, "'%s' must be at least 1", name);
    if (x > api->n_ctx) {
        e->reason = "context_length_exceeded";
        return api_fail(e, CAIRN_ERANGE, name, "'%s' exceeds the context size (%d)", name,
                        api->n_ctx);
    }
    g->max_tokens = (int)x;
    return CAIRN_OK;
}

/* seed: an integer in [0, 2^64), or its decimal text (JSON integers here
 * stop at 2^63 - 1; a msgpack client's larger seed arrives as text). */
static int seed_field(const json_t *params, uint64_t random_seed, cairn_sampling_params *sp,
                      cairn_api_error *e)
{
    json_t *v = api_field(params, "seed");
    int64_t x;
    if (!v) {
        sp->seed = random_seed;
        return CAIRN_OK;
    }
    if (api_json_int(v, &x) && x >= 0) {
        sp->seed = (uint64_t)x;
        return CAIRN_OK;
    }
    const char *t = json_string_value(v);
    if (t && *t >= '0' && *t <= '9' && strlen(t) == json_string_length(v)) {
        char *end;
        errno = 0;
        unsigned long long u = strtoull(t, &end, 10);
        if (!errno && !*end) {
            sp->seed = (uint64_t)u;
            return CAIRN_OK;
        }
    }
    return api_fail(e, CAIRN_EINVAL, "seed", "'seed' must be an integer in [0, 2^64)");
}

/* stop: a string or up to CAIRN_MAX_STOP non-empty strings. */
static int stop_field(const json_t *params, cairn_gen_params *g, cairn_api_error *e)
{
    json_t *v = api_field(params, "stop");
    if (!v)
        return CAIRN_OK;
    if (!json_is_string(v) && !json_is_array(v))
        return api_fail(e, CAIRN_EINVAL, "stop", "'stop' must be a string or an array of strings");
    size_t count = json_is_string(v) ? 1 : json_array_size(v);
    if (count > CAIRN_MAX_STOP)
        return api_fail(e, CAIRN_ERANGE, "stop", "at most %d stop strings", CAIRN_MAX_STOP);
    for (size_t i = 0; i < count; i++) {
        json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(s) || json_string_length(s) == 0)
            return api_fail(e, CAIRN_EINVAL, "stop", "'stop' must hold non-empty strings");
        if (json_string_length(s) > CAIRN_API_MAX_STOP_BYTES)
            return api_fail(e, CAIRN_ERANGE, "stop", "a stop string is longer than %d bytes",
                            CAIRN_API_MAX_STOP_BYTES);
        if (strlen(json_string_value(s)) != json_string_length(s))
            return api_fail(e, CAIRN_EINVAL, "stop", "a stop string holds a NUL character");
        if (!(g->stop[g->n_stop] = strdup(json_string_value(s))))
            return api_oom(e);
        g->n_stop++;
    }
    return CAIRN_OK;
}

/* logit_bias: {"<token id>": bias in [-100, 100]}, at most
 * CAIRN_MAX_LOGIT_BIAS entries. */
static int logit_bias_field(const cairn_api *api, const json_t *params, cairn_sampling_params *sp,
                            cairn_api_error *e)
{
    json_t *v = api_field(params, "logit_bias");
    if (!v)
        return CAIRN_OK;
    if (!json_is_object(v))
        return api_fail(e, CAIRN_EINVAL, "logit_bias",
                        "'logit_bias' must be an object of token ids to biases");
    if (json_object_size(v) > CAIRN_MAX_LOGIT_BIAS)
        return api_fail(e, CAIRN_ERANGE, "logit_bias", "'logit_bias' has more than %d entries",
                        CAIRN_MAX_LOGIT_BIAS);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (!*key || *end || errno || id < 0 || id >= api->n_vocab)
            return api_fail(e, CAIRN_EINVAL, "logit_bias",
                            "'logit_bias' key '%.32s' is not a token id in [0, %d)", key,
                            api->n_vocab);
        double b = json_number_value(val);
        if (!json_is_number(val) || !(b >= -100 && b <= 100))
            return api_fail(e, CAIRN_EINVAL, "logit_bias",
                            "'logit_bias'[\"%.32s\"] must be a number in [-100, 100]", key);
        sp->logit_bias[sp->n_logit_bias].token = (int32_t)id;
        sp->logit_bias[sp->n_logit_bias].bias = (float)b;
        sp->n_logit_bias++;
    }
    return CAIRN_OK;
}

/* logprobs: chat a boolean and top_logprobs 0..20; completions an integer
 * 0..20 (the alternatives; 0: only the chosen tokens'). Native requests have
 * no logprobs in their results, so they take neither field. */
static int logprobs_fields(cairn_api_op op, const json_t *params, cairn_gen_params *g,
                           cairn_api_error *e)
{
    const bool chat = op == CAIRN_API_CHAT;
    if (!chat && op != CAIRN_API_COMPLETION)
        return CAIRN_OK;
    json_t *lp = api_field(params, "logprobs");
    json_t *top = chat ? api_field(params, "top_logprobs") : lp;
    if (lp && (chat ? !json_is_boolean(lp) : !json_is_integer(lp)))
        return api_fail(e, CAIRN_EINVAL, "logprobs", chat ? "'logprobs' must be a boolean"
                                                          : "'logprobs' must be an integer in [0, 20]");
    g->logprobs = chat ? json_is_true(lp) : lp != NULL;
    if (!top)
        return CAIRN_OK;
    const char *name = chat ? "top_logprobs" : "logprobs";
    if (!json_is_integer(top) || json_integer_value(top) < 0 || json_integer_value(top) > 20)
        return api_fail(e, CAIRN_EINVAL, name, "'%s' must be an integer in [0, 20]", name);
    if (!g->logprobs && json_integer_value(top) > 0)
        return api_fail(e, CAIRN_EINVAL, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    g->sampling.n_logprobs = (int)json_integer_value(top);
    return CAIRN_OK;
}

/* speculative: true (the server's methods), false (none), or the names of
 * some of the server's methods ("ngram", "draft", "eagle"; a string, comma-
 * separated, or an array of strings), which then alone propose; and draft
 * {depth 1..16, top_k 1..16, n 1..255}: the draft tree; absent keys take the
 * server's settings. */
static int speculation_methods(const cairn_api *api, const json_t *v, cairn_gen_params *g,
                               cairn_api_error *e)
{
    const cairn_spec *spec = api->runtime ? cairn_runtime_spec(api->runtime) : NULL;
    const size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n == 0)
        return api_fail(e, CAIRN_EINVAL, "speculative", "'speculative' names no method");
    for (size_t i = 0; i < n; i++) {
        const json_t *item = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(item))
            return api_fail(e, CAIRN_EINVAL, "speculative",
                            "'speculative' must be a boolean, a method name or an array of them");
        const char *list = json_string_value(item);
        while (*list) {
            const char *end = strchr(list, ',');
            const size_t len = end ? (size_t)(end - list) : strlen(list);
            char name[32];
            if (len == 0 || len >= sizeof name)
                return api_fail(e, CAIRN_EINVAL, "speculative",
                                "'speculative' names an empty or unknown method");
            memcpy(name, list, len);
            name[len] = '\0';
            for (size_t c = 0; c < len; c++)
                if ((unsigned char)name[c] < 0x20 || name[c] == 0x7f)
                    return api_fail(e, CAIRN_EINVAL, "speculative",
                                    "'speculative' names an unknown method (a control character)");
            list += len + (end ? 1 : 0);
            const uint32_t bit = cairn_spec_method_mask(spec, name);
            if (!bit)
                return api_fail(e, CAIRN_EINVAL, "speculative",
                                "this server does not run the speculative method '%s' (it runs: "
                                "%s)", name, spec ? cairn_spec_describe(spec) : "none");
            g->spec_methods |= bit;
        }
    }
    return CAIRN_OK;
}

static int speculation_fields(const cairn_api *api, const json_t *params, cairn_gen_params *g,
                              cairn_api_error *e)
{
    const json_t *v = api_field(params, "speculative");
    if (v && (json_is_string(v) || json_is_array(v))) {
        int rc = speculation_methods(api, v, g, e);
        if (rc)
            return rc;
    } else {
        bool speculative = true;
        int rc = api_get_bool(params, "speculative", &speculative, e);
        if (rc)
            return rc;
        g->no_speculation = !speculative;
    }
    json_t *d = api_field(params, "draft");
    if (!d)
        return CAIRN_OK;
    if (!json_is_object(d))
        return api_fail(e, CAIRN_EINVAL, "draft", "'draft' must be a map");
    static const struct {
        const char *key;
        int hi;
        size_t offset;
    } keys[] = {{"depth", 16, offsetof(cairn_spec_params, depth)},
                {"top_k", 16, offsetof(cairn_spec_params, top_k)},
                {"n", 255, offsetof(cairn_spec_params, n_draft)},
                {"chain", 16, offsetof(cairn_spec_params, chain_max)}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = api_field(d, keys[i].key);
        int64_t x;
        if (!v)
            continue;
        if (!api_json_int(v, &x) || x < 1 || x > keys[i].hi)
            return api_fail(e, CAIRN_EINVAL, "draft", "'draft'.%s must be an integer in [1, %d]",
                            keys[i].key, keys[i].hi);
        *(int *)((char *)&g->draft + keys[i].offset) = (int)x;
    }
    return CAIRN_OK;
}

int api_gen_fields(const cairn_api *api, cairn_api_op op, const json_t *params,
                   uint64_t random_seed, cairn_gen_params *g, cairn_api_error *e)
{
    int rc;
    if ((rc = max_tokens_field(api, op, params, g, e)) ||
        (rc = sampling_numbers(params, &g->sampling, e)) ||
        (rc = seed_field(params, random_seed, &g->sampling, e)) || (rc = stop_field(params, g, e)) ||
        (rc = logit_bias_field(api, params, &g->sampling, e)) ||
        (rc = logprobs_fields(op, params, g, e)) || (rc = speculation_fields(api, params, g, e)) ||
        (rc = api_get_bool(params, "stream", &g->stream, e)) ||
        (rc = api_get_bool(params, "ignore_eos", &g->ignore_eos, e)))
        return rc;
    return api_response_format(params, g, e);
}

cairn_gen_params cairn_api_gen_defaults(const cairn_api *api, cairn_api_op op)
{
    cairn_gen_params g;
    memset(&g, 0, sizeof g);
    g.sampling = cairn_sampling_defaults();
    g.max_tokens = 128;
    if (op == CAIRN_API_CHAT || op == CAIRN_API_COMPLETION) {
        /* OpenAI's sampling: the extensions top_k / min_p off */
        g.sampling.temperature = 1;
        g.sampling.top_p = 1;
        g.sampling.top_k = 0;
        g.sampling.min_p = 0;
        g.max_tokens = op == CAIRN_API_CHAT ? api->n_ctx : 16; /* chat: until the context ends */
    }
    /* the model's own recommendation, where its checkpoint ships one */
    if (api->runtime)
        cairn_runtime_sampling_defaults(api->runtime, &g.sampling);
    return g;
}
