/*
 * store/promote.c — promotion: bringing a path of the tree up to the device
 * (uploads from host RAM, disk reads into host slots), and the engine-side
 * end of the disk tier: draining its completions into finished promotions,
 * fetch rounds, persists and record events (poll, wait). Apart from
 * kvcache.c because it is the asynchronous half of the cache.
 *
 * Promotion in brief. promote() uploads HOST nodes on the path at once, and
 * for DISK nodes takes a host slot per page and queues a disk read into it;
 * then it queues a fence. The disk serves requests in order, so when the
 * fence completes every read this promotion (or an earlier one) queued for
 * the path has completed too; poll() then finishes the promotion: fully
 * loaded DISK nodes become HOST, HOST nodes go up to the device, and the
 * event is posted. While a load is in flight its page has host_slot >= 0 in
 * a DISK node, and slot_state[] says how the read went.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- promotion ---------------------------------------------------------- */

int kvc_push_event(cairn_kvcache *c, cairn_kvcache_event ev)
{
    if (c->n_events == c->cap_events) {
        size_t cap = c->cap_events ? 2 * c->cap_events : 16;
        cairn_kvcache_event *e = realloc(c->events, cap * sizeof *e);
        if (!e)
            return CAIRN_ENOMEM;
        c->events = e;
        c->cap_events = cap;
    }
    c->events[c->n_events++] = ev;
    return CAIRN_OK;
}

/* Host node -> device. CAIRN_EFULL when the device has no room. */
static int upload_node(cairn_kvcache *c, cairn_radix_node *node)
{
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    double upload_seconds = 0;
    for (size_t i = 0; i < np; i++) {
        int32_t id;
        int rc = cairn_kvcache_alloc(c, 1, &id);
        double t0 = cairn_now();
        if (rc == CAIRN_OK)
            rc = kvc_page_to_device(c, id, pg[i].host_slot);
        upload_seconds += cairn_now() - t0;
        if (rc) {
            /* Undo this node's uploads: it stays a HOST node. */
            for (size_t j = 0; j < i; j++) {
                cairn_page_pool_release(c->dev, 1, &pg[j].device_page);
                pg[j].device_page = -1;
            }
            return rc == CAIRN_EFULL ? CAIRN_EFULL : rc;
        }
        pg[i].device_page = id;
    }
    for (size_t i = 0; i < np; i++) {
        c->slot_state[pg[i].host_slot] = SLOT_IDLE;
        kvc_host_release(c, pg[i].host_slot);
        pg[i].host_slot = -1;
    }
    kvc_set_tier(c, node, CAIRN_TIER_DEVICE);
    c->stats.promoted_pages += np;
    c->stats.tier[CAIRN_TIER_HOST].promoted_pages += np;
    kvc_note_upload(c, np, upload_seconds);
    return CAIRN_OK;
}

/* Release the slots of pages whose reads finished (loaded or missed), and
 * record misses as lost pages. Slots still loading belong to a later
 * promotion and are left to it. */
static void unload_finished(cairn_kvcache *c, cairn_radix_page *pg, size_t np)
{
    for (size_t i = 0; i < np; i++) {
        if (pg[i].host_slot < 0)
            continue;
        uint8_t st = c->slot_state[pg[i].host_slot];
        if (st == SLOT_LOADING)
            continue;
        if (st == SLOT_MISSED) {
            pg[i].flags |= PAGE_LOST;
            pg[i].on_disk = 0;
        }
        c->slot_state[pg[i].host_slot] = SLOT_IDLE;
        kvc_host_release(c, pg[i].host_slot);
        pg[i].host_slot = -1;
    }
}

static size_t leading_device_pages(cairn_kvcache *c, cairn_radix_node *node)
{
    size_t n_nodes, k = 0;
    if (kvc_path_nodes(c, node, &n_nodes))
        return 0;
    for (size_t i = 0; i < n_nodes; i++) {
        if (cairn_radix_node_tier(c->nodes[i]) != CAIRN_TIER_DEVICE)
            break;
        k += cairn_radix_node_pages(c->nodes[i], NULL);
    }
    return k;
}

