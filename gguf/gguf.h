/*
 * gguf/gguf.h — the GGUF reader: one memory-mapped, fully validated model
 * file, its metadata and its tensors.
 *
 * GGUF is what llama.cpp and Ollama users download: a header, key/value
 * metadata (architecture, hyper-parameters, tokenizer, chat template) and
 * the tensors, aligned, in one file. Every other module reads model files
 * through this one; runtime/ opens a file once and hands the same handle to
 * the text module (vocabulary, chat template) and the model module
 * (weights).
 *
 * Ownership: cairn_gguf_open / _open_memory give the caller a handle freed
 * with cairn_gguf_close; every pointer a getter returns (names, strings,
 * tensor data) is owned by the handle and valid until it is closed. A
 * handle is immutable once open: any number of threads may read it at once.
 * Errors: CAIRN_EIO (cannot open or map), CAIRN_EFORMAT (damage: the message
 * names the field), CAIRN_EUNSUPPORTED (a valid file cairn cannot read),
 * CAIRN_ENOTFOUND / CAIRN_EINVAL from getters as documented below.
 * Depends on common/ only.
 */
#ifndef CAIRN_GGUF_H
#define CAIRN_GGUF_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/* GGUF                                                                     */
/* ======================================================================== */
/*
 * A GGUF file (versions 2 and 3, little-endian) is:
 *
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x  { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to `general.alignment` (default 32)
 *   tensor data: each tensor at data_start + offset (offset aligned)
 *
 * The file is mmap'ed read-only. Opening validates everything before anything
 * is trusted: every length against the bytes that remain, string lengths and
 * array counts against caps, tensor types against the known types, each
 * tensor's byte size (from its shape and type) against the data section, and
 * offsets against alignment and overlap. A truncated or corrupt file fails
 * with CAIRN_EFORMAT and a message naming the field, never a crash.
 */

typedef struct cairn_gguf cairn_gguf;

typedef enum {
    CAIRN_GGUF_UINT8 = 0,
    CAIRN_GGUF_INT8 = 1,
    CAIRN_GGUF_UINT16 = 2,
    CAIRN_GGUF_INT16 = 3,
    CAIRN_GGUF_UINT32 = 4,
    CAIRN_GGUF_INT32 = 5,
    CAIRN_GGUF_FLOAT32 = 6,
    CAIRN_GGUF_BOOL = 7,
    CAIRN_GGUF_STRING = 8,
    CAIRN_GGUF_ARRAY = 9,
    CAIRN_GGUF_UINT64 = 10,
    CAIRN_GGUF_INT64 = 11,
    CAIRN_GGUF_FLOAT64 = 12,
} cairn_gguf_vtype;

typedef struct {
    const char *name;    /* NUL-terminated copy owned by the cairn_gguf      */
    int n_dims;          /* 1..4                                             */
    int64_t ne[4];       /* elements per dimension, ne[0] fastest-varying;   */
                         /* unused dims are 1                                */
    cairn_type type;
    uint64_t offset;     /* from the start of the data section               */
    uint64_t size;       /* bytes                                            */
    const void *data;    /* inside the mapping                               */
} cairn_gguf_tensor;

/* Open and validate `path`. On success *out owns the mapping. GGUF v1,
 * big-endian files and tensor types cairn does not know give
 * CAIRN_EUNSUPPORTED; damage gives CAIRN_EFORMAT. */
int cairn_gguf_open(const char *path, cairn_gguf **out, char *err, size_t err_len);

/* Parse an in-memory image (not copied; must outlive the handle). Used by
 * tests and fuzzers; identical validation. */
int cairn_gguf_open_memory(const void *data, size_t size, cairn_gguf **out, char *err,
                           size_t err_len);
void cairn_gguf_close(cairn_gguf *g);

/* The file's GGUF version (2 or 3), its tensor-data alignment, and the whole
 * image (mapped or the caller's memory; valid until close). */
uint32_t cairn_gguf_version(const cairn_gguf *g);
size_t cairn_gguf_alignment(const cairn_gguf *g);
const void *cairn_gguf_file_data(const cairn_gguf *g, size_t *size);

/* Metadata. Keys are looked up by exact name; index order is file order. */
int64_t cairn_gguf_n_kv(const cairn_gguf *g);
int64_t cairn_gguf_find_key(const cairn_gguf *g, const char *key); /* -1 when absent */
const char *cairn_gguf_key(const cairn_gguf *g, int64_t i);
cairn_gguf_vtype cairn_gguf_kv_type(const cairn_gguf *g, int64_t i);

/* Typed getters by key. Integer getters accept any integer or bool value that
 * fits the requested type; the float getter accepts FLOAT32/FLOAT64 and
 * integers. CAIRN_ENOTFOUND when absent, CAIRN_EFORMAT when of another type
 * or out of range. Strings are not NUL-terminated in the file: *len is given,
 * and *str is NUL-terminated by the reader (a copy it owns). */
