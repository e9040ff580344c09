/*
 * cli/cmd_chat_format.c — `cairn chat-format`: render a conversation with a
 * model's chat template and print exactly the text (no newline added), so it
 * can be compared byte for byte with a reference rendering. Needs only the
 * GGUF metadata; weights are never loaded.
 */
#include "ckpt/ckpt.h"
#include "cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: cairn chat-format -m MODEL --messages FILE.json [--tools FILE.json]\n"
    "                         [--no-generation-prompt] [--no-thinking]\n\n"
    "Formats a conversation with the model's chat template (tokenizer.chat_template)\n"
    "and prints the text to stdout exactly, without a trailing newline. A leading\n"
    "BOS the template writes is left out (tokenization adds it).\n\n"
    "  -m, --model PATH            GGUF file or checkpoint folder (only metadata is used)\n"
    "      --messages FILE         JSON array of OpenAI-style messages: {role, content,\n"
    "                              tool_calls?, tool_call_id?, name?,\n"
    "                              reasoning_content?} (\"-\" = stdin)\n"
    "      --tools FILE            JSON array of OpenAI tools [{type, function}]\n"
    "      --no-generation-prompt  do not open an assistant turn at the end\n"
    "      --no-thinking           answer without reasoning (enable_thinking=false)\n"
    "      --family                print the recognised template family to stderr\n"
    "  -h, --help                  this help\n";

/* The string value of `key` in `obj`, NULL when absent or null. *bad is set
 * when present with another type. */
static const char *opt_string(json_t *obj, const char *key, bool *bad)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return NULL;
    if (!json_is_string(v)) {
        *bad = true;
        return NULL;
    }
    return json_string_value(v);
}

static json_t *load_json(const char *path, const char *what)
{
    size_t len = 0;
    char *text = cli_read_file(path, &len);
    if (!text) {
        fprintf(stderr, "cairn chat-format: cannot read %s '%s': %s\n", what, path,
                strerror(errno));
        return NULL;
    }
    json_error_t jerr;
    json_t *j = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!j) {
        fprintf(stderr, "cairn chat-format: %s '%s': line %d: %s\n", what, path, jerr.line,
                jerr.text);
        return NULL;
    }
    if (!json_is_array(j)) {
        fprintf(stderr, "cairn chat-format: %s '%s' must hold a JSON array\n", what, path);
        json_decref(j);
        return NULL;
    }
    return j;
}

int cmd_chat_format(int argc, char **argv)
{
    const char *model_path = CLI_DEFAULT_MODEL;
    const char *messages_path = NULL, *tools_path = NULL;
    bool gen_prompt = true, show_family = false, no_thinking = false;
    static const struct option longopts[] = {
        CLI_MODEL_PATH_LONGOPT,
        {"messages", required_argument, 0, 1},
        {"tools", required_argument, 0, 2},
        {"no-generation-prompt", no_argument, 0, 3},
        {"family", no_argument, 0, 4},
        {"no-thinking", no_argument, 0, 5},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm': model_path = optarg; break;
        case 1: messages_path = optarg; break;
        case 2: tools_path = optarg; break;
        case 3: gen_prompt = false; break;
        case 4: show_family = true; break;
        case 5: no_thinking = true; break;
        default: return cli_help_or_usage(opt, help);
        }
    }
    int status = cli_no_operands("cairn chat-format", argc, argv);
    if (status != CLI_PROCEED)
        return status;
    if (!messages_path) {
        fprintf(stderr, "cairn chat-format: --messages FILE is required\n");
        return 2;
    }

    status = 1;
    char err[512] = "";
    cairn_gguf *g = NULL;
    cairn_vocab *v = NULL;
    cairn_chat_template *tmpl = NULL;
    json_t *messages = NULL, *tools = NULL;
    cairn_chat_message *msgs = NULL;
    char **calls_text = NULL, *tools_text = NULL, *out = NULL;
    size_t n = 0;

    int rc = cairn_ckpt_open(model_path, &g, err, sizeof err);
    if (rc == CAIRN_OK)
        rc = cairn_vocab_load(g, &v, err, sizeof err);
    if (rc == CAIRN_OK)
        rc = cairn_chat_template_from_gguf(g, v, &tmpl);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn chat-format: %s\n", err[0] ? err : cairn_strerror(rc));
        goto done;
    }
    if (show_family)
        fprintf(stderr, "%s\n", cairn_chat_family_name(cairn_chat_template_family(tmpl)));
    if (!(messages = load_json(messages_path, "messages")))
        goto done;
    if (tools_path) {
        if (!(tools = load_json(tools_path, "tools")))
            goto done;
        tools_text = json_dumps(tools, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!tools_text)
            goto oom;
    }
    n = json_array_size(messages);
    msgs = calloc(n ? n : 1, sizeof *msgs);
    calls_text = calloc(n ? n : 1, sizeof *calls_text);
    if (!msgs || !calls_text)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(messages, i);
        bool bad = !json_is_object(m);
        msgs[i].role = opt_string(m, "role", &bad);
        msgs[i].content = opt_string(m, "content", &bad);
        msgs[i].tool_call_id = opt_string(m, "tool_call_id", &bad);
        msgs[i].name = opt_string(m, "name", &bad);
        msgs[i].reasoning_content = opt_string(m, "reasoning_content", &bad);
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls)) {
            if (!(calls_text[i] = json_dumps(calls, JSON_COMPACT | JSON_PRESERVE_ORDER)))
                goto oom;
            msgs[i].tool_calls_json = calls_text[i];
        }
        if (bad || !msgs[i].role) {
            fprintf(stderr, "cairn chat-format: message %zu needs a string role and string "
                            "fields\n", i);
            goto done;
        }
    }
    size_t len = 0;
    rc = cairn_chat_format_flags(tmpl, msgs, n, tools_text,
                                 (gen_prompt ? CAIRN_CHAT_GENERATION_PROMPT : 0) |
                                     (no_thinking ? CAIRN_CHAT_NO_THINKING : 0),
                                 &out, &len);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn chat-format: cannot format: %s\n", cairn_strerror(rc));
        goto done;
    }
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) {
        fprintf(stderr, "cairn chat-format: write failed\n");
        goto done;
    }
    status = 0;
    goto done;
oom:
    fprintf(stderr, "cairn chat-format: out of memory\n");
done:
    for (size_t i = 0; calls_text && i < n; i++)
        free(calls_text[i]);
    free(calls_text);
    free(msgs);
    free(out);
    free(tools_text);
    json_decref(messages);
    json_decref(tools);
    cairn_chat_template_free(tmpl);
    cairn_vocab_free(v);
    cairn_gguf_close(g);
    return status;
}
