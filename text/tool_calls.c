/*
 * text/tool_calls.c — the tool-call side of chat: reading the calls out of
 * a generated reply, the JSON schema that forces a reply to be a call, and
 * OpenAI's tools/tool_choice semantics reduced to what to render and parse.
 *
 * These three are kept apart from the formatters because they meet the
 * model's output, not its prompt: the parser must accept what a model
 * really writes (its family's markers, a fenced markdown block, or a bare
 * call object), and the forcing schema must be one the grammar
 * (text/grammar_compile.c) can enforce and the parser reads back as calls.
 *
 * The parser reads every family's forms whatever the template's family
 * (fine-tunes mix them, and a marker is unambiguous): it takes, left to
 * right, <tool_call> blocks, [TOOL_CALLS] and <|python_tag|> runs, and
 * fenced ```json / ``` blocks, plus a run of call objects at the very start
 * of the reply; the text between them is the content. Forms with a marker
 * take a call of any name; the markerless ones (fences, the leading run)
 * only calls of the request's tools that carry their arguments, so that an
 * ordinary JSON answer is never read as a call (the Llama 3 family's
 * leading object is its documented call format and takes any name).
 *
 * gpt-oss's replies are harmony messages in channels instead: they are
 * read apart (reasoning, content, calls), whole or as they stream.
 */
#include "text/chat_impl.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tool-call parsing ------------------------------------------------------- */

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static size_t skip_ws(const char *s, size_t i, size_t len)
{
    while (i < len && is_ws(s[i]))
        i++;
    return i;
}

/* c is one of set's characters (never NUL, which strchr would find) */
static bool in_set(char c, const char *set) { return c && strchr(set, c); }

static bool starts(const char *s, size_t i, size_t len, const char *lit)
{
    size_t n = strlen(lit);
    return len - i >= n && memcmp(s + i, lit, n) == 0;
}

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

/* What a call must be to count. */
typedef struct {
    const json_t *known; /* its name one of these tools; NULL: any name      */
    bool need_args;      /* it has "arguments" or "parameters"               */
} call_rule;

/* A {"name": str, "arguments"|"parameters": ...} object (or OpenAI's own
 * {"type": "function", "function": {...}}) as a call. The arguments may be
 * an object, JSON text of one (OpenAI's form, which models copy), "" or
 * null (none); anything else is not a call. CAIRN_EFORMAT: not a call. */
static int call_from_object(json_t *calls, const json_t *obj, call_rule rule)
{
    if (!json_is_object(obj))
        return CAIRN_EFORMAT;
    const json_t *fn = json_object_get(obj, "function");
    if (!json_object_get(obj, "name") && json_is_object(fn))
        obj = fn;
    const json_t *name = json_object_get(obj, "name");
    const json_t *args = json_object_get(obj, "arguments");
    if (!args)
        args = json_object_get(obj, "parameters");
    if (!json_is_string(name) || json_string_length(name) == 0 ||
        (rule.known && !names_a_tool(rule.known, name)) || (rule.need_args && !args))
        return CAIRN_EFORMAT;
    json_t *parsed = NULL;
    if (json_is_string(args) && json_string_length(args) > 0) {
        parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        if (!json_is_object(parsed)) {
            json_decref(parsed);
            return CAIRN_EFORMAT;
        }
        args = parsed;
    } else if (json_is_string(args) || json_is_null(args)) {
        args = NULL;
    } else if (args && !json_is_object(args)) {
        return CAIRN_EFORMAT;
    }
    int rc = add_call(calls, name, args);
    json_decref(parsed);
    return rc;
}

/* A call object or a non-empty array of them: all calls, or none added. */
static int calls_from_value(json_t *calls, const json_t *v, call_rule rule)
{
    json_t *got = json_array();
    if (!got)
        return CAIRN_ENOMEM;
    int rc = CAIRN_OK;
    if (json_is_array(v)) {
        size_t i;
        const json_t *el;
        rc = json_array_size(v) > 0 ? CAIRN_OK : CAIRN_EFORMAT;
        json_array_foreach(v, i, el)
        {
            if (rc == CAIRN_OK)
                rc = call_from_object(got, el, rule);
        }
    } else {
        rc = call_from_object(got, v, rule);
    }
    if (rc == CAIRN_OK && json_array_extend(calls, got))
        rc = CAIRN_ENOMEM;
    json_decref(got);
    return rc;
}

/* Calls as one or more JSON values from text[*pos] on, separated by
 * whitespace, ';' (Llama 3) or ','. Stops before the first value that is
 * not JSON or not calls; *pos ends past the last one taken. The number of
 * values taken, or -1 when out of memory. */
static int json_call_run(json_t *calls, const char *text, size_t len, size_t *pos,
                         call_rule rule)
{
    int n = 0;
    size_t p = *pos;
    for (;;) {
        size_t r = p;
        while (r < len && (is_ws(text[r]) || (n > 0 && (text[r] == ';' || text[r] == ','))))
            r++;
        if (r >= len || (text[r] != '{' && text[r] != '['))
            break;
        json_error_t jerr;
        json_t *v = json_loadb(text + r, len - r, JSON_DISABLE_EOF_CHECK, &jerr);
        int rc = v ? calls_from_value(calls, v, rule) : CAIRN_EFORMAT;
        json_decref(v);
        if (rc == CAIRN_ENOMEM)
            return -1;
        if (rc != CAIRN_OK)
            break;
        p = r + jerr.position;
        n++;
    }
    *pos = p;
    return n;
}

/* ---- Python literals (Llama 3.1's built-in tool calls) ---- */

static json_t *py_value(const char *s, size_t len, size_t *pos, int depth);

/* A '...' or "..." string; the usual backslash escapes are decoded, others
 * kept as written. */
static json_t *py_string(const char *s, size_t len, size_t *pos)
{
    char q = s[*pos];
    cairn_strbuf b = {0};
    size_t p = *pos + 1;
    for (; p < len && s[p] != q; p++) {
        char c = s[p];
        if (c == '\\' && p + 1 < len) {
            char e = s[++p];
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
            if (!in_set(e, "ntr\\'\""))
                cairn_strbuf_add(&b, "\\", 1);
        }
        cairn_strbuf_add(&b, &c, 1);
    }
    json_t *v = p < len && !b.oom ? json_stringn(b.data ? b.data : "", b.len) : NULL;
    cairn_strbuf_free(&b);
    *pos = p + 1;
    return v;
}

/* [v, ...] or {k: v, ...} (string keys); `close` is ']' or '}'. */
static json_t *py_container(const char *s, size_t len, size_t *pos, int depth, char close)
{
    json_t *out = close == ']' ? json_array() : json_object();
    size_t p = *pos + 1;
    for (bool first = true; out;) {
        p = skip_ws(s, p, len);
        if (p < len && s[p] == close) {
            *pos = p + 1;
            return out;
        }
        if (!first) {
            if (p >= len || s[p] != ',')
                break;
            p = skip_ws(s, p + 1, len);
            if (p < len && s[p] == close)
                continue; /* a trailing comma */
        }
        first = false;
        json_t *key = NULL;
        if (close == '}') {
            key = p < len && (s[p] == '"' || s[p] == '\'') ? py_string(s, len, &p) : NULL;
            p = skip_ws(s, p, len);
            if (!key || p >= len || s[p] != ':') {
                json_decref(key);
                break;
            }
            p++;
        }
        json_t *v = py_value(s, len, &p, depth + 1);
        int bad = !v || (key ? json_object_set_new(out, json_string_value(key), v)
                             : json_array_append_new(out, v));
        json_decref(key);
        if (bad)
            break;
    }
    json_decref(out);
    return NULL;
}

