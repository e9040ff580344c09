/*
 * api/tools.c — what constrains a reply: OpenAI's tools and tool_choice
 * (the tools a template renders, and a call the grammar forces) and
 * response_format (JSON, or JSON valid against a schema).
 */
#include "api/api_impl.h"

#include <stdlib.h>
#include <string.h>

/* `schema_text` (taken; NULL: any JSON object) compiled into g->grammar; a
 * refusal names `field`. */
static int compile_grammar(cairn_gen_params *g, char *schema_text, const char *field,
                           const char *what, cairn_api_error *e)
{
    char msg[200] = "";
    int rc = cairn_grammar_from_json_schema(schema_text, schema_text ? strlen(schema_text) : 0,
                                            &g->grammar, msg, sizeof msg);
    free(schema_text);
    if (rc == CAIRN_OK)
        return CAIRN_OK;
    g->grammar = NULL;
    if (rc == CAIRN_ENOMEM)
        return api_oom(e);
    return api_fail(e, CAIRN_EINVAL, field, "%s: %s", what, msg[0] ? msg : cairn_strerror(rc));
}

int api_response_format(const json_t *params, cairn_gen_params *g, cairn_api_error *e)
{
    json_t *rf = api_field(params, "response_format");
    if (!rf)
        return CAIRN_OK;
    json_t *type = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(type))
        return api_fail(e, CAIRN_EINVAL, "response_format",
                        "'response_format' must be {type: ...}");
    const char *t = json_string_value(type);
    if (strcmp(t, "text") == 0)
        return CAIRN_OK;
    char *schema_text = NULL;
    if (strcmp(t, "json_schema") == 0) {
        json_t *js = json_object_get(rf, "json_schema");
        json_t *schema = json_object_get(js, "schema");
        if (!json_is_object(js))
            return api_fail(e, CAIRN_EINVAL, "response_format",
                            "'response_format'.json_schema must be an object holding 'schema'");
        if (json_is_string(schema)) /* the schema as JSON text (native clients) */
            schema_text = strdup(json_string_value(schema));
        else if (json_is_object(schema) || json_is_boolean(schema))
            schema_text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
        else
            return api_fail(e, CAIRN_EINVAL, "response_format",
                            "'response_format'.json_schema.schema must be an object or JSON text");
        if (!schema_text)
            return api_oom(e);
    } else if (strcmp(t, "json_object") != 0) {
        return api_fail(e, CAIRN_EINVAL, "response_format",
                        "'response_format'.type must be text, json_object or json_schema");
    }
    return compile_grammar(g, schema_text, "response_format", "invalid JSON schema", e);
}

/* The response_format's schema as JSON (a new reference): json_object is
 * any object; NULL when there is no JSON format. */
static json_t *response_schema(const json_t *params)
{
    json_t *rf = api_field(params, "response_format");
    const char *t = json_string_value(json_object_get(rf, "type"));
    if (t && strcmp(t, "json_object") == 0)
        return json_pack("{s:s}", "type", "object");
    if (!t || strcmp(t, "json_schema") != 0)
        return NULL;
    json_t *schema = json_object_get(json_object_get(rf, "json_schema"), "schema");
    if (json_is_string(schema))
        return json_loads(json_string_value(schema), JSON_DECODE_ANY, NULL);
    return json_incref(schema);
}

/* Every "$ref" under `node` that points into the root's $defs/definitions
 * (or at the root itself) pointed at `prefix`NAME (or `prefix`root) in the
 * combined schema's $defs. */
static void prefix_refs(json_t *node, const char *prefix)
{
    if (json_is_array(node)) {
        size_t i;
        json_t *v;
        json_array_foreach(node, i, v)
            prefix_refs(v, prefix);
        return;
    }
    if (!json_is_object(node))
        return;
    const char *k;
    json_t *v;
    json_object_foreach(node, k, v)
    {
        const char *ref = strcmp(k, "$ref") == 0 ? json_string_value(v) : NULL;
        if (!ref) {
            prefix_refs(v, prefix);
            continue;
        }
        const char *name = strncmp(ref, "#/$defs/", 8) == 0         ? ref + 8
                           : strncmp(ref, "#/definitions/", 14) == 0 ? ref + 14
                           : strcmp(ref, "#") == 0                   ? "root"
                                                                     : NULL;
        if (!name)
            continue;
        char buf[512];
        snprintf(buf, sizeof buf, "#/$defs/%s%s", prefix, name);
        json_object_set_new(node, k, json_string(buf));
    }
}

/* Move `schema`'s $defs/definitions (its refs already prefixed) into
 * `defs` under `prefix`NAME, and the schema itself as `prefix`root. */
static void move_defs(json_t *schema, const char *prefix, json_t *defs)
{
    static const char *const keys[] = {"$defs", "definitions"};
    char buf[512];
    for (int i = 0; i < 2; i++) {
        const char *name;
        json_t *d;
        json_object_foreach(json_object_get(schema, keys[i]), name, d)
        {
            snprintf(buf, sizeof buf, "%s%s", prefix, name);
            json_object_set(defs, buf, d);
        }
        json_object_del(schema, keys[i]);
    }
    snprintf(buf, sizeof buf, "%sroot", prefix);
    json_object_set(defs, buf, schema);
}

