/*
 * text/chat_format.c — the family formatters: a conversation rendered as
 * the text of one template family (text/chat_template.c tells which), and
 * tokenized with only the formatter's own markers as special tokens.
 *
 * Each formatter writes into an outbuf (text/chat_impl.h), which also
 * records where it wrote a special marker (<|im_start|>, <|eot_id|>, BOS,
 * ...). cairn_chat_tokenize uses those spans so that text inside messages
 * can never become a control token: only the markers the formatter itself
 * wrote are parsed as special. The formatters are kept side by side so
 * their differences — whitespace, trimming, where the system text goes —
 * can be read against each other.
 */
#include "text/chat_impl.h"
#include "text/tokenizer_impl.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Jinja's trim ------------------------------------------------------------ */

/* Jinja's `trim` filter (Python str.strip()) for the whitespace that occurs in
 * practice: ASCII whitespace and the Unicode spaces U+0085, U+00A0, U+2000..
 * U+200A, U+2028, U+2029, U+202F, U+205F, U+3000. */
static size_t ws_len_at(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f))
        return 1;
    if (c == 0xc2 && i + 1 < n && ((unsigned char)s[i + 1] == 0x85 || (unsigned char)s[i + 1] == 0xa0))
        return 2;
    if (c == 0xe2 && i + 2 < n) {
        unsigned c1 = (unsigned char)s[i + 1], c2 = (unsigned char)s[i + 2];
        if (c1 == 0x80 && (c2 <= 0x8a || c2 == 0xa8 || c2 == 0xa9 || c2 == 0xaf))
            return 3;
        if (c1 == 0x81 && c2 == 0x9f)
            return 3;
    }
    if (c == 0xe3 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 && (unsigned char)s[i + 2] == 0x80)
        return 3;
    return 0;
}

static void ob_trimmed(outbuf *b, const char *s)
{
    size_t n = strlen(s), start = 0, end = n;
    for (size_t w; start < n && (w = ws_len_at(s, n, start)) > 0;)
        start += w;
    /* From the end: find the last non-whitespace character by walking forward. */
    size_t last_end = start;
    for (size_t i = start; i < n;) {
        size_t w = ws_len_at(s, n, i);
        if (w) {
            i += w;
        } else {
            unsigned char c = (unsigned char)s[i];
            size_t cl = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            i += cl;
            if (i > n)
                i = n;
            last_end = i;
        }
    }
    end = last_end;
    ob_add(b, s + start, end - start);
}

/* ---- family formatters ---------------------------------------------------- */

typedef struct {
    const msg *m;
    size_t n;
    json_t *tools; /* array or NULL                                      */
    bool gen_prompt;
    bool cont;     /* continuing a conversation: no preamble            */
    const char *effort; /* reasoning effort (HARMONY): "low", "medium", "high" */
    bool no_thinking;   /* enable_thinking=false (templates that think)     */
} conv;

static void fmt_generic(const cairn_chat_template *t, const conv *c, outbuf *b)
{
    (void)t;
    for (size_t i = 0; i < c->n; i++) {
        ob_str(b, "<|");
        ob_str(b, chat_role_name(c->m[i].role));
        ob_str(b, "|>\n");
        ob_str(b, c->m[i].content);
        if (c->m[i].calls) {
            outbuf j = {0};
            chat_py_json(&j, c->m[i].calls, -1, 0);
            if (j.text.oom)
                b->text.oom = true;
            ob_add(b, j.text.data, j.text.len);
            ob_free(&j);
        }
        ob_str(b, "\n");
    }
    if (c->gen_prompt)
        ob_str(b, "<|assistant|>\n");
}

/* A call in Qwen's form, after a newline when `newline`. */
static void qwen_tool_call(outbuf *b, const json_t *call, bool newline)
{
    ob_str(b, newline ? "\n<tool_call>\n{\"name\": \"" : "<tool_call>\n{\"name\": \"");
    const json_t *name = json_object_get(call, "name");
    ob_add(b, json_string_value(name), json_string_length(name));
    ob_str(b, "\", \"arguments\": ");
    chat_py_json(b, json_object_get(call, "arguments"), -1, 0);
    ob_str(b, "}\n</tool_call>");
}

/* Text between two offsets of s with the newlines at either end dropped
 * (Python's strip('\n')): *a and *e move inward. */
static void strip_newlines(const char *s, size_t *a, size_t *e, bool left, bool right)
{
    while (left && *a < *e && s[*a] == '\n')
        (*a)++;
    while (right && *e > *a && s[*e - 1] == '\n')
        (*e)--;
}

static const char *last_of(const char *s, const char *lit)
{
    const char *at = NULL;
    for (const char *p = s; (p = strstr(p, lit)); p++)
        at = p;
    return at;
}

/* The last question of a thinking template's conversation: the last user
 * message that is not only a tool's answer wrapped in <tool_response>
 * (replies after it are one multi-step answer, whose reasoning is kept);
 * n - 1 when there is none. */
static size_t last_query(const conv *c)
{
    for (size_t k = c->n; k-- > 0;) {
        const msg *x = &c->m[k];
        if (x->role != R_USER)
            continue;
        size_t n = strlen(x->content);
        bool wrapped = n >= 16 && strncmp(x->content, "<tool_response>", 15) == 0 &&
                       strcmp(x->content + n - 16, "</tool_response>") == 0;
        if (!wrapped)
            return k;
    }
    return c->n ? c->n - 1 : 0;
}

/* An assistant reply in a template that thinks (Qwen3's rule): its
 * reasoning is reasoning_content, else what the content holds before
 * </think> (the content is then what follows it). Replies after the last
 * question show their reasoning in <think>...</think> (the last reply
 * always, an earlier one when it has some); earlier replies lose it, as
 * the model was trained. */