/* A Python literal: string, number, True/False/None, list, dict. */
static json_t *py_value(const char *s, size_t len, size_t *pos, int depth)
{
    size_t p = skip_ws(s, *pos, len);
    *pos = p;
    if (p >= len || depth > 32)
        return NULL;
    if (s[p] == '"' || s[p] == '\'')
        return py_string(s, len, pos);
    if (s[p] == '[' || s[p] == '{')
        return py_container(s, len, pos, depth, s[p] == '[' ? ']' : '}');
    static const char *const words[] = {"True", "False", "None"};
    for (int k = 0; k < 3; k++)
        if (starts(s, p, len, words[k])) {
            *pos = p + strlen(words[k]);
            return k == 0 ? json_true() : k == 1 ? json_false() : json_null();
        }
    char num[64];
    size_t n = 0;
    bool real = false;
    while (p + n < len && n + 1 < sizeof num && in_set(s[p + n], "+-0123456789.eE")) {
        real = real || in_set(s[p + n], ".eE");
        num[n] = s[p + n];
        n++;
    }
    num[n] = '\0';
    char *end = NULL;
    json_t *v = NULL;
    if (n > 0 && real) {
        double d = strtod(num, &end);
        v = *end == '\0' ? json_real(d) : NULL;
    } else if (n > 0) {
        long long i = strtoll(num, &end, 10);
        v = *end == '\0' ? json_integer(i) : NULL;
    }
    *pos = p + n;
    return v;
}

/* NAME.call(key=value, ...): Llama 3.1's built-in tools (brave_search,
 * wolfram_alpha) after <|python_tag|>; the call named NAME, its keyword
 * arguments as the arguments object. */
static int builtin_call(json_t *calls, const char *s, size_t len, size_t *pos)
{
    size_t p = *pos, n0 = p;
    while (p < len && (isalnum((unsigned char)s[p]) || s[p] == '_'))
        p++;
    size_t n1 = p;
    if (n1 == n0 || !starts(s, p, len, ".call("))
        return CAIRN_EFORMAT;
    p += 6;
    json_t *args = json_object();
    int rc = args ? CAIRN_EFORMAT : CAIRN_ENOMEM;
    for (bool first = true; args;) {
        p = skip_ws(s, p, len);
        if (p < len && s[p] == ')') {
            p++;
            rc = CAIRN_OK;
            break;
        }
        if (!first) {
            if (p >= len || s[p] != ',')
                break;
            p = skip_ws(s, p + 1, len);
            if (p < len && s[p] == ')')
                continue;
        }
        first = false;
        size_t k0 = p;
        while (p < len && (isalnum((unsigned char)s[p]) || s[p] == '_'))
            p++;
        size_t k1 = p;
        p = skip_ws(s, p, len);
        if (k1 == k0 || p >= len || s[p] != '=')
            break;
        p++;
        json_t *v = py_value(s, len, &p, 0);
        char key[128];
        if (!v || k1 - k0 >= sizeof key) {
            json_decref(v);
            break;
        }
        memcpy(key, s + k0, k1 - k0);
        key[k1 - k0] = '\0';
        if (json_object_set_new(args, key, v)) {
            rc = CAIRN_ENOMEM;
            break;
        }
    }
    json_t *name = rc == CAIRN_OK ? json_stringn(s + n0, n1 - n0) : NULL;
    if (rc == CAIRN_OK)
        rc = name ? add_call(calls, name, args) : CAIRN_ENOMEM;
    json_decref(name);
    json_decref(args);
    if (rc == CAIRN_OK)
        *pos = p;
    return rc;
}

/* ---- the forms ---- */

static const char TAG_OPEN[] = "<tool_call>", TAG_CLOSE[] = "</tool_call>";
static const char MISTRAL[] = "[TOOL_CALLS]", PYTHON_TAG[] = "<|python_tag|>", FENCE[] = "```";

/* Markers that open a call in some family's format. The last two are
 * formats the parser does not read (Llama 3.2's <function=...>, Kimi's):
 * held back all the same, so that such a call does not leak out as
 * content before it reaches the client whole. */
static const char *const call_openers[] = {TAG_OPEN, PYTHON_TAG, MISTRAL, "<function=",
                                           "<|tool_call_begin|>"};
#define N_CALL_OPENERS (sizeof call_openers / sizeof call_openers[0])

/* What one form read at a marker: the calls it added (0: none, the marker
 * stays text) and where the text after it resumes. */
typedef struct {
    int n;
    size_t end;
} form_result;

/* text[*a..*e) without a surrounding ``` fence (a call fenced inside a
 * <tool_call> block). */
static void unfence(const char *s, size_t *a, size_t *e)
{
    if (*e - *a < 6 || memcmp(s + *a, FENCE, 3) != 0)
        return;
    const char *nl = memchr(s + *a, '\n', *e - *a);
    if (!nl)
        return;
    size_t b = (size_t)(nl - s) + 1, f = *e;
    while (f > b && is_ws(s[f - 1]))
        f--;
    if (f - b >= 3 && memcmp(s + f - 3, FENCE, 3) == 0)
        f -= 3;
    *a = b;
    *e = f;
}

/* <tool_call>JSON</tool_call> (Qwen2.5, Hermes): the body one call (or an
 * array, or several objects). The block ends at its closing tag, else at
 * the next opening tag or the end (generation stopped, or the model left
 * the tag out): then a complete JSON still counts and what follows it is
 * text. A closed block that is not wholly calls stays text. */
static int form_tagged(json_t *calls, const char *s, size_t len, size_t at, form_result *r)
{
    const size_t no = sizeof TAG_OPEN - 1, nc = sizeof TAG_CLOSE - 1;
    size_t body = at + no;
    const char *c = memmem(s + body, len - body, TAG_CLOSE, nc);
    const char *o = memmem(s + body, len - body, TAG_OPEN, no);
    bool closed = c && (!o || c < o);
    size_t body_end = closed ? (size_t)(c - s) : o ? (size_t)(o - s) : len;
    size_t a = skip_ws(s, body, body_end), e = body_end;
    while (e > a && is_ws(s[e - 1]))
        e--;
    unfence(s, &a, &e);
    json_t *got = json_array();
    if (!got)
        return CAIRN_ENOMEM;
    size_t p = a;
    int n = json_call_run(got, s, e, &p, (call_rule){NULL, false});
    if (n < 0) {
        json_decref(got);
        return CAIRN_ENOMEM;
    }
    bool whole = skip_ws(s, p, e) == e;
    r->n = 0;
    r->end = closed ? body_end + nc : body_end;
    if (n > 0 && (whole || !closed)) {
        if (json_array_extend(calls, got)) {
            json_decref(got);
            return CAIRN_ENOMEM;
        }
        r->n = (int)json_array_size(got);
        if (!whole)
            r->end = p; /* unclosed: the rest is text */
    }
    json_decref(got);
    return CAIRN_OK;
}

