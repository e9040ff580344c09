/*
 * tests/kernels/test_stage_table.c — the CUDA backend's table of staged
 * index arrays already sent (kernels/cuda/cuda_stage_table.h), which is
 * plain host C and runs here without a GPU.
 *
 * The table decides how many host-to-device copies a step records. Inside
 * a step graph that number is part of the graph's shape: if it changes
 * from one step to the next, the graph cannot be updated in place and is
 * instantiated anew every step (review 2026-12-05, finding 2). So: a run of
 * decode steps of the same batch size, staged as model.c and the CUDA ops
 * stage them (token ids, positions for q and k, KV slots, attention tables
 * in every layer, the output rows last), each step captured, must record
 * the same copies every step. Without a capture, arrays the step before
 * sent may still be reused (an eager step gains from it). And the ring
 * model here behaves as cuda_backend.cu's: a wrap or a new epoch forgets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_stage_table.h"

/* cuda_backend.cu's staging ring, without the device: a pinned host ring
 * and the device mirror at the same offsets (here, a second array). */
enum { RING = 1 << 16, ROOM = 1 << 12 };

typedef struct {
    uint8_t host[RING], dev[RING];
    size_t used;
    cuda_stage_table t;
    int sent; /* copies recorded */
} ring;

static void room(ring *r, size_t n)
{
    if (RING - r->used < n) { /* cuda_stage_room: wrap */
        r->used = 0;
        cuda_stage_table_new_epoch(&r->t);
    }
}

/* cuda_stage_copy: reserve, fill, commit. Returns the device address. */
static const uint8_t *stage(ring *r, const void *src, size_t bytes)
{
    const size_t need = (bytes + 15) / 16 * 16;
    room(r, need);
    uint8_t *h = r->host + r->used, *d = r->dev + r->used;
    r->used += need;
    memcpy(h, src, bytes);
    uint8_t *earlier = cuda_stage_table_find(&r->t, h, bytes);
    if (earlier) {
        if (h + need == r->host + r->used)
            r->used -= need;
        return earlier;
    }
    r->sent++;
    cuda_stage_table_sent(&r->t, h, d, bytes);
    return d;
}

/* One decode step of B sequences at `step`, through n_layer layers; what
 * each array holds is what the model stages (not the real values, but
 * the same pattern of equal and different arrays). */
static int decode_step(ring *r, int B, int n_layer, int step, int capture)
{
    if (capture) { /* cuda_graph_begin */
        room(r, ROOM);
        cuda_stage_table_capture_begin(&r->t);
    }
    const int before = r->sent;
    int32_t tokens[16], pos[16], slots[16], tables[64], out_index[16];
    for (int s = 0; s < B; s++) {
        tokens[s] = 1000 + 37 * step + 11 * s; /* a new token each step */
        pos[s] = 20 + step;
        slots[s] = 4096 + 128 * s + 20 + step;
        out_index[s] = s; /* the same every step */
    }
    for (int i = 0; i < 4 * B; i++)
        tables[i] = step * 1000 + i; /* lengths in it change each step */
    stage(r, tokens, (size_t)B * 4);                /* get_rows (embeddings) */
    for (int l = 0; l < n_layer; l++) {
        stage(r, pos, (size_t)B * 4);               /* rope q                */
        stage(r, pos, (size_t)B * 4);               /* rope k                */
        stage(r, slots, (size_t)B * 4);             /* kv_store              */
        stage(r, tables, (size_t)4 * B * 4);        /* attention             */
    }
    stage(r, out_index, (size_t)B * 4);             /* get_rows (output rows) */
    return r->sent - before;
}

static ring R;

static void test_captured_steps_same_copies(void **state)
{
    (void)state;
    static const int batch[] = {1, 4, 9, 1};
    for (size_t b = 0; b < sizeof batch / sizeof batch[0]; b++) {
        memset(&R, 0, sizeof R);
        const int first = decode_step(&R, batch[b], 4, 0, 1);
        assert_int_equal(first, 5); /* tokens, positions, slots, tables, rows */
        for (int step = 1; step < 64; step++) {
            const int n = decode_step(&R, batch[b], 4, step, 1);
            if (n != first)
                fail_msg("batch %d, step %d: %d copies recorded, step 0 recorded %d (a graph "
                         "of another shape: it cannot be updated in place)",
                         batch[b], step, n, first);
        }
    }
}

static void test_eager_steps_reuse(void **state)
{
    (void)state;
    memset(&R, 0, sizeof R);
    /* within a step, every layer's positions, slots and tables go once */
    assert_int_equal(decode_step(&R, 4, 8, 0, 0), 5);
    /* across eager steps, the output rows sent by the step before can
     * still stand in (the saving the table exists for) */
    assert_int_equal(decode_step(&R, 4, 8, 1, 0), 4);
}

static void test_epochs_forget(void **state)
{
    (void)state;
    memset(&R, 0, sizeof R);
    const int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
    const uint8_t *da = stage(&R, a, sizeof a);
    assert_ptr_equal(stage(&R, a, sizeof a), da);
    const size_t used = R.used;
    assert_ptr_not_equal(stage(&R, b, sizeof b), da); /* other bytes: sent */
    assert_int_equal(R.sent, 2);
    assert_int_equal(R.used, used + 16);
    cuda_stage_table_new_epoch(&R.t);
    assert_ptr_not_equal(stage(&R, a, sizeof a), da); /* forgotten: sent again */
    assert_int_equal(R.sent, 3);
    /* a large region is sent every time, never compared */
    static uint8_t big[CUDA_STAGE_DEDUPE_MAX_BYTES + 16];
    uint8_t *h = R.host, *d = R.dev;
    cuda_stage_table_sent(&R.t, h, d, sizeof big);
    assert_null(cuda_stage_table_find(&R.t, h, sizeof big));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_captured_steps_same_copies),
        cmocka_unit_test(test_eager_steps_reuse),
        cmocka_unit_test(test_epochs_forget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
