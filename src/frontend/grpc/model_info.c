/*
 * model_info.c - ModelMetadataResponse and ModelConfig from a manifest.
 *
 * Everything is allocated in the caller's arena; an allocation failure is
 * reported as NOMEM with the model's name. Inputs and outputs are the
 * tensors clients see (pjs_manifest_client_tensors: a hooked or meta model's
 * client_inputs and client_outputs, with -1 where they vary); an
 * executable's shapes have -1 for every extent that differs between the
 * model's variants. An ensemble reports platform "ensemble" and its steps
 * as ensemble_scheduling. A decoupled meta reports
 * model_transaction_policy { decoupled: true }. A stateful model reports
 * sequence_batching (Triton's field numbers) with its state tensors and
 * control inputs, which are not among its inputs and outputs.
 */
#include "frontend/grpc/model_info.h"

#include <stdio.h>
#include <string.h>

#include "sched/coalesce.h"

typedef Inference__ModelMetadataResponse__TensorMetadata tensor_metadata;

Inference__DataType pjs_grpc_config_dtype(pjs_dtype t)
{
    switch (t) {
    case PJS_DTYPE_BOOL: return INFERENCE__DATA_TYPE__TYPE_BOOL;
    case PJS_DTYPE_U8: return INFERENCE__DATA_TYPE__TYPE_UINT8;
    case PJS_DTYPE_U16: return INFERENCE__DATA_TYPE__TYPE_UINT16;
    case PJS_DTYPE_U32: return INFERENCE__DATA_TYPE__TYPE_UINT32;
    case PJS_DTYPE_U64: return INFERENCE__DATA_TYPE__TYPE_UINT64;
    case PJS_DTYPE_I8: return INFERENCE__DATA_TYPE__TYPE_INT8;
    case PJS_DTYPE_I16: return INFERENCE__DATA_TYPE__TYPE_INT16;
    case PJS_DTYPE_I32: return INFERENCE__DATA_TYPE__TYPE_INT32;
    case PJS_DTYPE_I64: return INFERENCE__DATA_TYPE__TYPE_INT64;
    case PJS_DTYPE_F16: return INFERENCE__DATA_TYPE__TYPE_FP16;
    case PJS_DTYPE_BF16: return INFERENCE__DATA_TYPE__TYPE_BF16;
    case PJS_DTYPE_F32: return INFERENCE__DATA_TYPE__TYPE_FP32;
    case PJS_DTYPE_F64: return INFERENCE__DATA_TYPE__TYPE_FP64;
    case PJS_DTYPE_BYTES: return INFERENCE__DATA_TYPE__TYPE_STRING;
    default: return INFERENCE__DATA_TYPE__TYPE_INVALID;
    }
}

static int no_memory(const pjs_grpc_model_desc *m, pjs_error *err)
{
    return pjs_error_set(err, PJS_ERR_NOMEM, "model %s: no memory to describe it", m->name);
}

/* "pjrt_<platform>" in the arena; "ensemble" for an ensemble, as Triton
 * names its ensembles' platform. */
static char *platform_name(const pjs_grpc_model_desc *m, pjs_grpc_arena *a)
{
    if (m->manifest->kind == PJS_KIND_ENSEMBLE)
        return "ensemble";
    size_t len = strlen("pjrt_") + strlen(m->platform) + 1;
    char *s = pjs_grpc_arena_alloc(a, len);
    if (s != NULL)
        snprintf(s, len, "pjrt_%s", m->platform);
    return s;
}

/* The client-visible dims[first..rank) of input (or output) i, copied into
 * the arena: extents that differ between the model's variants are -1. Never
 * NULL unless out of memory. */
static int64_t *copy_dims(pjs_grpc_arena *a, const pjs_manifest *mf, bool output, size_t i,
                          int first, size_t *n)
{
    pjs_shape s = pjs_manifest_client_shape(mf, output, i);
    *n = (size_t)(s.rank - first);
    int64_t *dims = pjs_grpc_arena_alloc(a, sizeof *dims * *n);
    if (dims != NULL)
        memcpy(dims, s.dims + first, sizeof *dims * *n);
    return dims;
}