/* After a marker: a run of JSON calls (an array or objects) from p. */
static int marker_json_run(json_t *calls, const char *s, size_t len, size_t p, form_result *r)
{
    size_t before = json_array_size(calls);
    int n = json_call_run(calls, s, len, &p, (call_rule){NULL, false});
    if (n < 0)
        return CAIRN_ENOMEM;
    r->n = (int)(json_array_size(calls) - before);
    if (n > 0)
        r->end = p;
    return CAIRN_OK;
}

/* [TOOL_CALLS] (Mistral): a JSON array of calls (v3; an object is taken
 * too), or NAME[ARGS]{...} (v11 and later, an optional [CALL_ID]ID before
 * [ARGS]; several may follow each other). Ids the model writes are not
 * kept: calls get this reply's ids like every other form. */
static int form_mistral(json_t *calls, const char *s, size_t len, size_t at, form_result *r)
{
    size_t p = skip_ws(s, at + sizeof MISTRAL - 1, len);
    r->n = 0;
    r->end = at + sizeof MISTRAL - 1;
    if (p < len && (s[p] == '[' || s[p] == '{'))
        return marker_json_run(calls, s, len, p, r);
    for (;;) {
        size_t n0 = p;
        while (p < len && (isalnum((unsigned char)s[p]) || in_set(s[p], "_-.")))
            p++;
        size_t n1 = p;
        if (starts(s, p, len, "[CALL_ID]")) {
            p += 9;
            while (p < len && isalnum((unsigned char)s[p]))
                p++;
        }
        if (n1 == n0 || !starts(s, p, len, "[ARGS]"))
            break;
        p = skip_ws(s, p + 6, len);
        json_error_t jerr;
        json_t *args = p < len && s[p] == '{'
                           ? json_loadb(s + p, len - p, JSON_DISABLE_EOF_CHECK, &jerr)
                           : NULL;
        json_t *obj = args ? json_pack("{s:s%, s:o}", "name", s + n0, n1 - n0, "arguments", args)
                           : NULL;
        int rc = obj ? call_from_object(calls, obj, (call_rule){NULL, false}) : CAIRN_EFORMAT;
        json_decref(obj);
        if (rc == CAIRN_ENOMEM)
            return rc;
        if (rc != CAIRN_OK)
            break;
        p += jerr.position;
        r->n++;
        r->end = p;
        p = skip_ws(s, p, len);
    }
    return CAIRN_OK;
}

/* <|python_tag|> (Llama 3.x): JSON call objects separated by ';', or
 * NAME.call(...) built-in calls. Code for the code interpreter (the tag
 * followed by plain Python) is not a call of a function tool: it stays
 * text, tag included. */
static int form_python_tag(json_t *calls, const char *s, size_t len, size_t at,
                           form_result *r)
{
    size_t p = skip_ws(s, at + sizeof PYTHON_TAG - 1, len);
    r->n = 0;
    r->end = at + sizeof PYTHON_TAG - 1;
    if (p < len && (s[p] == '[' || s[p] == '{'))
        return marker_json_run(calls, s, len, p, r);
    for (;;) {
        int rc = builtin_call(calls, s, len, &p);
        if (rc == CAIRN_ENOMEM)
            return rc;
        if (rc != CAIRN_OK)
            break;
        r->n++;
        r->end = p;
        p = skip_ws(s, p, len);
        if (p < len && s[p] == ';')
            p = skip_ws(s, p + 1, len);
    }
    return CAIRN_OK;
}

/* Is text[i] at the start of a line, after spaces or tabs only? */
static bool at_line_start(const char *s, size_t i)
{
    while (i > 0 && (s[i - 1] == ' ' || s[i - 1] == '\t'))
        i--;
    return i == 0 || s[i - 1] == '\n';
}

/* The next ``` at a line start from `from` (len when none). */
static size_t next_fence(const char *s, size_t len, size_t from)
{
    while (from < len) {
        const char *f = memmem(s + from, len - from, FENCE, 3);
        if (!f)
            break;
        size_t at = (size_t)(f - s);
        if (at_line_start(s, at))
            return at;
        from = at + 3;
    }
    return len;
}

/* Is the info string of a fence (text[a..e)) one a call may carry: none or
 * "json"? */
static bool json_info(const char *s, size_t a, size_t e)
{
    a = skip_ws(s, a, e);
    while (e > a && is_ws(s[e - 1]))
        e--;
    return e == a || (e - a == 4 && strncasecmp(s + a, "json", 4) == 0);
}

/* A fenced block at a line start: ```json or ``` then calls of the
 * request's tools, each with its arguments, and nothing else, up to the
 * closing fence (or the end). Any other block — another language, JSON
 * that is not such calls — stays text whole, closing fence included, so
 * what is inside it is never read as a marker or a fence. */
static int form_fence(json_t *calls, const char *s, size_t len, size_t at, const json_t *tools,
                      form_result *r)
{
    r->n = 0;
    const char *nl = memchr(s + at + 3, '\n', len - at - 3);
    if (!nl) { /* "```" alone on the last line: nothing follows */
        r->end = len;
        return CAIRN_OK;
    }
    size_t body = (size_t)(nl - s) + 1;
    size_t close = next_fence(s, len, body);
    r->end = close < len ? close + 3 : len;
    if (!tools || !json_info(s, at + 3, body - 1))
        return CAIRN_OK;
    json_t *got = json_array();
    if (!got)
        return CAIRN_ENOMEM;
    size_t p = body;
    int n = json_call_run(got, s, close, &p, (call_rule){tools, true});
    int rc = n < 0 ? CAIRN_ENOMEM : CAIRN_OK;
    if (n > 0 && skip_ws(s, p, close) == close) {
        if (json_array_extend(calls, got))
            rc = CAIRN_ENOMEM;
        r->n = (int)json_array_size(got);
    }
    json_decref(got);
    return rc;
}

/* The earliest marker in text[from..len): its position (len: none) and
 * kind (0 tag, 1 [TOOL_CALLS], 2 <|python_tag|>, 3 fence). at[k] caches
 * where marker k next occurs (SIZE_MAX: not searched yet), so that a reply
 * with many markers is searched once, not once per marker. */
static size_t next_marker(const char *s, size_t len, size_t from, size_t at[4], int *kind)
{
    static const char *const lit[] = {TAG_OPEN, MISTRAL, PYTHON_TAG};
    if (at[3] == SIZE_MAX || (at[3] < from && at[3] < len))
        at[3] = next_fence(s, len, from);
    size_t best = at[3];
    *kind = 3;
    for (int k = 0; k < 3; k++) {
        if (at[k] == SIZE_MAX || (at[k] < from && at[k] < len)) {
            const char *m = memmem(s + from, len - from, lit[k], strlen(lit[k]));
            at[k] = m ? (size_t)(m - s) : len;
        }
        if (at[k] < best) {
            best = at[k];
            *kind = k;
        }
    }
    return best;
}

