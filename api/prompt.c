/*
 * api/prompt.c — what a request's content becomes: plain text (tokenized),
 * token ids (checked), or a conversation (rendered with the model's chat
 * template, only the template's own markers parsed as special tokens, so a
 * message can never forge a turn).
 *
 * Every buffer is sized from the text actually received and bounded by the
 * limit that applies, never from a length a client declared.
 */
#include "api/api_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int api_tokenize(const cairn_api *api, const char *text, size_t len, int flags, size_t limit,
                 const char *field, const char *reason, int32_t **out, size_t *n_out,
                 cairn_api_error *e)
{
    if (!api->vocab)
        return api_fail(e, CAIRN_EUNSUPPORTED, field, "this server cannot tokenize text");
    /* A token covers at least one byte of text, plus BOS/EOS markers. */
    size_t cap = len + 4 < limit + 1 ? len + 4 : limit + 1;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return api_oom(e);
    size_t n = 0;
    int rc = cairn_tokenize(api->vocab, text, len, flags, ids, cap, &n);
    if (rc == CAIRN_OK && n > limit)
        rc = CAIRN_ERANGE;
    if (rc != CAIRN_OK) {
        free(ids);
        if (rc != CAIRN_ERANGE)
            return api_fail(e, rc == CAIRN_ENOMEM ? CAIRN_ENOMEM : CAIRN_EINVAL, field,
                            "cannot tokenize '%s': %s", field, cairn_strerror(rc));
        e->reason = reason;
        return api_fail(e, CAIRN_ERANGE, field, "'%s' has more than %zu tokens", field, limit);
    }
    *out = ids;
    *n_out = n;
    return CAIRN_OK;
}

/* Ids read by the front end: the same checks as from JSON. */
static int typed_ids(const cairn_api *api, const cairn_api_tokens *t, const char *field,
                     size_t limit, int32_t **out, size_t *n_out, cairn_api_error *e)
{
    if (t->n > limit)
        return api_fail(e, CAIRN_ERANGE, field, "'%s' has %zu tokens, more than the limit of %zu",
                        field, t->n, limit);
    for (size_t i = 0; i < t->n; i++)
        if ((int64_t)i == t->bad || t->ids[i] < 0 || t->ids[i] >= api->n_vocab)
            return api_fail(e, CAIRN_EINVAL, field, "'%s'[%zu] must be a token id in [0, %d)",
                            field, i, api->n_vocab);
    if (t->bad >= 0)
        return api_fail(e, CAIRN_EINVAL, field, "'%s'[%lld] must be a token id in [0, %d)",
                        field, (long long)t->bad, api->n_vocab);
    int32_t *ids = malloc((t->n ? t->n : 1) * sizeof *ids);
    if (!ids)
        return api_oom(e);
    if (t->n)
        memcpy(ids, t->ids, t->n * sizeof *ids);
    *out = ids;
    *n_out = t->n;
    return CAIRN_OK;
}

int api_token_array(const cairn_api *api, const json_t *v, const cairn_api_tokens *typed,
                    const char *field, size_t limit, int32_t **out, size_t *n_out,
                    cairn_api_error *e)
{
    if (typed && json_is_true(v))
        return typed_ids(api, typed, field, limit, out, n_out, e);
    if (!json_is_array(v))
        return api_fail(e, CAIRN_EINVAL, field, "'%s' must be an array of token ids", field);
    size_t n = json_array_size(v);
    if (n > limit)
        return api_fail(e, CAIRN_ERANGE, field, "'%s' has %zu tokens, more than the limit of %zu",
                        field, n, limit);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return api_oom(e);
    for (size_t i = 0; i < n; i++) {
        int64_t t;
        if (!api_json_int(json_array_get(v, i), &t) || t < 0 || t >= api->n_vocab) {
            free(ids);
            return api_fail(e, CAIRN_EINVAL, field, "'%s'[%zu] must be a token id in [0, %d)",
                            field, i, api->n_vocab);
        }
        ids[i] = (int32_t)t;
    }
    *out = ids;
    *n_out = n;
    return CAIRN_OK;
}

/* ---- conversations ---------------------------------------------------------------- */

/* Strings the messages point to that are not the request's own (joined
 * content parts, tool calls as JSON text), freed together. */