/* Finish bringing the path root..node to the device once its disk reads
 * have completed: CAIRN_OK, CAIRN_ENOTFOUND (a page was lost) or
 * CAIRN_EFULL; *resident receives the leading pages now on the device. */
int kvc_finish_path(cairn_kvcache *c, cairn_radix_node *node_in, size_t *resident)
{
    int status = CAIRN_OK;
    size_t n_nodes;
    if (kvc_path_nodes(c, node_in, &n_nodes)) {
        *resident = 0;
        return CAIRN_ENOMEM;
    }
    for (size_t i = 0; i < n_nodes; i++) {
        cairn_radix_node *node = c->nodes[i];
        int tier = cairn_radix_node_tier(node);
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(node, &pg);
        if (tier == CAIRN_TIER_DISK) {
            size_t loaded = 0, loading = 0, lost_at = np;
            for (size_t j = 0; j < np; j++) {
                int32_t s = pg[j].host_slot;
                uint8_t st = s >= 0 ? c->slot_state[s] : SLOT_IDLE;
                if (st == SLOT_LOADED)
                    loaded++;
                else if (st == SLOT_LOADING)
                    loading++;
                else if (lost_at == np && (st == SLOT_MISSED || (pg[j].flags & PAGE_LOST) ||
                                           !pg[j].on_disk))
                    lost_at = j;
            }
            if (status == CAIRN_OK && loaded == np) {
                for (size_t j = 0; j < np; j++)
                    c->slot_state[pg[j].host_slot] = SLOT_IDLE;
                kvc_set_tier(c, node, CAIRN_TIER_HOST);
                c->stats.tier[CAIRN_TIER_DISK].promoted_pages += np;
                tier = CAIRN_TIER_HOST;
            } else if (status == CAIRN_OK && lost_at < np) {
                /* Keep what loaded before the lost page: split it off. */
                cairn_radix_node *prefix = NULL;
                size_t lost_idx = lost_at;
                bool head_loaded = true;
                for (size_t j = 0; j < lost_at; j++)
                    head_loaded &= pg[j].host_slot >= 0 && c->slot_state[pg[j].host_slot] == SLOT_LOADED;
                if (lost_at > 0 && head_loaded &&
                    cairn_radix_split(c->tree, node, lost_at, &prefix) == CAIRN_OK) {
                    cairn_radix_page *pp;
                    size_t pn = cairn_radix_node_pages(prefix, &pp);
                    for (size_t j = 0; j < pn; j++)
                        c->slot_state[pp[j].host_slot] = SLOT_IDLE;
                    kvc_set_tier(c, prefix, CAIRN_TIER_HOST);
                    c->stats.tier[CAIRN_TIER_DISK].promoted_pages += pn;
                    if (upload_node(c, prefix) != CAIRN_OK)
                        status = CAIRN_EFULL;
                    np = cairn_radix_node_pages(node, &pg);
                    lost_idx = 0; /* the node now starts at the lost page */
                }
                unload_finished(c, pg, np);
                pg[lost_idx].flags |= PAGE_LOST;
                pg[lost_idx].on_disk = 0;
                c->stats.lost_pages++;
                if (status == CAIRN_OK)
                    status = CAIRN_ENOTFOUND;
                continue;
            } else {
                /* After an earlier failure, or pages this promotion could not
                 * start loading: give back what finished; a later promotion
                 * owns anything still loading. */
                if (loading == 0)
                    unload_finished(c, pg, np);
                if (status == CAIRN_OK)
                    status = CAIRN_EFULL;
                continue;
            }
        }
        if (tier == CAIRN_TIER_HOST && status == CAIRN_OK) {
            int rc = upload_node(c, node);
            if (rc)
                status = rc;
        }
    }
    *resident = leading_device_pages(c, node_in);
    if (status == CAIRN_OK && *resident != cairn_radix_node_depth(node_in))
        status = CAIRN_EFULL;
    return status;
}

static void finish_promotion(cairn_kvcache *c, const promotion *p)
{
    size_t resident;
    int status = kvc_finish_path(c, p->node, &resident);
    kvc_push_event(c, (cairn_kvcache_event){.cookie = p->cookie, .status = status,
                                        .resident_pages = resident});
}

