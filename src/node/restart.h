/*
 * restart.h - when a worker that went down is started again: exponential
 * backoff and a restart budget. Pure logic on times the caller passes
 * (milliseconds of a monotonic clock), unit-tested on a virtual clock.
 *
 * Each restart waits backoff_initial_ms, doubling after each restart up to
 * backoff_max_ms; a worker that stayed ready for stable_ms before it went
 * down starts again from backoff_initial_ms. A worker that would restart
 * more than max_restarts times within window_ms is given up on (failed).
 *
 * One pjs_node_restart per worker, used by the one thread that supervises
 * it.
 */
#ifndef PJS_NODE_RESTART_H
#define PJS_NODE_RESTART_H

#include <stdbool.h>
#include <stdint.h>

/* Largest --max-restarts. */
#define PJS_NODE_MAX_RESTARTS_LIMIT 1000

typedef struct pjs_node_restart_policy {
    unsigned backoff_initial_ms; /* first delay [100] */
    unsigned backoff_max_ms;     /* the doubling stops here [5000] */
    unsigned stable_ms;          /* ready this long resets the delay [30000] */
    unsigned max_restarts;       /* restarts allowed within window_ms [5]; 0: never restart */
    unsigned window_ms;          /* [60000] */
} pjs_node_restart_policy;

/* The defaults in brackets above. */
void pjs_node_restart_policy_init(pjs_node_restart_policy *p);

typedef struct pjs_node_restart {
    pjs_node_restart_policy policy;
    unsigned next_delay_ms;
    /* Times of the restarts within the window, oldest first. */
    int64_t recent[PJS_NODE_MAX_RESTARTS_LIMIT];
    unsigned n_recent;
} pjs_node_restart;

void pjs_node_restart_init(pjs_node_restart *r, const pjs_node_restart_policy *p);

/* The worker went down at now_ms; it had been ready since ready_since_ms
 * (negative: it was not ready when it went down). Returns the delay before
 * starting it again (counted as a restart), or -1 when the budget is spent:
 * max_restarts restarts already happened within the last window_ms. */
int64_t pjs_node_restart_next(pjs_node_restart *r, int64_t now_ms, int64_t ready_since_ms);

#endif