typedef struct {
    char **v;
    size_t n, cap;
} keep_list;

static char *keep(keep_list *l, char *s)
{
    if (!s)
        return NULL;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            free(s);
            return NULL;
        }
        l->v = v;
        l->cap = cap;
    }
    return l->v[l->n++] = s;
}

static void keep_free(keep_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
}

/* A message's content: a string, an array of {type: "text", text} parts
 * (joined), or null (*out NULL). */
static int message_content(const json_t *m, size_t i, keep_list *kl, const char **out,
                           cairn_api_error *e)
{
    *out = NULL;
    json_t *content = api_field(m, "content");
    if (!content)
        return CAIRN_OK;
    if (json_is_string(content)) {
        if (strlen(json_string_value(content)) != json_string_length(content))
            return api_fail(e, CAIRN_EINVAL, "messages",
                            "messages[%zu].content holds a NUL character", i);
        *out = json_string_value(content);
        return CAIRN_OK;
    }
    if (!json_is_array(content))
        return api_fail(e, CAIRN_EINVAL, "messages",
                        "messages[%zu].content must be a string or an array of parts", i);
    cairn_strbuf joined = {0};
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part)
    {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        int rc = CAIRN_OK;
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0)
            rc = api_fail(e, CAIRN_EINVAL, "messages",
                          "messages[%zu].content[%zu]: only text parts are supported", i, k);
        else if (!json_is_string(text) ||
                 strlen(json_string_value(text)) != json_string_length(text))
            rc = api_fail(e, CAIRN_EINVAL, "messages",
                          "messages[%zu].content[%zu].text must be a string", i, k);
        if (rc) {
            cairn_strbuf_free(&joined);
            return rc;
        }
        cairn_strbuf_add(&joined, json_string_value(text), json_string_length(text));
    }
    if (joined.oom)
        return api_oom(e);
    *out = keep(kl, joined.data ? joined.data : strdup(""));
    return *out ? CAIRN_OK : api_oom(e);
}

static bool role_valid(const char *r)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(r, roles[i]) == 0)
            return true;
    return false;
}

/* One message object into *m (strings borrowed from it or kept in kl). */
static int read_message(const json_t *obj, size_t i, keep_list *kl, cairn_chat_message *m,
                        cairn_api_error *e)
{
    json_t *role = json_object_get(obj, "role");
    if (!json_is_object(obj) || !json_is_string(role) || !role_valid(json_string_value(role)))
        return api_fail(e, CAIRN_EINVAL, "messages",
                        "messages[%zu].role must be system, developer, user, assistant or tool",
                        i);
    const char *r = json_string_value(role);
    /* the templates know "system"; "developer" is OpenAI's new name for it */
    m->role = strcmp(r, "developer") == 0 ? "system" : r;
    int rc = message_content(obj, i, kl, &m->content, e);
    if (rc)
        return rc;
    json_t *calls = api_field(obj, "tool_calls");
    if (calls) {
        if (strcmp(r, "assistant") != 0 || !json_is_array(calls))
            return api_fail(e, CAIRN_EINVAL, "messages", "messages[%zu].tool_calls: only an "
                            "assistant message may carry an array of tool calls", i);
        if (!(m->tool_calls_json = keep(kl, json_dumps(calls, JSON_COMPACT))))
            return api_oom(e);
    }
    if (!m->content && !(strcmp(r, "assistant") == 0 && calls))
        return api_fail(e, CAIRN_EINVAL, "messages", "messages[%zu].content is required", i);
    json_t *id = api_field(obj, "tool_call_id"), *name = api_field(obj, "name");
    if ((id && !json_is_string(id)) || (name && !json_is_string(name)))
        return api_fail(e, CAIRN_EINVAL, "messages",
                        "messages[%zu]: tool_call_id and name must be strings", i);
    m->tool_call_id = id ? json_string_value(id) : NULL;
    m->name = name ? json_string_value(name) : NULL;
    /* an earlier reply's reasoning, as OpenAI-compatible servers return it
     * (vLLM and llama.cpp: reasoning_content; Hugging Face: thinking) */
    json_t *reasoning = api_field(obj, "reasoning_content");
    if (!reasoning)
        reasoning = api_field(obj, "thinking");
    if (reasoning && (strcmp(r, "assistant") != 0 || !api_clean_string(reasoning)))
        return api_fail(e, CAIRN_EINVAL, "messages", "messages[%zu].reasoning_content: only an "
                        "assistant message may carry one, as a string", i);
    m->reasoning_content = reasoning ? json_string_value(reasoning) : NULL;
    return CAIRN_OK;
}