static void thinking_assistant(outbuf *b, const conv *c, size_t i, size_t query)
{
    const msg *x = &c->m[i];
    const char *content = x->content, *reasoning = x->reasoning ? x->reasoning : "";
    size_t c0 = 0, c1 = strlen(content), r0 = 0, r1 = strlen(reasoning);
    const char *close = x->reasoning ? NULL : strstr(content, "</think>");
    if (close) {
        /* reasoning: before the first </think>, after the last <think> in it */
        reasoning = content;
        r1 = (size_t)(close - content);
        strip_newlines(content, &r0, &r1, false, true);
        for (const char *o = content; (o = strstr(o, "<think>")) && (size_t)(o - content) + 7 <= r1; o++)
            r0 = (size_t)(o - content) + 7;
        strip_newlines(content, &r0, &r1, true, false);
        c0 = (size_t)(last_of(content, "</think>") - content) + 8;
        strip_newlines(content, &c0, &c1, true, false);
    }
    ob_special(b, "<|im_start|>");
    ob_str(b, "assistant\n");
    if (i > query && (i + 1 == c->n || r1 > r0)) {
        size_t ra = r0, re = r1, ca = c0, ce = c1;
        strip_newlines(reasoning, &ra, &re, true, true);
        strip_newlines(content, &ca, &ce, true, false);
        ob_special(b, "<think>");
        ob_str(b, "\n");
        ob_add(b, reasoning + ra, re - ra);
        ob_str(b, "\n");
        ob_special(b, "</think>");
        ob_str(b, "\n\n");
        ob_add(b, content + ca, ce - ca);
    } else {
        ob_add(b, content + c0, c1 - c0);
    }
    for (size_t k = 0; k < json_array_size(x->calls); k++)
        qwen_tool_call(b, json_array_get(x->calls, k), k > 0 || c1 > c0);
    ob_special(b, "<|im_end|>");
    ob_str(b, "\n");
}

/* ChatML; with `qwen` the Qwen2.5 default system prompt, tools block and
 * tool-call/tool-response format. */
static void fmt_chatml(const cairn_chat_template *t, const conv *c, outbuf *b, bool qwen)
{
    const msg *m = c->m;
    bool first_system = c->n > 0 && m[0].role == R_SYSTEM && !c->cont;
    const char *system = first_system ? m[0].content : t->qwen_default ? t->qwen_system : NULL;
    if (qwen && !c->cont) {
        if (c->tools && json_array_size(c->tools) > 0) {
            ob_special(b, "<|im_start|>");
            ob_str(b, "system\n");
            if (system) {
                ob_str(b, system);
                ob_str(b, "\n\n");
            }
            ob_str(b, "# Tools\n\nYou may call one or more functions to assist with the user "
                      "query.\n\nYou are provided with function signatures within <tools></tools> "
                      "XML tags:\n<tools>");
            for (size_t i = 0; i < json_array_size(c->tools); i++) {
                ob_str(b, "\n");
                chat_py_json(b, json_array_get(c->tools, i), -1, 0);
            }
            ob_str(b, "\n</tools>\n\nFor each function call, return a json object with function "
                      "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                      "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                      "</tool_call>");
            ob_special(b, "<|im_end|>");
            ob_str(b, "\n");
        } else if (system) {
            ob_special(b, "<|im_start|>");
            ob_str(b, "system\n");
            ob_str(b, system);
            ob_special(b, "<|im_end|>");
            ob_str(b, "\n");
        }
    }
    const size_t query = t->thinks ? last_query(c) : 0; /* only thinking replies read it */
    for (size_t i = 0; i < c->n; i++) {
        const msg *x = &m[i];
        if (qwen && i == 0 && first_system)
            continue; /* already in the system block */
        if (x->role == R_ASSISTANT && t->thinks) {
            thinking_assistant(b, c, i, query);
        } else if (x->role == R_ASSISTANT && x->calls) {
            ob_special(b, "<|im_start|>");
            ob_str(b, "assistant");
            if (x->has_content) {
                ob_str(b, "\n");
                ob_str(b, x->content);
            }
            for (size_t k = 0; k < json_array_size(x->calls); k++)
                qwen_tool_call(b, json_array_get(x->calls, k), true);
            ob_special(b, "<|im_end|>");
            ob_str(b, "\n");
        } else if (x->role == R_TOOL && qwen) {
            if (i == 0 || m[i - 1].role != R_TOOL) {
                ob_special(b, "<|im_start|>");
                ob_str(b, "user");
            }
            ob_str(b, "\n<tool_response>\n");
            ob_str(b, x->content);
            ob_str(b, "\n</tool_response>");
            if (i + 1 == c->n || m[i + 1].role != R_TOOL) {
                ob_special(b, "<|im_end|>");
                ob_str(b, "\n");
            }
        } else {
            ob_special(b, "<|im_start|>");
            ob_str(b, chat_role_name(x->role));
            ob_str(b, "\n");
            ob_str(b, x->content);
            ob_special(b, "<|im_end|>");
            ob_str(b, "\n");
        }
    }
    if (c->gen_prompt) {
        ob_special(b, "<|im_start|>");
        ob_str(b, "assistant\n");
        if (t->thinks && c->no_thinking) { /* enable_thinking=false: an empty reasoning */
            ob_special(b, "<think>");
            ob_str(b, "\n\n");
            ob_special(b, "</think>");
            ob_str(b, "\n\n");
        }
    }
}

static void llama3_header(outbuf *b, const char *role)
{
    ob_special(b, "<|start_header_id|>");
    ob_str(b, role);
    ob_special(b, "<|end_header_id|>");
    ob_str(b, "\n\n");
}

static const char llama3_tool_instructions[] =
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name "
    "and its value}.Do not use variables.\n\n";

/* Llama 3 (plain turns) and Llama 3.1+ (dated system header, custom tools in
 * the first user message, one JSON tool call per assistant turn, tool results
 * as "ipython" turns). */
