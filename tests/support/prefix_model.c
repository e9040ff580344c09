/*
 * tests/support/prefix_model.c — the reference model the radix and store
 * property tests check a tree against (support.h): a plain list of the
 * sequences inserted, searched exhaustively, so that it cannot share a bug
 * with the tree it checks.
 */
#include "tests/support/support.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

void pm_init(pm_model *m, size_t page_size, size_t max_pages, size_t cap)
{
    *m = (pm_model){.page_size = page_size, .max_pages = max_pages, .cap = cap};
    m->tok = calloc(cap * max_pages * page_size, sizeof(int32_t));
    m->n_pages = calloc(cap, sizeof(size_t));
    if (!m->tok || !m->n_pages)
        fail_msg("prefix model: out of memory (%zu sequences)", cap);
}

void pm_free(pm_model *m)
{
    free(m->tok);
    free(m->n_pages);
    *m = (pm_model){0};
}

static int32_t *seq_tokens(const pm_model *m, size_t i)
{
    return m->tok + i * m->max_pages * m->page_size;
}

/* Whole pages a and b (na and nb pages) have in common from the start. */
static size_t common_pages(const pm_model *m, const int32_t *a, size_t na, const int32_t *b,
                           size_t nb)
{
    size_t k = 0, ps = m->page_size;
    while (k < na && k < nb && memcmp(a + k * ps, b + k * ps, ps * sizeof(int32_t)) == 0)
        k++;
    return k;
}

bool pm_add(pm_model *m, const int32_t *tok, size_t np)
{
    if (m->n == m->cap || np > m->max_pages)
        return false;
    memcpy(seq_tokens(m, m->n), tok, np * m->page_size * sizeof(int32_t));
    m->n_pages[m->n++] = np;
    return true;
}

size_t pm_match(const pm_model *m, const int32_t *tok, size_t np)
{
    size_t best = 0;
    for (size_t i = 0; i < m->n; i++) {
        size_t k = common_pages(m, seq_tokens(m, i), m->n_pages[i], tok, np);
        if (k > best)
            best = k;
    }
    return best;
}

void pm_query(const pm_model *m, uint64_t *rng, unsigned fresh_one_in, int32_t *tok,
              size_t *np)
{
    size_t n = 1 + support_xorshift64(rng) % m->max_pages, keep = 0;
    if (m->n && support_xorshift64(rng) % fresh_one_in != 0) {
        size_t i = support_xorshift64(rng) % m->n;
        keep = support_xorshift64(rng) % (m->n_pages[i] + 1);
        if (keep > n)
            keep = n;
        memcpy(tok, seq_tokens(m, i), keep * m->page_size * sizeof(int32_t));
    }
    for (size_t i = keep * m->page_size; i < n * m->page_size; i++)
        tok[i] = (int32_t)(support_xorshift64(rng) % 3);
    *np = n;
}

void pm_forget(pm_model *m, const int32_t *tok, size_t depth, size_t start)
{
    for (size_t i = 0; i < m->n; i++)
        if (common_pages(m, seq_tokens(m, i), m->n_pages[i], tok, depth) > start)
            m->n_pages[i] = start;
}

void pm_node_tokens(cairn_radix_node *node, size_t depth, size_t page_size, int32_t *tok)
{
    size_t pos = depth;
    for (cairn_radix_node *x = node; cairn_radix_parent(x); x = cairn_radix_parent(x)) {
        size_t xn = cairn_radix_node_pages(x, NULL);
        pos -= xn;
        memcpy(tok + pos * page_size, cairn_radix_node_tokens(x),
               xn * page_size * sizeof(int32_t));
    }
}
