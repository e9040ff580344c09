/*
 * model/spec_ngram.c — prompt lookup: guesses copied from the sequence
 * itself. Agents, RAG and code editing repeat their context (a quoted
 * passage, a tool result, the function being edited): when the last few
 * tokens occurred before, what followed them then is a good guess now.
 *
 *   tokens   ... a b c d e ............ a b c [pending = d]
 *                  └─ match ─┘               └─ n-gram ─┘
 *   guess    e, ...  (what followed the most recent earlier occurrence)
 *
 * The longest n-gram is tried first (ngram_max down to ngram_min tokens
 * ending at the pending one); the most recent occurrence gives the main
 * chain, and up to two older occurrences that continue differently give
 * shorter side branches, so the tree covers a text that was quoted with
 * variations. No weights and no KV: the whole state is the sequence.
 */
#include "model/spec_impl.h"

#include <stdlib.h>

#define SIDE_BRANCHES 2

typedef struct {
    int ngram_min, ngram_max;
} ngram_state;

static int ngram_seq_create(void *method, const cairn_spec_params *p,
                            const cairn_sampling_params *sp, void **state)
{
    (void)method, (void)sp;
    ngram_state *g = calloc(1, sizeof *g);
    if (!g)
        return CAIRN_ENOMEM;
    g->ngram_min = p->ngram_min;
    g->ngram_max = p->ngram_max;
    *state = g;
    return CAIRN_OK;
}

static void ngram_seq_free(void *state) { free(state); }

/* Whether h[a .. a+n) == h[b .. b+n). */
static bool same(const int32_t *h, int a, int b, int n)
{
    for (int i = 0; i < n; i++)
        if (h[a + i] != h[b + i])
            return false;
    return true;
}

/* Adds the continuation of the occurrence ending before `at` (h[at] is the
 * first guessed token) as a chain of at most `len` rows under the root. */
static int add_chain(spec_tree *t, const int32_t *h, int N, int at, int len, int source)
{
    int parent = 0, added = 0;
    for (int i = 0; i < len && at + i < N; i++) {
        const int before = t->n;
        const int r = spec_tree_add(t, parent, h[at + i], source);
        if (r < 0)
            break;
        added += t->n - before;
        parent = r;
    }
    return added;
}

static int ngram_propose(void *state, const spec_view *v, spec_tree *t, int budget, int source)
{
    const ngram_state *g = state;
    const int32_t *h = v->tokens;
    const int N = v->n_past + 1; /* the pending token included */
    int len = v->chain_len < budget ? v->chain_len : budget;
    if (len <= 0)
        return CAIRN_OK;
    for (int n = g->ngram_max; n >= g->ngram_min; n--) {
        if (N < n + 1)
            continue;
        const int key = N - n;
        int found = 0;
        int32_t first[1 + SIDE_BRANCHES];
        /* the most recent occurrences first: p + n < N leaves a next token */
        for (int p = key - 1; p >= 0 && found <= SIDE_BRANCHES; p--) {
            if (h[p] != h[key] || !same(h, p, key, n))
                continue;
            const int at = p + n;
            bool seen = false;
            for (int i = 0; i < found; i++)
                seen |= first[i] == h[at];
            if (seen)
                continue; /* the same guess as a more recent occurrence */
            first[found] = h[at];
            const int want = found == 0 ? len : len / 2;
            if (want > 0 && budget > 0)
                budget -= add_chain(t, h, N, at, want < budget ? want : budget, source);
            found++;
        }
        if (found)
            return CAIRN_OK;
    }
    return CAIRN_OK;
}

const spec_drafter_ops spec_ngram_ops = {
    .name = "ngram",
    .needs_features = false,
    .seq_create = ngram_seq_create,
    .seq_free = ngram_seq_free,
    .propose = ngram_propose,
};
