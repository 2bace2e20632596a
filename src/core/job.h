/*
 * job.h - what the scheduler knows of a queued request.
 *
 * Every pjs_infer_request embeds one pjs_sched_job; the scheduler's queues
 * (policy.h) link jobs, never requests, so its decisions can be tested
 * without models or a device.
 */
#ifndef PJS_CORE_JOB_H
#define PJS_CORE_JOB_H

#include <stdbool.h>
#include <stdint.h>

typedef struct pjs_sched_job {
    uint64_t arrival_ns;   /* when queued (monotonic) */
    uint64_t deadline_ns;  /* monotonic; 0: none */
    int64_t rows;          /* rows in the batch axis (1 for unbatched models) */
    bool committed;        /* dispatched ahead of the discipline (meta sub-calls) */
    struct pjs_sched_job *next;
} pjs_sched_job;

#endif