/* Generic chat format of docs/protocol.md, for a server without a
 * template: "<|ROLE|>\n" content "\n" per message ("<|assistant|>\n" opens
 * the reply). */
static int render_generic(const cairn_api *api, const cairn_chat_message *m, size_t n,
                          bool assistant, int flags, int32_t **tokens, size_t *n_tokens,
                          cairn_api_error *e)
{
    cairn_strbuf b = {0};
    const bool continue_final = flags & API_RENDER_CONTINUE_FINAL;
    for (size_t i = 0; i < n; i++) {
        cairn_strbuf_add(&b, "<|", 2);
        cairn_strbuf_add(&b, m[i].role, strlen(m[i].role));
        cairn_strbuf_add(&b, "|>\n", 3);
        if (m[i].content)
            cairn_strbuf_add(&b, m[i].content, strlen(m[i].content));
        if (!(continue_final && i + 1 == n))
            cairn_strbuf_add(&b, "\n", 1);
    }
    flags &= ~API_RENDER_CONTINUE_FINAL;
    if (assistant && !continue_final)
        cairn_strbuf_add(&b, "<|assistant|>\n", 14);
    int rc = b.oom ? api_oom(e)
                   : api_tokenize(api, b.data ? b.data : "", b.len, flags, (size_t)api->n_ctx,
                                  "messages", "context_length_exceeded", tokens, n_tokens, e);
    cairn_strbuf_free(&b);
    return rc;
}

static size_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Remember what render_messages was given (conv may be NULL). */
static int keep_conversation(cairn_api_conversation *conv, const json_t *msgs, const char *system,
                             int flags, cairn_api_error *e)
{
    if (!conv)
        return CAIRN_OK;
    conv->msgs = msgs ? json_incref((json_t *)msgs) : NULL;
    conv->system = system ? strdup(system) : NULL;
    conv->flags = flags;
    return system && !conv->system ? api_oom(e) : CAIRN_OK;
}

/* The conversation `msgs` (with a `system` text first, when given) as
 * tokens: the model's template with `chat_flags`, or the generic format. */
static int render_messages(const cairn_api *api, const json_t *msgs, const char *system,
                           const char *tools_json, int chat_flags, int32_t **tokens,
                           size_t *n_tokens, cairn_api_conversation *conv, cairn_api_error *e)
{
    size_t n = (system ? 1 : 0) + (msgs ? json_array_size(msgs) : 0);
    cairn_chat_message *m = calloc(n ? n : 1, sizeof *m);
    keep_list kl = {0};
    if (!m)
        return api_oom(e);
    int rc = CAIRN_OK;
    size_t k = 0;
    if (system)
        m[k++] = (cairn_chat_message){.role = "system", .content = system};
    for (size_t i = 0; msgs && i < json_array_size(msgs) && rc == CAIRN_OK; i++)
        rc = read_message(json_array_get(msgs, i), i, &kl, &m[k++], e);
    if (rc == CAIRN_OK && !api->vocab)
        rc = api_fail(e, CAIRN_EUNSUPPORTED, "messages", "this server cannot tokenize text");
    if (rc == CAIRN_OK && (chat_flags & CAIRN_CHAT_CONTINUE_FINAL) &&
        (!n || strcmp(m[n - 1].role, "assistant") != 0 || m[n - 1].tool_calls_json))
        rc = api_fail(e, CAIRN_EINVAL, "continue_final_message",
                      "'continue_final_message' needs the last message to be an assistant reply "
                      "without tool calls");
    if (rc == CAIRN_OK && !api->chat_template) {
        int tflags = ((chat_flags & CAIRN_CHAT_ADD_BOS) ? CAIRN_TOK_ADD_BOS : 0) |
                     ((chat_flags & CAIRN_CHAT_CONTINUE_FINAL) ? API_RENDER_CONTINUE_FINAL : 0);
        rc = render_generic(api, m, n, chat_flags & CAIRN_CHAT_GENERATION_PROMPT, tflags, tokens,
                            n_tokens, e);
    } else if (rc == CAIRN_OK) {
        int frc = cairn_chat_tokenize(api->chat_template, api->vocab, m, n, tools_json,
                                      chat_flags, tokens, n_tokens);
        if (frc == CAIRN_ENOMEM)
            rc = api_oom(e);
        else if (frc != CAIRN_OK)
            rc = api_fail(e, CAIRN_EINVAL, "messages", "the messages cannot be rendered with the "
                          "model's chat template: %s", cairn_strerror(frc));
        else if (*n_tokens > (size_t)api->n_ctx) {
            e->reason = "context_length_exceeded";
            rc = api_fail(e, CAIRN_ERANGE, "messages",
                          "the prompt has %zu tokens, more than the context's %d", *n_tokens,
                          api->n_ctx);
            free(*tokens);
            *tokens = NULL;
            *n_tokens = 0;
        }
    }
    free(m);
    keep_free(&kl);
    if (rc == CAIRN_OK && (rc = keep_conversation(conv, msgs, system, chat_flags, e))) {
        free(*tokens);
        *tokens = NULL;
        *n_tokens = 0;
    }
    return rc;
}

