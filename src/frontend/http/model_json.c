/*
 * model_json.c - model metadata, configuration and statistics documents (see
 * model_json.h).
 *
 * Built with jansson's json_pack; a NULL anywhere (out of memory) makes the
 * whole pack fail, so every function returns a complete document or NULL.
 * Inputs and outputs are the tensors clients see (pjs_manifest_client_tensors:
 * a hooked or meta model's client_inputs and client_outputs). An ensemble's
 * platform is "ensemble" and its configuration lists its steps as Triton's
 * ensemble_scheduling; a decoupled meta's has model_transaction_policy
 * {"decoupled": true}; a stateful model's has sequence_batching with its
 * state tensors and control inputs (which are not among its inputs and
 * outputs).
 */
#include "frontend/http/model_json.h"

#include <stdio.h>

#include "sched/coalesce.h"

/* [d0, d1, ...] from dims[first..rank) of input (or output) i as clients see
 * it: extents that differ between the model's variants are -1. */
static json_t *dims_json(const pjs_manifest *m, bool output, size_t i, int first)
{
    pjs_shape s = pjs_manifest_client_shape(m, output, i);
    json_t *dims = json_array();
    for (int d = first; dims != NULL && d < s.rank; d++)
        if (json_array_append_new(dims, json_integer(s.dims[d])) != 0) {
            json_decref(dims);
            return NULL;
        }
    return dims;
}

static json_t *tensor_metadata_json(const pjs_manifest *m, bool output)
{
    size_t n = 0;
    const pjs_tensor_spec *specs = pjs_manifest_client_tensors(m, output, &n);
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < n; i++) {
        json_t *t = json_pack("{s:s, s:s, s:o}", "name", specs[i].name, "datatype",
                              pjs_dtype_kserve_name(specs[i].dtype), "shape",
                              dims_json(m, output, i, 0));
        if (t == NULL || json_array_append_new(list, t) != 0) {
            json_decref(list);
            return NULL;
        }
    }
    return list;
}

json_t *pjs_model_metadata_json(const char *name, const char *platform, const pjs_manifest *m)
{
    if (m->kind == PJS_KIND_ENSEMBLE)
        platform = "ensemble";
    return json_pack("{s:s, s:[s], s:s, s:o, s:o}", "name", name, "versions",
                     PJS_MODEL_VERSION, "platform", platform, "inputs",
                     tensor_metadata_json(m, false), "outputs", tensor_metadata_json(m, true));
}

/* Triton's data_type spelling: "TYPE_" and the KServe name ("TYPE_FP32"),
 * except for strings, which the configuration calls TYPE_STRING. */
static const char *config_data_type(pjs_dtype dt, char *buf, size_t size)
{
    snprintf(buf, size, "TYPE_%s", dt == PJS_DTYPE_BYTES ? "STRING" : pjs_dtype_kserve_name(dt));
    return buf;
}

static json_t *tensor_config_json(const pjs_manifest *m, int64_t max_batch_size, bool inputs)
{
    size_t n = 0;
    const pjs_tensor_spec *specs = pjs_manifest_client_tensors(m, !inputs, &n);
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < n; i++) {
        const pjs_tensor_spec *s = &specs[i];
        char type[32];
        /* With max_batch_size > 0 Triton leaves the batch axis out of dims. */
        json_t *dims = dims_json(m, !inputs, i, s->batched && max_batch_size > 0 ? 1 : 0);
        json_t *t = inputs ? json_pack("{s:s, s:s, s:s, s:o, s:b, s:b, s:b}", "name", s->name,
                                       "data_type", config_data_type(s->dtype, type, sizeof type),
                                       "format", pjs_tensor_format_name(s->format), "dims", dims, "is_shape_tensor",
                                       0, "allow_ragged_batch", 0, "optional", 0)
                           : json_pack("{s:s, s:s, s:o, s:s, s:b}", "name", s->name,
                                       "data_type", config_data_type(s->dtype, type, sizeof type),
                                       "dims", dims, "label_filename",
                                       s->labels != NULL ? s->labels->file : "",
                                       "is_shape_tensor", 0);
        if (t == NULL || json_array_append_new(list, t) != 0) {
            json_decref(list);
            return NULL;
        }
    }
    return list;
}

/* {"preferred_batch_size": [compiled sizes up to max_batch_size],
 * "max_queue_delay_microseconds": 0} (see sched/coalesce.h). */