static tensor_metadata **metadata_tensors(const pjs_manifest *mf, bool output, pjs_grpc_arena *a,
                                         size_t *n_out)
{
    size_t n = 0;
    const pjs_tensor_spec *specs = pjs_manifest_client_tensors(mf, output, &n);
    *n_out = n;
    tensor_metadata **list = pjs_grpc_arena_alloc(a, sizeof *list * n);
    for (size_t i = 0; list != NULL && i < n; i++) {
        tensor_metadata *t = pjs_grpc_arena_alloc(a, sizeof *t);
        if (t == NULL)
            return NULL;
        *t = (tensor_metadata)INFERENCE__MODEL_METADATA_RESPONSE__TENSOR_METADATA__INIT;
        t->name = specs[i].name;
        t->datatype = (char *)pjs_dtype_kserve_name(specs[i].dtype);
        t->shape = copy_dims(a, mf, output, i, 0, &t->n_shape);
        if (t->shape == NULL)
            return NULL;
        list[i] = t;
    }
    return list;
}

int pjs_grpc_model_metadata(const pjs_grpc_model_desc *m, pjs_grpc_arena *a,
                            Inference__ModelMetadataResponse **out, pjs_error *err)
{
    const pjs_manifest *mf = m->manifest;
    Inference__ModelMetadataResponse *r = pjs_grpc_arena_alloc(a, sizeof *r);
    char **versions = pjs_grpc_arena_alloc(a, sizeof *versions);
    if (r == NULL || versions == NULL)
        return no_memory(m, err);
    *r = (Inference__ModelMetadataResponse)INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    r->name = (char *)m->name;
    versions[0] = (char *)m->version;
    r->versions = versions;
    r->n_versions = 1;
    r->platform = platform_name(m, a);
    r->inputs = metadata_tensors(mf, false, a, &r->n_inputs);
    r->outputs = metadata_tensors(mf, true, a, &r->n_outputs);
    if (r->platform == NULL || r->inputs == NULL || r->outputs == NULL)
        return no_memory(m, err);
    *out = r;
    return 0;
}

/* dims of a config tensor: without the batch axis when the model batches. */
static int64_t *config_dims(const pjs_grpc_model_desc *m, bool output, size_t i,
                            pjs_grpc_arena *a, size_t *n)
{
    size_t n_specs = 0;
    const pjs_tensor_spec *s = &pjs_manifest_client_tensors(m->manifest, output, &n_specs)[i];
    return copy_dims(a, m->manifest, output, i, m->max_batch_size > 0 && s->batched ? 1 : 0, n);
}

_Static_assert(INFERENCE__MODEL_INPUT__FORMAT__FORMAT_NHWC == (int)PJS_FORMAT_NHWC &&
                   INFERENCE__MODEL_INPUT__FORMAT__FORMAT_NCHW == (int)PJS_FORMAT_NCHW,
               "pjs_tensor_format mirrors ModelInput.Format");

static Inference__ModelInput **config_inputs(const pjs_grpc_model_desc *m, pjs_grpc_arena *a,
                                             size_t *n_out)
{
    size_t n = 0;
    const pjs_tensor_spec *specs = pjs_manifest_client_tensors(m->manifest, false, &n);
    Inference__ModelInput **list = pjs_grpc_arena_alloc(a, sizeof *list * n);
    *n_out = n;
    for (size_t i = 0; list != NULL && i < n; i++) {
        Inference__ModelInput *t = pjs_grpc_arena_alloc(a, sizeof *t);
        if (t == NULL)
            return NULL;
        *t = (Inference__ModelInput)INFERENCE__MODEL_INPUT__INIT;
        t->name = specs[i].name;
        t->data_type = pjs_grpc_config_dtype(specs[i].dtype);
        t->format = (Inference__ModelInput__Format)specs[i].format; /* same values */
        t->dims = config_dims(m, false, i, a, &t->n_dims);
        if (t->dims == NULL)
            return NULL;
        list[i] = t;
    }
    return list;
}

static Inference__ModelOutput **config_outputs(const pjs_grpc_model_desc *m, pjs_grpc_arena *a,
                                               size_t *n_out)
{
    size_t n = 0;
    const pjs_tensor_spec *specs = pjs_manifest_client_tensors(m->manifest, true, &n);
    Inference__ModelOutput **list = pjs_grpc_arena_alloc(a, sizeof *list * n);
    *n_out = n;
    for (size_t i = 0; list != NULL && i < n; i++) {
        Inference__ModelOutput *t = pjs_grpc_arena_alloc(a, sizeof *t);
        if (t == NULL)
            return NULL;
        *t = (Inference__ModelOutput)INFERENCE__MODEL_OUTPUT__INIT;
        t->name = specs[i].name;
        t->data_type = pjs_grpc_config_dtype(specs[i].dtype);
        if (specs[i].labels != NULL) /* the classes' names, for classification */
            t->label_filename = specs[i].labels->file;
        t->dims = config_dims(m, true, i, a, &t->n_dims);
        if (t->dims == NULL)
            return NULL;
        list[i] = t;
    }
    return list;
}