size_t cairn_api_conversation_parts(const cairn_api_call *c)
{
    if (!c->conv.msgs && !c->conv.system)
        return 0;
    return (c->conv.system ? 1 : 0) + json_array_size(c->conv.msgs);
}

int cairn_api_conversation_end(const cairn_api *api, const cairn_api_call *c, size_t k,
                               bool with_tools, const int32_t *tokens, size_t n, size_t *pos)
{
    *pos = 0;
    size_t parts = cairn_api_conversation_parts(c);
    if (parts == 0)
        return CAIRN_ENOTFOUND;
    if (k > parts || (!tokens && n))
        return CAIRN_EINVAL;
    const size_t n_sys = c->conv.system ? 1 : 0;
    json_t *msgs = json_array();
    if (!msgs)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i + n_sys < k; i++)
        if (json_array_append(msgs, json_array_get(c->conv.msgs, i))) {
            json_decref(msgs);
            return CAIRN_ENOMEM;
        }
    /* The parts alone, as history: no reply opened or continued after them. */
    int flags = c->conv.flags & ~(CAIRN_CHAT_GENERATION_PROMPT | CAIRN_CHAT_CONTINUE_FINAL);
    int32_t *t = NULL;
    size_t nt = 0;
    cairn_api_error e = {0};
    int rc = render_messages(api, msgs, k >= 1 && n_sys ? c->conv.system : NULL,
                             with_tools ? c->tools_json : NULL, flags, &t, &nt, NULL, &e);
    json_decref(msgs);
    if (rc == CAIRN_ENOMEM)
        return rc;
    if (rc == CAIRN_OK)
        *pos = lcp(t, nt, tokens, n);
    free(t);
    /* A prefix that cannot be rendered on its own (a template that insists
     * on a user turn): its end is unknown, so it is the start. */
    return CAIRN_OK;
}

/* ---- the native ops' content ---------------------------------------------------------- */