static int parse_all(const cairn_chat_template *t, json_t *calls, const char *s, size_t len,
                     const json_t *tools, outbuf *content)
{
    size_t pos = 0;
    /* A run of call objects opening the reply: small models answer so
     * without their family's markers, and forced calls are generated so. */
    size_t p = skip_ws(s, 0, len);
    if (p < len && (s[p] == '{' || s[p] == '[') && (tools || t->family == CAIRN_CHAT_LLAMA3)) {
        call_rule rule = {t->family == CAIRN_CHAT_LLAMA3 ? NULL : tools, true};
        int n = json_call_run(calls, s, len, &p, rule);
        if (n < 0)
            return CAIRN_ENOMEM;
        if (n > 0)
            pos = p;
    }
    size_t lit_at[4] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    while (pos < len) {
        int kind;
        size_t at = next_marker(s, len, pos, lit_at, &kind);
        if (at >= len)
            break;
        form_result r;
        int rc = kind == 0   ? form_tagged(calls, s, len, at, &r)
                 : kind == 1 ? form_mistral(calls, s, len, at, &r)
                 : kind == 2 ? form_python_tag(calls, s, len, at, &r)
                             : form_fence(calls, s, len, at, tools, &r);
        if (rc != CAIRN_OK)
            return rc;
        ob_add(content, s + pos, (r.n > 0 ? at : r.end) - pos);
        pos = r.end;
    }
    ob_add(content, s + pos, len - pos);
    return content->text.oom ? CAIRN_ENOMEM : CAIRN_OK;
}

/* ---- replies in channels (harmony) ------------------------------------------- */
/*
 * A harmony reply is a run of messages, each a header up to <|message|>
 * ("<|start|>assistant<|channel|>final", or "<|channel|>commentary
 * to=functions.f <|constrain|>json") and a body up to the next marker.
 * cairn_chat_reply_next walks it with a cursor, so that a stream is read
 * once as it grows and a complete reply is read by the same steps
 * (cairn_chat_parse_reply): what a client was streamed is then always the
 * beginning of what it would have been answered.
 */

/* Markers that close a message (consumed) and that open the next one's
 * header (left for it). A body ends at the first of either. */
static const char *const H_CLOSE[] = {"<|end|>", "<|call|>", "<|return|>"};
static const char *const H_OPEN[] = {"<|start|>", "<|channel|>"};
static const char H_MESSAGE[] = "<|message|>";

bool cairn_chat_reply_has_channels(const cairn_chat_template *t)
{
    return cairn_chat_template_family(t) == CAIRN_CHAT_HARMONY || cairn_chat_template_thinks(t);
}

/* Is text[p..len) a header's beginning: 1 yes, 0 no, -1 perhaps (too
 * short to tell). At the reply's start the header may begin with the
 * recipient (" to=functions.f<|channel|>..."): the generation prompt wrote
 * "<|start|>assistant". */
static int header_starts(const char *s, size_t p, size_t len)
{
    static const char *const at_start[] = {" to=", "to="};
    int verdict = 0;
    for (size_t k = 0; k < 2 + (p == 0 ? 2 : 0); k++) {
        const char *m = k < 2 ? H_OPEN[k] : at_start[k - 2];
        size_t n = strlen(m), have = len - p;
        if (have >= n && memcmp(s + p, m, n) == 0)
            return 1;
        if (have < n && memcmp(s + p, m, have) == 0)
            verdict = -1;
    }
    return verdict;
}

/* The word after `key` in the header h[0..n): up to a space or a marker. */
static bool header_word(const char *h, size_t n, const char *key, size_t *off, size_t *len)
{
    const char *k = memmem(h, n, key, strlen(key));
    if (!k)
        return false;
    size_t a = (size_t)(k - h) + strlen(key), e = a;
    while (e < n && !is_ws(h[e]) && h[e] != '<')
        e++;
    *off = a;
    *len = e - a;
    return true;
}

/* What the message whose header is text[p..m) holds; a call's name into c. */
static cairn_chat_reply_kind header_kind(const char *s, size_t p, size_t m,
                                         cairn_chat_reply_cursor *c)
{
    size_t off, n;
    if (header_word(s + p, m - p, "to=", &off, &n) && n > 0 &&
        !(n == 9 && memcmp(s + p + off, "assistant", 9) == 0)) {
        off += p;
        static const char fns[] = "functions.";
        if (n > sizeof fns - 1 && memcmp(s + off, fns, sizeof fns - 1) == 0) {
            off += sizeof fns - 1;
            n -= sizeof fns - 1;
        }
        c->call_name = off;
        c->call_name_len = n;
        return CAIRN_REPLY_CALL;
    }
    if (header_word(s + p, m - p, "<|channel|>", &off, &n) && n == 8 &&
        memcmp(s + p + off, "analysis", 8) == 0)
        return CAIRN_REPLY_REASONING;
    return CAIRN_REPLY_CONTENT; /* final, commentary to no one, or none */
}

/* The first marker ending a body in text[p..len): its offset (len: none)
 * and *close its length when it closes the message (0: it opens the next). */
static size_t body_end(const char *s, size_t p, size_t len, size_t *close)
{
    *close = 0;
    for (size_t at = p; at < len; at++) {
        const char *q = memchr(s + at, '<', len - at);
        if (!q)
            break;
        at = (size_t)(q - s);
        for (size_t k = 0; k < 3; k++)
            if (starts(s, at, len, H_CLOSE[k])) {
                *close = strlen(H_CLOSE[k]);
                return at;
            }
        for (size_t k = 0; k < 2; k++)
            if (starts(s, at, len, H_OPEN[k]))
                return at;
    }
    return len;
}

/* Bytes at the end of text[p..len) that may begin one of markers[0..n). */
static size_t held_marker(const char *s, size_t p, size_t len, const char *const *markers,
                          size_t n)
{
    size_t hold = 0;
    for (size_t k = 0; k < n; k++)
        for (size_t m = strlen(markers[k]) - 1; m > hold; m--)
            if (m <= len - p && memcmp(s + len - m, markers[k], m) == 0) {
                hold = m;
                break;
            }
    return hold;
}

/* How many bytes at the end of text[p..len) may be the beginning of a
 * marker that ends a body (held back until the next text tells). */
static size_t partial_marker(const char *s, size_t p, size_t len)
{
    const char *const all[] = {H_CLOSE[0], H_CLOSE[1], H_CLOSE[2], H_OPEN[0], H_OPEN[1]};
    return held_marker(s, p, len, all, 5);
}

/* Without channels: all text is content, as it comes. */
static bool plain_next(cairn_chat_reply_cursor *c, size_t len, cairn_chat_reply_part *part)
{
    if (c->pos >= len)
        return false;
    *part = (cairn_chat_reply_part){.kind = CAIRN_REPLY_CONTENT, .off = c->pos,
                                    .len = len - c->pos};
    c->pos = len;
    return true;
}

/* ---- replies that think first (<think> ... </think>) -------------------------- */
/*
 * Qwen3, QwQ and their kin write their reasoning first, between <think>
 * and </think>, then the answer (and Qwen's <tool_call> blocks):
 *
 *     <think>\nThe user asks 2+2.\n</think>\n\n4
 *     ^^^^^^^  reasoning (newlines    ^^^^^^^^^  content (leading
 *              around it dropped)                whitespace dropped)
 *
 * Read as llama.cpp's and vLLM's reasoning parsers read it: the first
 * <think> opens the reasoning, which runs to </think> (to the end of a reply
 * cut off inside it); text before <think> and after </think> is content;
 * without <think> there is no reasoning. The template renders a reply's
 * reasoning back the same way (chat_format.c), so a conversation resent
 * with reasoning_content has the tokens the model wrote.
 *
 * The cursor's states: before <think> (T_BEFORE), in the reasoning, after
 * </think>, and T_HELD once a tool call may have begun (nothing more is
 * streamed: the call comes whole from the parse at the end, and the
 * content with it). c->call_body marks where the current part's text
 * begins while nothing of it was given, so that leading whitespace can be
 * skipped as it arrives. A piece never ends in whitespace (content) or a
 * newline (reasoning) that may still turn out to be trailing, nor in what
 * may be the beginning of a marker: what was streamed is always the
 * beginning of what the parse gives.
 */
