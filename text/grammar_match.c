/*
 * text/grammar_match.c — the second half of structured output: a matcher
 * that follows one generation through a compiled grammar
 * (text/grammar_impl.h, built by text/grammar_compile.c) and masks the
 * logits of every token that cannot continue a valid document, with the
 * per-vocabulary index that makes masking cheap. This is the part that runs
 * inside an engine step, once per generated token.
 *
 * Matcher. The state is a set of stacks, as in an Earley/GBNF recogniser
 * with the prediction step done eagerly: each stack's top is a byte-set
 * element, its parents are where to continue when a rule ends. Stacks are
 * persistent linked lists in one node arena, so stepping a byte shares
 * every parent with the previous state. A stack set that contains the empty
 * stack means the document may end here.
 *
 * Masking. A vocabulary is indexed once (cairn_grammar_vocab): the bytes of
 * every token and a byte trie over them. A mask walks the trie depth first,
 * stepping the stack set one byte per trie edge and cutting a subtree as
 * soon as no stack survives, so the tokens sharing a prefix are stepped once
 * and structural positions (after '{', ':' or ',') cost a few hundred node
 * visits. Inside a free-form string almost every token is possible and the
 * trie walk would visit it all; that state is recognised (every plain
 * character leads back to the same stack set) and decided per token: a token
 * made only of plain characters is allowed outright, the others are walked
 * from their first special byte ('"', '\\', a control byte, an incomplete
 * UTF-8 tail). Where most tokens continue but not uniformly (a pattern's
 * character class: most characters pass, to different states), the trie
 * walk is cut short and the tokens are decided through a transition cache
 * over the stack sets met (mask_by_cache), a lookup per byte.
 */
#include "text/text.h"
#include "text/grammar_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep one step bounded whatever the grammar. */
#define MAX_EXPAND_DEPTH 4096    /* reference expansions without a byte       */
#define MAX_STACKS 512           /* live stacks in one state                  */
#define MAX_EXPANSIONS 65536     /* reference expansions for one byte step:
                                    a schema of nested alternatives could
                                    otherwise expand exponentially            */
#define MAX_PLAIN_LEVELS 1100    /* > MAX_REPEAT + a token's plain characters  */
#define DFS_MAX_NODES 8192       /* trie nodes (or a quarter of the trie, if
                                    less) one mask walks before it takes the
                                    transition cache instead                 */

static bool bs_has(const grammar_byteset *s, uint8_t b)
{
    return (s->bits[b >> 6] >> (b & 63)) & 1;
}

/* ======================================================================== */
/* Vocabulary index                                                         */
/* ======================================================================== */

typedef struct {
    int32_t first_child; /* children are contiguous */
    int32_t tok_lo;      /* tokens ending here: sorted[tok_lo .. tok_lo+n_tok) */
    uint16_t n_children;
    uint16_t n_tok;
    uint8_t byte;        /* the edge from the parent */
} trie_node;

struct cairn_grammar_vocab {
    int32_t n_tokens;
    uint8_t *bytes;      /* all pieces back to back */
    uint32_t *off;       /* [n_tokens + 1] */
    uint8_t *is_eog;     /* [n_tokens] */
    uint16_t *plain_len; /* [n_tokens] leading bytes that are whole plain string characters */
    uint16_t *plain_chars; /* [n_tokens] how many characters those bytes are */
    int32_t *sorted;     /* tokens in the trie (non-empty, not EOG), sorted by bytes */
    int32_t n_sorted;
    trie_node *nodes;
    int32_t n_nodes, cap_nodes;
    int max_len;
};