/* preferred_batch_size = the compiled batch sizes up to max_batch_size,
 * no queue delay (see sched/coalesce.h). */
static Inference__ModelDynamicBatching *dynamic_batching(const pjs_manifest *mf,
                                                         int64_t max_batch_size,
                                                         pjs_grpc_arena *a)
{
    Inference__ModelDynamicBatching *d = pjs_grpc_arena_alloc(a, sizeof *d);
    int32_t *sizes = pjs_grpc_arena_alloc(a, sizeof *sizes * mf->n_batch_sizes);
    if (d == NULL || sizes == NULL)
        return NULL;
    *d = (Inference__ModelDynamicBatching)INFERENCE__MODEL_DYNAMIC_BATCHING__INIT;
    size_t n = 0;
    for (size_t i = 0; i < mf->n_batch_sizes && mf->batch_sizes[i] <= max_batch_size; i++)
        sizes[n++] = (int32_t)mf->batch_sizes[i];
    d->preferred_batch_size = sizes;
    d->n_preferred_batch_size = n;
    d->max_queue_delay_microseconds = 0;
    return d;
}

/* A control input (`sequence.controls`) as Triton's ControlInput: its
 * kind, and the false/true values of a flag or the dtype of the id. NULL
 * when out of memory. */
static Inference__ModelSequenceBatching__ControlInput *
control_input(const pjs_tensor_spec *in, pjs_sequence_control k, pjs_grpc_arena *a)
{
    typedef Inference__ModelSequenceBatching__Control control_msg;
    static const Inference__ModelSequenceBatching__Control__Kind kinds[PJS_CONTROL_COUNT] = {
        [PJS_CONTROL_START] = INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_START,
        [PJS_CONTROL_END] = INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_END,
        [PJS_CONTROL_READY] = INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_READY,
        [PJS_CONTROL_CORRID] =
            INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__KIND__CONTROL_SEQUENCE_CORRID};
    static int32_t i32_flags[2] = {0, 1};
    static float f32_flags[2] = {0, 1};
    static protobuf_c_boolean bool_flags[2] = {0, 1};
    Inference__ModelSequenceBatching__ControlInput *ci = pjs_grpc_arena_alloc(a, sizeof *ci);
    control_msg *c = pjs_grpc_arena_alloc(a, sizeof *c);
    control_msg **cs = pjs_grpc_arena_alloc(a, sizeof *cs);
    if (ci == NULL || c == NULL || cs == NULL)
        return NULL;
    *ci = (Inference__ModelSequenceBatching__ControlInput)
        INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL_INPUT__INIT;
    *c = (control_msg)INFERENCE__MODEL_SEQUENCE_BATCHING__CONTROL__INIT;
    c->kind = kinds[k];
    if (k == PJS_CONTROL_CORRID)
        c->data_type = pjs_grpc_config_dtype(in->dtype);
    else if (in->dtype == PJS_DTYPE_F32)
        c->fp32_false_true = f32_flags, c->n_fp32_false_true = 2;
    else if (in->dtype == PJS_DTYPE_BOOL)
        c->bool_false_true = bool_flags, c->n_bool_false_true = 2;
    else
        c->int32_false_true = i32_flags, c->n_int32_false_true = 2;
    cs[0] = c;
    ci->name = in->name;
    ci->control = cs;
    ci->n_control = 1;
    return ci;
}

/* A stateful model's sequence_batching: the idle timeout, the oldest
 * strategy over the compiled sizes, each control input and each state
 * tensor (dims without the batch axis, initial zeros). NULL when out of
 * memory. */
