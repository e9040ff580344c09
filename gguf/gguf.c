/*
 * gguf/gguf.c — read-only GGUF reader.
 *
 * The whole file is parsed and validated once in open; afterwards every
 * accessor is a lookup into tables built here. Nothing read from the file is
 * trusted before it is checked against the bytes that remain, so a truncated
 * or hostile file ends in CAIRN_EFORMAT with a message, never a wild read.
 *
 * Memory: scalar values and scalar arrays are not copied (accessors point into
 * the mapping); keys, tensor names and string values are copied so they can be
 * NUL-terminated.
 */
#include "gguf/gguf.h"
#include "gguf/gguf_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Caps that keep hostile sizes from turning into huge allocations or deep
 * recursion. Real files stay far below them (the largest vocabularies have
 * ~260k tokens; keys are < 100 bytes; tensor names < 100 bytes). */
#define GGUF_MAX_KEY_LEN 65535u
#define GGUF_MAX_NAME_LEN 1024u
#define GGUF_MAX_STRING_LEN (1u << 30)
#define GGUF_MAX_ARRAY_COUNT (1ull << 32)
#define GGUF_MAX_NESTING 8
#define GGUF_MAX_ALIGNMENT (1u << 30)
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct {
    char *key;            /* NUL-terminated copy                               */
    cairn_gguf_vtype type;
    /* scalars: pointer to the value bytes in the file                          */
    const uint8_t *scalar;
    /* strings: NUL-terminated copy                                            */
    char *str;
    size_t str_len;
    /* arrays                                                                  */
    cairn_gguf_vtype elem_type;
    uint64_t n;
    const uint8_t *arr_data; /* packed scalars in the file; NULL otherwise     */
    char **arr_strs;         /* [n] NUL-terminated copies (string arrays)      */
    size_t *arr_lens;        /* [n]                                            */
    char *arr_block;         /* storage behind arr_strs                        */
} gguf_kv;

typedef struct {
    const char *name;
    int64_t index;
} name_index;

struct cairn_gguf {
    const uint8_t *base;
    size_t size;
    void *map;          /* non-NULL when we own an mmap of `size` bytes        */
    uint32_t version;
    size_t alignment;
    size_t data_start;  /* offset of the tensor data section in the file       */
    int64_t n_kv;
    gguf_kv *kvs;
    name_index *kv_sorted; /* keys sorted, for binary search               */
    int64_t n_tensors;
    cairn_gguf_tensor *tensors;
    name_index *t_sorted;  /* tensor names sorted                          */
    char *name_block;   /* storage for tensor names                            */
    /* built in memory (cairn_gguf_builder): the image is ours to free, the
     * tensor data lies elsewhere, and these blocks are released at close */
    void *owned_image;
    cairn_gguf_keep *keep;
    int n_keep;
};

/* ---- error reporting ---------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    size_t size;
    size_t pos;
    char *err;
    size_t err_len;
    char ctx[192]; /* what is being read, for messages: "tensor info 3 name"  */
    /* an image from cairn_gguf_builder: tensor i's bytes at ext_data[i], not in
     * the image; cairn's own types allowed */
    const void *const *ext_data;
    uint64_t ext_size; /* the extent their offsets were laid out in */
} reader;

