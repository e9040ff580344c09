/*
 * route/pick.c — the cost of sending a request to a replica and the choice
 * among replicas (route.h, section 3). Pure functions: the unit test
 * (tests/route/test_route_index.c) checks them on their own.
 */
#include "route/route.h"

double route_cost(int64_t n_prompt, int64_t cached, const route_load *load,
                  const route_weights *w)
{
    if (cached < 0)
        cached = 0;
    if (cached > n_prompt)
        cached = n_prompt;
    double cost = (1.0 + w->work) * (double)(n_prompt - cached);
    if (load)
        cost += (double)load->prefill + w->decode * (double)load->decode;
    return cost;
}

int64_t route_expected_decode(int64_t max_tokens, int64_t estimate)
{
    if (max_tokens <= 0)
        return estimate;
    return max_tokens < estimate ? max_tokens : estimate;
}

int route_pick(route_policy policy, const route_candidate *c, int n, int64_t n_prompt,
               const route_weights *w, int *cursor)
{
    if (n <= 0)
        return -1;
    int start = 0; /* the first candidate at or after the cursor's slot */
    while (start < n && c[start].slot < *cursor)
        start++;
    if (start == n)
        start = 0;
    int best = -1;
    double best_cost = 0;
    for (int k = 0; k < n; k++) {
        int i = (start + k) % n;
        if (!c[i].up)
            continue;
        if (policy == ROUTE_POLICY_ROUND_ROBIN) {
            best = i;
            break;
        }
        double cost = route_cost(n_prompt, c[i].cached, &c[i].load, w);
        /* strictly better only: an equal one found later loses to the one
         * nearer the cursor, which is what spreads equal requests */
        if (best < 0 || cost < best_cost ||
            (cost == best_cost && c[i].load.inflight < c[best].load.inflight)) {
            best = i;
            best_cost = cost;
        }
    }
    if (best >= 0)
        *cursor = c[best].slot + 1;
    return best;
}
