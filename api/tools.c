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

/* tool_choice "required" or a named function: the reply is constrained,
 * like response_format, to a call of one of the tools (cairn_chat_tool_call_
 * schema); the reply parser reads it back as calls. */
static int force_call(const cairn_api *api, const char *tools_json, bool several,
                      cairn_gen_params *g, cairn_api_error *e)
{
    if (g->grammar)
        return api_fail(e, CAIRN_EINVAL, "tool_choice", "a required or named 'tool_choice' "
                        "cannot be combined with a JSON 'response_format'");
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
    if (mode != CAIRN_TOOLS_REQUIRED && mode != CAIRN_TOOLS_NAMED)
        return CAIRN_OK;
    if (!forcing)
        return api_fail(e, CAIRN_EINVAL, "tool_choice",
                        "a required or named 'tool_choice' goes with a request that generates");
    /* "required" may answer several calls at once unless the client said
     * parallel_tool_calls: false; a named choice is one call */
    bool parallel = true;
    if ((rc = api_get_bool(params, "parallel_tool_calls", &parallel, e)))
        return rc;
    return force_call(api, *render_json, mode == CAIRN_TOOLS_REQUIRED && parallel, g, e);
}