static int fail(reader *r, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(reader *r, int status, const char *fmt, ...)
{
    if (r->err && r->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->err_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

static void set_ctx(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_ctx(reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->ctx, sizeof r->ctx, fmt, ap);
    va_end(ap);
}

static size_t remaining(const reader *r) { return r->size - r->pos; }

/* Ensure `n` more bytes exist; `what` completes the context in messages. */
static int need(reader *r, uint64_t n, const char *what)
{
    if (n > remaining(r))
        return fail(r, CAIRN_EFORMAT,
                    "truncated: %s%s%s runs past end of file (needs %llu bytes at offset %zu, "
                    "file has %zu)",
                    r->ctx, *what ? " " : "", what, (unsigned long long)n, r->pos, r->size);
    return CAIRN_OK;
}

static int rd_u32(reader *r, const char *what, uint32_t *v)
{
    int rc = need(r, 4, what);
    if (rc)
        return rc;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return CAIRN_OK;
}

static int rd_u64(reader *r, const char *what, uint64_t *v)
{
    int rc = need(r, 8, what);
    if (rc)
        return rc;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return CAIRN_OK;
}

/* Reads a GGUF string (u64 length + bytes). Returns a view into the file. */
static int rd_str(reader *r, const char *what, uint64_t cap, const uint8_t **s, uint64_t *len)
{
    char w[64];
    snprintf(w, sizeof w, "%s length", what);
    int rc = rd_u64(r, w, len);
    if (rc)
        return rc;
    if (*len > cap)
        return fail(r, CAIRN_EFORMAT, "%s%s%s length %llu exceeds the limit of %llu bytes", r->ctx,
                    *what ? " " : "", what, (unsigned long long)*len, (unsigned long long)cap);
    rc = need(r, *len, what);
    if (rc)
        return rc;
    *s = r->p + r->pos;
    r->pos += (size_t)*len;
    return CAIRN_OK;
}

static char *dup_bytes(const uint8_t *s, uint64_t len)
{
    char *c = malloc((size_t)len + 1);
    if (!c)
        return NULL;
    if (len)
        memcpy(c, s, (size_t)len);
    c[len] = '\0';
    return c;
}

/* ---- values ------------------------------------------------------------- */

/* Size in bytes of a scalar value type; 0 for string/array/unknown. */
size_t gguf_scalar_size(uint32_t t)
{
    switch (t) {
    case CAIRN_GGUF_UINT8:
    case CAIRN_GGUF_INT8:
    case CAIRN_GGUF_BOOL:
        return 1;
    case CAIRN_GGUF_UINT16:
    case CAIRN_GGUF_INT16:
        return 2;
    case CAIRN_GGUF_UINT32:
    case CAIRN_GGUF_INT32:
    case CAIRN_GGUF_FLOAT32:
        return 4;
    case CAIRN_GGUF_UINT64:
    case CAIRN_GGUF_INT64:
    case CAIRN_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static bool vtype_known(uint32_t t) { return t <= CAIRN_GGUF_FLOAT64; }

static int check_bools(reader *r, const uint8_t *b, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (b[i] > 1)
            return fail(r, CAIRN_EFORMAT, "%s: bool value %u%s is neither 0 nor 1", r->ctx, b[i],
                        n > 1 ? " in array" : "");
    return CAIRN_OK;
}

/* Skips (validating) one array body: u32 elem type, u64 count, elements.
 * Used for arrays nested inside arrays, which are only counted. */
static int skip_array(reader *r, int depth)
{
    if (depth > GGUF_MAX_NESTING)
        return fail(r, CAIRN_EFORMAT, "%s: arrays nested deeper than %d levels", r->ctx,
                    GGUF_MAX_NESTING);
    uint32_t et;
    uint64_t n;
    int rc = rd_u32(r, "nested array element type", &et);
    if (rc)
        return rc;
    if (!vtype_known(et))
        return fail(r, CAIRN_EFORMAT, "%s: nested array has unknown element type %u", r->ctx, et);
    rc = rd_u64(r, "nested array count", &n);
    if (rc)
        return rc;
    if (n > GGUF_MAX_ARRAY_COUNT)
        return fail(r, CAIRN_EFORMAT, "%s: nested array count %llu exceeds the limit", r->ctx,
                    (unsigned long long)n);
    size_t es = gguf_scalar_size(et);
    if (es) {
        if (n > remaining(r) / es)
            return fail(r, CAIRN_EFORMAT,
                        "truncated: %s nested array of %llu elements runs past end of file",
                        r->ctx, (unsigned long long)n);
        if (et == CAIRN_GGUF_BOOL && (rc = check_bools(r, r->p + r->pos, n)))
            return rc;
        r->pos += (size_t)(n * es);
        return CAIRN_OK;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (et == CAIRN_GGUF_STRING) {
            const uint8_t *s;
            uint64_t len;
            if ((rc = rd_str(r, "nested array string", GGUF_MAX_STRING_LEN, &s, &len)))
                return rc;
        } else if ((rc = skip_array(r, depth + 1))) {
            return rc;
        }
    }
    return CAIRN_OK;
}

/* Parses the value of one key-value pair into kv. */
static int read_value(reader *r, gguf_kv *kv)
{
    int rc;
    size_t es = gguf_scalar_size(kv->type);
    if (es) {
        if ((rc = need(r, es, "value")))
            return rc;
        kv->scalar = r->p + r->pos;
        if (kv->type == CAIRN_GGUF_BOOL && (rc = check_bools(r, kv->scalar, 1)))
            return rc;
        r->pos += es;
        return CAIRN_OK;
    }
    if (kv->type == CAIRN_GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        if ((rc = rd_str(r, "string value", GGUF_MAX_STRING_LEN, &s, &len)))
            return rc;
        if (!(kv->str = dup_bytes(s, len)))
            return fail(r, CAIRN_ENOMEM, "out of memory copying %s", r->ctx);
        kv->str_len = (size_t)len;
        return CAIRN_OK;
    }
    /* array */
    uint32_t et;
    if ((rc = rd_u32(r, "array element type", &et)))
        return rc;
    if (!vtype_known(et))
        return fail(r, CAIRN_EFORMAT, "%s: array has unknown element type %u", r->ctx, et);
    kv->elem_type = (cairn_gguf_vtype)et;
    if ((rc = rd_u64(r, "array count", &kv->n)))
        return rc;
    if (kv->n > GGUF_MAX_ARRAY_COUNT)
        return fail(r, CAIRN_EFORMAT, "%s: array count %llu exceeds the limit of %llu", r->ctx,
                    (unsigned long long)kv->n, (unsigned long long)GGUF_MAX_ARRAY_COUNT);
    es = gguf_scalar_size(et);
    if (es) {
        if (kv->n > remaining(r) / es)
            return fail(r, CAIRN_EFORMAT,
                        "truncated: %s array of %llu elements runs past end of file "
                        "(offset %zu, file has %zu bytes)",
                        r->ctx, (unsigned long long)kv->n, r->pos, r->size);
        kv->arr_data = r->p + r->pos;
        if (et == CAIRN_GGUF_BOOL && (rc = check_bools(r, kv->arr_data, kv->n)))
            return rc;
        r->pos += (size_t)(kv->n * es);
        return CAIRN_OK;
    }
    if (et == CAIRN_GGUF_ARRAY) {
        /* Each nested array takes at least 12 bytes, which bounds the loop. */
        for (uint64_t i = 0; i < kv->n; i++) {
            set_ctx(r, "metadata '%s' array element %llu", kv->key, (unsigned long long)i);
            if ((rc = skip_array(r, 2)))
                return rc;
        }
        return CAIRN_OK;
    }
    /* String array: first pass validates and sums lengths, second copies.
     * Each element takes at least 8 bytes, so n is bounded by the file. */
    if (kv->n > remaining(r) / 8)
        return fail(r, CAIRN_EFORMAT,
                    "truncated: %s array of %llu strings runs past end of file", r->ctx,
                    (unsigned long long)kv->n);
    size_t start = r->pos;
    uint64_t total = 0;
    for (uint64_t i = 0; i < kv->n; i++) {
        const uint8_t *s;
        uint64_t len;
        char w[64];
        snprintf(w, sizeof w, "array string %llu", (unsigned long long)i);
        if ((rc = rd_str(r, w, GGUF_MAX_STRING_LEN, &s, &len)))
            return rc;
        total += len + 1; /* bounded by the file size: no overflow */
    }
    size_t n = (size_t)kv->n;
    kv->arr_strs = malloc((n ? n : 1) * sizeof *kv->arr_strs);
    kv->arr_lens = malloc((n ? n : 1) * sizeof *kv->arr_lens);
    kv->arr_block = malloc(total ? (size_t)total : 1);
    if (!kv->arr_strs || !kv->arr_lens || !kv->arr_block)
        return fail(r, CAIRN_ENOMEM, "out of memory copying %s", r->ctx);
    size_t pos = start, out = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t len;
        memcpy(&len, r->p + pos, 8);
        pos += 8;
        kv->arr_strs[i] = kv->arr_block + out;
        kv->arr_lens[i] = (size_t)len;
        memcpy(kv->arr_block + out, r->p + pos, (size_t)len);
        kv->arr_block[out + len] = '\0';
        out += (size_t)len + 1;
        pos += (size_t)len;
    }
    return CAIRN_OK;
}

/* ---- sorting helpers for lookups and overlap checks --------------------- */

static int cmp_name_index(const void *a, const void *b)
{
    return strcmp(((const name_index *)a)->name, ((const name_index *)b)->name);
}

static int64_t find_name(const name_index *idx, int64_t n, const char *name)
{
    int64_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(idx[mid].name, name);
        if (c == 0)
            return idx[mid].index;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

typedef struct {
    uint64_t offset, size;
    int64_t index;
} extent;

static int cmp_extent(const void *a, const void *b)
{
    const extent *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->size < y->size ? -1 : x->size > y->size;
}

/* ---- parsing ------------------------------------------------------------ */

static void free_contents(cairn_gguf *g)
{
    if (g->kvs) {
        for (int64_t i = 0; i < g->n_kv; i++) {
            free(g->kvs[i].key);
            free(g->kvs[i].str);
            free(g->kvs[i].arr_strs);
            free(g->kvs[i].arr_lens);
            free(g->kvs[i].arr_block);
        }
    }
    free(g->kvs);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->t_sorted);
    free(g->name_block);
}

static int parse_tensor_infos(cairn_gguf *g, reader *r, uint64_t n_tensors);

static int parse(cairn_gguf *g, reader *r)
{
    int rc;
    set_ctx(r, "header");
    if ((rc = need(r, 4, "magic")))
        return rc;
    if (memcmp(r->p, "GGUF", 4) != 0)
        return fail(r, CAIRN_EFORMAT, "not a GGUF file (bad magic)");
    r->pos = 4;
    if ((rc = rd_u32(r, "version", &g->version)))
        return rc;
    if (g->version == 1)
        return fail(r, CAIRN_EUNSUPPORTED, "GGUF version 1 is not supported (only 2 and 3)");
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && g->version != 0)
            return fail(r, CAIRN_EUNSUPPORTED, "big-endian GGUF files are not supported");
        return fail(r, CAIRN_EUNSUPPORTED, "GGUF version %u is not supported (only 2 and 3)",
                    g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(r, "tensor count", &n_tensors)) || (rc = rd_u64(r, "metadata count", &n_kv)))
        return rc;
    /* A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes and
     * a tensor info at least 8 + 4 + 8 + 4 + 8: counts beyond what the file
     * can hold are rejected before anything is allocated for them. */
    if (n_kv > remaining(r) / 13)
        return fail(r, CAIRN_EFORMAT,
                    "truncated: header says %llu metadata pairs, the file cannot hold them",
                    (unsigned long long)n_kv);
    if (n_tensors > remaining(r) / 32)
        return fail(r, CAIRN_EFORMAT,
                    "truncated: header says %llu tensors, the file cannot hold them",
                    (unsigned long long)n_tensors);

    g->kvs = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kvs);
    if (!g->kvs)
        return fail(r, CAIRN_ENOMEM, "out of memory for %llu metadata pairs",
                    (unsigned long long)n_kv);
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kvs[i];
        const uint8_t *k;
        uint64_t klen;
        set_ctx(r, "metadata %llu", (unsigned long long)i);
        if ((rc = rd_str(r, "key", GGUF_MAX_KEY_LEN, &k, &klen)))
            return rc;
        if (klen == 0)
            return fail(r, CAIRN_EFORMAT, "metadata %llu has an empty key", (unsigned long long)i);
        if (memchr(k, 0, (size_t)klen))
            return fail(r, CAIRN_EFORMAT, "metadata %llu key contains a NUL byte",
                        (unsigned long long)i);
        if (!(kv->key = dup_bytes(k, klen)))
            return fail(r, CAIRN_ENOMEM, "out of memory");
        g->n_kv = (int64_t)i + 1; /* so free_contents frees this key */
        set_ctx(r, "metadata %llu ('%s')", (unsigned long long)i, kv->key);
        uint32_t t;
        if ((rc = rd_u32(r, "value type", &t)))
            return rc;
        if (!vtype_known(t))
            return fail(r, CAIRN_EFORMAT, "%s has unknown value type %u", r->ctx, t);
        kv->type = (cairn_gguf_vtype)t;
        if ((rc = read_value(r, kv)))
            return rc;
    }
    g->n_kv = (int64_t)n_kv;

    g->kv_sorted = malloc((n_kv ? (size_t)n_kv : 1) * sizeof *g->kv_sorted);
    if (!g->kv_sorted)
        return fail(r, CAIRN_ENOMEM, "out of memory");
    for (int64_t i = 0; i < g->n_kv; i++)
        g->kv_sorted[i] = (name_index){g->kvs[i].key, i};
    qsort(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, cmp_name_index);
    for (int64_t i = 1; i < g->n_kv; i++)
        if (strcmp(g->kv_sorted[i - 1].name, g->kv_sorted[i].name) == 0)
            return fail(r, CAIRN_EFORMAT, "duplicate metadata key '%s'", g->kv_sorted[i].name);

    /* general.alignment must be known before tensor offsets are checked. */
    int64_t ai = cairn_gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        uint32_t a;
        if (cairn_gguf_get_u32(g, "general.alignment", &a) != CAIRN_OK)
            return fail(r, CAIRN_EFORMAT, "general.alignment is not an unsigned 32-bit integer");
        if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT)
            return fail(r, CAIRN_EFORMAT, "general.alignment %u is not a power of two up to %u",
                        a, GGUF_MAX_ALIGNMENT);
        g->alignment = a;
    }
    return parse_tensor_infos(g, r, n_tensors);
}

