/*
 * engine/chat.c — chat templates without a Jinja interpreter.
 *
 * A GGUF's `tokenizer.chat_template` is a Jinja2 program. Rather than
 * interpreting it, cairn recognises which family the template belongs to by
 * markers in its source and formats conversations with a hand-written
 * formatter per family. Each formatter reproduces, byte for byte, what the
 * Hugging Face rendering (jinja2 with trim_blocks and lstrip_blocks, and a
 * `tojson` that is Python's json.dumps with ensure_ascii=False) produces for
 * that family's reference template; tests/chat/ checks this against jinja2.
 *
 * The formatter writes into a buffer that also records where it wrote a
 * special marker (<|im_start|>, <|eot_id|>, BOS, ...). cairn_chat_tokenize
 * uses those spans so that text inside messages can never become a control
 * token: only the markers the formatter itself wrote are parsed as special.
 */
#include "text/text.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
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

static void ob_add(outbuf *b, const char *s, size_t n) { cairn_strbuf_add(&b->text, s, n); }

static void ob_str(outbuf *b, const char *s)
{
    if (s)
        ob_add(b, s, strlen(s));
}

/* A marker the template writes itself (turn delimiters, BOS/EOS): tokenized
 * as a special token when the vocabulary has one with this text. */
static void ob_special(outbuf *b, const char *s)
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

static void ob_free(outbuf *b)
{
    free(b->text.data);
    free(b->specials);
    memset(b, 0, sizeof *b);
}

/* ---- Python-compatible JSON serialisation ------------------------------- */
/*
 * HF renders `tojson` as json.dumps(x, ensure_ascii=False, indent=indent,
 * separators=None, sort_keys=False): ", " and ": " without indent, "," and
 * ": " with it; keys in their given order; non-ASCII kept; floats as
 * Python's repr (the shortest text that reads back to the same double).
 */

static void py_json_string(outbuf *b, const char *s, size_t n)
{
    ob_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char hex[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(hex, sizeof hex, "\\u%04x", c);
                esc = hex;
            }
        }
        if (esc) {
            ob_add(b, s + run, i - run);
            ob_str(b, esc);
            run = i + 1;
        }
    }
    ob_add(b, s + run, n - run);
    ob_add(b, "\"", 1);
}

/* Python's float repr: shortest round-tripping digits; positional notation
 * for decimal exponents -4..15 (with ".0" when integral), else d.ddde+XX. */
static void py_float(outbuf *b, double v)
{
    if (isnan(v)) {
        ob_str(b, "NaN");
        return;
    }
    if (isinf(v)) {
        ob_str(b, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char sci[40];
    for (int prec = 0; prec < 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec, v);
        if (strtod(sci, NULL) == v)
            break;
    }
    /* sci = [-]d[.ddd]e[+-]XX */
    const char *p = sci;
    bool neg = *p == '-';
    if (neg)
        p++;
    char digits[24];
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.' && nd < sizeof digits - 1)
            digits[nd++] = *p;
    digits[nd] = '\0';
    int exp = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0')
        digits[--nd] = '\0';
    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp >= 0) {
            for (int i = 0; i <= exp; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t i = (size_t)exp + 1; i < nd; i++)
                    out[o++] = digits[i];
            else
                out[o++] = '0';
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++)
                out[o++] = '0';
            for (size_t i = 0; i < nd; i++)
                out[o++] = digits[i];
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    ob_str(b, out);
}

static void py_newline_indent(outbuf *b, int indent, int level)
{
    ob_add(b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        ob_add(b, " ", 1);
}

/* indent < 0: no indentation (", " separators). */
static void py_json(outbuf *b, const json_t *j, int indent, int level)
{
    char num[32];
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        if (json_object_size(j) == 0) {
            ob_str(b, "{}");
            return;
        }
        ob_add(b, "{", 1);
        const char *key;
        json_t *val;
        bool first = true;
        void *it = json_object_iter((json_t *)j);
        for (; it; it = json_object_iter_next((json_t *)j, it)) {
            key = json_object_iter_key(it);
            val = json_object_iter_value(it);
            if (!first)
                ob_str(b, indent >= 0 ? "," : ", ");
            first = false;
            if (indent >= 0)
                py_newline_indent(b, indent, level + 1);
            py_json_string(b, key, strlen(key));
            ob_str(b, ": ");
            py_json(b, val, indent, level + 1);
        }
        if (indent >= 0)
            py_newline_indent(b, indent, level);
        ob_add(b, "}", 1);
        return;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if (n == 0) {
            ob_str(b, "[]");
            return;
        }
        ob_add(b, "[", 1);
        for (size_t i = 0; i < n; i++) {
            if (i)
                ob_str(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                py_newline_indent(b, indent, level + 1);
            py_json(b, json_array_get(j, i), indent, level + 1);
        }
        if (indent >= 0)
            py_newline_indent(b, indent, level);
        ob_add(b, "]", 1);
        return;
    }
    case JSON_STRING:
        py_json_string(b, json_string_value(j), json_string_length(j));
        return;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
        ob_str(b, num);
        return;
    case JSON_REAL:
        py_float(b, json_real_value(j));
        return;
    case JSON_TRUE: ob_str(b, "true"); return;
    case JSON_FALSE: ob_str(b, "false"); return;
    case JSON_NULL: ob_str(b, "null"); return;
    }
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
};