/* Queue disk reads (into host slots) for the DISK pages on the path
 * root..node that are not loading yet. *queued: reads queued now; *pending:
 * some page is being loaded by an earlier promotion. */
void kvc_queue_path_reads(cairn_kvcache *c, size_t n_nodes, size_t *queued, bool *pending)
{
    size_t ps = (size_t)c->L.page_size;
    *queued = 0;
    *pending = false;
    for (size_t i = 0; i < n_nodes; i++) {
        cairn_radix_node *x = c->nodes[i];
        if (cairn_radix_node_tier(x) != CAIRN_TIER_DISK)
            continue;
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(x, &pg);
        const int32_t *tok = cairn_radix_node_tokens(x);
        for (size_t j = 0; j < np; j++) {
            if (pg[j].host_slot >= 0) {
                *pending = true; /* an earlier promotion is loading it */
                continue;
            }
            if ((pg[j].flags & PAGE_LOST) || !pg[j].on_disk)
                continue; /* finish_promotion reports it lost */
            kvc_host_room(c, 1);
            int32_t slot;
            if (cairn_host_pool_alloc(c->host, 1, &slot) != CAIRN_OK)
                continue; /* reported as EFULL when the promotion finishes */
            int rc = cairn_disk_read(c->disk, pg[j].hash, tok + j * ps,
                                     cairn_host_pool_slot(c->host, slot), COOKIE_READ | (uint64_t)slot);
            if (rc) {
                kvc_host_release(c, slot);
                continue;
            }
            c->slot_state[slot] = SLOT_LOADING;
            pg[j].host_slot = slot;
            (*queued)++;
        }
    }
}

int cairn_kvcache_promote(cairn_kvcache *c, cairn_radix_node *node, uint64_t cookie)
{
    if (!c || !node)
        return CAIRN_EINVAL;
    if (cairn_radix_parent(node) && cairn_radix_node_refs(node) <= 0)
        return CAIRN_EINVAL;
    c->stats.promotions++;
    size_t n_nodes;
    int rc = kvc_path_nodes(c, node, &n_nodes);
    if (rc)
        return rc;
    size_t queued = 0;
    bool pending = false;
    kvc_queue_path_reads(c, n_nodes, &queued, &pending);
    promotion p = {.cookie = cookie, .id = ++c->next_promo, .node = node, .n_reads = queued};
    if ((queued || pending) && c->disk) {
        if (c->n_promos == c->cap_promos) {
            size_t cap = c->cap_promos ? 2 * c->cap_promos : 8;
            promotion *np = realloc(c->promos, cap * sizeof *np);
            if (!np)
                return CAIRN_ENOMEM; /* reads stay queued; their slots come
                                        back when the node is promoted later */
            c->promos = np;
            c->cap_promos = cap;
        }
        rc = cairn_disk_fence(c->disk, COOKIE_FENCE | p.id);
        if (rc == CAIRN_OK) {
            c->promos[c->n_promos++] = p;
            return CAIRN_OK;
        }
    }
    finish_promotion(c, &p);
    return CAIRN_OK;
}

/* ---- disk completions and events ---------------------------------------- */

pending_op *kvc_find_op(cairn_kvcache *c, uint64_t id, size_t *idx)
{
    for (size_t j = 0; j < c->n_ops; j++)
        if (c->ops[j].id == id) {
            *idx = j;
            return &c->ops[j];
        }
    return NULL;
}