static char *ob_take(outbuf *b);
static int read_tool_calls(const cairn_chat_template *t, const char *text, size_t len,
                           const char *tools_json, const char *id_prefix, char **calls_json,
                           char **content);

enum { T_BEFORE = 0, T_REASONING = CAIRN_REPLY_REASONING, T_AFTER = CAIRN_REPLY_CONTENT, T_HELD };
static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

/* The first call opener in text[p..len): its offset, len when none. */
static size_t first_call_opener(const char *s, size_t p, size_t len)
{
    size_t best = len;
    for (size_t k = 0; k < N_CALL_OPENERS; k++) {
        const char *o = memmem(s + p, len - p, call_openers[k], strlen(call_openers[k]));
        if (o && (size_t)(o - s) < best)
            best = (size_t)(o - s);
    }
    return best;
}

static size_t find_lit(const char *s, size_t p, size_t len, const char *lit)
{
    const char *f = p < len ? memmem(s + p, len - p, lit, strlen(lit)) : NULL;
    return f ? (size_t)(f - s) : len;
}

/* A content piece text[from..upto) as a part (false when empty). */
static bool think_part(cairn_chat_reply_part *part, int kind, size_t from, size_t upto)
{
    if (upto <= from)
        return false;
    *part = (cairn_chat_reply_part){.kind = (cairn_chat_reply_kind)kind, .off = from,
                                    .len = upto - from};
    return true;
}

static bool think_next(cairn_chat_reply_cursor *c, const char *s, size_t len, bool done,
                       cairn_chat_reply_part *part)
{
    for (;;) {
        size_t p = c->pos;
        if (p >= len)
            return false;
        if (c->state == T_HELD) {
            c->pos = len;
            return done && think_part(part, CAIRN_REPLY_CONTENT, p, len);
        }
        if (c->state == T_REASONING) {
            if (p == c->call_body) { /* nothing given yet: leading newlines go */
                while (p < len && s[p] == '\n')
                    p++;
                c->pos = c->call_body = p;
            }
            size_t e = find_lit(s, p, len, THINK_CLOSE);
            size_t upto = e < len || done ? e : len - held_marker(s, p, len,
                                                                 (const char *const[]){THINK_CLOSE}, 1);
            size_t keep = upto;
            while (keep > p && s[keep - 1] == '\n')
                keep--;
            if (e < len) {
                c->state = T_AFTER;
                c->pos = c->call_body = e + sizeof THINK_CLOSE - 1;
            } else {
                c->pos = keep;
            }
            if (think_part(part, CAIRN_REPLY_REASONING, p, keep))
                return true;
            if (e < len)
                continue;
            return false;
        }
        /* content, before <think> or after </think> */
        if (p == c->call_body) { /* nothing given yet: leading whitespace goes */
            p = skip_ws(s, p, len);
            c->pos = c->call_body = p;
            if (p == len)
                return false;
            /* a reply opening with JSON may be a forced call (read by the
             * parse): held, as in harmony */
            if (c->state == T_BEFORE && p == skip_ws(s, 0, len) && (s[p] == '{' || s[p] == '[') &&
                !done) {
                c->state = T_HELD;
                return false;
            }
        }
        size_t o = first_call_opener(s, p, len);
        size_t t = c->state == T_BEFORE ? find_lit(s, p, len, THINK_OPEN) : len;
        if (t < o) { /* the reasoning opens: what came before is content, whole */
            c->state = T_REASONING;
            c->pos = c->call_body = t + sizeof THINK_OPEN - 1;
            if (think_part(part, CAIRN_REPLY_CONTENT, p, t))
                return true;
            continue;
        }
        size_t upto = o;
        if (o == len && !done) {
            static const char *const marks[] = {THINK_OPEN, TAG_OPEN, PYTHON_TAG, MISTRAL,
                                                "<function=", "<|tool_call_begin|>"};
            size_t first = c->state == T_BEFORE ? 0 : 1;
            upto = len - held_marker(s, p, len, marks + first, 6 - first);
        }
        if (o < len || !done)
            while (upto > p && is_ws(s[upto - 1]))
                upto--;
        c->pos = upto;
        if (o < len)
            c->state = T_HELD;
        if (think_part(part, CAIRN_REPLY_CONTENT, p, upto))
            return true;
        if (o < len)
            continue;
        return false;
    }
}

/* A complete thinking reply's parts, as think_next gives them:
 * *reasoning (NULL when there was no <think>) and *content. */
static int think_split(const char *s, size_t len, char **reasoning, char **content)
{
    *reasoning = *content = NULL;
    size_t a = find_lit(s, 0, len, THINK_OPEN);
    size_t b0 = skip_ws(s, 0, len);
    outbuf r = {0}, c = {0};
    if (a == len) {
        ob_add(&c, s + b0, len - b0);
    } else {
        if (b0 < a)
            ob_add(&c, s + b0, a - b0);
        size_t r0 = a + sizeof THINK_OPEN - 1, e = find_lit(s, r0, len, THINK_CLOSE);
        size_t r1 = e;
        while (r0 < r1 && s[r0] == '\n')
            r0++;
        while (r1 > r0 && s[r1 - 1] == '\n')
            r1--;
        ob_add(&r, s + r0, r1 - r0);
        if (e < len) {
            size_t after = skip_ws(s, e + sizeof THINK_CLOSE - 1, len);
            ob_add(&c, s + after, len - after);
        }
        if (!(*reasoning = ob_take(&r))) {
            ob_free(&c);
            return CAIRN_ENOMEM;
        }
    }
    if (c.text.oom || !(*content = ob_take(&c))) {
        free(*reasoning);
        *reasoning = NULL;
        ob_free(&c);
        return CAIRN_ENOMEM;
    }
    return CAIRN_OK;
}