static int fmt_llama3(const cairn_chat_template *t, const conv *c, outbuf *b)
{
    const msg *m = c->m;
    size_t i = 0;
    if (!c->cont)
        ob_special(b, t->bos_text);
    bool tools = t->llama31 && c->tools != NULL;
    if (t->llama31 && !c->cont) {
        const char *system = "";
        if (c->n > 0 && m[0].role == R_SYSTEM)
            system = m[i++].content;
        llama3_header(b, "system");
        if (tools)
            ob_str(b, "Environment: ipython\n");
        ob_str(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
        ob_str(b, t->date);
        ob_str(b, "\n\n");
        ob_trimmed(b, system);
        ob_special(b, "<|eot_id|>");
        if (tools) {
            if (i >= c->n) {
                cairn_log(CAIRN_LOG_WARN, "chat: Llama 3.1 puts tools in the first user message, "
                                          "and there is none");
                return CAIRN_EINVAL;
            }
            llama3_header(b, "user");
            ob_str(b, "Given the following functions, please respond with a JSON for a function "
                      "call with its proper arguments that best answers the given prompt.\n\n");
            ob_str(b, llama3_tool_instructions);
            for (size_t k = 0; k < json_array_size(c->tools); k++) {
                chat_py_json(b, json_array_get(c->tools, k), 4, 0);
                ob_str(b, "\n\n");
            }
            ob_trimmed(b, m[i++].content);
            ob_special(b, "<|eot_id|>");
        }
    }
    for (; i < c->n; i++) {
        const msg *x = &m[i];
        if (t->llama31 && x->role == R_ASSISTANT && x->calls) {
            if (json_array_size(x->calls) != 1) {
                cairn_log(CAIRN_LOG_WARN, "chat: Llama 3.1 takes one tool call per turn");
                return CAIRN_EINVAL;
            }
            const json_t *call = json_array_get(x->calls, 0);
            const json_t *name = json_object_get(call, "name");
            llama3_header(b, "assistant");
            ob_str(b, "{\"name\": \"");
            ob_add(b, json_string_value(name), json_string_length(name));
            ob_str(b, "\", \"parameters\": ");
            chat_py_json(b, json_object_get(call, "arguments"), -1, 0);
            ob_str(b, "}");
            ob_special(b, "<|eot_id|>");
        } else if (t->llama31 && x->role == R_TOOL) {
            /* The template tests `content is iterable`, which a string is:
             * tool results are rendered as JSON strings. */
            llama3_header(b, "ipython");
            chat_py_json_string(b, x->content, strlen(x->content));
            ob_special(b, "<|eot_id|>");
        } else {
            llama3_header(b, chat_role_name(x->role));
            ob_trimmed(b, x->content);
            ob_special(b, "<|eot_id|>");
        }
    }
    if (c->gen_prompt)
        llama3_header(b, "assistant");
    return CAIRN_OK;
}

/* Llama 2 ([INST] with a <<SYS>> block in the first user turn, BOS before
 * every user turn) and Mistral ([INST] only, system text prepended to the
 * first user message). */
static void fmt_llama2(const cairn_chat_template *t, const conv *c, outbuf *b)
{
    const msg *m = c->m;
    size_t i = 0;
    const char *system = NULL;
    if (c->n > 0 && m[0].role == R_SYSTEM)
        system = m[i++].content;
    if (!t->llama2_sys && !c->cont) /* Llama 2 writes BOS before every user turn */
        ob_special(b, t->bos_text);
    bool first = true;
    for (; i < c->n; i++, first = false) {
        const msg *x = &m[i];
        if (x->role == R_USER || x->role == R_TOOL || x->role == R_SYSTEM) {
            if (t->llama2_sys) {
                ob_special(b, t->bos_text);
                ob_special(b, "[INST]");
                ob_str(b, " ");
                outbuf content = {0};
                if (first && system) {
                    ob_str(&content, "<<SYS>>\n");
                    ob_str(&content, system);
                    ob_str(&content, "\n<</SYS>>\n\n");
                }
                ob_str(&content, x->content);
                if (content.text.oom)
                    b->text.oom = true;
                ob_trimmed(b, content.text.data ? content.text.data : "");
                ob_free(&content);
                ob_str(b, " ");
                ob_special(b, "[/INST]");
            } else if (t->mistral_tight) {
                ob_special(b, "[INST]");
                if (system && i + 1 == c->n) {
                    ob_str(b, system);
                    ob_str(b, "\n\n");
                }
                ob_str(b, x->content);
                ob_special(b, "[/INST]");
            } else {
                ob_special(b, "[INST]");
                ob_str(b, " ");
                if (first && system && *system) {
                    ob_str(b, system);
                    ob_str(b, "\n\n");
                }
                ob_str(b, x->content);
                ob_str(b, " ");
                ob_special(b, "[/INST]");
            }
        } else { /* assistant */
            if (!t->mistral_tight)
                ob_str(b, " ");
            if (t->llama2_sys)
                ob_trimmed(b, x->content);
            else
                ob_str(b, x->content);
            if (t->llama2_sys)
                ob_str(b, " ");
            ob_special(b, t->eos_text);
        }
    }
}

/* Gemma: user/model turns; no system role (its text opens the first user
 * turn); contents trimmed. */
static void fmt_gemma(const cairn_chat_template *t, const conv *c, outbuf *b)
{
    const msg *m = c->m;
    size_t i = 0;
    const char *prefix = NULL;
    if (c->n > 0 && m[0].role == R_SYSTEM)
        prefix = m[i++].content;
    if (!c->cont)
        ob_special(b, t->bos_text);
    bool first = true;
    for (; i < c->n; i++, first = false) {
        const msg *x = &m[i];
        ob_special(b, "<start_of_turn>");
        ob_str(b, x->role == R_ASSISTANT ? "model" : chat_role_name(x->role));
        ob_str(b, "\n");
        if (first && prefix) {
            ob_str(b, prefix);
            ob_str(b, "\n\n");
        }
        ob_trimmed(b, x->content);
        ob_special(b, "<end_of_turn>");
        ob_str(b, "\n");
    }
    if (c->gen_prompt) {
        ob_special(b, "<start_of_turn>");
        ob_str(b, "model\n");
    }
}

/* Phi-3: <|system|>/<|user|>/<|assistant|> turns closed by <|end|>; an empty
 * system message is left out; other roles are not rendered. */
static void fmt_phi3(const cairn_chat_template *t, const conv *c, outbuf *b)
{
    for (size_t i = 0; i < c->n; i++) {
        const msg *x = &c->m[i];
        const char *marker = x->role == R_SYSTEM ? (x->has_content ? "<|system|>" : NULL)
                             : x->role == R_USER      ? "<|user|>"
                             : x->role == R_ASSISTANT ? "<|assistant|>"
                                                      : NULL;
        if (!marker)
            continue;
        ob_special(b, marker);
        ob_str(b, "\n");
        ob_str(b, x->content);
        ob_special(b, "<|end|>");
        ob_str(b, "\n");
    }
    if (c->gen_prompt) {
        ob_special(b, "<|assistant|>");
        ob_str(b, "\n");
    } else if (t->phi3_eos && !c->cont) {
        ob_special(b, t->eos_text);
    }
}

/* ---- harmony (gpt-oss) ------------------------------------------------------ */
/*
 * OpenAI's harmony format: messages "<|start|>ROLE<|message|>TEXT<|end|>",
 * assistant messages in a channel (final for replies, analysis for
 * reasoning, commentary for tool calls). The template renders the tools as
 * TypeScript declarations through two macros whose output is reproduced
 * below with the template's own whitespace quirks (a variable tag after a
 * line break keeps the indentation before it: "a: \n                string"
 * in nested objects). Python semantics the template relies on are mirrored
 * where they show: Jinja truthiness, str() of values joined into the text,
 * a `set` inside a loop not leaving it (so oneOf's object check never
 * fires). Where the template fails outright (a tool without a description,
 * a default added to a string that is not one) cairn renders instead: the
 * description as "", the value as Python's str() would.
 */

/* Jinja truthiness of a JSON value; NULL is undefined (false). */
static bool jtruthy(const json_t *j)
{
    switch (j ? json_typeof(j) : JSON_NULL) {
    case JSON_OBJECT: return json_object_size(j) > 0;
    case JSON_ARRAY: return json_array_size(j) > 0;
    case JSON_STRING: return json_string_length(j) > 0;
    case JSON_INTEGER: return json_integer_value(j) != 0;
    case JSON_REAL: return json_real_value(j) != 0.0;
    case JSON_TRUE: return true;
    default: return false;
    }
}

/* `x.key` in the template: a member of an object, else undefined (NULL). */
static const json_t *jget(const json_t *x, const char *key)
{
    return json_is_object(x) ? json_object_get(x, key) : NULL;
}

static bool jis(const json_t *x, const char *s)
{
    return json_is_string(x) && strcmp(json_string_value(x), s) == 0;
}

/* Python's str() of a value written into the text: strings as they are,
 * True/False/None, numbers as repr. (Containers come out as JSON, where
 * Python would write its repr: no schema in practice puts them there.) */
static void py_str(outbuf *b, const json_t *j)
{
    if (json_is_string(j))
        ob_add(b, json_string_value(j), json_string_length(j));
    else if (json_is_true(j))
        ob_str(b, "True");
    else if (json_is_false(j))
        ob_str(b, "False");
    else if (!j || json_is_null(j))
        ob_str(b, "None");
    else
        chat_py_json(b, j, -1, 0);
}

/* The items a Jinja loop or join walks over a value: an array's elements,
 * an object's keys, a string's characters (as JSON strings, new refs). */
static json_t *jiter(const json_t *x)
{
    if (json_is_array(x))
        return json_incref((json_t *)x);
    json_t *out = json_array();
    if (json_is_object(x)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)x, k, v)
        {
            json_array_append_new(out, json_string(k));
        }
    } else if (json_is_string(x)) {
        const char *s = json_string_value(x);
        size_t n = json_string_length(x);
        for (size_t i = 0; i < n;) {
            unsigned char c = (unsigned char)s[i];
            size_t cl = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            if (i + cl > n)
                cl = n - i;
            json_array_append_new(out, json_stringn(s + i, cl));
            i += cl;
        }
    }
    return out;
}

