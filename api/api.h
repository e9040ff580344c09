/*
 * api/api.h — what a request means, decided once for every front end.
 *
 * cairn speaks msgpack-RPC (docs/protocol.md), OpenAI's HTTP API
 * (docs/openai.md) and Anthropic's (docs/anthropic.md). Each front end parses its own wire
 * format; what the fields then mean — their ranges and defaults, how a
 * prompt, a conversation, tools and a response format become tokens and a
 * grammar — is here, in one place, so that the same field takes the same
 * values whichever protocol carries it (the table is docs/api.md):
 *
 *     msgpack params ──(server/msgpack: to JSON)──┐
 *                                                 ├─▶ cairn_api_decode ──▶ cairn_request
 *     HTTP JSON body ─────────────────────────────┘    (tokenize, render    (session/, the
 *                                                        templates, compile   engine thread)
 *                                                        grammars)
 *     DONE event ──▶ cairn_api_tool_calls, cairn_api_token_piece ──▶ the front end's reply
 *
 * Parameters arrive as a JSON object (jansson): the form the HTTP API has
 * already, and one msgpack maps onto without loss for everything a request
 * holds (a msgpack integer above 2^63 - 1, which no JSON integer here can
 * hold, arrives as its decimal text: what a seed that large takes). A
 * field given as null counts as absent;
 * fields this server does not know are ignored, so clients may send what a
 * later server understands.
 *
 * Other wire formats (Anthropic's Messages, OpenAI's Responses) are
 * translated here into the chat form above and decoded by its rules, so a
 * front end for them writes only its replies.
 *
 * Dialects. The fields are the same; what differs by op is what a request
 * may carry (a native `session.append` takes no sampling) and the defaults:
 * native requests sample like llama.cpp (temperature 0.8, top-k 40, top-p
 * 0.95, min-p 0.05, 128 tokens), OpenAI ones like OpenAI (temperature 1,
 * top-p 1, no top-k or min-p; chat until the context ends, completions 16
 * tokens).
 *
 * Threads: a cairn_api is immutable once filled in; cairn_api_decode and
 * the result helpers may run on any number of threads at once. This is text
 * work (tokenizing a long document, rendering a template, compiling a
 * grammar): the server runs it on libuv's threadpool, never on its loop
 * thread, and it never runs inside an engine step.
 *
 * Layering: api/ uses text/ (tokenizers, templates, grammars), model/
 * (sampling defaults), runtime/ (the grammar vocabulary, built off the
 * engine thread) and session/ (the engine request it builds); never the
 * cache, the tree or a socket.
 */
#ifndef CAIRN_API_H
#define CAIRN_API_H

#include "session/session.h"

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CAIRN_API_MAX_STOP_BYTES 256  /* bytes of one stop string               */
#define CAIRN_API_MAX_CHOICES 64      /* n, OpenAI ops                           */
#define CAIRN_API_MAX_SESSION_KEY 256 /* bytes of an HTTP session_id / prompt_cache_key */

/* What decoding needs to know of the model. Fill it in once; it is only
 * read afterwards. */
typedef struct {
    const cairn_vocab *vocab; /* NULL: requests carrying text are refused as
                                 unsupported (tests without a model)       */
    const cairn_chat_template *chat_template; /* formats messages; NULL: the
                                 generic format of docs/protocol.md        */
    int n_vocab;              /* token ids must be below it               */
    int n_ctx;                /* the most tokens of a prompt, a session's
                                 content, and of max_tokens               */
    uint32_t max_tokenize;    /* tokenize: the most tokens an answer holds */
    size_t max_text_bytes;    /* detokenize: the most bytes an answer holds */
    cairn_runtime *runtime;   /* optional: a request with a grammar builds
                                 the runtime's grammar vocabulary (once, ~80
                                 ms for a 150k vocabulary) on the decoding
                                 thread, so the engine thread never does  */
    int default_chat_flags;   /* the server's chat_template_kwargs defaults
                                 as CAIRN_CHAT_REASONING_* / NO_THINKING
                                 (cairn_api_template_kwargs_flags); a
                                 request's own kwargs override them key by
                                 key                                      */
} cairn_api;