/* With tool_choice auto and a JSON response_format, the reply is either a
 * call of a tool or the final answer in the response's schema: one grammar
 * of both (each schema's $refs moved under a prefix of its own). */
static int call_or_answer(const cairn_api *api, const char *tools_json, json_t *answer,
                          bool several, cairn_gen_params *g, cairn_api_error *e)
{
    char *call_text = NULL;
    int rc = cairn_chat_tool_call_schema(api->chat_template, tools_json, several, &call_text);
    if (rc == CAIRN_ENOMEM)
        return api_oom(e);
    if (rc != CAIRN_OK)
        return api_fail(e, CAIRN_EINVAL, "tools", "the tools cannot be offered with "
                        "'response_format': %s", cairn_strerror(rc));
    json_t *call = json_loads(call_text, 0, NULL), *defs = json_object();
    free(call_text);
    json_t *both = call && defs && json_is_object(answer) ? json_pack("{s:[{s:s},{s:s}]}", "anyOf",
                                                                       "$ref", "#/$defs/call_root",
                                                                       "$ref", "#/$defs/answer_root")
                                                          : NULL;
    char *text = NULL;
    if (both) {
        prefix_refs(call, "call_");
        prefix_refs(answer, "answer_");
        move_defs(call, "call_", defs);
        move_defs(answer, "answer_", defs);
        json_object_set(both, "$defs", defs);
        text = json_dumps(both, JSON_COMPACT | JSON_PRESERVE_ORDER);
    }
    json_decref(both);
    json_decref(defs);
    json_decref(call);
    if (!text)
        return json_is_object(answer) ? api_oom(e)
                                      : api_fail(e, CAIRN_EINVAL, "response_format",
                                                 "'response_format' schema must be an object");
    cairn_grammar_free(g->grammar);
    g->grammar = NULL;
    return compile_grammar(g, text, "response_format", "invalid JSON schema", e);
}

/* tool_choice "required" or a named function: the reply is constrained,
 * like response_format, to a call of one of the tools (cairn_chat_tool_call_
 * schema); the reply parser reads it back as calls. A response_format is
 * for the final answer, which this turn is not: it waits for a later one. */
static int force_call(const cairn_api *api, const char *tools_json, bool several,
                      cairn_gen_params *g, cairn_api_error *e)
{
    cairn_grammar_free(g->grammar);
    g->grammar = NULL;
    char *schema = NULL;
    int rc = cairn_chat_tool_call_schema(api->chat_template, tools_json, several, &schema);
    if (rc == CAIRN_ENOMEM)
        return api_oom(e);
    if (rc != CAIRN_OK)
        return api_fail(e, CAIRN_EINVAL, "tools", "the tools cannot be forced: %s",
                        cairn_strerror(rc));
    return compile_grammar(g, schema, "tools", "the tools cannot be forced", e);
}

int api_tools(const cairn_api *api, const json_t *params, bool forcing, cairn_gen_params *g,
              char **render_json, cairn_api_error *e)
{
    *render_json = NULL;
    json_t *tools = api_field(params, "tools"), *choice = api_field(params, "tool_choice");
    if (!tools && !choice)
        return CAIRN_OK;
    char *tools_text = tools ? json_dumps(tools, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *choice_text = choice ? json_dumps(choice, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if ((tools && !tools_text) || (choice && !choice_text)) {
        free(tools_text);
        free(choice_text);
        return api_oom(e);
    }
    cairn_chat_tool_mode mode;
    char which[sizeof e->field_text] = "tools", msg[sizeof e->message] = "";
    int rc = cairn_chat_tools_select(tools_text, choice_text, render_json, &mode, which,
                                     sizeof which, msg, sizeof msg);
    free(tools_text);
    free(choice_text);
    if (rc == CAIRN_ENOMEM)
        return api_oom(e);
    if (rc != CAIRN_OK) {
        /* the field may name a tool (tools[I].function.parameters): kept
         * in the error itself */
        api_fail(e, CAIRN_EINVAL, NULL, "%s", msg);
        memcpy(e->field_text, which, sizeof which);
        e->field = e->field_text;
        return CAIRN_EINVAL;
    }
    /* several calls at once unless the client said parallel_tool_calls:
     * false; a named choice is one call */
    bool parallel = true;
    if ((rc = api_get_bool(params, "parallel_tool_calls", &parallel, e)))
        return rc;
    if (mode == CAIRN_TOOLS_AUTO && g->grammar && forcing) {
        /* tools first, then the answer in the response's format */
        json_t *answer = response_schema(params);
        rc = call_or_answer(api, *render_json, answer, parallel, g, e);
        json_decref(answer);
        return rc;
    }
    if (mode != CAIRN_TOOLS_REQUIRED && mode != CAIRN_TOOLS_NAMED)
        return CAIRN_OK;
    if (!forcing)
        return api_fail(e, CAIRN_EINVAL, "tool_choice",
                        "a required or named 'tool_choice' goes with a request that generates");
    return force_call(api, *render_json, mode == CAIRN_TOOLS_REQUIRED && parallel, g, e);
}