int cairn_gguf_get_u32(const cairn_gguf *g, const char *key, uint32_t *out);
int cairn_gguf_get_i64(const cairn_gguf *g, const char *key, int64_t *out);
int cairn_gguf_get_f32(const cairn_gguf *g, const char *key, float *out);
int cairn_gguf_get_bool(const cairn_gguf *g, const char *key, bool *out);
int cairn_gguf_get_str(const cairn_gguf *g, const char *key, const char **str, size_t *len);

/* Arrays: element type and count; scalar elements as a packed little-endian
 * array inside the mapping (may be unaligned: read with memcpy); string
 * elements one at a time (CAIRN_EINVAL for an index out of range). For string
 * and nested arrays *data is NULL. Nested arrays are parsed and validated but
 * can only be counted. */
int cairn_gguf_get_arr(const cairn_gguf *g, const char *key, cairn_gguf_vtype *elem_type,
                       uint64_t *n, const void **data);
int cairn_gguf_get_arr_str(const cairn_gguf *g, const char *key, uint64_t i, const char **str,
                           size_t *len);

/* Tensors. */
int64_t cairn_gguf_n_tensors(const cairn_gguf *g);
const cairn_gguf_tensor *cairn_gguf_tensor_at(const cairn_gguf *g, int64_t i);
const cairn_gguf_tensor *cairn_gguf_find_tensor(const cairn_gguf *g, const char *name);


/* ======================================================================== */
/* Building a GGUF in memory                                                */
/* ======================================================================== */
/*
 * A cairn_gguf can also be assembled in memory, which is how a model that
 * arrives in another format (a Hugging Face checkpoint folder, ckpt/) is
 * handed to the loaders that read GGUF: the model, the vocabulary and the
 * chat template see the same keys and tensor names whatever the file was.
 *
 *     builder ──set_*──▶ metadata      ──finish──▶ cairn_gguf (metadata
 *             ──add_tensor──▶ name, type, shape, data pointer      image +
 *             ──keep──▶ blocks the data lives in                  pointers)
 *
 * finish() writes the metadata and tensor infos as a GGUF v3 image and opens
 * it with the same parser and checks as a file, so a builder cannot produce
 * a handle a file could not. The tensor bytes are not copied: each tensor's
 * data pointer is the one given to add_tensor. Blocks handed to keep() (a
 * mapping, a repacked buffer) are released by cairn_gguf_close, after which
 * the pointers into them are gone. cairn's own types (traits.own) are
 * allowed here and only here.
 *
 * Errors: CAIRN_EINVAL (bad argument: empty or over-long key, bad shape),
 * CAIRN_ENOMEM; both are sticky: once a call failed, finish() fails with
 * that status, so a sequence of calls is checked once at the end. A builder
 * is used by one thread.
 */
typedef struct cairn_gguf_builder cairn_gguf_builder;

/* A block the built handle owns: release(ptr, size) at cairn_gguf_close. */
typedef struct {
    void *ptr;
    size_t size;
    void (*release)(void *ptr, size_t size);
} cairn_gguf_keep;

int cairn_gguf_builder_new(cairn_gguf_builder **out);
/* Frees a builder that was not finished, releasing the blocks kept so far. */
void cairn_gguf_builder_free(cairn_gguf_builder *b);

int cairn_gguf_builder_set_str(cairn_gguf_builder *b, const char *key, const char *str);
int cairn_gguf_builder_set_u32(cairn_gguf_builder *b, const char *key, uint32_t v);
int cairn_gguf_builder_set_i32(cairn_gguf_builder *b, const char *key, int32_t v);
int cairn_gguf_builder_set_f32(cairn_gguf_builder *b, const char *key, float v);
int cairn_gguf_builder_set_bool(cairn_gguf_builder *b, const char *key, bool v);
/* An array of n strings (lens[i] bytes each; lens NULL: NUL-terminated). */
int cairn_gguf_builder_set_arr_str(cairn_gguf_builder *b, const char *key, const char *const *strs,
                                   const size_t *lens, uint64_t n);
/* An array of n scalars of elem_type (packed little-endian, as stored). */
int cairn_gguf_builder_set_arr(cairn_gguf_builder *b, const char *key, cairn_gguf_vtype elem_type,
                               const void *data, uint64_t n);

/* A tensor of `type` and shape ne[n_dims] (ne[0] fastest), whose bytes are
 * at `data` (not copied; must stay valid until the built handle is closed:
 * give the block it lies in to keep()). */
int cairn_gguf_builder_add_tensor(cairn_gguf_builder *b, const char *name, cairn_type type,
                                  int n_dims, const int64_t *ne, const void *data);
/* Hand a block to the handle-to-be (released with it, or by builder_free). */
int cairn_gguf_builder_keep(cairn_gguf_builder *b, cairn_gguf_keep block);

/* Build and open. Consumes the builder whatever the result: on failure the
 * kept blocks are released and *out is untouched. */
int cairn_gguf_builder_finish(cairn_gguf_builder *b, cairn_gguf **out, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_GGUF_H */
