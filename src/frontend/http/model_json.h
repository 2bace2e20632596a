/*
 * model_json.h - the JSON documents that describe a model, as Triton's REST
 * API shapes them: metadata (GET /v2/models/{m}), configuration (.../config)
 * and statistics (.../stats).
 *
 * They are built from a model's manifest and a statistics snapshot, not from
 * a live model, so they can be tested without a server. Pure functions; any
 * thread. Each returns a new jansson value (NULL when out of memory).
 */
#ifndef PJS_FRONTEND_HTTP_MODEL_JSON_H
#define PJS_FRONTEND_HTTP_MODEL_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/manifest.h"
#include "registry/model.h"

/* {"name", "versions": ["1"], "platform", "inputs", "outputs"} of the
 * tensors clients see (pjs_manifest_client_tensors: a hooked or meta
 * model's client_inputs / client_outputs, else the executable's); each
 * tensor {"name", "datatype", "shape"} with -1 for the batch axis, for every
 * extent declared -1 and for every extent that differs between the model's
 * variants (also in config dims). */
json_t *pjs_model_metadata_json(const char *name, const char *platform,
                                const pjs_manifest *m);

/* Triton's model configuration: name, platform, backend "pjserve",
 * max_batch_size, input and output (data_type "TYPE_FP32", dims without the
 * batch axis when max_batch_size > 0) and, when the model's requests are
 * coalesced (sched/coalesce.h; batching_off: a load's configuration
 * override left dynamic_batching out), dynamic_batching with the compiled
 * batch sizes up to max_batch_size as preferred_batch_size and
 * max_queue_delay_microseconds 0. */
json_t *pjs_model_config_json(const char *name, const char *platform, const pjs_manifest *m,
                              int64_t max_batch_size, bool batching_off);

/* One entry of "model_stats": name, version, last_inference, inference_count,
 * execution_count, inference_stats (success, fail, queue, compute_input,
 * compute_infer, compute_output, cache_hit, cache_miss as {count, ns}) and
 * batch_stats (the batch sizes that ran). */
json_t *pjs_model_stats_json(const char *name, const char *version, const pjs_model_stats *st);

#endif
