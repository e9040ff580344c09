/*
 * kernels/cuda/cuda_stage_table.h — which index arrays of the CUDA backend's
 * staging ring already went to the device (kernels/cuda/cuda_impl.h, "staging
 * ring"), so that an identical one is not sent again.
 *
 * Plain host C, no CUDA, all of it inline here: cuda_backend.cu and
 * cuda_graph.cu use it, and so does a test built without CUDA
 * (tests/kernels/test_stage_table.c), so the policy is tested where there
 * is no GPU. (Inline rather than a .c file: the CUDA library is linked
 * after the kernels library, so it could not call into it.) Internal to
 * the kernels module, like cuda_impl.h.
 *
 * An entry is valid while its epoch is the table's. The epoch ends when the
 * ring wraps or grows (the bytes behind an entry are about to be reused),
 * when a step graph is given up (its copies never ran), and when a step
 * graph starts (cuda_stage_table_capture_begin says why).
 */
#ifndef CAIRN_KERNELS_CUDA_STAGE_TABLE_H
#define CAIRN_KERNELS_CUDA_STAGE_TABLE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Regions above this are sent as they are: comparing them would cost more
 * than the copy saves (masks of long trees). */
#define CUDA_STAGE_DEDUPE_MAX_BYTES ((size_t)256 << 10)

enum { CUDA_STAGE_SENT = 8 }; /* regions remembered, the newest */

typedef struct {
    struct {
        const uint8_t *host; /* the region in the pinned ring              */
        uint8_t *dev;        /* its device mirror, where the copy put it    */
        size_t bytes;
        uint64_t epoch;
    } sent[CUDA_STAGE_SENT];
    unsigned next; /* the entry the next send overwrites (oldest first) */
    uint64_t epoch;
} cuda_stage_table;

/* The device copy of an earlier region of this epoch holding exactly the
 * `bytes` at `host`, or NULL (then the caller sends the region and records
 * it with cuda_stage_table_sent). */
static inline uint8_t *cuda_stage_table_find(const cuda_stage_table *t, const uint8_t *host,
                                             size_t bytes)
{
    if (bytes > CUDA_STAGE_DEDUPE_MAX_BYTES)
        return NULL;
    for (unsigned i = 0; i < (unsigned)CUDA_STAGE_SENT; i++) {
        /* newest first */
        const unsigned k = (t->next + CUDA_STAGE_SENT - 1 - i) % (unsigned)CUDA_STAGE_SENT;
        if (t->sent[k].epoch == t->epoch && t->sent[k].host && t->sent[k].bytes == bytes &&
            memcmp(t->sent[k].host, host, bytes) == 0)
            return t->sent[k].dev;
    }
    return NULL;
}

/* Record a region just sent from `host` to `dev`. */
static inline void cuda_stage_table_sent(cuda_stage_table *t, const uint8_t *host, uint8_t *dev,
                                         size_t bytes)
{
    if (bytes > CUDA_STAGE_DEDUPE_MAX_BYTES)
        return;
    const unsigned k = t->next++ % (unsigned)CUDA_STAGE_SENT;
    t->sent[k].host = host;
    t->sent[k].dev = dev;
    t->sent[k].bytes = bytes;
    t->sent[k].epoch = t->epoch;
}

/* Forget every region recorded so far. */
static inline void cuda_stage_table_new_epoch(cuda_stage_table *t)
{
    t->epoch++;
}

/* A step graph is about to be recorded: only regions sent inside it may
 * stand in for later ones inside it. */
static inline void cuda_stage_table_capture_begin(cuda_stage_table *t)
{
    /* Inside a capture a reuse is not a saving but a change of shape. The
     * regions of the step before are still among the 8 newest, so an array
     * that is the same every step (the output rows 0..B-1) is found there on
     * one step and records no copy; by the next step the sends in between
     * have pushed that entry out, so it is sent again; found again on the
     * one after... The graph's memcpy nodes would then alternate (5, 4, 5,
     * 4 for a decode step), cudaGraphExecUpdate would refuse every step,
     * and every step would be instantiated anew. Starting each capture with
     * an empty table gives every step of a batch size the same nodes. */
    cuda_stage_table_new_epoch(t);
}

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_KERNELS_CUDA_STAGE_TABLE_H */
