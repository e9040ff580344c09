/*
 * gguf/gguf_build.c — assembling a cairn_gguf in memory (gguf.h, "Building
 * a GGUF in memory"): the metadata and tensor infos are serialised as a GGUF
 * v3 image exactly as a writer would put them in a file, then opened by the
 * parser in gguf.c, which points the tensors at the caller's data instead of
 * at a data section.
 */
#include "gguf/gguf_impl.h"

#include <stdlib.h>
#include <string.h>

#define BUILD_ALIGNMENT 32 /* GGUF's default; offsets are only bookkeeping here */

typedef struct {
    char *name;
    cairn_type type;
    int n_dims;
    int64_t ne[4];
    const void *data;
    uint64_t offset, size;
} built_tensor;

struct cairn_gguf_builder {
    cairn_strbuf kv; /* the serialised key-value pairs */
    uint64_t n_kv;
    built_tensor *tensors;
    int n_tensors, cap_tensors;
    cairn_gguf_keep *keep;
    int n_keep, cap_keep;
    uint64_t data_extent;
    int status; /* the first failure, sticky */
};

int cairn_gguf_builder_new(cairn_gguf_builder **out)
{
    if (!out)
        return CAIRN_EINVAL;
    *out = calloc(1, sizeof **out);
    return *out ? CAIRN_OK : CAIRN_ENOMEM;
}

void cairn_gguf_builder_free(cairn_gguf_builder *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->n_keep; i++)
        b->keep[i].release(b->keep[i].ptr, b->keep[i].size);
    for (int i = 0; i < b->n_tensors; i++)
        free(b->tensors[i].name);
    free(b->tensors);
    free(b->keep);
    cairn_strbuf_free(&b->kv);
    free(b);
}

static int fail(cairn_gguf_builder *b, int status)
{
    if (b && b->status == CAIRN_OK)
        b->status = status;
    return status;
}

static void put(cairn_gguf_builder *b, const void *p, size_t n) { cairn_strbuf_add(&b->kv, p, n); }
static void put_u32(cairn_gguf_builder *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(cairn_gguf_builder *b, uint64_t v) { put(b, &v, 8); }
static void put_str(cairn_gguf_builder *b, const char *s, size_t n)
{
    put_u64(b, n);
    put(b, s, n);
}

/* The key and value type of one pair; 0 when the key is acceptable. */
static int begin_kv(cairn_gguf_builder *b, const char *key, cairn_gguf_vtype type)
{
    if (!b)
        return CAIRN_EINVAL;
    if (b->status)
        return b->status;
    if (!key || !key[0] || strlen(key) > 65535)
        return fail(b, CAIRN_EINVAL);
    put_str(b, key, strlen(key));
    put_u32(b, (uint32_t)type);
    b->n_kv++;
    return CAIRN_OK;
}

static int end_kv(cairn_gguf_builder *b) { return b->kv.oom ? fail(b, CAIRN_ENOMEM) : CAIRN_OK; }

int cairn_gguf_builder_set_str(cairn_gguf_builder *b, const char *key, const char *str)
{
    if (!str)
        return fail(b, CAIRN_EINVAL);
    int rc = begin_kv(b, key, CAIRN_GGUF_STRING);
    if (rc)
        return rc;
    put_str(b, str, strlen(str));
    return end_kv(b);
}

/* One scalar pair: the value's bytes as stored (little-endian). */
static int set_scalar(cairn_gguf_builder *b, const char *key, cairn_gguf_vtype type,
                      const void *v)
{
    int rc = begin_kv(b, key, type);
    if (rc)
        return rc;
    put(b, v, gguf_scalar_size((uint32_t)type));
    return end_kv(b);
}

int cairn_gguf_builder_set_u32(cairn_gguf_builder *b, const char *key, uint32_t v)
{
    return set_scalar(b, key, CAIRN_GGUF_UINT32, &v);
}

int cairn_gguf_builder_set_i32(cairn_gguf_builder *b, const char *key, int32_t v)
{
    return set_scalar(b, key, CAIRN_GGUF_INT32, &v);
}

int cairn_gguf_builder_set_f32(cairn_gguf_builder *b, const char *key, float v)
{
    return set_scalar(b, key, CAIRN_GGUF_FLOAT32, &v);
}

int cairn_gguf_builder_set_bool(cairn_gguf_builder *b, const char *key, bool v)
{
    const uint8_t byte = v ? 1 : 0;
    return set_scalar(b, key, CAIRN_GGUF_BOOL, &byte);
}

int cairn_gguf_builder_set_arr_str(cairn_gguf_builder *b, const char *key, const char *const *strs,
                                   const size_t *lens, uint64_t n)
{
    if (!strs && n)
        return fail(b, CAIRN_EINVAL);
    int rc = begin_kv(b, key, CAIRN_GGUF_ARRAY);
    if (rc)
        return rc;
    put_u32(b, CAIRN_GGUF_STRING);
    put_u64(b, n);
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i])
            return fail(b, CAIRN_EINVAL);
        put_str(b, strs[i], lens ? lens[i] : strlen(strs[i]));
    }
    return end_kv(b);
}