/* `items|join(sep)` */
static void jjoin(outbuf *b, const json_t *x, const char *sep)
{
    json_t *items = jiter(x);
    for (size_t i = 0; i < json_array_size(items); i++) {
        if (i)
            ob_str(b, sep);
        py_str(b, json_array_get(items, i));
    }
    json_decref(items);
}

/* `name in (required or [])`: a list's element, an object's key, or a
 * string's substring, as Python's `in`. */
static bool jrequired(const json_t *required, const char *name)
{
    if (json_is_array(required)) {
        size_t i;
        const json_t *r;
        json_array_foreach(required, i, r)
        {
            if (jis(r, name))
                return true;
        }
        return false;
    }
    if (json_is_object(required))
        return json_object_get(required, name) != NULL;
    if (json_is_string(required))
        return strstr(json_string_value(required), name) != NULL;
    return false;
}

/* Characters (code points) in s[0..n): Jinja's `length` of a string. */
static size_t utf8_chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* The template's render_typescript_type(spec). */
static void ts_type(outbuf *b, const json_t *spec)
{
    const json_t *type = jget(spec, "type");
    if (jis(type, "array")) {
        const json_t *items = jget(spec, "items");
        if (jtruthy(items)) {
            const json_t *it = jget(items, "type");
            if (jis(it, "string")) {
                ob_str(b, "string[]");
            } else if (jis(it, "number") || jis(it, "integer")) {
                ob_str(b, "number[]");
            } else if (jis(it, "boolean")) {
                ob_str(b, "boolean[]");
            } else {
                outbuf inner = {0};
                ts_type(&inner, items);
                const char *d = inner.text.data ? inner.text.data : "";
                if (inner.text.oom)
                    b->text.oom = true;
                if (strcmp(d, "object | object") == 0 || utf8_chars(d, inner.text.len) > 50) {
                    ob_str(b, "any[]");
                } else {
                    ob_add(b, d, inner.text.len);
                    ob_str(b, "[]");
                }
                ob_free(&inner);
            }
        } else {
            ob_str(b, "any[]");
        }
        if (jtruthy(jget(spec, "nullable")))
            ob_str(b, " | null");
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        /* ["string", "null"]: a union */
        jjoin(b, type, " | ");
    } else if (jtruthy(jget(spec, "oneOf"))) {
        /* The template's "any" for unions of objects never applies: the
         * flag is set inside the loop and Jinja does not carry it out. */
        json_t *variants = jiter(jget(spec, "oneOf"));
        for (size_t i = 0; i < json_array_size(variants); i++) {
            const json_t *v = json_array_get(variants, i);
            ts_type(b, v);
            const json_t *desc = jget(v, "description");
            if (jtruthy(desc)) {
                ob_str(b, "// ");
                py_str(b, desc);
            }
            const json_t *dflt = jget(v, "default");
            if (dflt) {
                ob_str(b, "                    // default: ");
                chat_py_json(b, dflt, -1, 0);
            }
            if (i + 1 < json_array_size(variants))
                ob_str(b, " | \n");
        }
        json_decref(variants);
    } else if (jis(type, "string")) {
        const json_t *en = jget(spec, "enum");
        if (jtruthy(en)) {
            ob_str(b, "\"");
            jjoin(b, en, "\" | \"");
            ob_str(b, "\"");
        } else {
            ob_str(b, "string");
            if (jtruthy(jget(spec, "nullable")))
                ob_str(b, " | null");
        }
    } else if (jis(type, "number") || jis(type, "integer")) {
        ob_str(b, "number");
    } else if (jis(type, "boolean")) {
        ob_str(b, "boolean");
    } else if (jis(type, "object")) {
        const json_t *props = jget(spec, "properties");
        if (jtruthy(props)) {
            const json_t *required = jget(spec, "required");
            ob_str(b, "{\n");
            json_t *names = jiter(props);
            for (size_t i = 0; i < json_array_size(names); i++) {
                const char *name = json_string_value(json_array_get(names, i));
                ob_str(b, name);
                if (!jrequired(jtruthy(required) ? required : NULL, name))
                    ob_str(b, "?");
                ob_str(b, ": \n                ");
                ts_type(b, jget(props, name));
                if (i + 1 < json_array_size(names))
                    ob_str(b, ", ");
            }
            json_decref(names);
            ob_str(b, "}");
        } else {
            ob_str(b, "object");
        }
    } else {
        ob_str(b, "any");
    }
}

