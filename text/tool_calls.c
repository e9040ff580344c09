/*
 * text/tool_calls.c — the tool-call side of chat: reading the calls out of
 * a generated reply, the JSON schema that forces a reply to be a call, and
 * OpenAI's tools/tool_choice semantics reduced to what to render and parse.
 *
 * These three are kept apart from the formatters because they meet the
 * model's output, not its prompt: the parser must accept what a model
 * really writes (its family's markers, or a bare call object), and the
 * forcing schema must be one the grammar (text/grammar_compile.c) can
 * enforce and the parser reads back as calls.
 */
#include "text/chat_impl.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