int cairn_gguf_builder_set_arr(cairn_gguf_builder *b, const char *key, cairn_gguf_vtype elem_type,
                               const void *data, uint64_t n)
{
    const size_t es = gguf_scalar_size((uint32_t)elem_type);
    if (!es || (!data && n) || n > SIZE_MAX / es)
        return fail(b, CAIRN_EINVAL);
    int rc = begin_kv(b, key, CAIRN_GGUF_ARRAY);
    if (rc)
        return rc;
    put_u32(b, (uint32_t)elem_type);
    put_u64(b, n);
    put(b, data, (size_t)n * es);
    return end_kv(b);
}

int cairn_gguf_builder_add_tensor(cairn_gguf_builder *b, const char *name, cairn_type type,
                                  int n_dims, const int64_t *ne, const void *data)
{
    if (!b)
        return CAIRN_EINVAL;
    if (b->status)
        return b->status;
    const cairn_type_traits *tr = cairn_type_get(type);
    if (!name || !name[0] || strlen(name) > 255 || !tr || n_dims < 1 || n_dims > 4 || !ne || !data)
        return fail(b, CAIRN_EINVAL);
    uint64_t elems = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || (uint64_t)ne[d] > (UINT64_MAX >> 1) / elems)
            return fail(b, CAIRN_EINVAL);
        elems *= (uint64_t)ne[d];
    }
    const size_t row = cairn_type_row_bytes(type, ne[0]);
    if (!row)
        return fail(b, CAIRN_EINVAL);
    if (b->n_tensors == b->cap_tensors) {
        const int cap = b->cap_tensors ? 2 * b->cap_tensors : 64;
        built_tensor *t = realloc(b->tensors, (size_t)cap * sizeof *t);
        if (!t)
            return fail(b, CAIRN_ENOMEM);
        b->tensors = t;
        b->cap_tensors = cap;
    }
    built_tensor *t = &b->tensors[b->n_tensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return fail(b, CAIRN_ENOMEM);
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < 4; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->data = data;
    t->size = (uint64_t)row * (elems / (uint64_t)ne[0]);
    t->offset = b->data_extent;
    b->data_extent += (t->size + BUILD_ALIGNMENT - 1) / BUILD_ALIGNMENT * BUILD_ALIGNMENT;
    b->n_tensors++;
    return CAIRN_OK;
}

int cairn_gguf_builder_keep(cairn_gguf_builder *b, cairn_gguf_keep block)
{
    if (!b || !block.release)
        return CAIRN_EINVAL;
    if (b->n_keep == b->cap_keep) {
        const int cap = b->cap_keep ? 2 * b->cap_keep : 16;
        cairn_gguf_keep *k = realloc(b->keep, (size_t)cap * sizeof *k);
        if (!k) {
            /* it is still released: the caller handed it over */
            block.release(block.ptr, block.size);
            return fail(b, CAIRN_ENOMEM);
        }
        b->keep = k;
        b->cap_keep = cap;
    }
    b->keep[b->n_keep++] = block;
    return CAIRN_OK;
}

int cairn_gguf_builder_finish(cairn_gguf_builder *b, cairn_gguf **out, char *err, size_t err_len)
{
    if (!b || !out) {
        cairn_gguf_builder_free(b);
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "invalid argument");
    }
    if (b->status) {
        const int rc = b->status;
        cairn_gguf_builder_free(b);
        return cairn_errorf(err, err_len, rc, "building the model description failed: %s",
                            cairn_strerror(rc));
    }
    cairn_strbuf img = {0};
    cairn_strbuf_add(&img, "GGUF", 4);
    const uint32_t version = 3;
    const uint64_t n_tensors = (uint64_t)b->n_tensors;
    cairn_strbuf_add(&img, &version, 4);
    cairn_strbuf_add(&img, &n_tensors, 8);
    cairn_strbuf_add(&img, &b->n_kv, 8);
    cairn_strbuf_add(&img, b->kv.data, b->kv.len);
    for (int i = 0; i < b->n_tensors; i++) {
        const built_tensor *t = &b->tensors[i];
        const uint64_t nlen = strlen(t->name);
        const uint32_t nd = (uint32_t)t->n_dims, type = (uint32_t)t->type;
        cairn_strbuf_add(&img, &nlen, 8);
        cairn_strbuf_add(&img, t->name, nlen);
        cairn_strbuf_add(&img, &nd, 4);
        for (int d = 0; d < t->n_dims; d++)
            cairn_strbuf_add(&img, &t->ne[d], 8);
        cairn_strbuf_add(&img, &type, 4);
        cairn_strbuf_add(&img, &t->offset, 8);
    }
    const void **data = malloc((b->n_tensors ? (size_t)b->n_tensors : 1) * sizeof *data);
    if (img.oom || !data) {
        free(data);
        cairn_strbuf_free(&img);
        cairn_gguf_builder_free(b);
        return cairn_errorf(err, err_len, CAIRN_ENOMEM, "out of memory");
    }
    for (int i = 0; i < b->n_tensors; i++)
        data[i] = b->tensors[i].data;
    int rc = gguf_open_built(img.data, img.len, data, b->data_extent, b->keep, b->n_keep, out, err,
                             err_len);
    free(data);
    if (rc != CAIRN_OK) {
        cairn_strbuf_free(&img);
    } else {
        b->keep = NULL; /* the handle owns them now */
        b->n_keep = 0;
    }
    cairn_gguf_builder_free(b);
    return rc;
}