int api_native_content(const cairn_api *api, const json_t *params, const api_content_rules *r,
                       int32_t **tokens, size_t *n, bool *given, bool *chat_turn,
                       cairn_api_conversation *conv, cairn_api_error *e)
{
    json_t *text = api_field(params, r->text_field), *ids = api_field(params, "tokens");
    json_t *msgs = r->allow_messages ? api_field(params, "messages") : NULL;
    json_t *system = r->allow_system ? api_field(params, "system") : NULL;
    *given = false;
    *chat_turn = false;
    if (r->first && r->tools_json && !msgs && !system)
        return api_fail(e, CAIRN_EINVAL, "tools",
                        "'tools' are rendered with 'messages' (or 'system'), not with '%s'",
                        ids ? "tokens" : r->text_field);
    if ((text != NULL) + (ids != NULL) + (msgs != NULL) > 1)
        return api_fail(e, CAIRN_EINVAL, r->text_field, "give only one of '%s', %s'tokens'",
                        r->text_field, r->allow_messages ? "'messages', " : "");
    if (system && (text || ids))
        return api_fail(e, CAIRN_EINVAL, "system", "'system' goes only with 'messages'");
    if (!text && !ids && !msgs && !system)
        return CAIRN_OK;
    *given = true;
    if (ids)
        return api_token_array(api, ids, r->typed, "tokens", (size_t)api->n_ctx, tokens, n, e);
    bool add_bos = r->first && api->vocab && cairn_vocab_add_bos(api->vocab);
    bool parse_special = false;
    int rc;
    if ((rc = api_get_bool(params, "add_bos", &add_bos, e)) ||
        (rc = api_get_bool(params, "parse_special", &parse_special, e)))
        return rc;
    if (text) {
        const char *s;
        size_t len;
        if (!json_is_string(text))
            return api_fail(e, CAIRN_EINVAL, r->text_field, "'%s' must be a string",
                            r->text_field);
        s = json_string_value(text);
        len = json_string_length(text);
        int flags = (add_bos ? CAIRN_TOK_ADD_BOS : 0) | (parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0);
        return api_tokenize(api, s, len, flags, (size_t)api->n_ctx, r->text_field, NULL, tokens,
                            n, e);
    }
    if (msgs && !json_is_array(msgs))
        return api_fail(e, CAIRN_EINVAL, "messages", "'messages' must be an array of maps");
    if (system && !json_is_string(system))
        return api_fail(e, CAIRN_EINVAL, "system", "'system' must be a string");
    /* Later messages of a session continue the conversation (no default
     * system prompt or BOS again). */
    int reply = 0;
    if (r->assistant && (rc = api_reply_flags(api, params, msgs, &reply, e)))
        return rc;
    int cflags = reply | (r->first ? 0 : CAIRN_CHAT_CONTINUE) | (add_bos ? CAIRN_CHAT_ADD_BOS : 0);
    *chat_turn = !r->first;
    return render_messages(api, msgs, system ? json_string_value(system) : NULL, r->tools_json,
                           cflags, tokens, n, conv, e);
}

/* ---- OpenAI's content --------------------------------------------------------------------- */

/* The reasoning flags of reasoning_effort, CAIRN_CHAT_REASONING_* or
 * NO_THINKING ("none" and "minimal", OpenAI's newer levels: as little as
 * the model allows, i.e. no reasoning where the template can turn it off);
 * -1 for another value. */
static int effort_flags(const json_t *v)
{
    static const char *const names[] = {"none", "minimal", "low", "medium", "high"};
    static const int values[] = {CAIRN_CHAT_NO_THINKING, CAIRN_CHAT_NO_THINKING,
                                 CAIRN_CHAT_REASONING_LOW, 0, CAIRN_CHAT_REASONING_HIGH};
    for (size_t i = 0; json_is_string(v) && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(json_string_value(v), names[i]) == 0)
            return values[i];
    return -1;
}

#define EFFORT_FLAGS (CAIRN_CHAT_REASONING_LOW | CAIRN_CHAT_REASONING_HIGH)

/* reasoning_effort (OpenAI's field, or in chat_template_kwargs as vLLM and
 * llama.cpp take it): CAIRN_CHAT_REASONING_* (0: the template's default);
 * chat_template_kwargs.enable_thinking (Qwen3's template variable, as
 * vLLM, SGLang and llama.cpp take it) false: CAIRN_CHAT_NO_THINKING. What
 * the request leaves out is the server's default (`defaults`). */
static int reasoning_flags(const json_t *params, int defaults, int *flags, cairn_api_error *e)
{
    const char *field = "reasoning_effort";
    json_t *v = api_field(params, field);
    json_t *kwargs = api_field(params, "chat_template_kwargs");
    if (!v && json_is_object(kwargs) && (v = api_field(kwargs, field)))
        field = "chat_template_kwargs.reasoning_effort";
    json_t *think = json_is_object(kwargs) ? api_field(kwargs, "enable_thinking") : NULL;
    if (think && !json_is_boolean(think))
        return api_fail(e, CAIRN_EINVAL, "chat_template_kwargs.enable_thinking",
                        "'chat_template_kwargs.enable_thinking' must be a boolean");
    const int effort = v ? effort_flags(v) : defaults & EFFORT_FLAGS;
    if (effort < 0)
        return api_fail(e, CAIRN_EINVAL, field,
                        "'%s' must be \"none\", \"minimal\", \"low\", \"medium\" or \"high\"",
                        field);
    *flags = effort;
    /* thinking: off when asked, or by default unless the request turns it on */
    if (think ? json_is_false(think) : (defaults & CAIRN_CHAT_NO_THINKING) && !v)
        *flags |= CAIRN_CHAT_NO_THINKING;
    return CAIRN_OK;
}