/* One tool of the template's render_tool_namespace. */
static void harmony_tool(outbuf *b, const json_t *tool)
{
    const json_t *fn = jget(tool, "function");
    const json_t *desc = jget(fn, "description"), *params = jget(fn, "parameters");
    ob_str(b, "// ");
    if (desc && !json_is_null(desc))
        py_str(b, desc);
    ob_str(b, "\ntype ");
    py_str(b, jget(fn, "name"));
    ob_str(b, " = ");
    const json_t *props = jget(params, "properties");
    if (!jtruthy(params) || !jtruthy(props)) {
        ob_str(b, "() => any;\n\n");
        return;
    }
    const json_t *required = jget(params, "required");
    ob_str(b, "(_: {\n");
    json_t *names = jiter(props);
    for (size_t i = 0; i < json_array_size(names); i++) {
        const char *name = json_string_value(json_array_get(names, i));
        const json_t *spec = jget(props, name);
        const json_t *pdesc = jget(spec, "description");
        if (jtruthy(pdesc)) {
            ob_str(b, "// ");
            py_str(b, pdesc);
            ob_str(b, "\n");
        }
        ob_str(b, name);
        if (!jrequired(jtruthy(required) ? required : NULL, name))
            ob_str(b, "?");
        ob_str(b, ": ");
        ts_type(b, spec);
        const json_t *dflt = jget(spec, "default");
        if (dflt) {
            if (jtruthy(jget(spec, "enum"))) {
                ob_str(b, ", // default: ");
                py_str(b, dflt);
            } else if (jtruthy(jget(spec, "oneOf"))) {
                ob_str(b, "// default: ");
                py_str(b, dflt);
            } else {
                ob_str(b, ", // default: ");
                chat_py_json(b, dflt, -1, 0);
            }
        }
        ob_str(b, ",\n");
    }
    json_decref(names);
    ob_str(b, "}) => any;\n\n");
}

/* The system message: identity, cutoff, today's date, reasoning effort and
 * the channels. The date is strftime_now("%Y-%m-%d"), which Hugging Face
 * defines as the local date at rendering time. */
static void harmony_system(outbuf *b, bool tools, const char *effort)
{
    char date[32] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm))
        strftime(date, sizeof date, "%Y-%m-%d", &tm);
    ob_special(b, "<|start|>");
    ob_str(b, "system");
    ob_special(b, "<|message|>");
    ob_str(b, "You are ChatGPT, a large language model trained by OpenAI.\n"
              "Knowledge cutoff: 2024-06\nCurrent date: ");
    ob_str(b, date);
    ob_str(b, "\n\nReasoning: ");
    ob_str(b, effort);
    ob_str(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included "
              "for every message.");
    if (tools)
        ob_str(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    ob_special(b, "<|end|>");
}