bool cairn_chat_reply_next(const cairn_chat_template *t, cairn_chat_reply_cursor *c,
                           const char *s, size_t len, bool done, cairn_chat_reply_part *part)
{
    if (!c || !part || (!s && len))
        return false;
    if (!cairn_chat_reply_has_channels(t))
        return plain_next(c, len, part);
    if (cairn_chat_template_thinks(t))
        return think_next(c, s, len, done, part);
    for (;;) {
        size_t p = c->pos;
        if (p > len)
            return false;
        if (c->state == 0) { /* at a header */
            if (p == len)
                return false;
            int h = header_starts(s, p, len);
            if (h < 0 && !done)
                return false;
            if (h > 0) {
                const char *m = memmem(s + p, len - p, H_MESSAGE, sizeof H_MESSAGE - 1);
                if (!m) {
                    if (done)
                        c->pos = len; /* a header cut off: nothing to give */
                    return false;
                }
                size_t at = (size_t)(m - s);
                c->state = (int)header_kind(s, p, at, c);
                c->pos = at + sizeof H_MESSAGE - 1;
                c->call_body = c->pos;
                continue;
            }
            /* Text without a header: content. At the reply's start, text
             * that opens with JSON may be a forced call (not harmony's
             * form; cairn_chat_parse_reply reads it): held to the end. */
            if (p == 0 && !done) {
                size_t q = skip_ws(s, 0, len);
                if (q == len || s[q] == '{' || s[q] == '[')
                    return false;
            }
            c->state = CAIRN_REPLY_CONTENT;
            continue;
        }
        size_t close;
        size_t e = body_end(s, p, len, &close);
        if (e < len) {
            cairn_chat_reply_kind kind = (cairn_chat_reply_kind)c->state;
            size_t from = kind == CAIRN_REPLY_CALL ? c->call_body : p;
            *part = (cairn_chat_reply_part){.kind = kind, .off = from, .len = e - from,
                                            .name_off = c->call_name,
                                            .name_len = c->call_name_len, .complete = true};
            c->pos = e + close;
            c->state = 0;
            /* an empty reasoning message is still one (the reply had
             * reasoning, if nothing to say in it) */
            if (part->len > 0 || kind != CAIRN_REPLY_CONTENT)
                return true;
            continue;
        }
        if (c->state == CAIRN_REPLY_CALL) {
            if (!done) {
                c->pos = len - partial_marker(s, p, len); /* searched up to there */
                return false;
            }
            *part = (cairn_chat_reply_part){.kind = CAIRN_REPLY_CALL, .off = c->call_body,
                                            .len = len - c->call_body, .name_off = c->call_name,
                                            .name_len = c->call_name_len, .complete = false};
            c->pos = len;
            c->state = 0;
            return true;
        }
        size_t upto = len - (done ? 0 : partial_marker(s, p, len));
        if (upto <= p)
            return false;
        *part = (cairn_chat_reply_part){.kind = (cairn_chat_reply_kind)c->state, .off = p,
                                        .len = upto - p};
        c->pos = upto;
        return true;
    }
}

/* A harmony call into `calls`: its arguments as JSON when they are, else
 * (a closed message) as the text written; a cut-off call that is not JSON
 * is dropped. */
static int harmony_call(json_t *calls, const char *s, const cairn_chat_reply_part *part)
{
    if (part->name_len == 0)
        return CAIRN_OK;
    size_t a = skip_ws(s, part->off, part->off + part->len), e = part->off + part->len;
    while (e > a && is_ws(s[e - 1]))
        e--;
    json_t *args = e > a ? json_loadb(s + a, e - a, JSON_DECODE_ANY, NULL) : json_object();
    if (!args && !part->complete)
        return CAIRN_OK;
    char *text = args ? json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY)
                      : strndup(s + a, e - a);
    json_decref(args);
    if (!text)
        return CAIRN_ENOMEM;
    json_t *c = json_pack("{s:s, s:s, s:{s:s%, s:s}}", "id", "", "type", "function", "function",
                          "name", s + part->name_off, part->name_len, "arguments", text);
    free(text);
    if (!c || json_array_append_new(calls, c))
        return CAIRN_ENOMEM;
    return CAIRN_OK;
}

/* A harmony reply's parts gathered: reasoning (NULL when none), content,
 * calls (an array, with empty ids). */
static int harmony_parts(const cairn_chat_template *t, const char *s, size_t len, outbuf *reasoning,
                         bool *reasoned, outbuf *content, json_t *calls)
{
    cairn_chat_reply_cursor c = {0};
    cairn_chat_reply_part part;
    *reasoned = false;
    while (cairn_chat_reply_next(t, &c, s, len, true, &part)) {
        if (part.kind == CAIRN_REPLY_CALL) {
            int rc = harmony_call(calls, s, &part);
            if (rc)
                return rc;
        } else if (part.kind == CAIRN_REPLY_REASONING) {
            *reasoned = true;
            ob_add(reasoning, s + part.off, part.len);
        } else {
            ob_add(content, s + part.off, part.len);
        }
    }
    return reasoning->text.oom || content->text.oom ? CAIRN_ENOMEM : CAIRN_OK;
}

/* The ids "<prefix><n>" of calls (every family's), and the array as JSON
 * text. */
static int number_calls(json_t *calls, const char *id_prefix, char **calls_json)
{
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call)
    {
        char id[160];
        snprintf(id, sizeof id, "%s%zu", id_prefix ? id_prefix : "call_", i);
        if (json_object_set_new(call, "id", json_string(id)) != 0)
            return CAIRN_ENOMEM;
    }
    *calls_json = json_dumps(calls, JSON_COMPACT | JSON_PRESERVE_ORDER);
    return *calls_json ? CAIRN_OK : CAIRN_ENOMEM;
}

static char *ob_take(outbuf *b)
{
    char *d = b->text.data ? b->text.data : strdup("");
    b->text.data = NULL;
    ob_free(b);
    return d;
}

/* A reply with harmony headers (else it is read as other families' are). */
static bool harmony_headed(const cairn_chat_template *t, const char *s, size_t len)
{
    return cairn_chat_reply_has_channels(t) && s &&
           (memmem(s, len, H_MESSAGE, sizeof H_MESSAGE - 1) ||
            memmem(s, len, H_OPEN[1], strlen(H_OPEN[1])));
}

/* Harmony: the reply's calls and the content beside them (the reasoning
 * left out), as cairn_chat_parse_tool_calls gives them. */
static int harmony_tool_calls(const cairn_chat_template *t, const char *s, size_t len,
                              const char *id_prefix, char **calls_json, char **content)
{
    outbuf r = {0}, c = {0};
    json_t *calls = json_array();
    bool reasoned;
    int rc = calls ? harmony_parts(t, s, len, &r, &reasoned, &c, calls) : CAIRN_ENOMEM;
    if (rc == CAIRN_OK && json_array_size(calls) == 0)
        rc = CAIRN_ENOTFOUND;
    if (rc == CAIRN_OK)
        rc = number_calls(calls, id_prefix, calls_json);
    json_decref(calls);
    ob_free(&r);
    if (rc == CAIRN_OK && !(*content = ob_take(&c))) {
        free(*calls_json);
        rc = CAIRN_ENOMEM;
    }
    ob_free(&c);
    return rc;
}

int cairn_chat_parse_reply(const cairn_chat_template *t, const char *text, size_t len,
                           const char *tools_json, const char *id_prefix, char **reasoning,
                           char **calls_json, char **content)
{
    if (!t || (!text && len) || !reasoning || !calls_json || !content)
        return CAIRN_EINVAL;
    *reasoning = *calls_json = *content = NULL;
    if (!text)
        text = "";
    if (cairn_chat_template_thinks(t)) {
        int rc = think_split(text, len, reasoning, content);
        if (rc || !tools_json)
            return rc;
        char *calls = NULL, *rest = NULL;
        rc = read_tool_calls(t, *content, strlen(*content), tools_json, id_prefix, &calls, &rest);
        if (rc == CAIRN_OK) {
            free(*content);
            *content = rest;
            *calls_json = calls;
        } else if (rc != CAIRN_ENOTFOUND) {
            free(*reasoning);
            free(*content);
            *reasoning = *content = NULL;
            return rc;
        }
        return CAIRN_OK;
    }
    if (!harmony_headed(t, text, len)) {
        int rc = cairn_chat_parse_tool_calls(t, text, len, tools_json, id_prefix, calls_json,
                                             content);
        if (rc != CAIRN_ENOTFOUND)
            return rc;
        *content = strndup(text, len);
        return *content ? CAIRN_OK : CAIRN_ENOMEM;
    }
    outbuf r = {0}, c = {0};
    json_t *calls = json_array();
    bool reasoned = false;
    int rc = calls ? harmony_parts(t, text, len, &r, &reasoned, &c, calls) : CAIRN_ENOMEM;
    if (rc == CAIRN_OK && json_array_size(calls) > 0)
        rc = number_calls(calls, id_prefix, calls_json);
    json_decref(calls);
    if (rc == CAIRN_OK) {
        *content = ob_take(&c);
        *reasoning = reasoned ? ob_take(&r) : NULL;
        if (!*content || (reasoned && !*reasoning))
            rc = CAIRN_ENOMEM;
    }
    ob_free(&r);
    ob_free(&c);
    if (rc) {
        free(*reasoning);
        free(*calls_json);
        free(*content);
        *reasoning = *calls_json = *content = NULL;
    }
    return rc;
}