/* A chat_template_kwargs object given as JSON text (a server's default,
 * vLLM's --default-chat-template-kwargs) as CAIRN_CHAT_* flags:
 * enable_thinking false -> NO_THINKING, reasoning_effort -> REASONING_*
 * (or NO_THINKING for "none"/"minimal"); other keys are the template's
 * and ignored, as in requests. CAIRN_EINVAL with a message in err when the
 * text is not a JSON object or a known key has the wrong type or value. */
int cairn_api_template_kwargs_flags(const char *json, int *flags, char *err, size_t err_len);

/* What a request asks for. The native methods, then OpenAI's routes. */
typedef enum {
    CAIRN_API_GENERATE = 1,   /* generate                                 */
    CAIRN_API_SESSION_OPEN,
    CAIRN_API_SESSION_APPEND,
    CAIRN_API_SESSION_GENERATE,
    CAIRN_API_SESSION_FORK,
    CAIRN_API_SESSION_TRUNCATE,
    CAIRN_API_SESSION_CLOSE,
    CAIRN_API_SESSION_INFO,
    CAIRN_API_CANCEL,         /* gen.cancel                               */
    CAIRN_API_CACHE_STATS,
    CAIRN_API_TOKENIZE,       /* answered without the engine               */
    CAIRN_API_DETOKENIZE,     /* answered without the engine               */
    CAIRN_API_CHAT,           /* POST /v1/chat/completions                */
    CAIRN_API_COMPLETION,     /* POST /v1/completions                     */
    CAIRN_API_MESSAGES,       /* POST /v1/messages (Anthropic's): a chat
                                 request once translated (api/anthropic.c) */
    CAIRN_API_RESPONSES,      /* POST /v1/responses (OpenAI's): a chat
                                 request, or a turn continuing a stored
                                 response's session (api/responses.c)     */
} cairn_api_op;

/* Why a request was refused. code: CAIRN_EINVAL (a field is wrong),
 * CAIRN_ERANGE (too large: a count, a length, the context), CAIRN_EUNSUPPORTED
 * (valid, but not here), CAIRN_ENOMEM. The front end turns it into its own
 * error (invalid_request / too_large natively; 400 over HTTP, 503 for
 * ENOMEM). */
typedef struct {
    int code;
    const char *field;  /* the request field at fault, or NULL: static, or
                           field_text of this same struct (a tool's
                           "tools[I].function.parameters")                  */
    const char *reason; /* static: "context_length_exceeded" when the
                           prompt or max_tokens does not fit the context
                           (OpenAI's error code), else NULL                  */
    char message[300];  /* one line, naming the field and what it may be    */
    char field_text[48];
} cairn_api_error;

/* One prompt of a completion request. */
typedef struct {
    int32_t *tokens;      /* NULL for prompts[0] (the call's req holds them) */
    size_t n_tokens;
    char *echo;           /* with echo: the prompt as text (the string given,
                             or its tokens detokenized), else NULL          */
    size_t echo_len;
} cairn_api_prompt;

/* A chat request's conversation as it was rendered, kept so that a position
 * in the prompt can be placed in the part it belongs to afterwards
 * (cairn_api_conversation_end): why a cached prefix ended where it did, where
 * a cache breakpoint falls. */
typedef struct {
    json_t *msgs;         /* the messages (a reference); NULL with no system
                             either: the prompt was not a conversation      */
    char *system;         /* a system text rendered before them, or NULL    */
    int flags;            /* the CAIRN_CHAT_* flags it was rendered with     */
} cairn_api_conversation;