/* Shape: n_dims (1..4) extents; those past n_dims stay 1. *n_elems is their
 * product, refused before it can overflow. */
static int read_tensor_shape(reader *r, cairn_gguf_tensor *t, int64_t *n_elems)
{
    int rc;
    uint32_t n_dims;
    if ((rc = rd_u32(r, "n_dims", &n_dims)))
        return rc;
    if (n_dims < 1 || n_dims > 4)
        return fail(r, CAIRN_EFORMAT, "%s has %u dimensions (must be 1..4)", r->ctx, n_dims);
    t->n_dims = (int)n_dims;
    *n_elems = 1;
    for (int d = 0; d < 4; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((rc = rd_u64(r, "shape", &ne)))
            return rc;
        if (ne > (uint64_t)INT64_MAX)
            return fail(r, CAIRN_EFORMAT, "%s dimension %u is negative or too large", r->ctx, d);
        t->ne[d] = (int64_t)ne;
        if (ne != 0 && *n_elems > INT64_MAX / (int64_t)ne)
            return fail(r, CAIRN_EFORMAT, "%s element count overflows 64 bits", r->ctx);
        *n_elems *= (int64_t)ne;
    }
    return CAIRN_OK;
}

/* The tensor type: a type id cairn knows but cannot run is EUNSUPPORTED,
 * one nobody knows is EFORMAT. */