const char *cairn_chat_family_name(cairn_chat_family f)
{
    switch (f) {
    case CAIRN_CHAT_GENERIC: return "generic";
    case CAIRN_CHAT_CHATML: return "chatml";
    case CAIRN_CHAT_QWEN2: return "qwen2";
    case CAIRN_CHAT_LLAMA3: return "llama3";
    case CAIRN_CHAT_LLAMA2: return "llama2";
    case CAIRN_CHAT_GEMMA: return "gemma";
    case CAIRN_CHAT_PHI3: return "phi3";
    }
    return "unknown";
}

cairn_chat_family cairn_chat_template_family(const cairn_chat_template *t)
{
    return t ? t->family : CAIRN_CHAT_GENERIC;
}

void cairn_chat_template_free(cairn_chat_template *t)
{
    if (!t)
        return;
    free(t->bos_text);
    free(t->eos_text);
    free(t);
}

static char *dup_or_empty(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    char *d = malloc(n + 1);
    if (d) {
        if (n)
            memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static cairn_chat_family detect_family(const char *src)
{
    if (!src || !*src)
        return CAIRN_CHAT_GENERIC;
    if (strstr(src, "<|im_start|>"))
        return strstr(src, "<tool_call>") ? CAIRN_CHAT_QWEN2 : CAIRN_CHAT_CHATML;
    if (strstr(src, "<|start_header_id|>"))
        return CAIRN_CHAT_LLAMA3;
    if (strstr(src, "<start_of_turn>"))
        return CAIRN_CHAT_GEMMA;
    if (strstr(src, "<|assistant|>") && strstr(src, "<|end|>"))
        return CAIRN_CHAT_PHI3;
    if (strstr(src, "[INST]"))
        return CAIRN_CHAT_LLAMA2;
    return CAIRN_CHAT_GENERIC;
}

int cairn_chat_template_from_string(const char *src, const cairn_vocab *v,
                                    cairn_chat_template **out)
{
    if (!out)
        return CAIRN_EINVAL;
    cairn_chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return CAIRN_ENOMEM;
    t->family = detect_family(src);
    if (src && *src && t->family == CAIRN_CHAT_GENERIC)
        cairn_log(CAIRN_LOG_WARN, "chat template: unrecognised template family; using the "
                                  "generic <|role|> format");
    const char *bos = NULL, *eos = NULL;
    if (v) {
        if (cairn_vocab_bos(v) >= 0)
            bos = cairn_vocab_token_text(v, cairn_vocab_bos(v));
        if (cairn_vocab_eos(v) >= 0)
            eos = cairn_vocab_token_text(v, cairn_vocab_eos(v));
    } else {
        /* No vocabulary: the family's customary texts. */
        switch (t->family) {
        case CAIRN_CHAT_LLAMA3: bos = "<|begin_of_text|>"; eos = "<|eot_id|>"; break;
        case CAIRN_CHAT_LLAMA2: bos = "<s>"; eos = "</s>"; break;
        case CAIRN_CHAT_GEMMA: bos = "<bos>"; eos = "<eos>"; break;
        case CAIRN_CHAT_PHI3: bos = "<s>"; eos = "<|endoftext|>"; break;
        default: eos = "<|endoftext|>"; break;
        }
    }
    t->bos_text = dup_or_empty(bos);
    t->eos_text = dup_or_empty(eos);
    if (!t->bos_text || !t->eos_text) {
        cairn_chat_template_free(t);
        return CAIRN_ENOMEM;
    }
    if (t->family == CAIRN_CHAT_LLAMA3 && strstr(src, "Cutting Knowledge Date")) {
        t->llama31 = true;
        snprintf(t->date, sizeof t->date, "26 Jul 2024");
        /* The template's own default: {%- set date_string = "..." %} */
        const char *d = strstr(src, "set date_string = \"");
        if (d) {
            d += strlen("set date_string = \"");
            const char *e = strchr(d, '"');
            if (e && (size_t)(e - d) < sizeof t->date)
                snprintf(t->date, sizeof t->date, "%.*s", (int)(e - d), d);
        }
    }
    t->llama2_sys = t->family == CAIRN_CHAT_LLAMA2 && strstr(src, "<<SYS>>");
    t->mistral_tight = t->family == CAIRN_CHAT_LLAMA2 && !t->llama2_sys &&
                       (strstr(src, "[INST]\"") || strstr(src, "[INST]'"));
    t->phi3_eos = t->family == CAIRN_CHAT_PHI3 && strstr(src, "eos_token");
    t->qwen_default = t->family == CAIRN_CHAT_QWEN2 && strstr(src, "You are Qwen, created by");
    *out = t;
    return CAIRN_OK;
}

int cairn_chat_template_from_gguf(const cairn_gguf *g, const cairn_vocab *v,
                                  cairn_chat_template **out)
{
    if (!g || !out)
        return CAIRN_EINVAL;
    const char *src = NULL;
    size_t len = 0;
    int rc = cairn_gguf_get_str(g, "tokenizer.chat_template", &src, &len);
    if (rc == CAIRN_ENOTFOUND) {
        cairn_log(CAIRN_LOG_WARN, "chat template: the model has no tokenizer.chat_template; "
                                  "using the generic <|role|> format");
        src = NULL;
    } else if (rc != CAIRN_OK) {
        return rc;
    }
    return cairn_chat_template_from_string(src, v, out);
}

/* ---- conversation preparation ------------------------------------------- */

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT, R_TOOL } role_id;

typedef struct {
    role_id role;
    const char *content; /* never NULL ("" for none) */
    bool has_content;    /* given and non-empty (Jinja truthiness)          */
    json_t *calls;       /* assistant: array of {name, arguments(json)}     */
} msg;

static const char *role_name(role_id r)
{
    static const char *const names[] = {"system", "user", "assistant", "tool"};
    return names[r];
}

/* One OpenAI tool call to {name, arguments}: arguments given as a JSON
 * string are parsed (templates render them as objects); a string that is not
 * JSON stays a string. */
static int normalise_calls(const char *calls_json, json_t **out)
{
    json_error_t jerr;
    json_t *in = json_loads(calls_json, JSON_DECODE_ANY, &jerr);
    if (!in || !json_is_array(in)) {
        json_decref(in);
        cairn_log(CAIRN_LOG_WARN, "chat: tool_calls is not a JSON array");
        return CAIRN_EINVAL;
    }
    json_t *calls = json_array();
    if (!calls) {
        json_decref(in);
        return CAIRN_ENOMEM;
    }
    size_t i;
    json_t *c;
    json_array_foreach(in, i, c) {
        json_t *fn = json_object_get(c, "function");
        if (!json_is_object(fn))
            fn = c; /* already {name, arguments} */
        json_t *name = json_object_get(fn, "name");
        json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(name)) {
            json_decref(in);
            json_decref(calls);
            cairn_log(CAIRN_LOG_WARN, "chat: tool call %zu has no function name", i);
            return CAIRN_EINVAL;
        }
        json_t *parsed = NULL;
        if (json_is_string(args))
            parsed = json_loadb(json_string_value(args), json_string_length(args),
                                JSON_DECODE_ANY, &jerr);
        if (!parsed)
            parsed = args ? json_incref(args) : json_object();
        json_t *one = json_object();
        if (!one || json_object_set_new(one, "name", json_incref(name)) ||
            json_object_set_new(one, "arguments", parsed) || json_array_append_new(calls, one)) {
            json_decref(in);
            json_decref(calls);
            return CAIRN_ENOMEM;
        }
    }
    json_decref(in);
    *out = calls;
    return CAIRN_OK;
}