int cairn_chat_parse_tool_calls(const cairn_chat_template *t, const char *text, size_t len,
                                const char *tools_json, const char *id_prefix, char **calls_json,
                                char **content)
{
    if (!t || (!text && len) || !calls_json || !content)
        return CAIRN_EINVAL;
    if (harmony_headed(t, text, len))
        return harmony_tool_calls(t, text, len, id_prefix, calls_json, content);
    if (cairn_chat_template_thinks(t) && text && memmem(text, len, THINK_OPEN, strlen(THINK_OPEN))) {
        /* the calls of the content; the reasoning is left out (a call it
         * talks about is not one) */
        char *reasoning = NULL, *answer = NULL;
        int rc = think_split(text, len, &reasoning, &answer);
        free(reasoning);
        if (rc == CAIRN_OK)
            rc = read_tool_calls(t, answer, strlen(answer), tools_json, id_prefix, calls_json,
                                 content);
        free(answer);
        return rc;
    }
    return read_tool_calls(t, text, len, tools_json, id_prefix, calls_json, content);
}

int cairn_chat_parse_answer_tool_calls(const cairn_chat_template *t, const char *text, size_t len,
                                       const char *tools_json, const char *id_prefix,
                                       char **calls_json, char **content)
{
    if (!t || (!text && len) || !calls_json || !content)
        return CAIRN_EINVAL;
    return read_tool_calls(t, text, len, tools_json, id_prefix, calls_json, content);
}

/* The tool calls of a text in every family's forms (cairn_chat_parse_tool_calls
 * without channels or reasoning). */
