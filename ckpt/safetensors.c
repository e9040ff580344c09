/*
 * ckpt/safetensors.c — the .safetensors files of a checkpoint folder.
 *
 * A file is
 *
 *     [u64 N, little-endian] [N bytes of JSON header] [data]
 *
 * and the header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end]} with offsets from the start of the data, plus an optional
 * "__metadata__" object of strings. Everything in it comes from the file,
 * so every number is checked before it is used: N against the file size
 * (and a cap), each dtype against the known ones, each shape's byte size
 * against its extent, every extent inside the data, no two overlapping.
 */
#include "ckpt/ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Far above any real header (a 70B model's is ~100 KB). */
#define ST_MAX_HEADER (100u << 20)
#define ST_MAX_FILES 4096

typedef struct {
    char *name;      /* file name inside the folder */
    void *map;
    size_t size;
} st_file;

struct st_set {
    st_file *files;
    int n_files;
    st_tensor *tensors; /* sorted by name */
    int n_tensors;
    char **names;       /* storage of tensor names */
};

static const struct {
    const char *name;
    size_t size;
} DTYPES[] = {
    [ST_BOOL] = {"BOOL", 1},  [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},    [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},  [ST_I32] = {"I32", 4},   [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},    [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},    [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

size_t st_dtype_size(st_dtype t) { return DTYPES[t].size; }
const char *st_dtype_name(st_dtype t) { return DTYPES[t].name; }

static int parse_dtype(const char *s, st_dtype *out)
{
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (strcmp(s, DTYPES[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    return -1;
}

static void unmap_block(void *ptr, size_t size)
{
    if (ptr)
        munmap(ptr, size);
}

void st_close(st_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_files; i++) {
        unmap_block(s->files[i].map, s->files[i].size);
        free(s->files[i].name);
    }
    for (int i = 0; i < s->n_tensors; i++)
        free(s->names[i]);
    free(s->names);
    free(s->files);
    free(s->tensors);
    free(s);
}

int st_keep_maps(st_set *s, cairn_gguf_builder *b)
{
    for (int i = 0; i < s->n_files; i++) {
        if (!s->files[i].map)
            continue;
        int rc = cairn_gguf_builder_keep(
            b, (cairn_gguf_keep){s->files[i].map, s->files[i].size, unmap_block});
        s->files[i].map = NULL; /* the builder releases it, whatever rc */
        if (rc)
            return rc;
    }
    return CAIRN_OK;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

const st_tensor *st_find(const st_set *s, const char *name)
{
    st_tensor key = {.name = name};
    return bsearch(&key, s->tensors, (size_t)s->n_tensors, sizeof key, cmp_tensor);
}

int st_count(const st_set *s) { return s->n_tensors; }
const st_tensor *st_at(const st_set *s, int i) { return &s->tensors[i]; }

typedef struct {
    uint64_t begin, end;
    int index;
} st_extent;

static int cmp_extent(const void *a, const void *b)
{
    const st_extent *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* One header entry into t; its extent into *ext. */
static int parse_entry(const char *file, const char *name, json_t *v, const uint8_t *data,
                       uint64_t data_size, st_tensor *t, st_extent *ext, char *err,
                       size_t err_len)
{
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) ||
        !json_is_array(off) || json_array_size(off) != 2)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "%s: tensor '%s' needs dtype, shape and data_offsets [begin, end]",
                            file, name);
    if (parse_dtype(json_string_value(dt), &t->dtype))
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED, "%s: tensor '%s' has dtype '%s'",
                            file, name, json_string_value(dt));
    const size_t nd = json_array_size(shape);
    if (nd > 4)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s: tensor '%s' has %zu dimensions (at most 4)", file, name, nd);
    t->n_dims = (int)nd;
    uint64_t elems = 1;
    for (size_t d = 0; d < 4; d++) {
        t->shape[d] = 1;
        if (d >= nd)
            continue;
        json_t *e = json_array_get(shape, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) > ((int64_t)1 << 40))
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "%s: tensor '%s' has an invalid shape", file, name);
        t->shape[d] = json_integer_value(e);
        if (t->shape[d] && elems > (UINT64_C(1) << 50) / (uint64_t)t->shape[d])
            return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: tensor '%s' is too large", file,
                                name);
        elems *= (uint64_t)t->shape[d];
    }
    json_t *b0 = json_array_get(off, 0), *b1 = json_array_get(off, 1);
    if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 ||
        json_integer_value(b1) < json_integer_value(b0))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: tensor '%s' has invalid data_offsets",
                            file, name);
    const uint64_t begin = (uint64_t)json_integer_value(b0), end = (uint64_t)json_integer_value(b1);
    if (end > data_size)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "%s: tensor '%s' data [%llu, %llu) runs past the end of the file "
                            "(%llu data bytes; truncated?)",
                            file, name, (unsigned long long)begin, (unsigned long long)end,
                            (unsigned long long)data_size);
    if (end - begin != elems * st_dtype_size(t->dtype))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "%s: tensor '%s' is %llu bytes, but %s of %llu elements needs %llu",
                            file, name, (unsigned long long)(end - begin),
                            st_dtype_name(t->dtype), (unsigned long long)elems,
                            (unsigned long long)(elems * st_dtype_size(t->dtype)));
    t->n_elems = (int64_t)elems;
    t->data = data + begin;
    t->size = (size_t)(end - begin);
    *ext = (st_extent){begin, end, 0};
    return CAIRN_OK;
}