static void free_msgs(msg *m, size_t n)
{
    for (size_t i = 0; m && i < n; i++)
        json_decref(m[i].calls);
    free(m);
}

static int prepare(const cairn_chat_message *in, size_t n, msg **out)
{
    msg *m = calloc(n ? n : 1, sizeof *m);
    if (!m)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const char *r = in[i].role ? in[i].role : "";
        if (!strcmp(r, "system") || !strcmp(r, "developer"))
            m[i].role = R_SYSTEM;
        else if (!strcmp(r, "user"))
            m[i].role = R_USER;
        else if (!strcmp(r, "assistant"))
            m[i].role = R_ASSISTANT;
        else if (!strcmp(r, "tool"))
            m[i].role = R_TOOL;
        else {
            cairn_log(CAIRN_LOG_WARN, "chat: message %zu has unknown role '%s'", i, r);
            free_msgs(m, n);
            return CAIRN_EINVAL;
        }
        m[i].content = in[i].content ? in[i].content : "";
        m[i].has_content = m[i].content[0] != '\0';
        if (m[i].role == R_ASSISTANT && in[i].tool_calls_json) {
            int rc = normalise_calls(in[i].tool_calls_json, &m[i].calls);
            if (rc) {
                free_msgs(m, n);
                return rc;
            }
            if (json_array_size(m[i].calls) == 0) { /* [] is falsy in Jinja */
                json_decref(m[i].calls);
                m[i].calls = NULL;
            }
        }
    }
    *out = m;
    return CAIRN_OK;
}

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
} conv;