/* A decoded request. Everything is owned by it: cairn_api_call_clear. */
typedef struct {
    cairn_api_op op;
    cairn_request *req;   /* the engine request to submit (client, id and
                             tenant are the front end's to fill); NULL for
                             TOKENIZE and DETOKENIZE                         */
    int32_t *tokens;      /* TOKENIZE: the answer                            */
    size_t n_tokens;
    char *text;           /* DETOKENIZE: the answer (complete UTF-8)         */
    size_t text_len;
    char *tools_json;     /* the reply is read for calls of these tools (a
                             JSON array); NULL: no tools                    */
    bool has_content;     /* native ops: a prompt, text, tokens or messages
                             was given (session.generate may have none)     */
    /* OpenAI ops */
    int n_choices;        /* n x the prompts: that many engine requests
                             (cairn_api_choice)                              */
    cairn_api_prompt *prompts; /* COMPLETION: each prompt of the request (a
                             prompt array has several), answered by
                             n_choices / n_prompts choices each; prompts[0]'s
                             tokens are req's                               */
    int n_prompts;
    bool echo;            /* completions: the reply starts with the prompt  */
    bool stream;
    bool include_usage;   /* stream_options.include_usage                   */
    bool logprobs;        /* return logprobs (chat: bool; completions: int)  */
    /* RESPONSES: req is a GENERATE (store false, nothing to continue) or a
     * SESSION_GENERATE whose session the front end provides first: a new
     * one (store true) or a fork of `previous` (its tokens continue it) */
    bool store;           /* store: keep the response (default true)        */
    bool has_previous;    /* previous_response_id was given                 */
    cairn_session_id previous; /* the session of previous_response_id       */
    char *echo_json;      /* the request fields the reply object repeats (a
                             JSON object: instructions, tools, metadata...) */
    cairn_api_conversation conv; /* chat prompts: what was rendered          */
} cairn_api_call;

/* A "tokens" field a front end has already read as ids (msgpack arrays of
 * integers: tens of thousands of them would cost megabytes as JSON values).
 * params then holds `true` in its place. bad: index of the first element
 * that is not an integer of 32 bits (-1: none); the ids are still checked
 * against the vocabulary and the limits here. */
typedef struct {
    const int32_t *ids;
    size_t n;
    int64_t bad;
} cairn_api_tokens;

/* Decode the parameters of one request.
 *   params          a JSON object (borrowed; NULL = no parameters)
 *   random_seed     the seed of a request that names none (the caller draws
 *                   it; every choice i of n samples with seed + i)
 *   session_header  OpenAI ops: the X-Session-Id header, or NULL
 *   tokens          the "tokens" field read already (see above), or NULL
 * CAIRN_OK and *out filled, or an error with *err filled and nothing left
 * allocated. */
int cairn_api_decode(const cairn_api *api, cairn_api_op op, const json_t *params,
                     uint64_t random_seed, const char *session_header,
                     const cairn_api_tokens *tokens, cairn_api_call *out, cairn_api_error *err);
void cairn_api_call_clear(cairn_api_call *c);

/* A request body as JSON (duplicate keys refused). An integer literal that
 * does not fit 64 signed bits is read as its decimal text, so that the field
 * it belongs to says what is wrong (a seed in [2^63, 2^64) is valid; a
 * larger one is refused naming `seed`) instead of the whole body being
 * "invalid JSON". NULL, with *err filled, when the text is not JSON. */
json_t *cairn_api_json_parse(const char *text, size_t len, json_error_t *err);

/* Choice `i` (0 .. n_choices-1) of an OpenAI request as an engine request of
 * its own (*out, the caller's): with n choices per prompt, the request of
 * prompt i / n with seed + i % n. The tokens and stop strings are copied,
 * the grammar shared. CAIRN_ENOMEM. */
int cairn_api_choice(const cairn_api_call *c, int i, cairn_request **out);

/* A finished reply read for tool calls (text/text.h, cairn_chat_parse_tool_
 * calls): *calls_json an OpenAI tool_calls array with ids "<id_prefix><n>",
 * *content the text around them (both malloc'ed). CAIRN_ENOTFOUND when the
 * text holds no call. `cut`: the reply was cut by max_tokens, so a call it
 * may have broken off is never content: once a call has begun, the content
 * is only the text before it (CAIRN_OK with *content set and *calls_json
 * NULL when no call was complete). */
int cairn_api_tool_calls(const cairn_api *api, const char *text, size_t len,
                         const char *tools_json, const char *id_prefix, bool cut,
                         char **calls_json, char **content);

