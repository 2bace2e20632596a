/*
 * coalesce.h - whether a model's requests are coalesced: the dispatcher's
 * rule, which both protocols' model configurations report
 * (dynamic_batching).
 *
 * The dispatcher runs requests of one model together in one execution when
 * every input and every output has a batch axis to concatenate and split
 * along, and the model was compiled for at least one batch size. The
 * compiled batch sizes are then the model's preferred batch sizes, and no
 * request is held back waiting for others (max_queue_delay_microseconds 0).
 * Pure function; any thread.
 */
#ifndef PJS_SCHED_COALESCE_H
#define PJS_SCHED_COALESCE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/manifest.h"

static inline bool pjs_model_coalesces(const pjs_manifest *m, int64_t max_batch_size)
{
    if (max_batch_size <= 0 || m->n_batch_sizes == 0)
        return false;
    for (size_t i = 0; i < m->n_inputs; i++)
        if (!m->inputs[i].batched)
            return false;
    for (size_t k = 0; k < m->n_outputs; k++)
        if (!m->outputs[k].batched)
            return false;
    return true;
}

#endif