/* The developer message: the conversation's first system text as
 * instructions, and the tools. */
static void harmony_developer(outbuf *b, const char *instructions, const json_t *tools)
{
    ob_special(b, "<|start|>");
    ob_str(b, "developer");
    ob_special(b, "<|message|>");
    if (instructions) {
        ob_str(b, "# Instructions\n\n");
        ob_str(b, instructions);
        ob_str(b, "\n\n");
    }
    if (tools) {
        ob_str(b, "# Tools\n\n## functions\n\nnamespace functions {\n\n");
        for (size_t i = 0; i < json_array_size(tools); i++)
            harmony_tool(b, json_array_get(tools, i));
        ob_str(b, "} // namespace functions");
    }
    ob_special(b, "<|end|>");
}

static void harmony_assistant(outbuf *b, const char *channel, const char *text, const char *end)
{
    ob_special(b, "<|start|>");
    ob_str(b, "assistant");
    ob_special(b, "<|channel|>");
    ob_str(b, channel);
    ob_special(b, "<|message|>");
    ob_str(b, text);
    ob_special(b, end);
}

/* The template refuses channel markers in an assistant's texts (they
 * belong in the separate fields). */
static bool harmony_has_channels(const char *s)
{
    return s && (strstr(s, "<|channel|>analysis<|message|>") ||
                 strstr(s, "<|channel|>final<|message|>"));
}

/* Is a later message of m[from..n) an assistant reply without calls? Then
 * an earlier call's reasoning is dropped, as the template does. */
static bool harmony_final_follows(const msg *m, size_t from, size_t n)
{
    for (size_t k = from; k < n; k++)
        if (m[k].role == R_ASSISTANT && !m[k].calls)
            return true;
    return false;
}

/* gpt-oss: the system message, a developer message (first system text,
 * tools), then user turns, assistant replies in the final channel (the
 * last one, without a generation prompt, with its reasoning and
 * <|return|> as in training), tool calls in the commentary channel and
 * tool results from "functions.NAME" of the last call. */
static int fmt_harmony(const cairn_chat_template *t, const conv *c, outbuf *b)
{
    (void)t;
    const msg *m = c->m;
    size_t i = 0;
    const json_t *tools = jtruthy(c->tools) ? c->tools : NULL;
    if (!c->cont) {
        harmony_system(b, tools != NULL, c->effort);
        const char *instructions = NULL;
        if (c->n > 0 && m[0].role == R_SYSTEM)
            instructions = m[i++].content;
        if ((instructions && *instructions) || tools)
            harmony_developer(b, instructions && *instructions ? instructions : NULL, tools);
    }
    const json_t *last_call = NULL; /* the name tool results are from */
    for (; i < c->n; i++) {
        const msg *x = &m[i];
        if (x->role == R_USER) {
            ob_special(b, "<|start|>");
            ob_str(b, "user");
            ob_special(b, "<|message|>");
            ob_str(b, x->content);
            ob_special(b, "<|end|>");
        } else if (x->role == R_TOOL) {
            if (!last_call) {
                cairn_log(CAIRN_LOG_WARN, "chat: harmony: message %zu is a tool result, and no "
                                          "assistant message before it made a tool call", i);
                return CAIRN_EINVAL;
            }
            ob_special(b, "<|start|>");
            ob_str(b, "functions.");
            ob_add(b, json_string_value(last_call), json_string_length(last_call));
            ob_str(b, " to=assistant");
            ob_special(b, "<|channel|>");
            ob_str(b, "commentary");
            ob_special(b, "<|message|>");
            chat_py_json_string(b, x->content, strlen(x->content));
            ob_special(b, "<|end|>");
        } else if (x->role == R_SYSTEM) {
            if (c->cont && i == 0) { /* continuing: new instructions */
                harmony_developer(b, x->content, NULL);
            }
            /* later system messages: the template renders none */
        } else if (harmony_has_channels(x->content) || harmony_has_channels(x->reasoning)) {
            cairn_log(CAIRN_LOG_WARN, "chat: harmony: assistant message %zu holds channel markers; "
                                      "give the reasoning as reasoning_content and the reply "
                                      "as content", i);
            return CAIRN_EINVAL;
        } else if (x->calls) {
            bool thinking = x->reasoning && *x->reasoning;
            if (x->has_content && thinking) {
                cairn_log(CAIRN_LOG_WARN, "chat: harmony: assistant message %zu with tool calls "
                                          "has both content and reasoning_content", i);
                return CAIRN_EINVAL;
            }
            if (json_array_size(x->calls) > 1)
                cairn_log(CAIRN_LOG_WARN, "chat: harmony renders one tool call per assistant "
                                          "message; %zu more of message %zu left out",
                          json_array_size(x->calls) - 1, i);
            if ((x->has_content || thinking) && !harmony_final_follows(m, i + 1, c->n))
                harmony_assistant(b, "analysis", x->has_content ? x->content : x->reasoning,
                                  "<|end|>");
            const json_t *call = json_array_get(x->calls, 0);
            last_call = json_object_get(call, "name");
            ob_special(b, "<|start|>");
            ob_str(b, "assistant to=functions.");
            ob_add(b, json_string_value(last_call), json_string_length(last_call));
            ob_special(b, "<|channel|>");
            ob_str(b, "commentary json");
            ob_special(b, "<|message|>");
            chat_py_json(b, json_object_get(call, "arguments"), -1, 0);
            ob_special(b, "<|call|>");
        } else if (i + 1 == c->n && !c->gen_prompt) {
            /* the training form: reasoning kept, <|return|> ends the reply */
            if (x->reasoning)
                harmony_assistant(b, "analysis", x->reasoning, "<|end|>");
            harmony_assistant(b, "final", x->content, "<|return|>");
        } else {
            harmony_assistant(b, "final", x->content, "<|end|>");
            last_call = NULL;
        }
    }
    if (c->gen_prompt) {
        ob_special(b, "<|start|>");
        ob_str(b, "assistant");
    }
    return CAIRN_OK;
}