static int cmp_tokens(const void *a, const void *b, void *arg)
{
    const cairn_grammar_vocab *gv = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = gv->off[x + 1] - gv->off[x], ly = gv->off[y + 1] - gv->off[y];
    int c = memcmp(gv->bytes + gv->off[x], gv->bytes + gv->off[y], lx < ly ? lx : ly);
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Bytes of a complete well-formed UTF-8 character starting at s, or 0. */
static int utf8_char_len(const uint8_t *s, size_t n)
{
    uint8_t b = s[0];
    int len;
    uint8_t lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) len = 2;
    else if (b >= 0xe0 && b <= 0xef) {
        len = 3;
        if (b == 0xe0) lo = 0xa0;
        if (b == 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
        len = 4;
        if (b == 0xf0) lo = 0x90;
        if (b == 0xf4) hi = 0x8f;
    } else return 0;
    if ((size_t)len > n || s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

static bool plain_ascii(uint8_t b) { return b >= 0x20 && b <= 0x7f && b != '"' && b != '\\'; }

static int trie_new_nodes(cairn_grammar_vocab *gv, int n)
{
    if (gv->n_nodes + n > gv->cap_nodes) {
        int32_t cap = gv->cap_nodes ? gv->cap_nodes : 4096;
        while (cap < gv->n_nodes + n)
            cap *= 2;
        trie_node *nn = realloc(gv->nodes, (size_t)cap * sizeof *nn);
        if (!nn)
            return -1;
        gv->nodes = nn;
        gv->cap_nodes = cap;
    }
    int first = gv->n_nodes;
    memset(gv->nodes + first, 0, (size_t)n * sizeof *gv->nodes);
    gv->n_nodes += n;
    return first;
}

/* Build the trie over sorted[] without recursion: a work list of (node,
 * range, depth); all tokens in a node's range share its depth-byte prefix. */
static int trie_build(cairn_grammar_vocab *gv)
{
    typedef struct { int32_t node, lo, hi, depth; } work;
    size_t cap = 1024, n = 0;
    work *todo = malloc(cap * sizeof *todo);
    if (!todo || trie_new_nodes(gv, 1) < 0) {
        free(todo);
        return CAIRN_ENOMEM;
    }
    todo[n++] = (work){0, 0, gv->n_sorted, 0};
    while (n > 0) {
        work w = todo[--n];
        int32_t lo = w.lo;
        /* tokens that end here sort first (a prefix sorts before its extensions) */
        while (lo < w.hi && (int32_t)(gv->off[gv->sorted[lo] + 1] - gv->off[gv->sorted[lo]]) == w.depth)
            lo++;
        gv->nodes[w.node].tok_lo = w.lo;
        gv->nodes[w.node].n_tok = (uint16_t)(lo - w.lo);
        int n_children = 0;
        for (int32_t i = lo; i < w.hi;) {
            uint8_t b = gv->bytes[gv->off[gv->sorted[i]] + w.depth];
            while (i < w.hi && gv->bytes[gv->off[gv->sorted[i]] + w.depth] == b)
                i++;
            n_children++;
        }
        if (n_children == 0)
            continue;
        int first = trie_new_nodes(gv, n_children);
        if (first < 0)
            goto oom;
        gv->nodes[w.node].first_child = first;
        gv->nodes[w.node].n_children = (uint16_t)n_children;
        int k = 0;
        for (int32_t i = lo; i < w.hi; k++) {
            int32_t start = i;
            uint8_t b = gv->bytes[gv->off[gv->sorted[i]] + w.depth];
            while (i < w.hi && gv->bytes[gv->off[gv->sorted[i]] + w.depth] == b)
                i++;
            gv->nodes[first + k].byte = b;
            if (n == cap) {
                cap *= 2;
                work *nt = realloc(todo, cap * sizeof *nt);
                if (!nt)
                    goto oom;
                todo = nt;
            }
            todo[n++] = (work){first + k, start, i, w.depth + 1};
        }
    }
    free(todo);
    return CAIRN_OK;
oom:
    free(todo);
    return CAIRN_ENOMEM;
}

int cairn_grammar_vocab_create(const cairn_vocab *v, cairn_grammar_vocab **out)
{
    if (!v || !out)
        return CAIRN_EINVAL;
    *out = NULL;
    cairn_grammar_vocab *gv = calloc(1, sizeof *gv);
    int32_t n = cairn_vocab_n_tokens(v);
    if (!gv)
        return CAIRN_ENOMEM;
    gv->n_tokens = n;
    size_t cap = (size_t)n * 8 + 256, used = 0;
    gv->bytes = malloc(cap);
    gv->off = malloc(((size_t)n + 1) * sizeof *gv->off);
    gv->is_eog = calloc((size_t)n + 1, 1);
    gv->plain_len = calloc((size_t)n + 1, sizeof *gv->plain_len);
    gv->plain_chars = calloc((size_t)n + 1, sizeof *gv->plain_chars);
    gv->sorted = malloc(((size_t)n + 1) * sizeof *gv->sorted);
    int rc = CAIRN_ENOMEM;
    if (!gv->bytes || !gv->off || !gv->is_eog || !gv->plain_len || !gv->plain_chars || !gv->sorted)
        goto fail;
    for (int32_t t = 0; t < n; t++) {
        gv->off[t] = (uint32_t)used;
        gv->is_eog[t] = cairn_vocab_is_eog(v, t);
        if (cap - used < 1024) {
            uint8_t *nb = realloc(gv->bytes, cap * 2);
            if (!nb)
                goto fail;
            gv->bytes = nb;
            cap *= 2;
        }
        size_t len = 0;
        /* Control tokens give no bytes: they never appear in a document. */
        rc = cairn_token_to_piece(v, t, false, (char *)gv->bytes + used, 1024, &len);
        if (rc != CAIRN_OK || len > 1024 || gv->is_eog[t])
            len = 0;
        rc = CAIRN_ENOMEM;
        const uint8_t *p = gv->bytes + used;
        size_t i = 0, chars = 0;
        while (i < len) {
            int cl = plain_ascii(p[i]) ? 1 : utf8_char_len(p + i, len - i);
            if (!cl)
                break;
            i += (size_t)cl;
            chars++;
        }
        gv->plain_len[t] = (uint16_t)i;
        gv->plain_chars[t] = (uint16_t)chars;
        if (len > 0)
            gv->sorted[gv->n_sorted++] = t;
        if ((int)len > gv->max_len)
            gv->max_len = (int)len;
        used += len;
    }
    gv->off[n] = (uint32_t)used;
    qsort_r(gv->sorted, (size_t)gv->n_sorted, sizeof *gv->sorted, cmp_tokens, gv);
    if ((rc = trie_build(gv)) != CAIRN_OK)
        goto fail;
    *out = gv;
    return CAIRN_OK;
fail:
    cairn_grammar_vocab_free(gv);
    return rc;
}

void cairn_grammar_vocab_free(cairn_grammar_vocab *gv)
{
    if (!gv)
        return;
    free(gv->bytes);
    free(gv->off);
    free(gv->is_eog);
    free(gv->plain_len);
    free(gv->plain_chars);
    free(gv->sorted);
    free(gv->nodes);
    free(gv);
}

/* ======================================================================== */
/* Matcher                                                                  */
/* ======================================================================== */

typedef struct {
    int32_t pos;    /* element to match next (a byte set, at a stack's top),
                       or where to continue (in a parent)                   */
    int32_t parent; /* -1: the bottom                                       */
} stack_node;

struct cairn_grammar_matcher {
    const cairn_grammar *g;
    const cairn_grammar_vocab *gv;
    cairn_grammar_vocab *owned_gv;
    stack_node *nodes;      /* [0, n_live): the current state's; above: scratch */
    int32_t n_nodes, cap_nodes, n_live;
    int32_t *pool;          /* stack sets: the current one at [0, n_cur)  */
    int32_t n_pool, cap_pool, n_cur;
    bool cur_accept;        /* the document may end here                     */
    bool oom;
    int32_t budget;         /* expansions left in this byte step             */
    uint8_t *allowed;       /* [n_tokens] scratch of a mask                  */
    int32_t *remap;         /* compaction scratch [cap_nodes]                */
    struct set_cache *cache; /* mask_by_cache's tables, made on first use   */
    int32_t dfs_left;       /* trie nodes a mask_dfs may still visit; < 0: cut */
};

/* A stack set being built at the top of the pool. */
typedef struct {
    int32_t off, n;
    bool accept;
} stack_set;

static int32_t push_node(cairn_grammar_matcher *m, int32_t pos, int32_t parent)
{
    if (m->n_nodes == m->cap_nodes) {
        int32_t cap = m->cap_nodes ? m->cap_nodes * 2 : 1024;
        stack_node *nn = realloc(m->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            m->oom = true;
            return -1;
        }
        m->nodes = nn;
        m->cap_nodes = cap;
    }
    m->nodes[m->n_nodes] = (stack_node){pos, parent};
    return m->n_nodes++;
}

static bool stack_equal(const cairn_grammar_matcher *m, int32_t a, int32_t b)
{
    while (a != b) {
        if (a < 0 || b < 0 || m->nodes[a].pos != m->nodes[b].pos)
            return false;
        a = m->nodes[a].parent;
        b = m->nodes[b].parent;
    }
    return true;
}

static void set_add(cairn_grammar_matcher *m, stack_set *o, int32_t node)
{
    for (int32_t i = 0; i < o->n; i++)
        if (stack_equal(m, m->pool[o->off + i], node))
            return;
    if (o->n >= MAX_STACKS)
        return; /* an ambiguity this wide drops continuations, never adds any */
    if (o->off + o->n == m->cap_pool) {
        int32_t cap = m->cap_pool * 2;
        int32_t *np = realloc(m->pool, (size_t)cap * sizeof *np);
        if (!np) {
            m->oom = true;
            return;
        }
        m->pool = np;
        m->cap_pool = cap;
    }
    m->pool[o->off + o->n++] = node;
    m->n_pool = o->off + o->n;
}

/* Continue at element `pos` with `parent` below: expand references until
 * every resulting stack has a byte set on top (or is empty: accept). */
static void expand(cairn_grammar_matcher *m, int32_t pos, int32_t parent, stack_set *o, int depth)
{
    const grammar_elem *el = m->g->elems;
    for (;;) {
        /* past the limits, continuations are dropped (never invented) */
        if (depth > MAX_EXPAND_DEPTH || m->oom || --m->budget < 0)
            return;
        switch (el[pos].kind) {
        case GRAMMAR_SET: {
            int32_t n = push_node(m, pos, parent);
            if (n >= 0)
                set_add(m, o, n);
            return;
        }
        case GRAMMAR_ALT_END:
        case GRAMMAR_RULE_END:
            if (parent < 0) {
                o->accept = true;
                return;
            }
            pos = m->nodes[parent].pos;
            parent = m->nodes[parent].parent;
            depth++;
            continue;
        case GRAMMAR_REF: {
            /* a reference that ends its alternative is a tail call */
            int32_t cont = parent;
            if (el[pos + 1].kind != GRAMMAR_ALT_END && (cont = push_node(m, pos + 1, parent)) < 0)
                return;
            int32_t a = m->g->rule_start[el[pos].v];
            while (el[a].kind != GRAMMAR_RULE_END) {
                expand(m, a, cont, o, depth + 1);
                while (el[a].kind != GRAMMAR_ALT_END)
                    a++;
                a++;
            }
            return;
        }
        }
        return;
    }
}

static stack_set set_begin(cairn_grammar_matcher *m)
{
    return (stack_set){m->n_pool, 0, false};
}

/* Step every stack of `in` over byte b into a new set at the pool's top. */
static stack_set advance(cairn_grammar_matcher *m, stack_set in, uint8_t b)
{
    stack_set o = set_begin(m);
    m->budget = MAX_EXPANSIONS;
    for (int32_t i = 0; i < in.n; i++) {
        const stack_node *top = &m->nodes[m->pool[in.off + i]];
        int32_t pos = top->pos, parent = top->parent;
        if (bs_has(&m->g->sets[m->g->elems[pos].v], b))
            expand(m, pos + 1, parent, &o, 0);
    }
    return o;
}

static bool set_equal(const cairn_grammar_matcher *m, stack_set a, stack_set b)
{
    if (a.n != b.n || a.accept != b.accept)
        return false;
    for (int32_t i = 0; i < a.n; i++) {
        bool found = false;
        for (int32_t k = 0; k < b.n && !found; k++)
            found = stack_equal(m, m->pool[a.off + i], m->pool[b.off + k]);
        if (!found)
            return false;
    }
    return true;
}

static stack_set cur_set(const cairn_grammar_matcher *m)
{
    return (stack_set){0, m->n_cur, m->cur_accept};
}

/* Make `s` the current state: copy its stacks' nodes to the bottom of the
 * arena (parents always precede children, so one ascending pass does). */
static int commit(cairn_grammar_matcher *m, stack_set s)
{
    if (m->cap_nodes > 0) {
        int32_t *nr = realloc(m->remap, (size_t)m->cap_nodes * sizeof *nr);
        if (!nr)
            return CAIRN_ENOMEM;
        m->remap = nr;
    }
    for (int32_t i = 0; i < m->n_nodes; i++)
        m->remap[i] = -1;
    for (int32_t i = 0; i < s.n; i++)
        for (int32_t k = m->pool[s.off + i]; k >= 0 && m->remap[k] == -1; k = m->nodes[k].parent)
            m->remap[k] = -2; /* reachable */
    int32_t n = 0;
    for (int32_t i = 0; i < m->n_nodes; i++) {
        if (m->remap[i] != -2)
            continue;
        int32_t parent = m->nodes[i].parent;
        m->nodes[n] = (stack_node){m->nodes[i].pos, parent < 0 ? -1 : m->remap[parent]};
        m->remap[i] = n++;
    }
    for (int32_t i = 0; i < s.n; i++)
        m->pool[i] = m->remap[m->pool[s.off + i]];
    m->n_cur = s.n;
    m->cur_accept = s.accept;
    m->n_nodes = m->n_live = n;
    m->n_pool = s.n;
    return CAIRN_OK;
}

static void scratch_reset(cairn_grammar_matcher *m)
{
    m->n_nodes = m->n_live;
    m->n_pool = m->n_cur;
}

int cairn_grammar_matcher_reset(cairn_grammar_matcher *m)
{
    if (!m)
        return CAIRN_EINVAL;
    m->n_nodes = m->n_live = 0;
    m->n_pool = m->n_cur = 0;
    m->oom = false;
    m->budget = MAX_EXPANSIONS;
    stack_set s = set_begin(m);
    int32_t a = m->g->rule_start[m->g->root];
    while (m->g->elems[a].kind != GRAMMAR_RULE_END) {
        expand(m, a, -1, &s, 0);
        while (m->g->elems[a].kind != GRAMMAR_ALT_END)
            a++;
        a++;
    }
    if (m->oom)
        return CAIRN_ENOMEM;
    return commit(m, s);
}

int cairn_grammar_matcher_create_with(const cairn_grammar *g, const cairn_grammar_vocab *gv,
                                      cairn_grammar_matcher **out)
{
    if (!g || !out)
        return CAIRN_EINVAL;
    *out = NULL;
    cairn_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return CAIRN_ENOMEM;
    m->g = g;
    m->gv = gv;
    m->cap_pool = 1024;
    m->pool = malloc((size_t)m->cap_pool * sizeof *m->pool);
    if (!m->pool || (gv && !(m->allowed = malloc((size_t)gv->n_tokens + 1)))) {
        cairn_grammar_matcher_free(m);
        return CAIRN_ENOMEM;
    }
    int rc = cairn_grammar_matcher_reset(m);
    if (rc) {
        cairn_grammar_matcher_free(m);
        return rc;
    }
    *out = m;
    return CAIRN_OK;
}

int cairn_grammar_matcher_create(const cairn_grammar *g, const cairn_vocab *v,
                                 cairn_grammar_matcher **out)
{
    if (!g || !out)
        return CAIRN_EINVAL;
    *out = NULL;
    cairn_grammar_vocab *gv = NULL;
    int rc = v ? cairn_grammar_vocab_create(v, &gv) : CAIRN_OK;
    if (rc == CAIRN_OK && (rc = cairn_grammar_matcher_create_with(g, gv, out)) == CAIRN_OK)
        (*out)->owned_gv = gv;
    else
        cairn_grammar_vocab_free(gv);
    return rc;
}

void cairn_grammar_matcher_free(cairn_grammar_matcher *m)
{
    if (!m)
        return;
    cairn_grammar_vocab_free(m->owned_gv);
    free(m->nodes);
    free(m->pool);
    free(m->allowed);
    free(m->remap);
    free(m->cache);
    free(m);
}

/* Step a copy of the current state over `len` bytes; the set reached (empty
 * with accept false when some byte is refused). Uses scratch only. */
static stack_set walk(cairn_grammar_matcher *m, stack_set s, const uint8_t *bytes, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        s = advance(m, s, bytes[i]);
        if (s.n == 0 && (!s.accept || i + 1 < len))
            return (stack_set){s.off, 0, false};
    }
    return s;
}

int cairn_grammar_matcher_accept_bytes(cairn_grammar_matcher *m, const char *bytes, size_t len)
{
    if (!m || (!bytes && len))
        return CAIRN_EINVAL;
    if (len == 0)
        return CAIRN_OK;
    stack_set s = walk(m, cur_set(m), (const uint8_t *)bytes, len);
    int rc = CAIRN_OK;
    if (m->oom)
        rc = CAIRN_ENOMEM;
    else if (s.n == 0 && !s.accept)
        rc = CAIRN_EINVAL;
    else
        rc = commit(m, s);
    if (rc != CAIRN_OK)
        scratch_reset(m);
    m->oom = false;
    return rc;
}

int cairn_grammar_matcher_accept(cairn_grammar_matcher *m, int32_t token)
{
    if (!m || !m->gv || token < 0 || token >= m->gv->n_tokens)
        return CAIRN_EINVAL;
    const cairn_grammar_vocab *gv = m->gv;
    uint32_t len = gv->off[token + 1] - gv->off[token];
    if (gv->is_eog[token])
        return m->cur_accept ? CAIRN_OK : CAIRN_EINVAL;
    if (len == 0)
        return CAIRN_EINVAL; /* a token without text cannot be part of a document */
    return cairn_grammar_matcher_accept_bytes(m, (const char *)gv->bytes + gv->off[token], len);
}

bool cairn_grammar_matcher_can_end(const cairn_grammar_matcher *m)
{
    return m && m->cur_accept;
}

bool cairn_grammar_matcher_done(const cairn_grammar_matcher *m)
{
    return m && m->cur_accept && m->n_cur == 0;
}

/* Trie walk: allow every token under `t` that the stack set `s` (the state
 * after t's bytes) can continue with. */
static void mask_dfs(cairn_grammar_matcher *m, int32_t t, stack_set s)
{
    const cairn_grammar_vocab *gv = m->gv;
    const trie_node *node = &gv->nodes[t];
    int32_t first = node->first_child, n = node->n_children;
    for (int32_t k = 0; k < n; k++) {
        if (--m->dfs_left < 0)
            return; /* too wide a walk: the caller masks another way */
        const trie_node *child = &gv->nodes[first + k];
        int32_t mark_nodes = m->n_nodes, mark_pool = m->n_pool;
        stack_set o = advance(m, s, child->byte);
        if (o.n > 0 || o.accept) {
            for (int32_t i = 0; i < child->n_tok; i++)
                m->allowed[gv->sorted[child->tok_lo + i]] = 1;
            if (o.n > 0 && child->n_children > 0)
                mask_dfs(m, first + k, o);
        }
        m->n_nodes = mark_nodes;
        m->n_pool = mark_pool;
    }
}

/* The set reached from `s` over one plain string character, when every
 * plain character (each plain ASCII byte, and one character of each UTF-8
 * lead-byte class) reaches the same set; false otherwise. The result stays
 * in scratch; everything else allocated here is released. */
static bool uniform_step(cairn_grammar_matcher *m, stack_set s, stack_set *out)
{
    /* Plain ASCII bytes step the same way when every top byte set holds
     * all of them or none: then one step with 'a' stands for them all. */
    for (int32_t i = 0; i < s.n; i++) {
        const grammar_byteset *set = &m->g->sets[m->g->elems[m->nodes[m->pool[s.off + i]].pos].v];
        bool has_a = bs_has(set, 'a');
        for (int b = 0x20; b <= 0x7f; b++)
            if (plain_ascii((uint8_t)b) && bs_has(set, (uint8_t)b) != has_a)
                return false;
    }
    stack_set r = advance(m, s, 'a');
    int32_t keep_nodes = m->n_nodes, keep_pool = m->n_pool;
    bool same = true; /* all dying is uniform too: a counted string is full */
    static const uint8_t reps[][4] = {
        {0xc2, 0x80}, {0xdf, 0xbf}, {0xe0, 0xa0, 0x80}, {0xe1, 0x80, 0x80}, {0xed, 0x9f, 0xbf},
        {0xee, 0x80, 0x80}, {0xef, 0xbf, 0xbf}, {0xf0, 0x90, 0x80, 0x80},
        {0xf1, 0x80, 0x80, 0x80}, {0xf4, 0x8f, 0xbf, 0xbf},
    };
    for (size_t i = 0; i < sizeof reps / sizeof reps[0] && same; i++) {
        size_t n = reps[i][0] < 0xe0 ? 2 : reps[i][0] < 0xf0 ? 3 : 4;
        same = set_equal(m, walk(m, s, reps[i], n), r);
        m->n_nodes = keep_nodes;
        m->n_pool = keep_pool;
    }
    *out = r;
    return same;
}

/* Per-token masking inside a string: levels[k] is the state after k plain
 * characters (the same whichever characters they are), so a token is
 * decided from the level of its plain prefix plus a walk over what follows
 * it. A free-form string loops (level 1 = level 0); a counted one runs out
 * of levels at maxLength. */
typedef struct {
    stack_set lv[MAX_PLAIN_LEVELS];
    int n;        /* levels known                                  */
    int loop_at;  /* every level from here on is this one; -1: none */
    bool stopped; /* no more levels: not uniform, or the set died  */
} plain_levels;

static stack_set level_at(cairn_grammar_matcher *m, plain_levels *pl, int k, int *got)
{
    while (pl->loop_at < 0 && pl->n <= k && !pl->stopped && pl->n < MAX_PLAIN_LEVELS) {
        stack_set next;
        if (!uniform_step(m, pl->lv[pl->n - 1], &next)) {
            pl->stopped = true;
            break;
        }
        /* the first character of a string enters its loop; the next ones
         * come back to it */
        if (set_equal(m, next, pl->lv[pl->n - 1]))
            pl->loop_at = pl->n - 1;
        else
            pl->lv[pl->n++] = next;
        if (next.n == 0)
            pl->stopped = true;
    }
    if (pl->loop_at >= 0 && k >= pl->loop_at) {
        *got = k;
        return pl->lv[pl->loop_at];
    }
    *got = k < pl->n ? k : pl->n - 1;
    return pl->lv[*got];
}

/* Byte length of the first `chars` characters of a plain prefix. */
static uint32_t plain_bytes(const uint8_t *p, int chars)
{
    uint32_t i = 0;
    for (int c = 0; c < chars; c++)
        i += plain_ascii(p[i]) ? 1 : (uint32_t)utf8_char_len(p + i, 4);
    return i;
}

static void mask_by_levels(cairn_grammar_matcher *m, plain_levels *pl)
{
    const cairn_grammar_vocab *gv = m->gv;
    for (int32_t t = 0; t < gv->n_tokens; t++) { /* id order: sequential memory */
        const uint8_t *p = gv->bytes + gv->off[t];
        uint32_t len = gv->off[t + 1] - gv->off[t];
        if (len == 0)
            continue; /* EOG and control tokens: decided by the caller */
        int chars = gv->plain_chars[t], got;
        stack_set s = level_at(m, pl, chars, &got);
        if (s.n == 0 && !(s.accept && got == chars && gv->plain_len[t] == len)) {
            m->allowed[t] = 0; /* the string is already too long (or the state died) */
            continue;
        }
        int32_t mark_nodes = m->n_nodes, mark_pool = m->n_pool;
        uint32_t skip = got == chars ? gv->plain_len[t] : plain_bytes(p, got);
        if (skip < len)
            s = walk(m, s, p + skip, len - skip);
        m->allowed[t] = s.n > 0 || s.accept;
        m->n_nodes = mark_nodes;
        m->n_pool = mark_pool;
    }
}

/* Per-token masking by a transition cache: the stack sets met while
 * walking tokens are interned, and (set, byte) -> set is computed once per
 * mask, so each token costs a table lookup per byte. This is for the
 * states a trie walk would spend most of the vocabulary on and the plain
 * levels cannot take (a pattern's character class that most characters
 * pass, each to its own state); when more sets turn up than the cache holds
 * (a grammar that is not DFA-like here) it gives up and the trie walk runs. */
#define CACHE_SETS 512
#define CACHE_DEAD (-2)

struct set_cache {
    stack_set set[CACHE_SETS];
    uint32_t hash[CACHE_SETS];
    int32_t next[CACHE_SETS][256]; /* -1 unknown, CACHE_DEAD, else a set */
    int n;
};

static uint32_t set_hash(const cairn_grammar_matcher *m, stack_set s)
{
    uint32_t h = (uint32_t)s.n * 2654435761u + s.accept;
    for (int32_t i = 0; i < s.n; i++) { /* order-free: a sum over stacks */
        uint32_t x = 2166136261u;
        for (int32_t k = m->pool[s.off + i]; k >= 0; k = m->nodes[k].parent)
            x = (x ^ (uint32_t)m->nodes[k].pos) * 16777619u;
        h += x;
    }
    return h;
}

/* The id of set s, interned when new (-1: the cache is full). */
static int32_t cache_intern(cairn_grammar_matcher *m, struct set_cache *c, stack_set s, bool *is_new)
{
    uint32_t h = set_hash(m, s);
    *is_new = false;
    for (int i = 0; i < c->n; i++)
        if (c->hash[i] == h && set_equal(m, c->set[i], s))
            return i;
    if (c->n == CACHE_SETS)
        return -1;
    c->set[c->n] = s;
    c->hash[c->n] = h;
    memset(c->next[c->n], -1, sizeof c->next[c->n]);
    *is_new = true;
    return c->n++;
}

static bool mask_by_cache(cairn_grammar_matcher *m)
{
    if (!m->cache && !(m->cache = malloc(sizeof *m->cache)))
        return false;
    struct set_cache *c = m->cache;
    const cairn_grammar_vocab *gv = m->gv;
    bool is_new;
    c->n = 0;
    int32_t start = cache_intern(m, c, cur_set(m), &is_new);
    for (int32_t t = 0; t < gv->n_tokens; t++) {
        const uint8_t *p = gv->bytes + gv->off[t];
        uint32_t len = gv->off[t + 1] - gv->off[t];
        if (len == 0)
            continue; /* EOG and control tokens: decided by the caller */
        int32_t id = start;
        for (uint32_t i = 0; i < len && id >= 0; i++) {
            int32_t nx = c->next[id][p[i]];
            if (nx == -1) {
                int32_t mark_nodes = m->n_nodes, mark_pool = m->n_pool;
                stack_set o = advance(m, c->set[id], p[i]);
                if (m->oom)
                    return false;
                if (o.n == 0 && !o.accept) {
                    nx = CACHE_DEAD;
                } else if ((nx = cache_intern(m, c, o, &is_new)) < 0) {
                    return false;
                }
                if (!is_new || nx == CACHE_DEAD) { /* keep only a new set's nodes */
                    m->n_nodes = mark_nodes;
                    m->n_pool = mark_pool;
                }
                c->next[id][p[i]] = nx;
            }
            id = nx;
        }
        m->allowed[t] = id >= 0;
    }
    return true;
}

int cairn_grammar_matcher_mask(cairn_grammar_matcher *m, float *logits, int n_vocab)
{
    if (!m || !m->gv || !logits || n_vocab <= 0)
        return CAIRN_EINVAL;
    const cairn_grammar_vocab *gv = m->gv;
    memset(m->allowed, 0, (size_t)gv->n_tokens);
    plain_levels pl;
    pl.n = 1;
    pl.lv[0] = cur_set(m);
    pl.loop_at = -1;
    pl.stopped = false;
    stack_set first;
    if (m->n_cur > 0 && uniform_step(m, pl.lv[0], &first) && first.n > 0) {
        /* inside a string: decide token by token from the plain levels */
        if (set_equal(m, first, pl.lv[0]))
            pl.loop_at = 0;
        else
            pl.lv[pl.n++] = first;
        pl.stopped = first.n == 0;
        mask_by_levels(m, &pl);
        scratch_reset(m);
    } else if (m->n_cur > 0) {
        /* the trie walk, cheap where few tokens continue; where most do
         * (it visits more than DFS_MAX_NODES), the transition cache */
        scratch_reset(m);
        m->dfs_left = gv->n_nodes / 4 < DFS_MAX_NODES ? gv->n_nodes / 4 : DFS_MAX_NODES;
        mask_dfs(m, 0, cur_set(m));
        scratch_reset(m);
        if (m->dfs_left < 0) {
            memset(m->allowed, 0, (size_t)gv->n_tokens);
            bool cached = mask_by_cache(m);
            scratch_reset(m);
            if (!cached) {
                m->oom = false;
                memset(m->allowed, 0, (size_t)gv->n_tokens);
                m->dfs_left = INT32_MAX;
                mask_dfs(m, 0, cur_set(m));
                scratch_reset(m);
            }
        }
    }
    bool oom = m->oom;
    m->oom = false;
    int n_allowed = 0;
    for (int t = 0; t < n_vocab; t++) {
        bool ok = t < gv->n_tokens && (gv->is_eog[t] ? m->cur_accept : m->allowed[t]);
        if (!ok)
            logits[t] = -INFINITY;
        n_allowed += ok;
    }
    if (oom)
        return CAIRN_ENOMEM;
    return n_allowed > 0 ? CAIRN_OK : CAIRN_ENOTFOUND;
}
