/*
 * api/json.c — a request body's JSON, read the same way for every HTTP
 * front end.
 *
 * jansson holds integers in 64 signed bits and refuses a document with a
 * larger one as malformed ("too big integer"). A client that sends
 * `"seed": 18446744073709551615` (a valid u64 seed) or a seed past 2^64 has
 * sent valid JSON with one field out of range, and must hear about that
 * field. So a document refused for that reason only is read again with each
 * such integer literal taken as its decimal text: what the msgpack front end
 * already does with a uint64 above 2^63 - 1, and what the fields that take
 * integers that large (seed) accept, while every other integer field refuses
 * a string naming itself.
 */
#include "api/api_impl.h"

#include <string.h>

/* The body with every integer literal outside int64 quoted; NULL on ENOMEM. */
static char *quote_big_integers(const char *text, size_t len, size_t *out_len)
{
    cairn_strbuf b = {0};
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < len;) {
        const char c = text[i];
        if (in_string || c == '"' || (c != '-' && !(c >= '0' && c <= '9'))) {
            if (in_string) {
                in_string = escaped || c != '"';
                escaped = !escaped && c == '\\';
            } else {
                in_string = c == '"';
            }
            cairn_strbuf_add(&b, &c, 1);
            i++;
            continue;
        }
        /* a number: [-]digits[.digits][(e|E)[+-]digits] */
        size_t j = i + (c == '-'), digits = 0;
        bool integral = true;
        while (j < len && text[j] >= '0' && text[j] <= '9')
            j++, digits++;
        while (j < len && (strchr(".eE+-", text[j]) || (text[j] >= '0' && text[j] <= '9'))) {
            integral = false;
            j++;
        }
        /* 19 digits may still fit; strncmp compares equal-length digit runs */
        const char *limit = c == '-' ? "9223372036854775808" : "9223372036854775807";
        const bool big = integral && (digits > 19 || (digits == 19 &&
                                                      strncmp(text + j - 19, limit, 19) > 0));
        if (big)
            cairn_strbuf_add(&b, "\"", 1);
        cairn_strbuf_add(&b, text + i, j - i);
        if (big)
            cairn_strbuf_add(&b, "\"", 1);
        i = j;
    }
    cairn_strbuf_add(&b, "", 0);
    if (b.oom) {
        cairn_strbuf_free(&b);
        return NULL;
    }
    *out_len = b.len;
    return b.data;
}

json_t *cairn_api_json_parse(const char *text, size_t len, json_error_t *err)
{
    json_t *root = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, err);
    if (root || !strstr(err->text, "too big"))
        return root;
    size_t n = 0;
    char *quoted = quote_big_integers(text, len, &n);
    if (!quoted) {
        snprintf(err->text, sizeof err->text, "out of memory");
        return NULL;
    }
    root = json_loadb(quoted, n, JSON_REJECT_DUPLICATES, err);
    free(quoted);
    return root;
}

/* ---- building a chat request out of another front end's body --------------------------- */

bool api_clean_string(const json_t *v)
{
    return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v);
}

int api_set(json_t *obj, const char *key, json_t *v, cairn_api_error *e)
{
    return v && json_object_set_new(obj, key, v) == 0 ? CAIRN_OK : api_oom(e);
}

int api_append(json_t *arr, json_t *v, cairn_api_error *e)
{
    return v && json_array_append_new(arr, v) == 0 ? CAIRN_OK : api_oom(e);
}

int api_function_tool(json_t *tools, const json_t *name, const json_t *desc, const json_t *schema,
                      cairn_api_error *e)
{
    json_t *fn = json_pack("{s:O}", "name", name);
    if (fn && desc)
        json_object_set(fn, "description", (json_t *)desc);
    if (fn && schema)
        json_object_set(fn, "parameters", (json_t *)schema);
    return api_append(tools, json_pack("{s:s, s:o}", "type", "function", "function", fn), e);
}

int api_translate_tools(const json_t *params, json_t *chat, api_tool_parts parts,
                        cairn_api_error *e)
{
    json_t *in = api_field(params, "tools");
    if (!in)
        return CAIRN_OK;
    if (!json_is_array(in))
        return api_fail(e, CAIRN_EINVAL, "tools", "'tools' must be an array");
    json_t *tools = json_array();
    int rc = api_set(chat, "tools", tools, e);
    size_t i;
    json_t *t;
    json_array_foreach(in, i, t)
    {
        const json_t *name = NULL, *desc = NULL, *schema = NULL;
        if (rc || (rc = parts(t, i, &name, &desc, &schema, e)))
            return rc;
        rc = api_function_tool(tools, name, desc, schema, e);
    }
    return rc;
}

void api_rename_field(cairn_api_error *e, const api_field_name *names, size_t n)
{
    for (size_t i = 0; e->field && i < n; i++) {
        if (strcmp(e->field, names[i].chat) != 0)
            continue;
        e->field = names[i].wire;
        char quoted[40], *at;
        snprintf(quoted, sizeof quoted, "'%s'", names[i].chat);
        if ((at = strstr(e->message, quoted))) {
            char rest[sizeof e->message];
            snprintf(rest, sizeof rest, "%s", at + strlen(quoted));
            snprintf(at, sizeof e->message - (size_t)(at - e->message), "'%s'%s", names[i].wire,
                     rest);
        }
        return;
    }
}
