/*
 * tests/store/test_util.h — what the store tests share: a memory-only
 * backend (so the tests need no compute kernels and run the same under
 * ASan), synthetic page payloads derived from tokens, temporary directories.
 */
#ifndef CAIRN_TESTS_STORE_UTIL_H
#define CAIRN_TESTS_STORE_UTIL_H

#include "store/tiers.h"

/* A backend whose memory is plain malloc'd host memory and whose copies are
 * memcpy; every compute op returns CAIRN_EUNSUPPORTED. It counts bytes moved
 * so tests can see that tier-0 traffic goes through upload/download. */
typedef struct {
    size_t uploaded, downloaded, live_allocs;
} test_backend_counters;

/* With CAIRN_TEST_TRANSFER_DELAY=N (N >= 1) in the environment the backend
 * also has the transfer and fence slots, with copies to host memory
 * carried out only when their fence passes (test_util.c says how late). */
cairn_backend *test_backend_create(void);
test_backend_counters *test_backend_counters_of(cairn_backend *be);

/* Fill `out` [bytes] with the synthetic KV of the page that ends a prefix:
 * a deterministic function of all the prefix's tokens, so a page stored for
 * one prefix can never pass for another's. */
void test_payload(const int32_t *prefix_tokens, size_t n_tokens, void *out, size_t bytes);

/* A fresh empty directory under $TMPDIR (or /tmp), and its removal (the
 * LMDB files in it, then the directory). */
void test_make_dir(char *out, size_t len, const char *tag);
void test_remove_dir(const char *dir);

/* A tiny KV layout: 1 layer, 1 head of 8 floats, `page_size` tokens. */
cairn_kv_layout test_layout(int page_size);

#endif