static int read_tensor_type(reader *r, cairn_gguf_tensor *t, const cairn_type_traits **tr)
{
    uint32_t type;
    int rc = rd_u32(r, "type", &type);
    if (rc)
        return rc;
    *tr = cairn_type_get((int)type);
    if (!*tr) {
        if (type < CAIRN_TYPE_COUNT_)
            return fail(r, CAIRN_EUNSUPPORTED, "%s has tensor type %u, which cairn does not support",
                        r->ctx, type);
        return fail(r, CAIRN_EFORMAT, "%s has unknown tensor type %u", r->ctx, type);
    }
    if ((*tr)->own && !r->ext_data)
        return fail(r, CAIRN_EFORMAT, "%s has tensor type %s, which is cairn's own in-memory "
                    "layout and never valid in a file", r->ctx, (*tr)->name);
    t->type = (cairn_type)type;
    return CAIRN_OK;
}

/* Byte size: whole rows of ne[0] elements times the other dims, each step
 * checked for overflow since the extents come from the file. */
static int set_tensor_size(reader *r, cairn_gguf_tensor *t, const cairn_type_traits *tr,
                           int64_t n_elems)
{
    if (t->ne[0] % tr->block_elems)
        return fail(r, CAIRN_EFORMAT, "%s row of %lld elements is not a multiple of the %s block size %d",
                    r->ctx, (long long)t->ne[0], tr->name, tr->block_elems);
    uint64_t row = 0, rows = 1;
    if (n_elems != 0) {
        if ((uint64_t)(t->ne[0] / tr->block_elems) > UINT64_MAX / (uint64_t)tr->block_bytes)
            return fail(r, CAIRN_EFORMAT, "%s row byte size overflows 64 bits", r->ctx);
        row = cairn_type_row_bytes((int)t->type, t->ne[0]);
        if (row == 0)
            return fail(r, CAIRN_EFORMAT, "%s has no valid row size", r->ctx);
        rows = (uint64_t)(n_elems / t->ne[0]);
    }
    if (row != 0 && rows > UINT64_MAX / row)
        return fail(r, CAIRN_EFORMAT, "%s byte size overflows 64 bits", r->ctx);
    t->size = row * rows;
    return CAIRN_OK;
}