int cairn_api_template_kwargs_flags(const char *json, int *flags, char *err, size_t err_len)
{
    json_error_t jerr;
    json_t *kw = json ? json_loads(json, 0, &jerr) : NULL;
    if (!json_is_object(kw)) {
        json_decref(kw);
        snprintf(err, err_len, "chat template kwargs must be a JSON object");
        return CAIRN_EINVAL;
    }
    json_t *params = json_pack("{s:O}", "chat_template_kwargs", kw);
    cairn_api_error e = {0};
    int rc = params ? reasoning_flags(params, 0, flags, &e) : CAIRN_ENOMEM;
    if (rc == CAIRN_EINVAL)
        snprintf(err, err_len, "%s", e.message);
    json_decref(params);
    json_decref(kw);
    return rc;
}

int api_reply_flags(const cairn_api *api, const json_t *params, const json_t *msgs, int *flags,
                    cairn_api_error *e)
{
    size_t n = json_array_size(msgs);
    const char *last = n ? json_string_value(json_object_get(json_array_get(msgs, n - 1), "role"))
                         : NULL;
    const bool ends_with_reply = last && strcmp(last, "assistant") == 0;
    bool continue_final = ends_with_reply, gen_prompt = true;
    int rc;
    if ((rc = api_get_bool(params, "continue_final_message", &continue_final, e)) ||
        (rc = api_get_bool(params, "add_generation_prompt", &gen_prompt, e)))
        return rc;
    if (continue_final && api_field(params, "add_generation_prompt") && gen_prompt)
        return api_fail(e, CAIRN_EINVAL, "continue_final_message",
                        "'continue_final_message' and 'add_generation_prompt' cannot both be "
                        "true");
    int effort;
    if ((rc = reasoning_flags(params, api->default_chat_flags, &effort, e)))
        return rc;
    *flags = (continue_final ? CAIRN_CHAT_CONTINUE_FINAL
              : gen_prompt   ? CAIRN_CHAT_GENERATION_PROMPT
                             : 0) |
             effort;
    return CAIRN_OK;
}