static void fmt_generic(const cairn_chat_template *t, const conv *c, outbuf *b)
{
    (void)t;
    for (size_t i = 0; i < c->n; i++) {
        ob_str(b, "<|");
        ob_str(b, role_name(c->m[i].role));
        ob_str(b, "|>\n");
        ob_str(b, c->m[i].content);
        if (c->m[i].calls) {
            outbuf j = {0};
            py_json(&j, c->m[i].calls, -1, 0);
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

static void qwen_tool_call(outbuf *b, const json_t *call)
{
    ob_str(b, "\n<tool_call>\n{\"name\": \"");
    const json_t *name = json_object_get(call, "name");
    ob_add(b, json_string_value(name), json_string_length(name));
    ob_str(b, "\", \"arguments\": ");
    py_json(b, json_object_get(call, "arguments"), -1, 0);
    ob_str(b, "}\n</tool_call>");
}

static const char qwen_default_system[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

/* ChatML; with `qwen` the Qwen2.5 default system prompt, tools block and
 * tool-call/tool-response format. */
static void fmt_chatml(const cairn_chat_template *t, const conv *c, outbuf *b, bool qwen)
{
    const msg *m = c->m;
    bool first_system = c->n > 0 && m[0].role == R_SYSTEM && !c->cont;
    const char *system = first_system ? m[0].content : t->qwen_default ? qwen_default_system
                                                                         : NULL;
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
                py_json(b, json_array_get(c->tools, i), -1, 0);
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
    for (size_t i = 0; i < c->n; i++) {
        const msg *x = &m[i];
        if (qwen && i == 0 && first_system)
            continue; /* already in the system block */
        if (x->role == R_ASSISTANT && x->calls) {
            ob_special(b, "<|im_start|>");
            ob_str(b, "assistant");
            if (x->has_content) {
                ob_str(b, "\n");
                ob_str(b, x->content);
            }
            for (size_t k = 0; k < json_array_size(x->calls); k++)
                qwen_tool_call(b, json_array_get(x->calls, k));
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
            ob_str(b, role_name(x->role));
            ob_str(b, "\n");
            ob_str(b, x->content);
            ob_special(b, "<|im_end|>");
            ob_str(b, "\n");
        }
    }
    if (c->gen_prompt) {
        ob_special(b, "<|im_start|>");
        ob_str(b, "assistant\n");
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
                py_json(b, json_array_get(c->tools, k), 4, 0);
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
            py_json(b, json_object_get(call, "arguments"), -1, 0);
            ob_str(b, "}");
            ob_special(b, "<|eot_id|>");
        } else if (t->llama31 && x->role == R_TOOL) {
            /* The template tests `content is iterable`, which a string is:
             * tool results are rendered as JSON strings. */
            llama3_header(b, "ipython");
            py_json_string(b, x->content, strlen(x->content));
            ob_special(b, "<|eot_id|>");
        } else {
            llama3_header(b, role_name(x->role));
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
                ob_str(b, "[INST] ");
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
                ob_str(b, " [/INST]");
            } else if (t->mistral_tight) {
                ob_str(b, "[INST]");
                if (system && i + 1 == c->n) {
                    ob_str(b, system);
                    ob_str(b, "\n\n");
                }
                ob_str(b, x->content);
                ob_str(b, "[/INST]");
            } else {
                ob_str(b, "[INST] ");
                if (first && system && *system) {
                    ob_str(b, system);
                    ob_str(b, "\n\n");
                }
                ob_str(b, x->content);
                ob_str(b, " [/INST]");
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
        ob_str(b, x->role == R_ASSISTANT ? "model" : role_name(x->role));
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

/* Render into b. Leading BOS text is written when the template writes it. */
static int render(const cairn_chat_template *t, const cairn_chat_message *msgs, size_t n_msgs,
                  const char *tools_json, bool gen_prompt, bool cont, outbuf *b)
{
    if (!t || (!msgs && n_msgs))
        return CAIRN_EINVAL;
    msg *m = NULL;
    int rc = prepare(msgs, n_msgs, &m);
    if (rc)
        return rc;
    conv c = {.m = m, .n = n_msgs, .gen_prompt = gen_prompt, .cont = cont};
    if (tools_json) {
        json_error_t jerr;
        c.tools = json_loads(tools_json, JSON_DECODE_ANY, &jerr);
        if (!json_is_array(c.tools)) {
            cairn_log(CAIRN_LOG_WARN, "chat: tools is not a JSON array");
            json_decref(c.tools);
            free_msgs(m, n_msgs);
            return CAIRN_EINVAL;
        }
        if (json_array_size(c.tools) > 0 && t->family != CAIRN_CHAT_QWEN2 &&
            !(t->family == CAIRN_CHAT_LLAMA3 && t->llama31))
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
    }
    json_decref(c.tools);
    free_msgs(m, n_msgs);
    if (rc == CAIRN_OK && b->text.oom)
        rc = CAIRN_ENOMEM;
    return rc;
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
    if (!out)
        return CAIRN_EINVAL;
    outbuf b = {0};
    int rc = render(t, msgs, n_msgs, tools_json, add_generation_prompt, false, &b);
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
    int rc = render(t, msgs, n_msgs, tools_json, flags & CAIRN_CHAT_GENERATION_PROMPT, cont, &b);
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
         * with special parsing whenever the contents hold no marker text. */
        for (size_t k = first; rc == CAIRN_OK && k <= b.n_specials; k++) {
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
    case CAIRN_CHAT_LLAMA2: return t->eos_text;
    case CAIRN_CHAT_GENERIC: return "\n";
    }
    return "";
}

/* ---- tool-call parsing ------------------------------------------------------- */

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Append an OpenAI tool call {id, type, function: {name, arguments:
 * "<json>"}}; the id is filled in once all calls are in. */
static int add_call(json_t *calls, const json_t *name, const json_t *args)
{
    char *arg_text = args ? json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY)
                          : strdup("{}");
    if (!arg_text)
        return CAIRN_ENOMEM;
    json_t *c = json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", "", "type", "function", "function",
                          "name", name, "arguments", arg_text);
    free(arg_text);
    if (!c || json_array_append_new(calls, c))
        return CAIRN_ENOMEM;
    return CAIRN_OK;
}

/* A {"name": str, <args_key>: ...} object (args_key "arguments" or
 * "parameters"; either is accepted). */
static int call_from_object(json_t *calls, const json_t *obj)
{
    if (!json_is_object(obj))
        return CAIRN_EFORMAT;
    const json_t *name = json_object_get(obj, "name");
    const json_t *args = json_object_get(obj, "arguments");
    if (!args)
        args = json_object_get(obj, "parameters");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return CAIRN_EFORMAT;
    return add_call(calls, name, args);
}

static void trim_range(const char *s, size_t *a, size_t *b)
{
    while (*a < *b && is_ws(s[*a]))
        (*a)++;
    while (*b > *a && is_ws(s[*b - 1]))
        (*b)--;
}

/* <tool_call>JSON</tool_call> blocks (Qwen2.5 / Hermes). Well-formed blocks
 * become calls and leave the text; malformed ones stay as text. An unclosed
 * last block (generation stopped) counts when its JSON is complete. */
static int parse_tagged(json_t *calls, const char *text, size_t len, outbuf *content)
{
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const size_t no = sizeof open - 1, nc = sizeof close - 1;
    size_t pos = 0;
    while (pos < len) {
        const char *o = memmem(text + pos, len - pos, open, no);
        if (!o)
            break;
        size_t at = (size_t)(o - text), body = at + no;
        const char *c = memmem(text + body, len - body, close, nc);
        size_t body_end = c ? (size_t)(c - text) : len;
        size_t after = c ? body_end + nc : len;
        size_t a = body, e = body_end;
        trim_range(text, &a, &e);
        json_error_t jerr;
        json_t *obj = json_loadb(text + a, e - a, 0, &jerr);
        int rc = obj ? call_from_object(calls, obj) : CAIRN_EFORMAT;
        json_decref(obj);
        if (rc == CAIRN_ENOMEM)
            return rc;
        if (rc == CAIRN_OK) {
            ob_add(content, text + pos, at - pos);
        } else {
            ob_add(content, text + pos, after - pos);
        }
        pos = after;
    }
    ob_add(content, text + pos, len - pos);
    return CAIRN_OK;
}

/* Llama 3.x: the reply is a JSON object {"name", "parameters"}, optionally
 * after <|python_tag|>; a text after it stays as content. */
static int parse_llama3(json_t *calls, const char *text, size_t len, outbuf *content)
{
    size_t a = 0;
    while (a < len && is_ws(text[a]))
        a++;
    static const char tag[] = "<|python_tag|>";
    if (len - a >= sizeof tag - 1 && memcmp(text + a, tag, sizeof tag - 1) == 0) {
        a += sizeof tag - 1;
        while (a < len && is_ws(text[a]))
            a++;
    }
    if (a < len && text[a] == '{') {
        json_error_t jerr;
        json_t *obj = json_loadb(text + a, len - a, JSON_DISABLE_EOF_CHECK, &jerr);
        int rc = obj ? call_from_object(calls, obj) : CAIRN_EFORMAT;
        json_decref(obj);
        if (rc == CAIRN_ENOMEM)
            return rc;
        if (rc == CAIRN_OK) {
            size_t rest = a + jerr.position;
            /* Several calls may be separated by ';'. */
            while (rest < len) {
                size_t r = rest;
                while (r < len && (is_ws(text[r]) || text[r] == ';'))
                    r++;
                if (r >= len || text[r] != '{')
                    break;
                obj = json_loadb(text + r, len - r, JSON_DISABLE_EOF_CHECK, &jerr);
                rc = obj ? call_from_object(calls, obj) : CAIRN_EFORMAT;
                json_decref(obj);
                if (rc == CAIRN_ENOMEM)
                    return rc;
                if (rc != CAIRN_OK)
                    break;
                rest = r + jerr.position;
            }
            ob_add(content, text + rest, len - rest);
            return CAIRN_OK;
        }
    }
    ob_add(content, text, len);
    return CAIRN_OK;
}

/* Is `name` the function name of one of `tools` (OpenAI tools array)? */
static bool names_a_tool(const json_t *tools, const json_t *name)
{
    size_t i;
    const json_t *tool;
    json_array_foreach(tools, i, tool)
    {
        if (json_equal(json_object_get(json_object_get(tool, "function"), "name"), name))
            return true;
    }
    return false;
}

/* Small models often answer a tool prompt with the bare call object, without
 * their family's markers (and a forced call is generated that way): the whole
 * text a {"name": TOOL, "arguments"|"parameters": {...}} object, or an array
 * of them, naming tools of `tools`. Calls are added only when all qualify. */
static int parse_bare(json_t *calls, const char *text, size_t len, const json_t *tools)
{
    json_t *v = json_loadb(text, len, 0, NULL);
    if (!v)
        return CAIRN_OK;
    json_t *list = json_is_array(v) ? json_incref(v) : json_pack("[O]", v);
    json_decref(v);
    if (!list)
        return CAIRN_ENOMEM;
    size_t i;
    json_t *el;
    bool all = json_array_size(list) > 0;
    json_array_foreach(list, i, el)
    {
        json_t *args = json_object_get(el, "arguments");
        if (!args)
            args = json_object_get(el, "parameters");
        all = all && json_is_object(el) && names_a_tool(tools, json_object_get(el, "name")) &&
              (json_is_object(args) || json_is_string(args));
    }
    int rc = CAIRN_OK;
    json_array_foreach(list, i, el)
    {
        if (!all || rc != CAIRN_OK)
            break;
        rc = call_from_object(calls, el);
    }
    json_decref(list);
    return rc;
}

int cairn_chat_parse_tool_calls(const cairn_chat_template *t, const char *text, size_t len,
                                const char *tools_json, const char *id_prefix, char **calls_json,
                                char **content)
{
    if (!t || (!text && len) || !calls_json || !content)
        return CAIRN_EINVAL;
    json_t *tools = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
    if (tools_json && !json_is_array(tools)) { /* (a macro: its argument is read twice) */
        json_decref(tools);
        return CAIRN_EINVAL;
    }
    json_t *calls = json_array();
    outbuf rest = {0};
    if (!calls) {
        json_decref(tools);
        return CAIRN_ENOMEM;
    }
    int rc = t->family == CAIRN_CHAT_LLAMA3 ? parse_llama3(calls, text, len, &rest)
                                            : parse_tagged(calls, text, len, &rest);
    if (rc == CAIRN_OK && rest.text.oom)
        rc = CAIRN_ENOMEM;
    if (rc == CAIRN_OK && json_array_size(calls) == 0 && tools) {
        rc = parse_bare(calls, text, len, tools);
        if (json_array_size(calls) > 0)
            rest.text.len = 0; /* the whole text was the calls */
    }
    json_decref(tools);
    if (rc == CAIRN_OK && json_array_size(calls) == 0)
        rc = CAIRN_ENOTFOUND;
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call)
    {
        char id[160];
        snprintf(id, sizeof id, "%s%zu", id_prefix ? id_prefix : "call_", i);
        if (rc == CAIRN_OK && json_object_set_new(call, "id", json_string(id)) != 0)
            rc = CAIRN_ENOMEM;
    }
    char *cj = NULL, *ct = NULL;
    if (rc == CAIRN_OK) {
        cj = json_dumps(calls, JSON_COMPACT | JSON_PRESERVE_ORDER);
        size_t a = 0, e = rest.text.len;
        trim_range(rest.text.data ? rest.text.data : "", &a, &e);
        ct = malloc(e - a + 1);
        if (!cj || !ct) {
            rc = CAIRN_ENOMEM;
        } else {
            if (e > a)
                memcpy(ct, rest.text.data + a, e - a);
            ct[e - a] = '\0';
        }
    }
    json_decref(calls);
    ob_free(&rest);
    if (rc) {
        free(cj);
        free(ct);
        return rc;
    }
    *calls_json = cj;
    *content = ct;
    return CAIRN_OK;
}

/* ---- forcing a tool call -------------------------------------------------------
 *
 * The schema of a reply that is a call: {"name": TOOL, ARGS: {...}} with ARGS
 * "parameters" for Llama 3 (its template asks for that key), else
 * "arguments"; with `several`, also an array of one or more calls. Each
 * tool's `parameters` is embedded whole, its $defs moved to the root under
 * "t<i>.<name>" (the schema itself under "t<i>", for "#") and its "$ref"s
 * rewritten to match; a tool whose schema the grammar cannot take gets
 * free-form object arguments, with a warning. */

/* Rewrite the "$ref"s under `node` for tool i's moved definitions. false
 * when a ref of another form is met. */
static bool rebase_refs(json_t *node, size_t i)
{
    if (json_is_array(node)) {
        size_t k;
        json_t *el;
        json_array_foreach(node, k, el)
        {
            if (!rebase_refs(el, i))
                return false;
        }
        return true;
    }
    if (!json_is_object(node))
        return true;
    const char *key;
    json_t *val;
    json_object_foreach(node, key, val)
    {
        if (strcmp(key, "$ref") == 0 && json_is_string(val)) {
            const char *ref = json_string_value(val), *name = NULL;
            if (strncmp(ref, "#/$defs/", 8) == 0)
                name = ref + 8;
            else if (strncmp(ref, "#/definitions/", 14) == 0)
                name = ref + 14;
            else if (strcmp(ref, "#") != 0)
                return false;
            char buf[320];
            int n = name ? snprintf(buf, sizeof buf, "#/$defs/t%zu.%s", i, name)
                         : snprintf(buf, sizeof buf, "#/$defs/t%zu", i);
            if (n < 0 || (size_t)n >= sizeof buf || json_string_set(val, buf) != 0)
                return false;
        } else if (!rebase_refs(val, i)) {
            return false;
        }
    }
    return true;
}

/* Tool i's parameters moved into `defs`; the schema of its arguments as a
 * new reference (NULL: out of memory). */
static json_t *tool_arguments_schema(const json_t *tool, size_t i, json_t *defs)
{
    const json_t *fn = json_object_get(tool, "function");
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *params = json_object_get(fn, "parameters");
    if (!json_is_object(params))
        return json_pack("{s:s}", "type", "object"); /* none declared */
    char *text = json_dumps(params, JSON_COMPACT);
    cairn_grammar *g = NULL;
    char why[200] = "";
    int rc = text ? cairn_grammar_from_json_schema(text, strlen(text), &g, why, sizeof why)
                  : CAIRN_ENOMEM;
    free(text);
    cairn_grammar_free(g);
    if (rc == CAIRN_ENOMEM)
        return NULL;
    json_t *copy = rc == CAIRN_OK ? json_deep_copy(params) : NULL;
    if (copy) {
        bool ok = true;
        static const char *const def_keys[] = {"$defs", "definitions"};
        for (size_t k = 0; ok && k < 2; k++) {
            json_t *d = json_object_get(copy, def_keys[k]);
            const char *dname;
            json_t *dval;
            json_object_foreach(d, dname, dval)
            {
                char key[300];
                int n = snprintf(key, sizeof key, "t%zu.%s", i, dname);
                ok = ok && n > 0 && (size_t)n < sizeof key && !strpbrk(dname, "/~") &&
                     rebase_refs(dval, i) && json_object_set(defs, key, dval) == 0;
            }
            json_object_del(copy, def_keys[k]);
        }
        char key[32], ref[40];
        snprintf(key, sizeof key, "t%zu", i);
        snprintf(ref, sizeof ref, "#/$defs/%s", key);
        ok = ok && rebase_refs(copy, i) && json_object_set(defs, key, copy) == 0;
        json_decref(copy);
        if (ok)
            return json_pack("{s:s}", "$ref", ref);
        snprintf(why, sizeof why, "a $ref other than #, #/$defs/NAME or #/definitions/NAME");
    }
    cairn_log(CAIRN_LOG_WARN, "chat: tool %s: its parameters schema cannot be enforced (%s); "
                              "its arguments are only constrained to a JSON object",
              name ? name : "?", why[0] ? why : "out of memory");
    return json_pack("{s:s}", "type", "object");
}

int cairn_chat_tool_call_schema(const cairn_chat_template *t, const char *tools_json,
                                bool several, char **schema_json)
{
    if (!tools_json || !schema_json)
        return CAIRN_EINVAL;
    *schema_json = NULL;
    json_t *tools = json_loads(tools_json, 0, NULL);
    if (!json_is_array(tools) || json_array_size(tools) == 0) {
        json_decref(tools);
        return CAIRN_EINVAL;
    }
    const char *args_key =
        t && t->family == CAIRN_CHAT_LLAMA3 ? "parameters" : "arguments";
    json_t *defs = json_object(), *calls = json_array();
    int rc = defs && calls ? CAIRN_OK : CAIRN_ENOMEM;
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool)
    {
        if (rc != CAIRN_OK)
            break;
        json_t *name = json_object_get(json_object_get(tool, "function"), "name");
        if (!json_is_string(name)) {
            rc = CAIRN_EINVAL;
            break;
        }
        /* {"type": "object", "properties": {"name": {"const": NAME}, ARGS:
         * schema}, "required": [...]}: properties are generated in this
         * order, the name first as the templates show it. (jansson's _new
         * and "o" steal their reference even when they fail.) */
        json_t *props = json_object();
        if (!props || json_object_set_new(props, "name", json_pack("{s:O}", "const", name)) ||
            json_object_set_new(props, args_key, tool_arguments_schema(tool, i, defs)) ||
            json_array_append_new(calls, json_pack("{s:s, s:O, s:[s,s]}", "type", "object",
                                                   "properties", props, "required", "name",
                                                   args_key)))
            rc = CAIRN_ENOMEM;
        json_decref(props);
    }
    json_t *one = NULL, *schema = NULL;
    if (rc == CAIRN_OK) {
        one = json_array_size(calls) == 1 ? json_incref(json_array_get(calls, 0))
                                          : json_pack("{s:O}", "anyOf", calls);
        if (one && several)
            schema = json_pack("{s:O, s:[O, {s:s, s:i, s:O}]}", "$defs", defs, "anyOf", one,
                               "type", "array", "minItems", 1, "items", one);
        else if (one && json_object_set(one, "$defs", defs) == 0)
            schema = json_incref(one);
        char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text)
            *schema_json = text;
        else
            rc = CAIRN_ENOMEM;
    }
    json_decref(schema);
    json_decref(one);
    json_decref(calls);
    json_decref(defs);
    json_decref(tools);
    return rc;
}

/* ---- choosing the tools of a request ------------------------------------------ */

static int tools_fail(char *err, size_t err_len, const char **field, const char *which,
                      const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    if (field)
        *field = which;
    return CAIRN_EINVAL;
}

int cairn_chat_tools_select(const char *tools_json, const char *choice_json, char **render_json,
                            cairn_chat_tool_mode *mode, const char **field, char *err,
                            size_t err_len)
{
    if (!render_json || !mode)
        return CAIRN_EINVAL;
    *render_json = NULL;
    *mode = CAIRN_TOOLS_OFF;
    json_t *choice = choice_json ? json_loads(choice_json, JSON_DECODE_ANY, NULL) : NULL;
    if (choice_json && !choice)
        return tools_fail(err, err_len, field, "tool_choice", "'tool_choice' is not JSON");
    const char *c = json_string_value(choice); /* NULL unless a string */
    if (choice && !c && !json_is_object(choice)) {
        json_decref(choice);
        return tools_fail(err, err_len, field, "tool_choice",
                          "'tool_choice' must be a string or an object");
    }
    if (c && strcmp(c, "none") && strcmp(c, "auto") && strcmp(c, "required")) {
        json_decref(choice);
        return tools_fail(err, err_len, field, "tool_choice",
                          "'tool_choice' must be none, auto, required or a named function");
    }
    json_t *tools = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
    int rc = CAIRN_OK;
    if (!tools_json) {
        if (choice && !(c && (strcmp(c, "none") == 0 || strcmp(c, "auto") == 0)))
            rc = tools_fail(err, err_len, field, "tool_choice", "'tool_choice' needs 'tools'");
        json_decref(choice);
        return rc;
    }
    if (!json_is_array(tools))
        rc = tools_fail(err, err_len, field, "tools", "'tools' must be an array");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        if (rc != CAIRN_OK)
            break;
        json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
            !json_is_object(fn) || !json_is_string(name) || json_string_length(name) == 0)
            rc = tools_fail(err, err_len, field, "tools",
                            "tools[%zu] must be {type: \"function\", function: {name, ...}}", i);
        else if (params && !json_is_object(params) && !json_is_null(params))
            rc = tools_fail(err, err_len, field, "tools",
                            "tools[%zu].function.parameters must be an object", i);
    }
    json_t *render = rc == CAIRN_OK ? json_incref(tools) : NULL;
    cairn_chat_tool_mode m = CAIRN_TOOLS_AUTO;
    if (rc == CAIRN_OK && c && strcmp(c, "none") == 0) {
        m = CAIRN_TOOLS_OFF;
    } else if (rc == CAIRN_OK && c && strcmp(c, "required") == 0) {
        m = CAIRN_TOOLS_REQUIRED;
    } else if (rc == CAIRN_OK && json_is_object(choice)) {
        /* {"type": "function", "function": {"name": N}}: only that tool */
        json_t *want = json_object_get(json_object_get(choice, "function"), "name");
        json_t *only = NULL;
        json_array_foreach(tools, i, t)
        {
            if (json_is_string(want) &&
                json_equal(json_object_get(json_object_get(t, "function"), "name"), want))
                only = t;
        }
        json_decref(render);
        render = NULL;
        if (!json_is_string(want))
            rc = tools_fail(err, err_len, field, "tool_choice",
                            "'tool_choice'.function.name must be a string");
        else if (!only)
            rc = tools_fail(err, err_len, field, "tool_choice",
                            "'tool_choice' names a function not in 'tools'");
        else if (!(render = json_pack("[O]", only)))
            rc = CAIRN_ENOMEM;
        m = CAIRN_TOOLS_NAMED;
    }
    if (rc == CAIRN_OK && json_array_size(render) == 0 && m >= CAIRN_TOOLS_REQUIRED)
        rc = tools_fail(err, err_len, field, "tool_choice",
                        "'tool_choice' asks for a call but 'tools' is empty");
    if (rc == CAIRN_OK && m != CAIRN_TOOLS_OFF && json_array_size(render) > 0) {
        if (!(*render_json = json_dumps(render, JSON_COMPACT | JSON_PRESERVE_ORDER)))
            rc = CAIRN_ENOMEM;
        else
            *mode = m;
    }
    json_decref(render);
    json_decref(tools);
    json_decref(choice);
    return rc;
}