/* Tensor info i: name, shape, type and offset. The name stays a view into
 * the file (*name, *name_len) until all infos are read and the names can be
 * copied into one block. */
static int read_tensor_info(cairn_gguf *g, reader *r, uint64_t i, const uint8_t **name,
                            uint64_t *name_len)
{
    int rc;
    cairn_gguf_tensor *t = &g->tensors[i];
    set_ctx(r, "tensor info %llu", (unsigned long long)i);
    if ((rc = rd_str(r, "name", GGUF_MAX_NAME_LEN, name, name_len)))
        return rc;
    if (memchr(*name, 0, (size_t)*name_len))
        return fail(r, CAIRN_EFORMAT, "tensor info %llu name contains a NUL byte",
                    (unsigned long long)i);
    set_ctx(r, "tensor info %llu ('%.*s')", (unsigned long long)i, (int)*name_len,
            (const char *)*name);
    int64_t n_elems = 1;
    const cairn_type_traits *tr = NULL;
    if ((rc = read_tensor_shape(r, t, &n_elems)) || (rc = read_tensor_type(r, t, &tr)))
        return rc;
    if ((rc = rd_u64(r, "offset", &t->offset)))
        return rc;
    if (t->offset % g->alignment)
        return fail(r, CAIRN_EFORMAT, "%s offset %llu is not a multiple of the alignment %zu",
                    r->ctx, (unsigned long long)t->offset, g->alignment);
    return set_tensor_size(r, t, tr, n_elems);
}

/* Data section: after the header, padded to the alignment. Sets
 * g->data_start and *data_size, the bytes from there to the end. */
static int locate_data_section(cairn_gguf *g, reader *r, uint64_t n_tensors, uint64_t *data_size)
{
    size_t hdr_end = r->pos;
    size_t pad = (g->alignment - hdr_end % g->alignment) % g->alignment;
    g->data_start = hdr_end + pad;
    *data_size = 0;
    if (r->ext_data) {
        *data_size = r->ext_size;
    } else if (n_tensors > 0) {
        if (pad > remaining(r)) {
            set_ctx(r, "data section");
            return fail(r, CAIRN_EFORMAT,
                        "truncated: padding before the tensor data runs past end of file "
                        "(data would start at %zu, file has %zu bytes)",
                        g->data_start, r->size);
        }
        *data_size = r->size - g->data_start;
    } else if (g->data_start > r->size) {
        g->data_start = r->size; /* vocab-only files may end without padding */
    }
    return CAIRN_OK;
}

/* Copy the names into g->name_block, NUL-terminated, and point each tensor
 * at its bytes once they are known to lie inside the data section; ext[i]
 * gets tensor i's extent for the overlap check. */