/* Handle every disk completion waiting. */
void kvc_drain_disk(cairn_kvcache *c)
{
    if (!c->disk)
        return;
    cairn_disk_completion done[64];
    int k;
    do {
        cairn_disk_poll(c->disk, done, 64, &k);
        for (int i = 0; i < k; i++) {
            uint64_t kind = COOKIE_KIND(done[i].cookie), v = COOKIE_VALUE(done[i].cookie);
            if (kind == COOKIE_READ) {
                if (c->slot_state[v] == SLOT_ORPHAN) {
                    int32_t slot = (int32_t)v;
                    c->slot_state[v] = SLOT_IDLE;
                    kvc_host_release(c, slot);
                } else {
                    c->slot_state[v] = done[i].status == CAIRN_OK ? SLOT_LOADED : SLOT_MISSED;
                    c->slot_shared[v] = done[i].status == CAIRN_OK && done[i].shared;
                    c->slot_seen[v] = done[i].status != CAIRN_OK
                                          ? (uint8_t)((done[i].seen_elsewhere ? SLOT_SEEN : 0) |
                                                      (done[i].busy_elsewhere ? SLOT_BUSY : 0))
                                          : 0;
                }
            } else if (kind == COOKIE_CHILD) {
                kvc_child_done(c, (int32_t)v, &done[i]);
                if (c->slot_state[v] == SLOT_LOADED)
                    done[i].data = NULL; /* the op took it */
            } else if (kind == COOKIE_WRITE) {
                if (v == BEHIND_WRITE)
                    kvc_behind_done(c, done[i].status);
                c->stats.tier[CAIRN_TIER_DISK].store_ops++;
                c->stats.tier[CAIRN_TIER_DISK].store_seconds += done[i].seconds;
                if (done[i].status != CAIRN_OK)
                    c->stats.write_failures++;
            } else if (kind == COOKIE_FENCE) {
                for (size_t j = 0; j < c->n_promos; j++) {
                    if (c->promos[j].id != v)
                        continue;
                    promotion p = c->promos[j];
                    c->promos[j] = c->promos[--c->n_promos];
                    kvc_note_disk_round(c, p.n_reads, done[i].seconds);
                    finish_promotion(c, &p);
                    break;
                }
            } else if (kind == COOKIE_FETCH) {
                for (size_t j = 0; j < c->n_fetches; j++) {
                    if (c->fetches[j]->id != v)
                        continue;
                    fetch_op *op = c->fetches[j];
                    c->fetches[j] = c->fetches[--c->n_fetches];
                    kvc_advance_fetch(c, op, done[i].seconds);
                    break;
                }
            } else if (kind == COOKIE_OP) {
                size_t idx;
                pending_op *op = kvc_find_op(c, v, &idx);
                if (op) {
                    int status = op->status != CAIRN_OK ? op->status : done[i].status;
                    if (op->kind == CAIRN_KVCACHE_EV_PERSIST && status == CAIRN_OK &&
                        c->stats.write_failures > op->failures_before)
                        status = CAIRN_EIO; /* conservative: some write failed meanwhile */
                    if (op->kind >= 0) {
                        cairn_kvcache_event ev = {.cookie = op->cookie, .status = status,
                                                  .kind = op->kind, .data = done[i].data,
                                                  .data_bytes = done[i].bytes};
                        if (kvc_push_event(c, ev) == CAIRN_OK)
                            done[i].data = NULL;
                    } else {
                        op->status = status; /* flush: read by its waiter */
                        op->kind = -2;       /* done */
                        continue;            /* the waiter removes it */
                    }
                    c->ops[idx] = c->ops[--c->n_ops];
                }
            }
            free(done[i].data); /* nobody's (or not handed over) */
        }
    } while (k == 64);
}

int cairn_kvcache_poll(cairn_kvcache *c, cairn_kvcache_event *out, int max, int *n)
{
    if (!c || !n || max < 0 || (max && !out))
        return CAIRN_EINVAL;
    kvc_drain_disk(c);
    kvc_behind_step(c); /* after the drain: completions made room */
    kvc_flush_events(c);
    size_t m = c->n_events < (size_t)max ? c->n_events : (size_t)max;
    if (m) {
        memcpy(out, c->events, m * sizeof *out);
        memmove(c->events, c->events + m, (c->n_events - m) * sizeof *c->events);
        c->n_events -= m;
    }
    *n = (int)m;
    return CAIRN_OK;
}

int cairn_kvcache_wait(cairn_kvcache *c, int timeout_ms)
{
    if (!c)
        return CAIRN_EINVAL;
    if (c->n_events || !c->disk)
        return CAIRN_OK;
    return cairn_disk_wait(c->disk, timeout_ms);
}
