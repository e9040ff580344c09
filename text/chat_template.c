/*
 * text/chat_template.c — chat templates without a Jinja interpreter: which
 * family a template is, and the pieces every family's formatter shares.
 *
 * A GGUF's `tokenizer.chat_template` is a Jinja2 program. Rather than
 * interpreting it, cairn recognises which family the template belongs to by
 * markers in its source and formats conversations with a hand-written
 * formatter per family (text/chat_format.c). Each formatter reproduces, byte
 * for byte, what the Hugging Face rendering (jinja2 with trim_blocks and
 * lstrip_blocks, and a `tojson` that is Python's json.dumps with
 * ensure_ascii=False) produces for that family's reference template;
 * tests/chat/ checks this against jinja2. So this file holds what that
 * takes besides the formatters: the family and its variants read from the
 * source, a JSON serialiser that matches Python's, and the caller's
 * messages normalised into the form the formatters read.
 */
#include "text/chat_impl.h"
#include "text/tokenizer_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Python-compatible JSON serialisation ------------------------------- */
/*
 * HF renders `tojson` as json.dumps(x, ensure_ascii=False, indent=indent,
 * separators=None, sort_keys=False): ", " and ": " without indent, "," and
 * ": " with it; keys in their given order; non-ASCII kept; floats as
 * Python's repr (the shortest text that reads back to the same double).
 */

void chat_py_json_string(outbuf *b, const char *s, size_t n)
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
void chat_py_json(outbuf *b, const json_t *j, int indent, int level)
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
            chat_py_json_string(b, key, strlen(key));
            ob_str(b, ": ");
            chat_py_json(b, val, indent, level + 1);
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
            chat_py_json(b, json_array_get(j, i), indent, level + 1);
        }
        if (indent >= 0)
            py_newline_indent(b, indent, level);
        ob_add(b, "]", 1);
        return;
    }
    case JSON_STRING:
        chat_py_json_string(b, json_string_value(j), json_string_length(j));
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
    case CAIRN_CHAT_HARMONY: return "harmony";
    }
    return "unknown";
}

cairn_chat_family cairn_chat_template_family(const cairn_chat_template *t)
{
    return t ? t->family : CAIRN_CHAT_GENERIC;
}

bool cairn_chat_template_thinks(const cairn_chat_template *t)
{
    return t && t->thinks;
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
    /* first: the template also writes <|end|>, which alone would look like
     * Phi-3's */
    if (strstr(src, "<|start|>") && strstr(src, "<|channel|>") && strstr(src, "<|message|>"))
        return CAIRN_CHAT_HARMONY;
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
        case CAIRN_CHAT_HARMONY: bos = "<|startoftext|>"; eos = "<|return|>"; break;
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
    t->thinks = (t->family == CAIRN_CHAT_QWEN2 || t->family == CAIRN_CHAT_CHATML) &&
                strstr(src, "<think>") && strstr(src, "</think>");
    /* Qwen2.5's default system prompt, taken from the template itself (a
     * variant may word it otherwise): from "You are Qwen, created by" to the
     * end of its string literal or of the system turn */
    const char *qd = t->family == CAIRN_CHAT_QWEN2 ? strstr(src, "You are Qwen, created by") : NULL;
    if (qd) {
        size_t n = strcspn(qd, "'\"<\\");
        if (n < sizeof t->qwen_system) {
            memcpy(t->qwen_system, qd, n);
            t->qwen_system[n] = '\0';
            t->qwen_default = true;
        }
    }
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
        /* Many converted files carry no template (Gemma 3's GGUFs among
         * them). Their vocabulary still says which turn markers the model
         * was trained on: the family whose markers it has, else generic. */
        /* each marker is also a template text detect_family knows */
        static const char *const markers[] = {"<start_of_turn>", "<|start_header_id|>",
                                              "<|im_start|>"};
        src = NULL;
        for (size_t i = 0; v && !src && i < sizeof markers / sizeof markers[0]; i++)
            if (tok_lookup_text(v, markers[i], strlen(markers[i])) >= 0)
                src = markers[i];
        if (src)
            cairn_log(CAIRN_LOG_INFO, "chat template: the model has no tokenizer.chat_template; "
                                      "its vocabulary has %s, so that family's format is used",
                      src);
        else
            cairn_log(CAIRN_LOG_WARN, "chat template: the model has no tokenizer.chat_template; "
                                      "using the generic <|role|> format");
    } else if (rc != CAIRN_OK) {
        return rc;
    }
    return cairn_chat_template_from_string(src, v, out);
}

/* ---- conversation preparation ------------------------------------------- */

const char *chat_role_name(role_id r)
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

void chat_free_msgs(msg *m, size_t n)
{
    for (size_t i = 0; m && i < n; i++)
        json_decref(m[i].calls);
    free(m);
}

int chat_prepare(const cairn_chat_message *in, size_t n, msg **out)
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
            chat_free_msgs(m, n);
            return CAIRN_EINVAL;
        }
        m[i].content = in[i].content ? in[i].content : "";
        m[i].has_content = m[i].content[0] != '\0';
        m[i].reasoning = m[i].role == R_ASSISTANT ? in[i].reasoning_content : NULL;
        if (m[i].role == R_ASSISTANT && in[i].tool_calls_json) {
            int rc = normalise_calls(in[i].tool_calls_json, &m[i].calls);
            if (rc) {
                chat_free_msgs(m, n);
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