static int place_tensors(cairn_gguf *g, reader *r, uint64_t n_tensors, const uint8_t **views,
                         const uint64_t *name_lens, uint64_t data_size, extent *ext)
{
    size_t np = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        cairn_gguf_tensor *t = &g->tensors[i];
        memcpy(g->name_block + np, views[i], (size_t)name_lens[i]);
        g->name_block[np + name_lens[i]] = '\0';
        t->name = g->name_block + np;
        np += (size_t)name_lens[i] + 1;
        if (t->offset > data_size || t->size > data_size - t->offset)
            return fail(r, CAIRN_EFORMAT,
                        "truncated: tensor %llu ('%s') data [%llu, +%llu) runs past end of file "
                        "(data section has %llu bytes)",
                        (unsigned long long)i, t->name, (unsigned long long)t->offset,
                        (unsigned long long)t->size, (unsigned long long)data_size);
        t->data = r->ext_data ? r->ext_data[i] : r->p + g->data_start + t->offset;
        ext[i] = (extent){t->offset, t->size, (int64_t)i};
    }
    return CAIRN_OK;
}

/* No two non-empty tensors may share bytes: sorted by offset, each must
 * start at or after the end of the one before. Sorts ext. */
static int check_tensor_overlaps(const cairn_gguf *g, reader *r, extent *ext, uint64_t n_tensors)
{
    qsort(ext, (size_t)n_tensors, sizeof *ext, cmp_extent);
    for (uint64_t i = 1; i < n_tensors; i++) {
        const extent *a = &ext[i - 1], *b = &ext[i];
        if (a->size && b->size && b->offset < a->offset + a->size)
            return fail(r, CAIRN_EFORMAT, "tensors %lld ('%s') and %lld ('%s') overlap",
                        (long long)a->index, g->tensors[a->index].name, (long long)b->index,
                        g->tensors[b->index].name);
    }
    return CAIRN_OK;
}

/* g->t_sorted: the tensor names sorted for lookups, refusing duplicates
 * (a lookup could not tell them apart). */
static int index_tensor_names(cairn_gguf *g, reader *r)
{
    g->t_sorted = malloc((g->n_tensors ? (size_t)g->n_tensors : 1) * sizeof *g->t_sorted);
    if (!g->t_sorted)
        return fail(r, CAIRN_ENOMEM, "out of memory");
    for (int64_t i = 0; i < g->n_tensors; i++)
        g->t_sorted[i] = (name_index){g->tensors[i].name, i};
    qsort(g->t_sorted, (size_t)g->n_tensors, sizeof *g->t_sorted, cmp_name_index);
    for (int64_t i = 1; i < g->n_tensors; i++)
        if (strcmp(g->t_sorted[i - 1].name, g->t_sorted[i].name) == 0)
            return fail(r, CAIRN_EFORMAT, "duplicate tensor name '%s'", g->t_sorted[i].name);
    return CAIRN_OK;
}

static int parse_tensor_infos(cairn_gguf *g, reader *r, uint64_t n_tensors)
{
    int rc;
    /* Names: first pass keeps views into the file, then one block of copies. */
    const uint8_t **views = NULL;
    extent *ext = NULL;
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    views = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *views);
    uint64_t *name_lens = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *name_lens);
    if (!g->tensors || !views || !name_lens) {
        rc = fail(r, CAIRN_ENOMEM, "out of memory for %llu tensor infos",
                  (unsigned long long)n_tensors);
        goto out;
    }
    uint64_t names_total = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((rc = read_tensor_info(g, r, i, &views[i], &name_lens[i])))
            goto out;
        names_total += name_lens[i] + 1;
    }
    uint64_t data_size;
    if ((rc = locate_data_section(g, r, n_tensors, &data_size)))
        goto out;
    ext = malloc((n_tensors ? (size_t)n_tensors : 1) * sizeof *ext);
    g->name_block = malloc(names_total ? (size_t)names_total : 1);
    if (!ext || !g->name_block) {
        rc = fail(r, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = place_tensors(g, r, n_tensors, views, name_lens, data_size, ext)))
        goto out;
    g->n_tensors = (int64_t)n_tensors;
    if ((rc = check_tensor_overlaps(g, r, ext, n_tensors)))
        goto out;
    rc = index_tensor_names(g, r);
out:
    free(views);
    free(name_lens);
    free(ext);
    return rc;
}

/* ---- open/close --------------------------------------------------------- */

static int open_image_with(const void *data, size_t size, void *map, const void *const *ext_data,
                           uint64_t ext_size, cairn_gguf **out, char *err, size_t err_len)
{
    cairn_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        cairn_errorf(err, err_len, 0, "out of memory");
        return CAIRN_ENOMEM;
    }
    g->base = data;
    g->size = size;
    g->map = map;
    reader r = {.p = data,
                .size = size,
                .pos = 0,
                .err = err,
                .err_len = err_len,
                .ext_data = ext_data,
                .ext_size = ext_size};
    int rc = parse(g, &r);
    if (rc != CAIRN_OK) {
        g->map = NULL; /* the caller unmaps on failure */
        free_contents(g);
        free(g);
        return rc;
    }
    *out = g;
    return CAIRN_OK;
}