static int read_tool_calls(const cairn_chat_template *t, const char *text, size_t len,
                           const char *tools_json, const char *id_prefix, char **calls_json,
                           char **content)
{
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
    int rc = parse_all(t, calls, text ? text : "", len, tools, &rest);
    json_decref(tools);
    if (rc == CAIRN_OK && json_array_size(calls) == 0)
        rc = CAIRN_ENOTFOUND;
    char *cj = NULL, *ct = NULL;
    if (rc == CAIRN_OK)
        rc = number_calls(calls, id_prefix, &cj);
    if (rc == CAIRN_OK) {
        const char *d = rest.text.data ? rest.text.data : "";
        size_t a = skip_ws(d, 0, rest.text.len), e = rest.text.len;
        while (e > a && is_ws(d[e - 1]))
            e--;
        ct = malloc(e - a + 1);
        if (!ct) {
            rc = CAIRN_ENOMEM;
        } else {
            if (e > a)
                memcpy(ct, d + a, e - a);
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

/* ---- where a streamed call may begin ------------------------------------------- */


typedef enum { FENCE_NO, FENCE_MAYBE, FENCE_YES } fence_verdict;

/* Could the block whose info string is text[i0..i1) and whose body starts
 * at `body` be a call, as far as the text goes? A call block is json or
 * bare, and opens with {"name": "TOOL" (or [{"name": ...) where TOOL is
 * one of the tools: a name found as "name":"TOOL" in their compact JSON
 * text (a false match only holds longer). Only the first key is looked
 * at: a call block that puts its name later is not held. */
static fence_verdict fence_call(const char *s, size_t len, size_t i0, size_t i1, size_t body,
                                const char *tools_json)
{
    if (!tools_json || !json_info(s, i0, i1))
        return FENCE_NO;
    size_t p = skip_ws(s, body, len);
    if (p < len && s[p] == '[')
        p = skip_ws(s, p + 1, len);
    if (p >= len)
        return FENCE_MAYBE;
    if (s[p] != '{')
        return FENCE_NO;
    p = skip_ws(s, p + 1, len);
    static const char key[] = "\"name\"";
    size_t k = sizeof key - 1, have = len - p < k ? len - p : k;
    if (memcmp(s + p, key, have) != 0)
        return FENCE_NO;
    if (have < k)
        return FENCE_MAYBE;
    p = skip_ws(s, p + k, len);
    if (p < len && s[p] == ':')
        p = skip_ws(s, p + 1, len);
    else if (p < len)
        return FENCE_NO;
    if (p >= len)
        return FENCE_MAYBE;
    if (s[p] != '"')
        return FENCE_NO;
    size_t n0 = p + 1, n1 = n0;
    while (n1 < len && s[n1] != '"' && s[n1] != '\\')
        n1++;
    if (n1 >= len)
        return FENCE_MAYBE;
    if (s[n1] == '\\')
        return FENCE_YES; /* an escaped name: hold, the parser decides */
    char want[300];
    int w = snprintf(want, sizeof want, "\"name\":\"%.*s\"", (int)(n1 - n0), s + n0);
    if (w < 0 || (size_t)w >= sizeof want)
        return FENCE_YES;
    return strstr(tools_json, want) ? FENCE_YES : FENCE_NO;
}

size_t cairn_chat_tool_call_start(const char *s, size_t len, const char *tools_json,
                                  bool *certain)
{
    *certain = false;
    if (!s)
        return 0;
    size_t first = skip_ws(s, 0, len);
    if (first == len)
        return 0; /* only whitespace yet: what follows may be a leading call */
    if (s[first] == '{' || s[first] == '[') {
        /* a leading call object {"..., or an array of them [{"... (a
         * "[TOOL_CALLS]" is found as a marker below) */
        size_t p = skip_ws(s, first + 1, len);
        if (s[first] == '[' && p < len && s[p] == '{')
            p = skip_ws(s, p + 1, len);
        if (p >= len)
            return 0;
        if (s[p] == '"') {
            *certain = true;
            return 0;
        }
    }
    bool in_block = false; /* inside a fenced block that is not a call */
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(s + pos, '\n', len - pos);
        size_t eol = nl ? (size_t)(nl - s) : len, next = nl ? eol + 1 : len;
        size_t f = pos;
        while (f < eol && (s[f] == ' ' || s[f] == '\t'))
            f++;
        if (eol - f >= 3 && memcmp(s + f, FENCE, 3) == 0) {
            if (in_block) {
                in_block = false;
            } else if (!nl) {
                return pos; /* the info string is still coming */
            } else {
                fence_verdict v = fence_call(s, len, f + 3, eol, next, tools_json);
                if (v == FENCE_YES)
                    *certain = true;
                if (v != FENCE_NO)
                    return pos; /* the fence's line, indentation included */
                in_block = true;
            }
            pos = next;
            continue;
        }
        if (!nl && !in_block && eol - f < 3 && memcmp(s + f, FENCE, eol - f) == 0)
            return pos; /* "`", "``" or indentation at the end: a fence may be coming */
        if (!in_block) {
            size_t best = len;
            for (size_t i = 0; i < sizeof call_openers / sizeof *call_openers; i++) {
                const char *op = call_openers[i];
                size_t ol = strlen(op);
                const char *hit = memmem(s + pos, eol - pos, op, ol);
                if (hit && (size_t)(hit - s) < best) {
                    best = (size_t)(hit - s);
                    *certain = true;
                }
                for (size_t k = ol - 1; !nl && k > 0; k--)
                    if (k <= eol - pos && memcmp(s + len - k, op, k) == 0) {
                        if (len - k < best)
                            best = len - k;
                        break;
                    }
            }
            if (best < len) {
                /* a partial opener at the end is not certain, a full one is,
                 * whichever comes first */
                if (*certain) {
                    bool full = false;
                    for (size_t i = 0; i < sizeof call_openers / sizeof *call_openers; i++)
                        full = full || starts(s, best, len, call_openers[i]);
                    *certain = full;
                }
                return best;
            }
        }
        pos = next;
    }
    return len;
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
 * new reference (NULL: *rc says why, CAIRN_ENOMEM, or CAIRN_EINVAL for a
 * malformed schema). */
static json_t *tool_arguments_schema(const json_t *tool, size_t i, json_t *defs, int *rc_out)
{
    *rc_out = CAIRN_ENOMEM;
    const json_t *fn = json_object_get(tool, "function");
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *params = json_object_get(fn, "parameters");
    if (!params || json_is_null(params))
        return json_pack("{s:s}", "type", "object"); /* none declared */
    if (!json_is_object(params)) {
        *rc_out = CAIRN_EINVAL;
        return NULL;
    }
    char *text = json_dumps(params, JSON_COMPACT);
    cairn_grammar *g = NULL;
    char why[200] = "";
    int rc = text ? cairn_grammar_from_json_schema(text, strlen(text), &g, why, sizeof why)
                  : CAIRN_ENOMEM;
    free(text);
    cairn_grammar_free(g);
    if (rc == CAIRN_ENOMEM || rc == CAIRN_EINVAL) {
        if (rc == CAIRN_EINVAL)
            cairn_log(CAIRN_LOG_WARN, "chat: tool %s: its parameters schema is malformed (%s)",
                      name ? name : "?", why);
        *rc_out = rc;
        return NULL;
    }
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
        json_t *args = tool_arguments_schema(tool, i, defs, &rc);
        if (args)
            rc = CAIRN_OK; /* else out of memory, or a malformed schema */
        if (rc == CAIRN_OK &&
            (!props || json_object_set_new(props, "name", json_pack("{s:O}", "const", name)) ||
             json_object_set(props, args_key, args) ||
             json_array_append_new(calls, json_pack("{s:s, s:O, s:[s,s]}", "type", "object",
                                                    "properties", props, "required", "name",
                                                    args_key))))
            rc = CAIRN_ENOMEM;
        json_decref(args);
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

/* The field's name into field[field_len] (NULL: not wanted) and the
 * message into err; CAIRN_EINVAL. */
typedef struct {
    char *field, *err;
    size_t field_len, err_len;
} tools_error;

static int tools_fail(const tools_error *e, const char *which, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int tools_fail(const tools_error *e, const char *which, const char *fmt, ...)
{
    if (e->err && e->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->err, e->err_len, fmt, ap);
        va_end(ap);
    }
    if (e->field && e->field_len)
        snprintf(e->field, e->field_len, "%s", which);
    return CAIRN_EINVAL;
}

/* Tool i's parameters schema compiled, to find a malformed one when the
 * request arrives, whatever tool_choice says (OpenAI refuses such a tool
 * always): CAIRN_EINVAL naming tools[i].function.parameters. A valid schema
 * beyond the grammar's subset (or too large for it) is accepted: forcing
 * that tool constrains its arguments to an object only
 * (cairn_chat_tool_call_schema). */
static int check_parameters(const json_t *params, size_t i, const tools_error *e)
{
    char which[64];
    snprintf(which, sizeof which, "tools[%zu].function.parameters", i);
    if (!json_is_object(params))
        return tools_fail(e, which, "%s must be an object", which);
    char *text = json_dumps(params, JSON_COMPACT);
    if (!text)
        return CAIRN_ENOMEM;
    cairn_grammar *g = NULL;
    char why[200] = "";
    int rc = cairn_grammar_from_json_schema(text, strlen(text), &g, why, sizeof why);
    free(text);
    cairn_grammar_free(g);
    if (rc != CAIRN_EINVAL)
        return rc == CAIRN_ENOMEM ? rc : CAIRN_OK;
    return tools_fail(e, which, "%s is not a valid JSON schema: %s", which,
                      why[0] ? why : "malformed");
}

int cairn_chat_tools_select(const char *tools_json, const char *choice_json, char **render_json,
                            cairn_chat_tool_mode *mode, char *field, size_t field_len, char *err,
                            size_t err_len)
{
    const tools_error te = {field, err, field_len, err_len}, *e = &te;
    if (!render_json || !mode)
        return CAIRN_EINVAL;
    *render_json = NULL;
    *mode = CAIRN_TOOLS_OFF;
    json_t *choice = choice_json ? json_loads(choice_json, JSON_DECODE_ANY, NULL) : NULL;
    if (choice_json && !choice)
        return tools_fail(e, "tool_choice", "'tool_choice' is not JSON");
    const char *c = json_string_value(choice); /* NULL unless a string */
    if (choice && !c && !json_is_object(choice)) {
        json_decref(choice);
        return tools_fail(e, "tool_choice",
                          "'tool_choice' must be a string or an object");
    }
    if (c && strcmp(c, "none") && strcmp(c, "auto") && strcmp(c, "required")) {
        json_decref(choice);
        return tools_fail(e, "tool_choice",
                          "'tool_choice' must be none, auto, required or a named function");
    }
    json_t *tools = tools_json ? json_loads(tools_json, 0, NULL) : NULL;
    int rc = CAIRN_OK;
    if (!tools_json) {
        if (choice && !(c && (strcmp(c, "none") == 0 || strcmp(c, "auto") == 0)))
            rc = tools_fail(e, "tool_choice", "'tool_choice' needs 'tools'");
        json_decref(choice);
        return rc;
    }
    if (!json_is_array(tools))
        rc = tools_fail(e, "tools", "'tools' must be an array");
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
            rc = tools_fail(e, "tools",
                            "tools[%zu] must be {type: \"function\", function: {name, ...}}", i);
        else if (params && !json_is_null(params))
            rc = check_parameters(params, i, e);
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
            rc = tools_fail(e, "tool_choice",
                            "'tool_choice'.function.name must be a string");
        else if (!only)
            rc = tools_fail(e, "tool_choice",
                            "'tool_choice' names a function not in 'tools'");
        else if (!(render = json_pack("[O]", only)))
            rc = CAIRN_ENOMEM;
        m = CAIRN_TOOLS_NAMED;
    }
    if (rc == CAIRN_OK && json_array_size(render) == 0 && m >= CAIRN_TOOLS_REQUIRED)
        rc = tools_fail(e, "tool_choice",
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