/* Map dir/name and append its tensors to s. */
static int open_file(st_set *s, const char *dir, const char *name, char *err, size_t err_len)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
        strchr(name, '/') || strcmp(name, "..") == 0)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "bad weight file name '%s'", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cairn_errorf(err, err_len, errno == ENOENT ? CAIRN_ENOTFOUND : CAIRN_EIO,
                            "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cairn_errorf(err, err_len, CAIRN_EIO, "%s is not a readable file", path);
    }
    const size_t size = (size_t)st.st_size;
    if (size < 8) {
        close(fd);
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "%s: truncated (%zu bytes, no safetensors header)", name, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot map %s: %s", path, strerror(errno));
    st_file *files = realloc(s->files, (size_t)(s->n_files + 1) * sizeof *files);
    if (!files) {
        munmap(map, size);
        return CAIRN_ENOMEM;
    }
    s->files = files;
    st_file *f = &s->files[s->n_files++];
    *f = (st_file){strdup(name), map, size};
    if (!f->name)
        return CAIRN_ENOMEM;

    const uint8_t *p = map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | p[i];
    if (n > size - 8 || n > ST_MAX_HEADER || n < 2)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "%s: header length %llu does not fit the file (%zu bytes): not a "
                            "safetensors file, or truncated", name, (unsigned long long)n, size);
    json_error_t je;
    json_t *hdr = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(hdr)) {
        json_decref(hdr);
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "%s: the header is not a JSON object (%s at byte %d)", name,
                            hdr ? "not an object" : je.text, je.position);
    }
    const uint8_t *data = p + 8 + n;
    const uint64_t data_size = size - 8 - n;
    size_t count = json_object_size(hdr);
    st_tensor *ts = realloc(s->tensors, (size_t)(s->n_tensors + count) * sizeof *ts);
    char **names = realloc(s->names, (size_t)(s->n_tensors + count) * sizeof *names);
    st_extent *ext = calloc(count ? count : 1, sizeof *ext);
    if (ts)
        s->tensors = ts;
    if (names)
        s->names = names;
    int rc = ts && names && ext ? CAIRN_OK : CAIRN_ENOMEM;
    const char *key;
    json_t *v;
    int n_ext = 0;
    json_object_foreach(hdr, key, v)
    {
        if (rc)
            break;
        if (strcmp(key, "__metadata__") == 0)
            continue;
        st_tensor *t = &s->tensors[s->n_tensors];
        memset(t, 0, sizeof *t);
        if ((rc = parse_entry(name, key, v, data, data_size, t, &ext[n_ext], err, err_len)))
            break;
        if (!(s->names[s->n_tensors] = strdup(key))) {
            rc = CAIRN_ENOMEM;
            break;
        }
        t->name = s->names[s->n_tensors];
        t->file = f->name;
        ext[n_ext].index = s->n_tensors;
        n_ext++;
        s->n_tensors++;
    }
    if (rc == CAIRN_OK) {
        qsort(ext, (size_t)n_ext, sizeof *ext, cmp_extent);
        for (int i = 1; i < n_ext; i++)
            if (ext[i].begin < ext[i - 1].end && ext[i].end > ext[i].begin &&
                ext[i - 1].end > ext[i - 1].begin) {
                rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                  "%s: tensors '%s' and '%s' overlap", name,
                                  s->tensors[ext[i - 1].index].name, s->tensors[ext[i].index].name);
                break;
            }
    }
    free(ext);
    json_decref(hdr);
    return rc;
}