static int open_image(const void *data, size_t size, void *map, cairn_gguf **out, char *err,
                      size_t err_len)
{
    return open_image_with(data, size, map, NULL, 0, out, err, err_len);
}

int gguf_open_built(void *image, size_t size, const void *const *tensor_data,
                    uint64_t data_extent, cairn_gguf_keep *keep, int n_keep, cairn_gguf **out,
                    char *err, size_t err_len)
{
    int rc = open_image_with(image, size, NULL, tensor_data, data_extent, out, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    (*out)->owned_image = image;
    (*out)->keep = keep;
    (*out)->n_keep = n_keep;
    return CAIRN_OK;
}

int cairn_gguf_open_memory(const void *data, size_t size, cairn_gguf **out, char *err,
                           size_t err_len)
{
    if (!out || (!data && size)) {
        cairn_errorf(err, err_len, 0, "invalid argument");
        return CAIRN_EINVAL;
    }
    static const uint8_t empty[1];
    return open_image(data ? data : empty, size, NULL, out, err, err_len);
}

int cairn_gguf_open(const char *path, cairn_gguf **out, char *err, size_t err_len)
{
    if (!path || !out) {
        cairn_errorf(err, err_len, 0, "invalid argument");
        return CAIRN_EINVAL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        cairn_errorf(err, err_len, 0, "cannot open %s: %s", path, strerror(errno));
        return errno == ENOENT ? CAIRN_ENOTFOUND : CAIRN_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        cairn_errorf(err, err_len, 0, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        return CAIRN_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        cairn_errorf(err, err_len, 0, "%s is not a regular file", path);
        close(fd);
        return CAIRN_EIO;
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            cairn_errorf(err, err_len, 0, "cannot mmap %s: %s", path, strerror(errno));
            close(fd);
            return CAIRN_EIO;
        }
    }
    close(fd);
    static const uint8_t empty[1];
    char msg[256] = "";
    int rc = open_image(map ? map : empty, size, map, out, msg, sizeof msg);
    if (rc != CAIRN_OK) {
        cairn_errorf(err, err_len, 0, "%s: %s", path, msg);
        if (map)
            munmap(map, size);
    }
    return rc;
}

void cairn_gguf_close(cairn_gguf *g)
{
    if (!g)
        return;
    if (g->map)
        munmap(g->map, g->size);
    for (int i = 0; i < g->n_keep; i++)
        g->keep[i].release(g->keep[i].ptr, g->keep[i].size);
    free(g->keep);
    free(g->owned_image);
    free_contents(g);
    free(g);
}

/* ---- accessors ---------------------------------------------------------- */

uint32_t cairn_gguf_version(const cairn_gguf *g) { return g->version; }
size_t cairn_gguf_alignment(const cairn_gguf *g) { return g->alignment; }

const void *cairn_gguf_file_data(const cairn_gguf *g, size_t *size)
{
    if (size)
        *size = g->size;
    return g->base;
}

int64_t cairn_gguf_n_kv(const cairn_gguf *g) { return g->n_kv; }

int64_t cairn_gguf_find_key(const cairn_gguf *g, const char *key)
{
    if (!g || !key || !g->kv_sorted)
        return -1;
    return find_name(g->kv_sorted, g->n_kv, key);
}

const char *cairn_gguf_key(const cairn_gguf *g, int64_t i)
{
    return (i >= 0 && i < g->n_kv) ? g->kvs[i].key : NULL;
}

cairn_gguf_vtype cairn_gguf_kv_type(const cairn_gguf *g, int64_t i)
{
    return (i >= 0 && i < g->n_kv) ? g->kvs[i].type : (cairn_gguf_vtype)-1;
}

static const gguf_kv *lookup(const cairn_gguf *g, const char *key)
{
    int64_t i = cairn_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kvs[i];
}

/* Reads an integer-like scalar as a signed or unsigned 64-bit value.
 * Returns false when the value is not an integer or bool. */
static bool scalar_int(const gguf_kv *kv, bool *is_signed, int64_t *sv, uint64_t *uv)
{
    const uint8_t *p = kv->scalar;
    switch (kv->type) {
    case CAIRN_GGUF_UINT8: case CAIRN_GGUF_BOOL: { uint8_t v; memcpy(&v, p, 1); *uv = v; *is_signed = false; return true; }
    case CAIRN_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *uv = v; *is_signed = false; return true; }
    case CAIRN_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *uv = v; *is_signed = false; return true; }
    case CAIRN_GGUF_UINT64: { uint64_t v; memcpy(&v, p, 8); *uv = v; *is_signed = false; return true; }
    case CAIRN_GGUF_INT8: { int8_t v; memcpy(&v, p, 1); *sv = v; *is_signed = true; return true; }
    case CAIRN_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *sv = v; *is_signed = true; return true; }
    case CAIRN_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *sv = v; *is_signed = true; return true; }
    case CAIRN_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); *sv = v; *is_signed = true; return true; }
    default: return false;
    }
}

