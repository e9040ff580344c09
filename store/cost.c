/*
 * store/cost.c — the cost model of the tiered cache: rates measured as the
 * cache runs, and the choice of how many cached pages a fetch should load
 * rather than recompute. Kept apart because it is pure arithmetic over
 * cairn_kvcache's rate fields: no pages move here.
 *
 * Rates are measured as the cache runs: host->device uploads (bytes /
 * seconds, decayed sums), disk rounds (a decayed least-squares fit of
 * seconds = latency + bytes / rate over the rounds' fence latencies), and
 * the prefill rate the engine reports. See store.h for the priors.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#define RATE_DECAY 0.9 /* weight of the past in the decayed sums */

static void fit_add(decayed_fit *f, double x, double y)
{
    f->w = RATE_DECAY * f->w + 1;
    f->x = RATE_DECAY * f->x + x;
    f->y = RATE_DECAY * f->y + y;
    f->xx = RATE_DECAY * f->xx + x * x;
    f->xy = RATE_DECAY * f->xy + x * y;
}

/* Recompute the estimates in force from the measurements (unless a caller
 * pinned them). */
static void refresh_rates(cairn_kvcache *c)
{
    if (c->rates_overridden)
        return;
    cairn_kvcache_rates *r = &c->rates;
    r->compute_tokens_per_s = c->compute_rate > 0 ? c->compute_rate : PRIOR_COMPUTE_TOKENS_PER_S;
    if (c->h2d.y > 0 && c->h2d.x > 0)
        r->h2d_bytes_per_s = c->h2d.x / c->h2d.y;
    const decayed_fit *f = &c->disk_fit;
    if (f->w > 0) {
        double mx = f->x / f->w, my = f->y / f->w;
        double vx = f->xx / f->w - mx * mx, cxy = f->xy / f->w - mx * my;
        /* seconds per byte: the fit's slope when the rounds differed enough
         * in size to tell latency from throughput, else the last estimate. */
        double slope = 1.0 / r->disk_bytes_per_s;
        if (vx > 1e-6 * mx * mx && vx > 0 && cxy > 0)
            slope = cxy / vx;
        double latency = my - slope * mx;
        if (latency < 0) {
            /* All of the time is throughput. */
            latency = 0;
            if (mx > 0 && my > 0)
                slope = my / mx;
        }
        if (slope > 0)
            r->disk_bytes_per_s = 1.0 / slope;
        r->disk_latency_s = latency;
    }
}

void kvc_note_upload(cairn_kvcache *c, size_t pages, double seconds)
{
    if (pages == 0)
        return;
    c->stats.tier[CAIRN_TIER_HOST].load_ops++;
    c->stats.tier[CAIRN_TIER_HOST].load_seconds += seconds;
    c->rates.h2d_samples++;
    if (seconds > 0) {
        double bytes = (double)pages * (double)c->L.page_bytes;
        c->h2d.x = RATE_DECAY * c->h2d.x + bytes;
        c->h2d.y = RATE_DECAY * c->h2d.y + seconds;
        refresh_rates(c);
    }
}

/* A disk round (reads + fence) of n_reads pages took `seconds`. */
void kvc_note_disk_round(cairn_kvcache *c, size_t n_reads, double seconds)
{
    if (n_reads == 0)
        return;
    c->stats.tier[CAIRN_TIER_DISK].load_ops++;
    c->stats.tier[CAIRN_TIER_DISK].load_seconds += seconds;
    c->rates.disk_samples++;
    fit_add(&c->disk_fit, (double)n_reads * (double)c->L.page_bytes, seconds);
    refresh_rates(c);
}

/* How many leading pages of a candidate list are worth having on the
 * device: the count that saves the most time against recomputing them,
 * where a page costs nothing on the device, an upload in host RAM, a disk
 * read plus an upload on disk, and the first disk page adds one disk round
 * trip. Ties go to the shorter prefix, so a load is issued only when it is
 * expected to be strictly faster than recomputing. */
size_t kvc_choose_pages(const cairn_kvcache *c, const uint8_t *tier, size_t n)
{
    const cairn_kvcache_rates *r = &c->rates;
    double pb = (double)c->L.page_bytes;
    double recompute = (double)c->L.page_size / r->compute_tokens_per_s;
    double up = pb / r->h2d_bytes_per_s;
    double from_disk = pb / r->disk_bytes_per_s + up;
    double saved = 0, best_saved = 0;
    size_t best = 0;
    bool disk_seen = false;
    for (size_t i = 0; i < n; i++) {
        double cost = tier[i] == CAIRN_TIER_DEVICE ? 0 : tier[i] == CAIRN_TIER_HOST ? up : from_disk;
        if (tier[i] == CAIRN_TIER_DISK && !disk_seen) {
            cost += r->disk_latency_s;
            disk_seen = true;
        }
        saved += recompute - cost;
        if (saved > best_saved) {
            best_saved = saved;
            best = i + 1;
        }
    }
    return best;
}

int cairn_kvcache_set_compute_rate(cairn_kvcache *c, double tokens_per_s)
{
    if (!c || !(tokens_per_s > 0) || tokens_per_s > 1e15)
        return CAIRN_EINVAL;
    c->compute_rate = tokens_per_s;
    c->rates.compute_samples++;
    refresh_rates(c);
    return CAIRN_OK;
}

int cairn_kvcache_get_rates(const cairn_kvcache *c, cairn_kvcache_rates *out)
{
    if (!c || !out)
        return CAIRN_EINVAL;
    *out = c->rates;
    out->overridden = c->rates_overridden;
    return CAIRN_OK;
}

int cairn_kvcache_override_rates(cairn_kvcache *c, const cairn_kvcache_rates *r)
{
    if (!c)
        return CAIRN_EINVAL;
    if (!r) {
        c->rates_overridden = false;
        c->rates.compute_tokens_per_s = PRIOR_COMPUTE_TOKENS_PER_S;
        c->rates.h2d_bytes_per_s = PRIOR_H2D_BYTES_PER_S;
        c->rates.disk_bytes_per_s = PRIOR_DISK_BYTES_PER_S;
        c->rates.disk_latency_s = PRIOR_DISK_LATENCY_S;
        refresh_rates(c);
        return CAIRN_OK;
    }
    if (!(r->compute_tokens_per_s > 0) || !(r->h2d_bytes_per_s > 0) ||
        !(r->disk_bytes_per_s > 0) || !(r->disk_latency_s >= 0))
        return CAIRN_EINVAL;
    c->rates.compute_tokens_per_s = r->compute_tokens_per_s;
    c->rates.h2d_bytes_per_s = r->h2d_bytes_per_s;
    c->rates.disk_bytes_per_s = r->disk_bytes_per_s;
    c->rates.disk_latency_s = r->disk_latency_s;
    c->rates_overridden = true;
    return CAIRN_OK;
}
