/*
 * cli/main.c — the `cairn` executable: dispatch to a subcommand.
 */
#include "cli/cli.h"

#include <string.h>

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"run", cmd_run, "generate a continuation of a prompt"},
    {"chat", cmd_chat, "chat with a model in the terminal (its chat template, streamed)"},
    {"tokenize", cmd_tokenize, "print the token ids of text read from stdin"},
    {"chat-format", cmd_chat_format, "print a conversation formatted with the model's chat template"},
    {"perplexity", cmd_perplexity, "perplexity of a text file, as llama-perplexity computes it"},
    {"bench", cmd_bench, "prompt and generation speed in tokens/s, like llama-bench"},
    {"serve", cmd_serve, "serve the msgpack-RPC protocol on TCP and/or a Unix socket"},
    {"route", cmd_route, "route requests to replicas by their cached prefixes (scale-out)"},
    {"cache", cmd_cache, "cache explain: why a prompt would not be served from a server's cache"},
};

static void usage(FILE *to)
{
    fprintf(to, "usage: cairn COMMAND [options]   (cairn COMMAND --help for its options)\n\n"
                "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(to, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(to, "\ncairn %s — an inference engine that never computes a prompt prefix twice.\n",
            CAIRN_VERSION);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("cairn %s\n", CAIRN_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "cairn: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
