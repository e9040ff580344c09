/*
 * ckpt/ckpt.c — a checkpoint folder as one cairn_gguf (ckpt/ckpt.h).
 */
#include "ckpt/ckpt_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* config.json and friends are small; a tokenizer.json is a few MB. */
#define CKPT_MAX_JSON (256u << 20)

bool cairn_ckpt_is_folder(const char *path)
{
    struct stat st;
    if (!path || stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return false;
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    return stat(cfg, &st) == 0;
}

int ckpt_read_json(const char *dir, const char *name, bool optional, json_t **out, char *err,
                   size_t err_len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return optional ? CAIRN_ENOTFOUND
                            : cairn_errorf(err, err_len, CAIRN_ENOTFOUND, "%s: no %s", dir, name);
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot open %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > CKPT_MAX_JSON) {
        fclose(f);
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s is not a regular file of at most %u MB",
                            path, CKPT_MAX_JSON >> 20);
    }
    json_error_t je;
    json_t *j = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    if (!j)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)",
                            name, je.text, je.line, je.column);
    if (!json_is_object(j)) {
        json_decref(j);
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: not a JSON object", name);
    }
    *out = j;
    return CAIRN_OK;
}

const char *const cairn_ckpt_generation_keys[CAIRN_CKPT_N_GENERATION] = {
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty"};

int64_t ckpt_json_id(json_t *o, const char *key, int which)
{
    json_t *v = json_object_get(o, key);
    if (json_is_array(v))
        v = json_array_get(v, (size_t)which);
    else if (which > 0)
        v = NULL;
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static int open_folder(const char *dir, cairn_gguf **out, char *err, size_t err_len)
{
    const double t0 = cairn_now();
    cairn_gguf_builder *b = NULL;
    st_set *st = NULL;
    ckpt_config cfg;
    int rc = cairn_gguf_builder_new(&b);
    if (rc == CAIRN_OK)
        rc = ckpt_config_read(dir, &cfg, b, err, err_len);
    if (rc == CAIRN_OK)
        rc = ckpt_tokenizer_read(dir, &cfg, b, err, err_len);
    if (rc == CAIRN_OK)
        rc = st_open_dir(dir, &st, err, err_len);
    if (rc == CAIRN_OK)
        rc = ckpt_weights_add(st, &cfg, b, err, err_len);
    /* the mappings live as long as the handle: the tensors point into them */
    if (rc == CAIRN_OK)
        rc = st_keep_maps(st, b);
    st_close(st);
    if (rc != CAIRN_OK) {
        if (rc == CAIRN_ENOMEM && err && !err[0])
            cairn_errorf(err, err_len, rc, "out of memory");
        cairn_gguf_builder_free(b);
        return rc;
    }
    rc = cairn_gguf_builder_finish(b, out, err, err_len);
    if (rc == CAIRN_OK)
        cairn_log(CAIRN_LOG_INFO, "ckpt: %s read as %s in %.2f s", dir, cfg.arch, cairn_now() - t0);
    return rc;
}

int cairn_ckpt_open(const char *path, cairn_gguf **out, char *err, size_t err_len)
{
    if (!path || !out)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "invalid argument");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if (!cairn_ckpt_is_folder(path))
            return cairn_errorf(err, err_len, CAIRN_ENOTFOUND,
                                "%s is a directory without config.json: not a checkpoint folder",
                                path);
        if (err && err_len)
            err[0] = '\0';
        /* "./Qwen2.5-7B-Instruct-AWQ/": the folder without its trailing slashes */
        char dir[4096];
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/')
            n--;
        if (n >= sizeof dir)
            return cairn_errorf(err, err_len, CAIRN_EINVAL, "path too long");
        memcpy(dir, path, n);
        dir[n] = '\0';
        char msg[512] = "";
        int rc = open_folder(dir, out, msg, sizeof msg);
        if (rc != CAIRN_OK)
            cairn_errorf(err, err_len, rc, "%s: %s", dir, msg[0] ? msg : cairn_strerror(rc));
        return rc;
    }
    return cairn_gguf_open(path, out, err, err_len);
}