/* Streaming a reply with tools: the offset from which its text so far may
 * be a tool call and must be held back (text/text.h, cairn_chat_tool_call_
 * start; *certain: it is one, hold to the end). Cheap: any thread, the
 * loop thread included. */
size_t cairn_api_tool_call_start(const char *text, size_t len, const char *tools_json,
                                 bool *certain);

/* Replies in channels (gpt-oss's harmony, text/text.h): the model writes
 * its reasoning, its answer and its tool calls as separate messages, with
 * markers a client must never see. Does this model? Then every chat reply
 * is read with cairn_api_reply, tools or not, and a stream with
 * cairn_api_reply_next. */
bool cairn_api_reply_has_channels(const cairn_api *api);

/* A finished reply read into what a chat client is given (all malloc'ed):
 * *reasoning (`reasoning_content`; NULL: none), *calls_json (an OpenAI
 * tool_calls array with ids "<id_prefix><n>"; NULL: none) and *content
 * (NULL: the text as it is). Replies in channels are read whole
 * (cairn_chat_parse_reply: a call cut off by max_tokens is dropped unless
 * its arguments are complete JSON); other replies are
 * cairn_api_tool_calls(), and only with tools_json (*reasoning then NULL).
 * CAIRN_OK, CAIRN_ENOTFOUND (nothing read: the text as it is),
 * CAIRN_ENOMEM, CAIRN_EINVAL. */
int cairn_api_reply(const cairn_api *api, const char *text, size_t len, const char *tools_json,
                    const char *id_prefix, bool cut, char **reasoning, char **calls_json,
                    char **content);

/* Tokens in a reply's reasoning, for usage's reasoning_tokens: the count
 * of `text` tokenized as plain text (the markers around it not counted).
 * 0 without a vocabulary. Cheap next to the generation: any thread. */
int64_t cairn_api_reasoning_tokens(const cairn_api *api, const char *text, size_t len);

/* Streaming a reply in channels: its next settled part from *c on
 * (text/text.h, cairn_chat_reply_next). Reasoning and content pieces come
 * as they are written, concatenated the beginnings of cairn_api_reply's
 * *reasoning and *content for the finished text; calls come whole (the
 * finished reply's tool_calls are what a client is given). Cheap: any
 * thread, the loop thread included. */
bool cairn_api_reply_next(const cairn_api *api, cairn_chat_reply_cursor *c, const char *text,
                          size_t len, bool done, cairn_chat_reply_part *part);

/* Parts of a call's conversation: the system text given apart (native
 * `system`), then each message. 0 when the prompt was not a conversation. */
size_t cairn_api_conversation_parts(const cairn_api_call *c);

/* Where the rendering of the conversation's first k parts (k <= parts) ends
 * in `tokens`, the prompt the call decoded (the caller's copy: the request
 * may have been submitted). with_tools renders the tool list too; k = 0 with
 * tools is the template's preamble and tool list. Found as the longest common
 * prefix of `tokens` with those parts rendered alone (no generation prompt),
 * so for a template that renders an earlier turn differently once later ones
 * follow (one that drops reasoning) it is where the two renderings part.
 * Costs one rendering and tokenization of those parts. CAIRN_ENOTFOUND when
 * the call was no conversation, CAIRN_EINVAL for k beyond its parts,
 * CAIRN_ENOMEM. */
int cairn_api_conversation_end(const cairn_api *api, const cairn_api_call *c, size_t k,
                               bool with_tools, const int32_t *tokens, size_t n, size_t *pos);

/* The bytes of one token as a logprob entry shows them (special tokens
 * included), into out[cap]; *n their count. */
int cairn_api_token_piece(const cairn_api *api, int32_t token, char *out, size_t cap,
                          size_t *n);

/* Free what generation parameters own (stop strings, the grammar) and
 * leave them empty. */
void cairn_api_gen_clear(cairn_gen_params *g);

/* The sampling settings a dialect starts from (before the request's fields):
 * native (llama.cpp's) or OpenAI's. */
cairn_gen_params cairn_api_gen_defaults(const cairn_api *api, cairn_api_op op);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_API_H */