int cairn_gguf_get_u32(const cairn_gguf *g, const char *key, uint32_t *out)
{
    const gguf_kv *kv = lookup(g, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    bool s;
    int64_t sv;
    uint64_t uv;
    if (!scalar_int(kv, &s, &sv, &uv))
        return CAIRN_EFORMAT;
    if (s) {
        if (sv < 0 || sv > (int64_t)UINT32_MAX)
            return CAIRN_EFORMAT;
        *out = (uint32_t)sv;
    } else {
        if (uv > UINT32_MAX)
            return CAIRN_EFORMAT;
        *out = (uint32_t)uv;
    }
    return CAIRN_OK;
}

int cairn_gguf_get_i64(const cairn_gguf *g, const char *key, int64_t *out)
{
    const gguf_kv *kv = lookup(g, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    bool s;
    int64_t sv;
    uint64_t uv;
    if (!scalar_int(kv, &s, &sv, &uv))
        return CAIRN_EFORMAT;
    if (s) {
        *out = sv;
    } else {
        if (uv > (uint64_t)INT64_MAX)
            return CAIRN_EFORMAT;
        *out = (int64_t)uv;
    }
    return CAIRN_OK;
}

int cairn_gguf_get_f32(const cairn_gguf *g, const char *key, float *out)
{
    const gguf_kv *kv = lookup(g, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (kv->type == CAIRN_GGUF_FLOAT32) {
        memcpy(out, kv->scalar, 4);
        return CAIRN_OK;
    }
    if (kv->type == CAIRN_GGUF_FLOAT64) {
        double d;
        memcpy(&d, kv->scalar, 8);
        *out = (float)d;
        return CAIRN_OK;
    }
    if (kv->type == CAIRN_GGUF_BOOL)
        return CAIRN_EFORMAT;
    bool s;
    int64_t sv;
    uint64_t uv;
    if (!scalar_int(kv, &s, &sv, &uv))
        return CAIRN_EFORMAT;
    *out = s ? (float)sv : (float)uv;
    return CAIRN_OK;
}

int cairn_gguf_get_bool(const cairn_gguf *g, const char *key, bool *out)
{
    const gguf_kv *kv = lookup(g, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    bool s;
    int64_t sv;
    uint64_t uv;
    if (!scalar_int(kv, &s, &sv, &uv))
        return CAIRN_EFORMAT;
    /* Integers 0/1 are accepted too: some converters write flags as ints. */
    if (s ? (sv != 0 && sv != 1) : (uv > 1))
        return CAIRN_EFORMAT;
    *out = s ? sv != 0 : uv != 0;
    return CAIRN_OK;
}

int cairn_gguf_get_str(const cairn_gguf *g, const char *key, const char **str, size_t *len)
{
    const gguf_kv *kv = lookup(g, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (kv->type != CAIRN_GGUF_STRING)
        return CAIRN_EFORMAT;
    *str = kv->str;
    if (len)
        *len = kv->str_len;
    return CAIRN_OK;
}

int cairn_gguf_get_arr(const cairn_gguf *g, const char *key, cairn_gguf_vtype *elem_type,
                       uint64_t *n, const void **data)
{
    const gguf_kv *kv = lookup(g, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (kv->type != CAIRN_GGUF_ARRAY)
        return CAIRN_EFORMAT;
    if (elem_type)
        *elem_type = kv->elem_type;
    if (n)
        *n = kv->n;
    if (data)
        *data = kv->arr_data; /* NULL for string and nested arrays */
    return CAIRN_OK;
}

int cairn_gguf_get_arr_str(const cairn_gguf *g, const char *key, uint64_t i, const char **str,
                           size_t *len)
{
    const gguf_kv *kv = lookup(g, key);
    if (!kv)
        return CAIRN_ENOTFOUND;
    if (kv->type != CAIRN_GGUF_ARRAY || kv->elem_type != CAIRN_GGUF_STRING)
        return CAIRN_EFORMAT;
    if (i >= kv->n)
        return CAIRN_EINVAL;
    *str = kv->arr_strs[i];
    if (len)
        *len = kv->arr_lens[i];
    return CAIRN_OK;
}

int64_t cairn_gguf_n_tensors(const cairn_gguf *g) { return g->n_tensors; }

const cairn_gguf_tensor *cairn_gguf_tensor_at(const cairn_gguf *g, int64_t i)
{
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const cairn_gguf_tensor *cairn_gguf_find_tensor(const cairn_gguf *g, const char *name)
{
    if (!g || !name || !g->t_sorted)
        return NULL;
    int64_t i = find_name(g->t_sorted, g->n_tensors, name);
    return i < 0 ? NULL : &g->tensors[i];
}