/* The reasoning effort CAIRN_CHAT_REASONING_* flags ask for. */
static const char *effort_of(int flags)
{
    /* a model that always reasons (harmony) reasons least when asked not to */
    return (flags & CAIRN_CHAT_REASONING_HIGH)                                   ? "high"
           : (flags & (CAIRN_CHAT_REASONING_LOW | CAIRN_CHAT_NO_THINKING)) ? "low"
                                                                           : "medium";
}

/* Render into b. Leading BOS text is written when the template writes it.
 * flags: CAIRN_CHAT_REASONING_*. */
static int render_all(const cairn_chat_template *t, const cairn_chat_message *msgs, size_t n_msgs,
                  const char *tools_json, bool gen_prompt, bool cont, int flags, outbuf *b)
{
    if (!t || (!msgs && n_msgs))
        return CAIRN_EINVAL;
    msg *m = NULL;
    int rc = chat_prepare(msgs, n_msgs, &m);
    if (rc)
        return rc;
    conv c = {.m = m, .n = n_msgs, .gen_prompt = gen_prompt, .cont = cont,
              .effort = effort_of(flags), .no_thinking = (flags & CAIRN_CHAT_NO_THINKING) != 0};
    if (tools_json) {
        json_error_t jerr;
        c.tools = json_loads(tools_json, JSON_DECODE_ANY, &jerr);
        if (!json_is_array(c.tools)) {
            cairn_log(CAIRN_LOG_WARN, "chat: tools is not a JSON array");
            json_decref(c.tools);
            chat_free_msgs(m, n_msgs);
            return CAIRN_EINVAL;
        }
        if (json_array_size(c.tools) > 0 && t->family != CAIRN_CHAT_QWEN2 &&
            t->family != CAIRN_CHAT_HARMONY && !(t->family == CAIRN_CHAT_LLAMA3 && t->llama31))
            cairn_log(CAIRN_LOG_WARN, "chat: the %s template has no tool format; tools ignored",
                      cairn_chat_family_name(t->family));
    }
    switch (t->family) {
    case CAIRN_CHAT_GENERIC: fmt_generic(t, &c, b); break;
    case CAIRN_CHAT_CHATML: fmt_chatml(t, &c, b, false); break;
    case CAIRN_CHAT_QWEN2: fmt_chatml(t, &c, b, true); break;
    case CAIRN_CHAT_LLAMA3: rc = fmt_llama3(t, &c, b); break;
    case CAIRN_CHAT_LLAMA2: fmt_llama2(t, &c, b); break;
    case CAIRN_CHAT_GEMMA: fmt_gemma(t, &c, b); break;
    case CAIRN_CHAT_PHI3: fmt_phi3(t, &c, b); break;
    case CAIRN_CHAT_HARMONY: rc = fmt_harmony(t, &c, b); break;
    }
    json_decref(c.tools);
    chat_free_msgs(m, n_msgs);
    if (rc == CAIRN_OK && b->text.oom)
        rc = CAIRN_ENOMEM;
    return rc;
}

/* A sentinel no message holds (control bytes around a name): where the
 * final message's content goes when it is to be continued. */
static const char continue_mark[] = "\x1f\x1e" "cairn:continue" "\x1e\x1f";

/* The conversation; with `continue_final`, one whose last message is an
 * assistant reply to continue (a prefill): the text ends with that reply's
 * content — no end of turn, no new turn — whatever the family writes after
 * a reply. It is rendered with the sentinel in the content's place, cut at
 * the sentinel, and the content appended as message text. */
static int render(const cairn_chat_template *t, const cairn_chat_message *msgs, size_t n_msgs,
                  const char *tools_json, bool gen_prompt, bool cont, bool continue_final,
                  int flags, outbuf *b)
{
    if (!continue_final)
        return render_all(t, msgs, n_msgs, tools_json, gen_prompt, cont, flags, b);
    if (!n_msgs || !msgs || !msgs[n_msgs - 1].role ||
        strcmp(msgs[n_msgs - 1].role, "assistant") != 0 || msgs[n_msgs - 1].tool_calls_json)
        return CAIRN_EINVAL; /* only a plain assistant reply can be continued */
    cairn_chat_message *m = malloc(n_msgs * sizeof *m);
    if (!m)
        return CAIRN_ENOMEM;
    memcpy(m, msgs, n_msgs * sizeof *m);
    const char *content = m[n_msgs - 1].content ? m[n_msgs - 1].content : "";
    m[n_msgs - 1].content = continue_mark;
    int rc = render_all(t, m, n_msgs, tools_json, false, cont, flags, b);
    free(m);
    if (rc)
        return rc;
    const char *at = NULL;
    for (const char *p = b->text.data; p && (p = strstr(p, continue_mark)); p++)
        at = p; /* the last one: the final message's */
    if (!at)
        return CAIRN_EINVAL; /* the template dropped the reply */
    size_t cut = (size_t)(at - b->text.data);
    b->text.len = cut;
    b->text.data[cut] = '\0';
    while (b->n_specials && b->specials[b->n_specials - 1].off >= cut)
        b->n_specials--;
    ob_add(b, content, strlen(content));
    return b->text.oom ? CAIRN_ENOMEM : CAIRN_OK;
}

/* The BOS the template wrote at the very start, if any: its length. */
static size_t leading_bos(const cairn_chat_template *t, const outbuf *b)
{
    size_t n = strlen(t->bos_text);
    if (n && b->n_specials > 0 && b->specials[0].off == 0 && b->specials[0].len == n &&
        memcmp(b->text.data, t->bos_text, n) == 0)
        return n;
    return 0;
}