int api_chat_prompt(const cairn_api *api, const json_t *params, const char *tools_json,
                    int32_t **tokens, size_t *n, cairn_api_conversation *conv, cairn_api_error *e)
{
    json_t *msgs = api_field(params, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return api_fail(e, CAIRN_EINVAL, "messages", "'messages' must be a non-empty array");
    int flags = 0, rc;
    if ((rc = api_reply_flags(api, params, msgs, &flags, e)))
        return rc;
    flags |= api->vocab && cairn_vocab_add_bos(api->vocab) ? CAIRN_CHAT_ADD_BOS : 0;
    rc = render_messages(api, msgs, NULL, tools_json, flags, tokens, n, conv, e);
    if (rc == CAIRN_OK && *n == 0) {
        free(*tokens);
        *tokens = NULL;
        return api_fail(e, CAIRN_EINVAL, "messages", "the prompt is empty");
    }
    return rc;
}

int api_detokenize(const cairn_api *api, const int32_t *ids, size_t n, char **out,
                   size_t *out_len, cairn_api_error *e)
{
    cairn_detok *d = NULL;
    cairn_strbuf b = {0};
    char piece[512];
    size_t got = 0;
    int rc = cairn_detok_create(api->vocab, false, &d);
    for (size_t i = 0; rc == CAIRN_OK && i <= n; i++) {
        rc = i < n ? cairn_detok_push(d, ids[i], piece, sizeof piece, &got)
                   : cairn_detok_flush(d, piece, sizeof piece, &got);
        if (rc == CAIRN_OK)
            cairn_strbuf_add(&b, piece, got);
        /* token pieces can be long; the answer stays within the limit */
        if (rc == CAIRN_OK && b.len > api->max_text_bytes)
            rc = CAIRN_ERANGE;
    }
    cairn_detok_free(d);
    if (rc == CAIRN_OK && b.oom)
        rc = CAIRN_ENOMEM;
    if (rc != CAIRN_OK) {
        cairn_strbuf_free(&b);
        return rc == CAIRN_ERANGE ? api_fail(e, rc, "tokens", "the text would exceed max_string_bytes")
                                  : api_fail(e, rc, "tokens", "%s", cairn_strerror(rc));
    }
    *out = b.data ? b.data : strdup("");
    *out_len = b.len;
    return *out ? CAIRN_OK : api_oom(e);
}

/* Fill-in-the-middle markers of the vocabulary, as [prefix, suffix, middle]
 * token ids, in the spellings code models use (Qwen2.5-Coder, StarCoder,
 * CodeLlama, DeepSeek-Coder). False when the model has none. */
static bool fim_markers(const cairn_vocab *v, int32_t ids[3])
{
    static const char *const sets[][3] = {
        {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
        {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
        {"\xe2\x96\x81<PRE>", "\xe2\x96\x81<SUF>", "\xe2\x96\x81<MID>"},
        {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
         "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
         "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>"},
    };
    const int32_t n = cairn_vocab_n_tokens(v);
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        int found = 0;
        ids[0] = ids[1] = ids[2] = -1;
        for (int32_t t = 0; t < n && found < 3; t++) {
            const char *text = cairn_vocab_token_text(v, t);
            for (int k = 0; text && k < 3; k++)
                if (ids[k] < 0 && strcmp(text, sets[s][k]) == 0) {
                    ids[k] = t;
                    found++;
                }
        }
        if (found == 3)
            return true;
    }
    return false;
}

/* Append n ids to a growing array. */
static int ids_append(int32_t **v, size_t *len, const int32_t *ids, size_t n, cairn_api_error *e)
{
    int32_t *grown = realloc(*v, (*len + n + 1) * sizeof **v);
    if (!grown)
        return api_oom(e);
    memcpy(grown + *len, ids, n * sizeof *ids);
    *v = grown;
    *len += n;
    return CAIRN_OK;
}

/* One prompt: a string, or an array of token ids; with a suffix, the
 * fill-in-the-middle form [BOS] PRE prompt SUF suffix MID, whose
 * continuation is the text between the two. */
static int completion_prompt(const cairn_api *api, const json_t *p, const json_t *suffix,
                             int special, int32_t **tokens, size_t *n, cairn_api_error *e)
{
    *tokens = NULL;
    *n = 0;
    const bool add_bos = api->vocab && cairn_vocab_add_bos(api->vocab);
    int rc;
    int32_t fim[3];
    if (suffix && !(api->vocab && fim_markers(api->vocab, fim)))
        return api_fail(e, CAIRN_EUNSUPPORTED, "suffix",
                        "'suffix' needs a model with fill-in-the-middle tokens; this one has none");
    if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        rc = api_token_array(api, p, NULL, "prompt", (size_t)api->n_ctx, tokens, n, e);
        if (rc == CAIRN_ERANGE)
            e->reason = "context_length_exceeded";
        if (rc || !suffix)
            return rc;
    } else {
        if (!json_is_string(p))
            return api_fail(e, CAIRN_EINVAL, "prompt", "'prompt' must be a string, an array of "
                            "token ids, or an array of those (one prompt each)");
        if (strlen(json_string_value(p)) != json_string_length(p))
            return api_fail(e, CAIRN_EINVAL, "prompt", "'prompt' holds a NUL character");
        rc = api_tokenize(api, json_string_value(p), json_string_length(p),
                          (add_bos && !suffix ? CAIRN_TOK_ADD_BOS : 0) | special,
                          (size_t)api->n_ctx,
                          "prompt", "context_length_exceeded", tokens, n, e);
        if (rc)
            return rc;
        /* A vocabulary whose text already opens with BOS, tokenized with
         * BOS added too: one is enough. */
        int32_t bos = cairn_vocab_bos(api->vocab);
        if (*n >= 2 && bos >= 0 && (*tokens)[0] == bos && (*tokens)[1] == bos) {
            memmove(*tokens, *tokens + 1, (*n - 1) * sizeof **tokens);
            (*n)--;
        }
    }
    if (suffix) {
        int32_t *s = NULL, *all = NULL;
        size_t n_s = 0, n_all = 0;
        const int32_t bos = cairn_vocab_bos(api->vocab);
        rc = api_tokenize(api, json_string_value(suffix), json_string_length(suffix), special,
                          (size_t)api->n_ctx, "suffix", "context_length_exceeded", &s, &n_s, e);
        if (!rc && add_bos && bos >= 0)
            rc = ids_append(&all, &n_all, &bos, 1, e);
        if (!rc)
            rc = ids_append(&all, &n_all, &fim[0], 1, e);
        if (!rc)
            rc = ids_append(&all, &n_all, *tokens, *n, e);
        if (!rc)
            rc = ids_append(&all, &n_all, &fim[1], 1, e);
        if (!rc)
            rc = ids_append(&all, &n_all, s, n_s, e);
        if (!rc)
            rc = ids_append(&all, &n_all, &fim[2], 1, e);
        free(s);
        free(*tokens);
        *tokens = all;
        *n = n_all;
        if (rc == CAIRN_OK && n_all > (size_t)api->n_ctx) {
            e->reason = "context_length_exceeded";
            rc = api_fail(e, CAIRN_ERANGE, "prompt", "the prompt and suffix have %zu tokens, "
                          "more than the context's %d", n_all, api->n_ctx);
        }
        if (rc) {
            free(*tokens);
            *tokens = NULL;
            *n = 0;
            return rc;
        }
    }
    if (*n == 0) {
        free(*tokens);
        *tokens = NULL;
        return api_fail(e, CAIRN_EINVAL, "prompt", "the prompt is empty");
    }
    return CAIRN_OK;
}

int api_completion_prompts(const cairn_api *api, const json_t *params, cairn_api_call *c,
                           cairn_api_error *e)
{
    json_t *p = api_field(params, "prompt"), *suffix = api_field(params, "suffix");
    if (!p)
        return api_fail(e, CAIRN_EINVAL, "prompt", "'prompt' is required");
    if (suffix && !json_is_string(suffix))
        return api_fail(e, CAIRN_EINVAL, "suffix", "'suffix' must be a string");
    if (suffix && json_string_length(suffix) == 0)
        suffix = NULL; /* what clients send for "none" */
    /* A completion prompt is the client's own token stream (it may as well
     * send ids), so its special-token text becomes those tokens unless
     * `parse_special: false` asks for plain text, as vLLM and llama-server
     * do; chat messages never are (docs/security.md section 8). */
    bool parse_special = true;
    int rc0 = api_get_bool(params, "parse_special", &parse_special, e);
    if (rc0)
        return rc0;
    const int special = parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0;
    /* a prompt array: strings or arrays of ids, one prompt each */
    const bool many = json_is_array(p) && json_array_size(p) > 0 &&
                      !json_is_integer(json_array_get(p, 0));
    const size_t k = many ? json_array_size(p) : 1;
    if (json_is_array(p) && json_array_size(p) == 0)
        return api_fail(e, CAIRN_EINVAL, "prompt", "'prompt' is an empty array");
    if (k * (size_t)c->n_choices > CAIRN_API_MAX_CHOICES)
        return api_fail(e, CAIRN_ERANGE, "prompt", "%zu prompts with n = %d make more than %d "
                        "choices", k, c->n_choices, CAIRN_API_MAX_CHOICES);
    if (!(c->prompts = calloc(k, sizeof *c->prompts)))
        return api_oom(e);
    c->n_prompts = (int)k;
    for (size_t i = 0; i < k; i++) {
        const json_t *one = many ? json_array_get(p, i) : p;
        cairn_api_prompt *pr = &c->prompts[i];
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = completion_prompt(api, one, suffix, special, &ids, &n, e);
        if (rc)
            return rc;
        if (i == 0) {
            c->req->tokens = ids;
            c->req->n_tokens = n;
        } else {
            pr->tokens = ids;
            pr->n_tokens = n;
        }
        if (!c->echo)
            continue;
        if (json_is_string(one)) {
            pr->echo_len = json_string_length(one);
            if (!(pr->echo = malloc(pr->echo_len + 1)))
                return api_oom(e);
            memcpy(pr->echo, json_string_value(one), pr->echo_len + 1);
        } else if ((rc = api_detokenize(api, ids, n, &pr->echo, &pr->echo_len, e))) {
            return rc;
        }
    }
    c->n_choices *= (int)k;
    return CAIRN_OK;
}
