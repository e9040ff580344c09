/*
 * api/api_impl.h — what the files of api/ share (nothing outside api/
 * includes this): reporting an error, and reading one field of a request
 * with its type and range checked.
 *
 *   fields.c  the generation fields: one table of names, types and ranges
 *   prompt.c  prompt text, token ids and conversations -> tokens
 *   tools.c   tools, tool_choice and response_format -> grammars
 *   decode.c  each op: which fields it takes, into which engine request
 *   anthropic.c  Anthropic's Messages body translated into a chat request
 *   responses.c  OpenAI's Responses body: a chat request, or a turn that
 *             continues a stored response's session
 */
#ifndef CAIRN_API_IMPL_H
#define CAIRN_API_IMPL_H

#include "api/api.h"

/* Fill *e (code, field, message) and return code. */
int api_fail(cairn_api_error *e, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int api_oom(cairn_api_error *e);

/* A field that is absent or JSON null is absent: NULL. */
json_t *api_field(const json_t *params, const char *name);

/* Typed reads; absent leaves *out as it is and returns CAIRN_OK. Integers
 * may be given as numbers with an integral value (10.0). */
int api_get_bool(const json_t *params, const char *name, bool *out, cairn_api_error *e);
int api_get_int(const json_t *params, const char *name, int64_t lo, int64_t hi, int64_t *out,
                cairn_api_error *e);
/* A string: *s points into params (NUL-terminated, *len bytes; a NUL inside
 * is refused). */
int api_get_str(const json_t *params, const char *name, const char **s, size_t *len,
                cairn_api_error *e);
/* An integral JSON number as int64 (false when it is not one). */
bool api_json_int(const json_t *v, int64_t *out);

/* fields.c: every generation field of `op` into g (which holds the
 * dialect's defaults already). */
int api_gen_fields(const cairn_api *api, cairn_api_op op, const json_t *params,
                   uint64_t random_seed, cairn_gen_params *g, cairn_api_error *e);

/* prompt.c */
typedef struct {
    const char *text_field; /* "prompt" or "text": plain text given as      */
    bool allow_messages;    /* "messages" may be given                      */
    bool allow_system;      /* "system" (a system message before them)      */
    bool first;             /* starts a history: BOS by default, the
                               template's preamble (else it continues one)  */
    bool assistant;         /* open an assistant turn after messages         */
    const char *tools_json; /* tools to render with the messages (or NULL)  */
    const cairn_api_tokens *typed; /* "tokens" read by the front end, or NULL */
} api_content_rules;

/* The content fields of a native op into *tokens (malloc'ed). *given:
 * whether any was given; *chat_turn: they were messages continuing a
 * conversation. */
int api_native_content(const cairn_api *api, const json_t *params, const api_content_rules *r,
                       int32_t **tokens, size_t *n, bool *given, bool *chat_turn,
                       cairn_api_conversation *conv, cairn_api_error *e);
/* An array of token ids (each in [0, n_vocab), at most `limit`); with
 * `typed`, the ids the front end read in its place. */
int api_token_array(const cairn_api *api, const json_t *v, const cairn_api_tokens *typed,
                    const char *field, size_t limit, int32_t **out, size_t *n,
                    cairn_api_error *e);
/* Text into at most `limit` tokens (CAIRN_ERANGE beyond, with `reason`). */
int api_tokenize(const cairn_api *api, const char *text, size_t len, int flags, size_t limit,
                 const char *field, const char *reason, int32_t **out, size_t *n,
                 cairn_api_error *e);
/* OpenAI's chat messages (with tools) -> the prompt's tokens. */
/* How the reply follows the messages: a trailing assistant message is
 * continued (a prefill; `continue_final_message: false` answers it with a
 * new turn instead), else a new assistant turn is opened
 * (`add_generation_prompt: false` leaves it out); and how long it is to
 * reason (`reasoning_effort`, also in `chat_template_kwargs`: none,
 * minimal, low, medium, high; `chat_template_kwargs.enable_thinking`), the
 * server's defaults (api->default_chat_flags) where the request is silent.
 * CAIRN_CHAT_* flags. */
int api_reply_flags(const cairn_api *api, const json_t *params, const json_t *msgs, int *flags,
                    cairn_api_error *e);
/* The generic format's own flag, beside CAIRN_TOK_*: continue the last message. */
#define API_RENDER_CONTINUE_FINAL (1 << 30)
int api_chat_prompt(const cairn_api *api, const json_t *params, const char *tools_json,
                    int32_t **tokens, size_t *n, cairn_api_conversation *conv,
                    cairn_api_error *e);
/* OpenAI's completion prompt (string, [string] or token ids) -> tokens. */
/* Building a chat request out of another front end's body (json.c; the
 * values are taken, a NULL one is out of memory): a string without NUL,
 * obj[key] = v, arr += v, and tools += an OpenAI function tool. */
bool api_clean_string(const json_t *v);
int api_set(json_t *obj, const char *key, json_t *v, cairn_api_error *e);
int api_append(json_t *arr, json_t *v, cairn_api_error *e);
int api_function_tool(json_t *tools, const json_t *name, const json_t *desc, const json_t *schema,
                      cairn_api_error *e);
/* A front end's `tools` array as chat function tools in chat["tools"]:
 * `parts` checks tools[i] and names its name, description and schema
 * (borrowed; description and schema may be NULL), or fails naming it. */
typedef int (*api_tool_parts)(const json_t *tool, size_t i, const json_t **name,
                              const json_t **desc, const json_t **schema, cairn_api_error *e);
int api_translate_tools(const json_t *params, json_t *chat, api_tool_parts parts,
                        cairn_api_error *e);
/* A chat rule's error named as the front end's client wrote the field: the
 * first names[i].chat equal to e->field becomes names[i].wire, in the field
 * and where the message quotes it. */
typedef struct {
    const char *chat, *wire; /* static */
} api_field_name;
void api_rename_field(cairn_api_error *e, const api_field_name *names, size_t n);
/* The prompts of a completion (a string, ids, or an array of those; with
 * `suffix` in fill-in-the-middle form): c->req's tokens are the first,
 * c->prompts each one (and its text with echo), n_choices multiplied by
 * their count. */
int api_completion_prompts(const cairn_api *api, const json_t *params, cairn_api_call *c,
                           cairn_api_error *e);
/* ids as text, within max_text_bytes (special tokens not written). */
int api_detokenize(const cairn_api *api, const int32_t *ids, size_t n, char **out,
                   size_t *out_len, cairn_api_error *e);

/* tools.c */
/* tools / tool_choice / parallel_tool_calls: *render_json the tools to
 * render and read calls of (NULL: none); a required or named choice forces
 * the reply (g->grammar), which a JSON response_format excludes. `forcing`:
 * whether this op may force (it generates). */
int api_tools(const cairn_api *api, const json_t *params, bool forcing, cairn_gen_params *g,
              char **render_json, cairn_api_error *e);
/* response_format -> g->grammar (NULL for "text"). */
int api_response_format(const json_t *params, cairn_gen_params *g, cairn_api_error *e);

/* anthropic.c: CAIRN_API_MESSAGES (cairn_api_decode's contract). */
int api_decode_messages(const cairn_api *api, const json_t *params, uint64_t random_seed,
                        const char *session_header, cairn_api_call *out, cairn_api_error *e);
/* responses.c: CAIRN_API_RESPONSES (cairn_api_decode's contract). */
int api_decode_responses(const cairn_api *api, const json_t *params, uint64_t random_seed,
                         cairn_api_call *out, cairn_api_error *e);

#endif /* CAIRN_API_IMPL_H */