int cairn_chat_format(const cairn_chat_template *t, const cairn_chat_message *msgs,
                      size_t n_msgs, const char *tools_json, bool add_generation_prompt,
                      char **out, size_t *out_len)
{
    return cairn_chat_format_flags(t, msgs, n_msgs, tools_json,
                                   add_generation_prompt ? CAIRN_CHAT_GENERATION_PROMPT : 0, out,
                                   out_len);
}

int cairn_chat_format_flags(const cairn_chat_template *t, const cairn_chat_message *msgs,
                            size_t n_msgs, const char *tools_json, int flags, char **out,
                            size_t *out_len)
{
    if (!out)
        return CAIRN_EINVAL;
    outbuf b = {0};
    const bool cont_final = (flags & CAIRN_CHAT_CONTINUE_FINAL) != 0;
    int rc = render(t, msgs, n_msgs, tools_json,
                    !cont_final && (flags & CAIRN_CHAT_GENERATION_PROMPT), false, cont_final,
                    flags, &b);
    if (rc) {
        ob_free(&b);
        return rc;
    }
    size_t skip = leading_bos(t, &b);
    size_t n = b.text.len - skip;
    char *s = malloc(n + 1);
    if (!s) {
        ob_free(&b);
        return CAIRN_ENOMEM;
    }
    if (n)
        memcpy(s, b.text.data + skip, n);
    s[n] = '\0';
    ob_free(&b);
    *out = s;
    if (out_len)
        *out_len = n;
    return CAIRN_OK;
}

/* ---- tokenization ---------------------------------------------------------- */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} idvec;

static int tok_append(const cairn_vocab *v, idvec *out, const char *s, size_t len, int flags)
{
    if (len == 0)
        return CAIRN_OK;
    for (;;) {
        size_t n = 0;
        int rc = cairn_tokenize(v, s, len, flags, out->ids + out->n, out->cap - out->n, &n);
        if (rc == CAIRN_OK) {
            out->n += n;
            return CAIRN_OK;
        }
        if (rc != CAIRN_ERANGE)
            return rc;
        size_t cap = out->cap * 2 > out->n + n ? out->cap * 2 : out->n + n + 16;
        int32_t *d = realloc(out->ids, cap * sizeof *d);
        if (!d)
            return CAIRN_ENOMEM;
        out->ids = d;
        out->cap = cap;
    }
}

int cairn_chat_tokenize(const cairn_chat_template *t, const cairn_vocab *v,
                        const cairn_chat_message *msgs, size_t n_msgs, const char *tools_json,
                        int flags, int32_t **tokens, size_t *n_tokens)
{
    if (!t || !v || !tokens || !n_tokens)
        return CAIRN_EINVAL;
    bool cont = flags & CAIRN_CHAT_CONTINUE;
    outbuf b = {0};
    int rc = render(t, msgs, n_msgs, tools_json, flags & CAIRN_CHAT_GENERATION_PROMPT, cont,
                    flags & CAIRN_CHAT_CONTINUE_FINAL, flags, &b);
    idvec out = {0};
    if (rc == CAIRN_OK) {
        out.cap = b.text.len + 8;
        out.ids = malloc(out.cap * sizeof *out.ids);
        if (!out.ids)
            rc = CAIRN_ENOMEM;
    }
    if (rc == CAIRN_OK) {
        size_t pos = leading_bos(t, &b);
        size_t first = pos ? 1 : 0;
        int32_t bos = cairn_vocab_bos(v);
        if ((pos || (flags & CAIRN_CHAT_ADD_BOS)) && bos >= 0)
            out.ids[out.n++] = bos;
        /* Between the markers the formatter wrote, text (template text and
         * message contents alike) is tokenized plainly, so a message can never
         * produce a control token; each marker is tokenized with special
         * parsing. Splitting at special tokens is also what the reference
         * tokenizers do first, so the ids match tokenizing the whole text
         * with special parsing whenever the contents hold no marker text.
         * A marker this vocabulary has no special token for (Llama 2's
         * [INST] is plain text, Mistral's a control token) stays part of
         * the text around it, as whole-text tokenization would leave it. */
        for (size_t k = first; rc == CAIRN_OK && k <= b.n_specials; k++) {
            if (k < b.n_specials &&
                !tok_is_special_text(v, b.text.data + b.specials[k].off, b.specials[k].len))
                continue;
            size_t end = k < b.n_specials ? b.specials[k].off : b.text.len;
            rc = tok_append(v, &out, b.text.data + pos, end - pos, 0);
            if (rc == CAIRN_OK && k < b.n_specials) {
                rc = tok_append(v, &out, b.text.data + end, b.specials[k].len, CAIRN_TOK_PARSE_SPECIAL);
                pos = end + b.specials[k].len;
            }
        }
    }
    ob_free(&b);
    if (rc) {
        free(out.ids);
        return rc;
    }
    *tokens = out.ids;
    *n_tokens = out.n;
    return CAIRN_OK;
}

const char *cairn_chat_turn_end(const cairn_chat_template *t)
{
    switch (cairn_chat_template_family(t)) {
    case CAIRN_CHAT_CHATML:
    case CAIRN_CHAT_QWEN2: return "<|im_end|>\n";
    case CAIRN_CHAT_LLAMA3: return "<|eot_id|>";
    case CAIRN_CHAT_GEMMA: return "<end_of_turn>\n";
    case CAIRN_CHAT_PHI3: return "<|end|>\n";
    case CAIRN_CHAT_HARMONY: return "<|end|>"; /* after a reply (its <|return|> is not kept) */
    case CAIRN_CHAT_LLAMA2: return t->eos_text;
    case CAIRN_CHAT_GENERIC: return "\n";
    }
    return "";
}
