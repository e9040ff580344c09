/*
 * text/chat_impl.h — internals shared by the chat files: the output buffer
 * formatters write into, the template object, and a conversation in the form
 * the formatters read. Nothing outside text/ includes this.
 *
 *   chat_template.c  family recognition, Python-compatible JSON, preparing
 *                    the caller's messages
 *   chat_format.c    the family formatters and cairn_chat_tokenize
 *   tool_calls.c     reading tool calls back (and where a streamed one may
 *                    begin), and replies in channels (harmony) into
 *                    reasoning, content and calls; forcing a call,
 *                    choosing tools and checking their schemas
 */
#ifndef CAIRN_TEXT_CHAT_IMPL_H
#define CAIRN_TEXT_CHAT_IMPL_H

#include "text/text.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- output buffer with special spans ------------------------------------ */

typedef struct {
    size_t off, len;
} span;

/* The text being formatted, and where in it the formatter wrote its own
 * markers (only those become special tokens, see cairn_chat_tokenize). */
typedef struct {
    cairn_strbuf text;
    span *specials;
    size_t n_specials, cap_specials;
} outbuf;

static inline void ob_add(outbuf *b, const char *s, size_t n)
{
    cairn_strbuf_add(&b->text, s, n);
}

static inline void ob_str(outbuf *b, const char *s)
{
    if (s)
        ob_add(b, s, strlen(s));
}

/* A marker the template writes itself (turn delimiters, BOS/EOS): tokenized
 * as a special token when the vocabulary has one with this text. */
static inline void ob_special(outbuf *b, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (b->text.oom || n == 0)
        return;
    if (b->n_specials == b->cap_specials) {
        size_t cap = b->cap_specials ? b->cap_specials * 2 : 32;
        span *d = realloc(b->specials, cap * sizeof *d);
        if (!d) {
            b->text.oom = true;
            return;
        }
        b->specials = d;
        b->cap_specials = cap;
    }
    b->specials[b->n_specials++] = (span){b->text.len, n};
    ob_add(b, s, n);
}

static inline void ob_free(outbuf *b)
{
    free(b->text.data);
    free(b->specials);
    memset(b, 0, sizeof *b);
}

/* ---- templates ------------------------------------------------------------ */

struct cairn_chat_template {
    cairn_chat_family family;
    char *bos_text; /* the vocabulary's BOS/EOS text ("" when none)          */
    char *eos_text;
    /* Variants within a family, told apart by the source. */
    bool llama31;        /* Llama 3.1+: dated system header, JSON tool calls  */
    char date[64];       /* its date_string default                           */
    bool llama2_sys;     /* Llama 2: <<SYS>> block; else Mistral: system text
                            prepended to the first user message               */
    bool mistral_tight;  /* Mistral v3-tekken (Nemo): "[INST]text[/INST]" with
                            no spaces, system text on the last user message   */
    bool phi3_eos;       /* the template ends a non-prompting render with EOS */
    bool qwen_default;   /* Qwen2.5: a default system prompt when none is
                            given (Qwen3 and other ChatML tool templates have
                            none: no system turn, or only the tools block)  */
    char qwen_system[256]; /* that prompt, as the template's source writes it */
    bool thinks;         /* ChatML that reasons first in <think>...</think>
                            (Qwen3, QwQ): reasoning of replies after the last
                            question rendered back, enable_thinking          */
};

/* ---- conversation ---------------------------------------------------------- */

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT, R_TOOL } role_id;

typedef struct {
    role_id role;
    const char *content; /* never NULL ("" for none) */
    bool has_content;    /* given and non-empty (Jinja truthiness)          */
    json_t *calls;       /* assistant: array of {name, arguments(json)}     */
    const char *reasoning; /* assistant: reasoning_content, NULL when not given */
} msg;

/* Defined in chat_template.c. */
const char *chat_role_name(role_id r);
/* The caller's messages checked and normalised: roles to role_id ("developer"
 * is "system"), NULL contents to "", tool-call arguments given as JSON text
 * parsed. CAIRN_EINVAL for an unknown role or malformed tool calls. Free the
 * result with chat_free_msgs. */
int chat_prepare(const cairn_chat_message *in, size_t n, msg **out);
void chat_free_msgs(msg *m, size_t n);

/* Python's json.dumps(ensure_ascii=False), as Jinja's `tojson` renders:
 * indent < 0 for the one-line form with ", " and ": " separators. */
void chat_py_json(outbuf *b, const json_t *j, int indent, int level);
/* A JSON string literal of s[0..n), escaped as json.dumps does. */
void chat_py_json_string(outbuf *b, const char *s, size_t n);

#endif
