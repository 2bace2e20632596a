/*
 * restart.c - backoff and restart budget of one worker (restart.h).
 */
#include "node/restart.h"

#include <string.h>

void pjs_node_restart_policy_init(pjs_node_restart_policy *p)
{
    p->backoff_initial_ms = 100;
    p->backoff_max_ms = 5000;
    p->stable_ms = 30000;
    p->max_restarts = 5;
    p->window_ms = 60000;
}

void pjs_node_restart_init(pjs_node_restart *r, const pjs_node_restart_policy *p)
{
    memset(r, 0, sizeof *r);
    r->policy = *p;
    if (r->policy.max_restarts > PJS_NODE_MAX_RESTARTS_LIMIT)
        r->policy.max_restarts = PJS_NODE_MAX_RESTARTS_LIMIT;
    if (r->policy.backoff_max_ms < r->policy.backoff_initial_ms)
        r->policy.backoff_max_ms = r->policy.backoff_initial_ms;
    r->next_delay_ms = r->policy.backoff_initial_ms;
}

int64_t pjs_node_restart_next(pjs_node_restart *r, int64_t now_ms, int64_t ready_since_ms)
{
    const pjs_node_restart_policy *p = &r->policy;
    /* Forget restarts that left the window. */
    unsigned keep = 0;
    for (unsigned i = 0; i < r->n_recent; i++)
        if (now_ms - r->recent[i] < (int64_t)p->window_ms)
            r->recent[keep++] = r->recent[i];
    r->n_recent = keep;
    if (r->n_recent >= p->max_restarts)
        return -1;
    if (ready_since_ms >= 0 && now_ms - ready_since_ms >= (int64_t)p->stable_ms)
        r->next_delay_ms = p->backoff_initial_ms;
    int64_t delay = r->next_delay_ms;
    r->recent[r->n_recent++] = now_ms;
    unsigned doubled = r->next_delay_ms > p->backoff_max_ms / 2 ? p->backoff_max_ms
                                                                : r->next_delay_ms * 2;
    r->next_delay_ms = doubled > p->backoff_max_ms ? p->backoff_max_ms : doubled;
    return delay;
}