static Inference__ModelSequenceBatching *sequence_batching(const pjs_manifest *mf,
                                                           int64_t max_batch_size,
                                                           pjs_grpc_arena *a)
{
    typedef Inference__ModelSequenceBatching__State state_msg;
    typedef Inference__ModelSequenceBatching__InitialState initial_msg;
    const pjs_sequence_spec *q = &mf->sequence;
    Inference__ModelSequenceBatching *sb = pjs_grpc_arena_alloc(a, sizeof *sb);
    Inference__ModelSequenceBatching__StrategyOldest *old = pjs_grpc_arena_alloc(a, sizeof *old);
    Inference__ModelDynamicBatching *sizes = dynamic_batching(mf, max_batch_size, a);
    state_msg **states = pjs_grpc_arena_alloc(a, sizeof *states * q->n_state);
    if (sb == NULL || old == NULL || sizes == NULL || states == NULL)
        return NULL;
    *sb = (Inference__ModelSequenceBatching)INFERENCE__MODEL_SEQUENCE_BATCHING__INIT;
    *old = (Inference__ModelSequenceBatching__StrategyOldest)
        INFERENCE__MODEL_SEQUENCE_BATCHING__STRATEGY_OLDEST__INIT;
    old->max_candidate_sequences = (int32_t)q->max_sequences;
    old->preferred_batch_size = sizes->preferred_batch_size;
    old->n_preferred_batch_size = sizes->n_preferred_batch_size;
    old->preserve_ordering = true;
    sb->max_sequence_idle_microseconds = (uint64_t)q->idle_timeout_ms * 1000u;
    sb->strategy_choice_case = INFERENCE__MODEL_SEQUENCE_BATCHING__STRATEGY_CHOICE_OLDEST;
    sb->oldest = old;
    for (size_t j = 0; j < q->n_state; j++) {
        const pjs_tensor_spec *in = &mf->inputs[q->state[j].input];
        state_msg *st = pjs_grpc_arena_alloc(a, sizeof *st);
        initial_msg *init = pjs_grpc_arena_alloc(a, sizeof *init);
        initial_msg **inits = pjs_grpc_arena_alloc(a, sizeof *inits);
        int64_t *dims = pjs_grpc_arena_alloc(a, sizeof *dims * (size_t)(in->shape.rank + 1));
        if (st == NULL || init == NULL || inits == NULL || dims == NULL)
            return NULL;
        *st = (state_msg)INFERENCE__MODEL_SEQUENCE_BATCHING__STATE__INIT;
        *init = (initial_msg)INFERENCE__MODEL_SEQUENCE_BATCHING__INITIAL_STATE__INIT;
        size_t n_dims = 0;
        for (int d = 1; d < in->shape.rank; d++) /* the batch axis left out */
            dims[n_dims++] = in->shape.dims[d];
        st->input_name = in->name;
        st->output_name = mf->outputs[q->state[j].output].name;
        st->data_type = pjs_grpc_config_dtype(in->dtype);
        st->dims = dims;
        st->n_dims = n_dims;
        init->data_type = st->data_type;
        init->dims = dims;
        init->n_dims = n_dims;
        init->state_data_case = INFERENCE__MODEL_SEQUENCE_BATCHING__INITIAL_STATE__STATE_DATA_ZERO_DATA;
        init->zero_data = true;
        init->name = "zeros";
        inits[0] = init;
        st->initial_state = inits;
        st->n_initial_state = 1;
        states[j] = st;
    }
    sb->state = states;
    sb->n_state = q->n_state;
    Inference__ModelSequenceBatching__ControlInput **controls =
        pjs_grpc_arena_alloc(a, sizeof *controls * PJS_CONTROL_COUNT);
    if (controls == NULL)
        return NULL;
    sb->control_input = controls;
    for (int k = 0; k < PJS_CONTROL_COUNT; k++) {
        if (q->control[k] == PJS_CONTROL_NONE)
            continue;
        if ((controls[sb->n_control_input++] = control_input(&mf->inputs[q->control[k]], k, a)) ==
            NULL)
            return NULL;
    }
    return sb;
}

/* fn(a, map, n): one of a step's maps as protobuf map entries of type
 * ENTRY (model tensor -> ensemble tensor); NULL when out of memory. The two
 * maps have entry types of their own with the same fields. */
#define DEFINE_STEP_MAP(fn, ENTRY, INIT)                                                    \
    static ENTRY **fn(pjs_grpc_arena *a, const pjs_ensemble_map *map, size_t n)             \
    {                                                                                       \
        ENTRY **list = pjs_grpc_arena_alloc(a, sizeof *list * n);                           \
        for (size_t e = 0; list != NULL && e < n; e++) {                                    \
            if ((list[e] = pjs_grpc_arena_alloc(a, sizeof *list[e])) == NULL)               \
                return NULL;                                                                \
            *list[e] = (ENTRY)INIT;                                                         \
            list[e]->key = map[e].model_tensor;                                             \
            list[e]->value = map[e].ensemble_tensor;                                        \
        }                                                                                   \
        return list;                                                                        \
    }