static json_t *dynamic_batching_json(const pjs_manifest *m, int64_t max_batch_size)
{
    json_t *sizes = json_array();
    for (size_t i = 0; sizes != NULL && i < m->n_batch_sizes && m->batch_sizes[i] <= max_batch_size;
         i++)
        if (json_array_append_new(sizes, json_integer(m->batch_sizes[i])) != 0) {
            json_decref(sizes);
            return NULL;
        }
    return json_pack("{s:o, s:i}", "preferred_batch_size", sizes, "max_queue_delay_microseconds",
                     0);
}

/* Triton's control_input entries of a stateful model's control inputs:
 * each one's kind, and the false/true values of a flag or the id's dtype. */
static json_t *control_inputs_json(const pjs_manifest *m)
{
    static const char *const kinds[PJS_CONTROL_COUNT] = {
        [PJS_CONTROL_START] = "CONTROL_SEQUENCE_START", [PJS_CONTROL_END] = "CONTROL_SEQUENCE_END",
        [PJS_CONTROL_READY] = "CONTROL_SEQUENCE_READY",
        [PJS_CONTROL_CORRID] = "CONTROL_SEQUENCE_CORRID"};
    const pjs_sequence_spec *q = &m->sequence;
    json_t *list = json_array();
    for (int k = 0; list != NULL && k < PJS_CONTROL_COUNT; k++) {
        if (q->control[k] == PJS_CONTROL_NONE)
            continue;
        const pjs_tensor_spec *in = &m->inputs[q->control[k]];
        char type[32];
        json_t *control =
            k == PJS_CONTROL_CORRID ? json_pack("{s:s, s:s}", "kind", kinds[k], "data_type",
                                                config_data_type(in->dtype, type, sizeof type))
            : in->dtype == PJS_DTYPE_F32  ? json_pack("{s:s, s:[f,f]}", "kind", kinds[k],
                                                      "fp32_false_true", 0.0, 1.0)
            : in->dtype == PJS_DTYPE_BOOL ? json_pack("{s:s, s:[b,b]}", "kind", kinds[k],
                                                      "bool_false_true", 0, 1)
                                          : json_pack("{s:s, s:[i,i]}", "kind", kinds[k],
                                                      "int32_false_true", 0, 1);
        json_t *entry = json_pack("{s:s, s:[o]}", "name", in->name, "control", control);
        if (entry == NULL || json_array_append_new(list, entry) != 0) {
            json_decref(list);
            return NULL;
        }
    }
    return list;
}

/* A stateful model's Triton sequence_batching: the idle timeout, the oldest
 * strategy over the compiled sizes, its control inputs and each state tensor
 * (dims without the batch axis, initial zeros). */
static json_t *sequence_batching_json(const pjs_manifest *m, int64_t max_batch_size)
{
    const pjs_sequence_spec *q = &m->sequence;
    json_t *states = json_array();
    for (size_t j = 0; states != NULL && j < q->n_state; j++) {
        const pjs_tensor_spec *in = &m->inputs[q->state[j].input];
        char type[32];
        json_t *dims = json_array();
        for (int d = 1; dims != NULL && d < in->shape.rank; d++)
            if (json_array_append_new(dims, json_integer(in->shape.dims[d])) != 0) {
                json_decref(dims);
                dims = NULL;
            }
        json_t *st = json_pack(
            "{s:s, s:s, s:s, s:O, s:[{s:s, s:O, s:b, s:s}]}", "input_name", in->name,
            "output_name", m->outputs[q->state[j].output].name, "data_type",
            config_data_type(in->dtype, type, sizeof type), "dims", dims, "initial_state",
            "data_type", type, "dims", dims, "zero_data", 1, "name", "zeros");
        json_decref(dims);
        if (st == NULL || json_array_append_new(states, st) != 0) {
            json_decref(states);
            return NULL;
        }
    }
    json_t *sizes = dynamic_batching_json(m, max_batch_size);
    json_t *oldest = sizes == NULL ? NULL
                                   : json_pack("{s:I, s:O, s:i, s:b}", "max_candidate_sequences",
                                               (json_int_t)q->max_sequences,
                                               "preferred_batch_size",
                                               json_object_get(sizes, "preferred_batch_size"),
                                               "max_queue_delay_microseconds", 0,
                                               "preserve_ordering", 1);
    json_decref(sizes);
    return json_pack("{s:I, s:o, s:o, s:o}", "max_sequence_idle_microseconds",
                     (json_int_t)q->idle_timeout_ms * 1000, "control_input",
                     control_inputs_json(m), "oldest", oldest, "state", states);
}

/* {"model_name": ..., "model_version": -1, "input_map": {...}, "output_map":
 * {...}} per step, in manifest order: Triton's ensemble_scheduling. */
