/*
 * cli/cmd_tokenize.c — `cairn tokenize`: UTF-8 text on stdin, token ids on
 * stdout, space-separated on one line. Needs only the vocabulary, so it works
 * on vocab-only GGUF files and never loads weights.
 */
#include "ckpt/ckpt.h"
#include "cli/cli.h"

#include <getopt.h>
#include <stdlib.h>

static const char help[] =
    "usage: cairn tokenize -m MODEL [--no-bos] [--parse-special] < text\n\n"
    "Reads UTF-8 text from stdin and prints its token ids, space-separated, on one line.\n\n"
    "  -m, --model PATH     GGUF file or checkpoint folder with a vocabulary\n"
    "      --no-bos         do not prepend BOS even if the model asks for it\n"
    "      --parse-special  recognise special-token text such as <s> or <|im_start|>\n"
    "  -h, --help           this help\n";

int cmd_tokenize(int argc, char **argv)
{
    const char *model_path = CLI_DEFAULT_MODEL;
    bool no_bos = false, parse_special = false;
    static const struct option longopts[] = {
        CLI_MODEL_PATH_LONGOPT,
        {"no-bos", no_argument, 0, 1},
        {"parse-special", no_argument, 0, 2},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm': model_path = optarg; break;
        case 1: no_bos = true; break;
        case 2: parse_special = true; break;
        default: return cli_help_or_usage(opt, help);
        }
    }
    int status = cli_no_operands("cairn tokenize", argc, argv);
    if (status != CLI_PROCEED)
        return status;

    char err[512] = "";
    cairn_gguf *g = NULL;
    cairn_vocab *v = NULL;
    int rc = cairn_ckpt_open(model_path, &g, err, sizeof err);
    if (rc == CAIRN_OK)
        rc = cairn_vocab_load(g, &v, err, sizeof err);
    cairn_gguf_close(g);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn tokenize: %s\n", err[0] ? err : cairn_strerror(rc));
        return 1;
    }
    size_t len = 0;
    char *text = cli_read_file("-", &len);
    if (!text) {
        fprintf(stderr, "cairn tokenize: cannot read stdin\n");
        cairn_vocab_free(v);
        return 1;
    }
    int flags = (no_bos || !cairn_vocab_add_bos(v) ? 0 : CAIRN_TOK_ADD_BOS) |
                (parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0);
    int32_t *ids = NULL;
    size_t n = 0;
    rc = cli_tokenize_alloc(v, text, len, flags, &ids, &n);
    if (rc == CAIRN_OK) {
        for (size_t i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    } else {
        fprintf(stderr, "cairn tokenize: %s\n", cairn_strerror(rc));
    }
    free(ids);
    free(text);
    cairn_vocab_free(v);
    return rc == CAIRN_OK ? 0 : 1;
}