DEFINE_STEP_MAP(input_map_entries, Inference__ModelEnsembling__Step__InputMapEntry,
                INFERENCE__MODEL_ENSEMBLING__STEP__INPUT_MAP_ENTRY__INIT)
DEFINE_STEP_MAP(output_map_entries, Inference__ModelEnsembling__Step__OutputMapEntry,
                INFERENCE__MODEL_ENSEMBLING__STEP__OUTPUT_MAP_ENTRY__INIT)

/* An ensemble's steps as Triton's ensemble_scheduling, in manifest order. */
static Inference__ModelEnsembling *ensemble_scheduling(const pjs_manifest *mf, pjs_grpc_arena *a)
{
    Inference__ModelEnsembling *e = pjs_grpc_arena_alloc(a, sizeof *e);
    Inference__ModelEnsembling__Step **steps =
        pjs_grpc_arena_alloc(a, sizeof *steps * mf->n_steps);
    if (e == NULL || steps == NULL)
        return NULL;
    *e = (Inference__ModelEnsembling)INFERENCE__MODEL_ENSEMBLING__INIT;
    for (size_t s = 0; s < mf->n_steps; s++) {
        const pjs_ensemble_step *st = &mf->steps[s];
        Inference__ModelEnsembling__Step *t = pjs_grpc_arena_alloc(a, sizeof *t);
        if (t == NULL)
            return NULL;
        *t = (Inference__ModelEnsembling__Step)INFERENCE__MODEL_ENSEMBLING__STEP__INIT;
        t->model_name = st->model;
        t->model_version = st->version;
        t->n_input_map = st->n_inputs;
        t->input_map = input_map_entries(a, st->inputs, st->n_inputs);
        t->n_output_map = st->n_outputs;
        t->output_map = output_map_entries(a, st->outputs, st->n_outputs);
        if (t->input_map == NULL || t->output_map == NULL)
            return NULL;
        steps[s] = t;
    }
    e->step = steps;
    e->n_step = mf->n_steps;
    return e;
}

int pjs_grpc_model_config(const pjs_grpc_model_desc *m, pjs_grpc_arena *a,
                          Inference__ModelConfig **out, pjs_error *err)
{
    Inference__ModelConfig *c = pjs_grpc_arena_alloc(a, sizeof *c);
    if (c == NULL)
        return no_memory(m, err);
    *c = (Inference__ModelConfig)INFERENCE__MODEL_CONFIG__INIT;
    c->name = (char *)m->name;
    c->platform = platform_name(m, a);
    c->backend = "pjserve";
    c->max_batch_size = (int32_t)m->max_batch_size;
    c->input = config_inputs(m, a, &c->n_input);
    c->output = config_outputs(m, a, &c->n_output);
    if (m->manifest->kind == PJS_KIND_ENSEMBLE) {
        c->ensemble_scheduling = ensemble_scheduling(m->manifest, a);
        if (c->ensemble_scheduling == NULL)
            return no_memory(m, err);
        c->scheduling_choice_case = INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_ENSEMBLE_SCHEDULING;
    } else if (m->manifest->stateful) {
        c->sequence_batching = sequence_batching(m->manifest, m->max_batch_size, a);
        if (c->sequence_batching == NULL)
            return no_memory(m, err);
        c->scheduling_choice_case = INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_SEQUENCE_BATCHING;
    } else if (!m->batching_off && pjs_model_coalesces(m->manifest, m->max_batch_size)) {
        c->dynamic_batching = dynamic_batching(m->manifest, m->max_batch_size, a);
        if (c->dynamic_batching == NULL)
            return no_memory(m, err);
        c->scheduling_choice_case = INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING;
    }
    if (m->manifest->decoupled) {
        c->model_transaction_policy =
            pjs_grpc_arena_alloc(a, sizeof *c->model_transaction_policy);
        if (c->model_transaction_policy == NULL)
            return no_memory(m, err);
        *c->model_transaction_policy =
            (Inference__ModelTransactionPolicy)INFERENCE__MODEL_TRANSACTION_POLICY__INIT;
        c->model_transaction_policy->decoupled = true;
    }
    if (c->platform == NULL || c->input == NULL || c->output == NULL)
        return no_memory(m, err);
    *out = c;
    return 0;
}