static json_t *step_map_json(const pjs_ensemble_map *map, size_t n)
{
    json_t *o = json_object();
    for (size_t e = 0; o != NULL && e < n; e++)
        if (json_object_set_new(o, map[e].model_tensor, json_string(map[e].ensemble_tensor)) != 0) {
            json_decref(o);
            return NULL;
        }
    return o;
}

static json_t *ensemble_scheduling_json(const pjs_manifest *m)
{
    json_t *steps = json_array();
    for (size_t s = 0; steps != NULL && s < m->n_steps; s++) {
        const pjs_ensemble_step *st = &m->steps[s];
        json_t *step = json_pack("{s:s, s:I, s:o, s:o}", "model_name", st->model,
                                 "model_version", (json_int_t)st->version, "input_map",
                                 step_map_json(st->inputs, st->n_inputs), "output_map",
                                 step_map_json(st->outputs, st->n_outputs));
        if (step == NULL || json_array_append_new(steps, step) != 0) {
            json_decref(steps);
            return NULL;
        }
    }
    return json_pack("{s:o}", "step", steps);
}

json_t *pjs_model_config_json(const char *name, const char *platform, const pjs_manifest *m,
                              int64_t max_batch_size, bool batching_off)
{
    if (m->kind == PJS_KIND_ENSEMBLE)
        platform = "ensemble"; /* Triton's name for an ensemble's platform */
    json_t *config = json_pack(
        "{s:s, s:s, s:s, s:{s:{s:i}}, s:I, s:o, s:o}", "name", name, "platform", platform,
        "backend", "pjserve", "version_policy", "latest", "num_versions", 1, "max_batch_size",
        (json_int_t)max_batch_size, "input",
        tensor_config_json(m, max_batch_size, true), "output",
        tensor_config_json(m, max_batch_size, false));
    if (config != NULL && m->kind == PJS_KIND_ENSEMBLE &&
        json_object_set_new(config, "ensemble_scheduling", ensemble_scheduling_json(m)) != 0) {
        json_decref(config);
        return NULL;
    }
    if (config != NULL && m->stateful &&
        json_object_set_new(config, "sequence_batching",
                            sequence_batching_json(m, max_batch_size)) != 0) {
        json_decref(config);
        return NULL;
    }
    if (config != NULL && m->kind != PJS_KIND_ENSEMBLE && !m->stateful && !batching_off &&
        pjs_model_coalesces(m, max_batch_size) &&
        json_object_set_new(config, "dynamic_batching",
                            dynamic_batching_json(m, max_batch_size)) != 0) {
        json_decref(config);
        return NULL;
    }
    if (config != NULL && m->decoupled &&
        json_object_set_new(config, "model_transaction_policy",
                            json_pack("{s:b}", "decoupled", 1)) != 0) {
        json_decref(config);
        return NULL;
    }
    return config;
}

static json_t *duration_json(const pjs_duration_stat *d)
{
    return json_pack("{s:I, s:I}", "count", (json_int_t)d->count, "ns", (json_int_t)d->ns);
}

static json_t *batch_stats_json(const pjs_model_stats *st)
{
    json_t *list = json_array();
    for (size_t i = 0; list != NULL && i < st->n_batch; i++) {
        const pjs_batch_stat *b = &st->batch[i];
        if (b->compute_infer.count == 0)
            continue; /* the row counts that ran, as gRPC lists them */
        json_t *entry = json_pack("{s:I, s:o, s:o, s:o}", "batch_size",
                                  (json_int_t)b->batch_size, "compute_input",
                                  duration_json(&b->compute_input), "compute_infer",
                                  duration_json(&b->compute_infer), "compute_output",
                                  duration_json(&b->compute_output));
        if (entry == NULL || json_array_append_new(list, entry) != 0) {
            json_decref(list);
            return NULL;
        }
    }
    return list;
}

json_t *pjs_model_stats_json(const char *name, const char *version, const pjs_model_stats *st)
{
    static const pjs_duration_stat never = {0, 0}; /* pjserve has no response cache */
    json_t *inference_stats = json_pack(
        "{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "success", duration_json(&st->success),
        "fail", duration_json(&st->fail), "queue", duration_json(&st->queue), "compute_input",
        duration_json(&st->compute_input), "compute_infer", duration_json(&st->compute_infer),
        "compute_output", duration_json(&st->compute_output), "cache_hit", duration_json(&never),
        "cache_miss", duration_json(&never));
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:o, s:o, s:{}, s:[]}", "name", name, "version",
                     version, "last_inference", (json_int_t)st->last_inference_ms,
                     "inference_count", (json_int_t)st->inference_count, "execution_count",
                     (json_int_t)st->execution_count, "inference_stats", inference_stats,
                     "batch_stats", batch_stats_json(st), "response_stats", "memory_usage");
}