/* The shard names of an index, each once, in first-seen order. */
static int open_index(st_set *s, const char *dir, json_t *index, char *err, size_t err_len)
{
    json_t *map = json_object_get(index, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "model.safetensors.index.json: no weight_map object");
    const char *key;
    json_t *v;
    json_t *seen = json_object();
    int rc = seen ? CAIRN_OK : CAIRN_ENOMEM;
    json_object_foreach(map, key, v)
    {
        if (rc)
            break;
        if (!json_is_string(v)) {
            rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                              "model.safetensors.index.json: weight_map['%s'] is not a file name",
                              key);
            break;
        }
        const char *file = json_string_value(v);
        if (json_object_get(seen, file))
            continue;
        if (json_object_size(seen) >= ST_MAX_FILES) {
            rc = cairn_errorf(err, err_len, CAIRN_EFORMAT, "more than %d shards", ST_MAX_FILES);
            break;
        }
        json_object_set_new(seen, file, json_true());
        rc = open_file(s, dir, file, err, err_len);
    }
    json_decref(seen);
    return rc;
}

/* Every name the index promises must be in the shard it names (after the
 * tensors are sorted, so st_find can look them up). */
static int check_index(const st_set *s, json_t *index, char *err, size_t err_len)
{
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(index, "weight_map"), key, v)
    {
        const st_tensor *t = st_find(s, key);
        if (!t || strcmp(t->file, json_string_value(v)) != 0)
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "model.safetensors.index.json names '%s' in %s, which does not "
                                "hold it", key, json_string_value(v));
    }
    return CAIRN_OK;
}

int st_open_dir(const char *dir, st_set **out, char *err, size_t err_len)
{
    st_set *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    json_t *index = NULL;
    int rc = ckpt_read_json(dir, "model.safetensors.index.json", true, &index, err, err_len);
    if (rc == CAIRN_OK) {
        rc = open_index(s, dir, index, err, err_len);
    } else if (rc == CAIRN_ENOTFOUND) {
        /* model.safetensors, else the folder's one .safetensors file */
        char path[4096];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) == 0) {
            rc = open_file(s, dir, "model.safetensors", err, err_len);
        } else {
            DIR *d = opendir(dir);
            char *only = NULL;
            int n = 0;
            for (struct dirent *e; d && (e = readdir(d));) {
                const size_t len = strlen(e->d_name);
                if (len > 12 && strcmp(e->d_name + len - 12, ".safetensors") == 0 && n++ == 0)
                    only = strdup(e->d_name);
            }
            if (d)
                closedir(d);
            if (n == 1 && only)
                rc = open_file(s, dir, only, err, err_len);
            else
                rc = cairn_errorf(err, err_len, n ? CAIRN_EFORMAT : CAIRN_ENOTFOUND,
                                  n ? "%s: %d .safetensors files but no "
                                      "model.safetensors.index.json saying which to use"
                                    : "%s: no model.safetensors (or index) in the folder",
                                  dir, n);
            free(only);
        }
    }
    if (rc == CAIRN_OK) {
        qsort(s->tensors, (size_t)s->n_tensors, sizeof *s->tensors, cmp_tensor);
        for (int i = 1; i < s->n_tensors; i++)
            if (strcmp(s->tensors[i - 1].name, s->tensors[i].name) == 0) {
                rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                  "tensor '%s' appears twice (%s and %s)", s->tensors[i].name,
                                  s->tensors[i - 1].file, s->tensors[i].file);
                break;
            }
    }
    if (rc == CAIRN_OK && index)
        rc = check_index(s, index, err, err_len);
    json_decref(index);
    if (rc) {
        if (rc == CAIRN_ENOMEM)
            cairn_errorf(err, err_len, rc, "out of memory reading the safetensors headers");
        st_close(s);
        return rc;
    }
    *out = s;
    return CAIRN_OK;
}
