/*
 * infer.c - request validation shared by every front end.
 *
 * The checks run in the order a caller fixes mistakes: names first (unknown,
 * repeated, missing), then per input the datatype, the shape and the byte
 * size, then agreement on the batch, then the requested outputs. The first
 * failure is reported; messages name the model and the tensor and say what
 * was expected.
 *
 * A model with several input-shape variants first resolves the request to
 * the variant whose shapes its inputs have (datatypes, the same in every
 * variant, are checked before that); the per-input checks then run against
 * that variant's specs, which the inputs keep for the dispatcher.
 *
 * A hooked or meta model is first checked against its client tensors
 * (pjs_infer_validate_client), which have no variants but may have extents
 * that vary (-1: any extent) and BYTES tensors. A BYTES input has no fixed
 * byte size: its serialized data must be well formed and hold exactly one
 * element per position of its shape.
 */
#include "core/infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bytes.h"
#include "core/classify.h"
#include "core/shm.h"

void pjs_infer_request_init(pjs_infer_request *r)
{
    memset(r, 0, sizeof *r);
    r->id = "";
    r->times.received = pjs_now_ns();
}

void pjs_infer_request_release(pjs_infer_request *r)
{
    for (size_t i = 0; i < r->n_outputs; i++) {
        free(r->outputs[i].data);
        r->outputs[i].data = NULL;
    }
    r->n_outputs = 0;
}

int pjs_infer_input_from_shm(pjs_infer_input *in, pjs_shm_view *view, pjs_error *err)
{
    in->nbytes = view->size;
    int64_t device_id;
    uint64_t address;
    if (pjs_shm_view_device(view, &device_id, &address)) {
        in->device = view;
        return 0;
    }
    int rc = pjs_shm_view_read(view, err);
    if (rc == 0)
        in->data = view->data;
    return rc;
}

int pjs_infer_read_device_inputs(pjs_infer_request *r, pjs_error *err)
{
    for (size_t i = 0; i < r->n_inputs; i++) {
        pjs_infer_input *in = &r->inputs[i];
        if (in->device == NULL || in->data != NULL)
            continue;
        int rc = pjs_shm_view_read(in->device, err);
        if (rc != 0)
            return pjs_error_prefix(err, "input \"%.256s\": ", in->name);
        in->data = in->device->data;
    }
    return 0;
}

uint64_t pjs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t pjs_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* "x, y" into buf. */
static const char *tensor_names(const pjs_tensor_spec *specs, size_t n, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "", specs[i].name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

static const pjs_tensor_spec *find_spec(const pjs_tensor_spec *specs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0)
            return &specs[i];
    return NULL;
}

/* The shape the model takes, with the batch axis shown as -1. */
static const char *expected_shape(const pjs_tensor_spec *s, char *buf, size_t size)
{
    return pjs_shape_format(&s->shape, buf, size);
}

static int check_datatype(const pjs_infer_input *in, const pjs_manifest *m, pjs_error *err)
{
    const pjs_tensor_spec *s = in->spec;
    size_t dt_len = in->datatype ? strlen(in->datatype) : 0;
    pjs_dtype dt = pjs_dtype_from_kserve(in->datatype ? in->datatype : "", dt_len);
    if (dt == PJS_DTYPE_INVALID)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": unknown datatype \"%.32s\" (the model "
                             "takes %s)",
                             m->name, in->name, in->datatype ? in->datatype : "",
                             pjs_dtype_kserve_name(s->dtype));
    if (dt != s->dtype)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": datatype %s does not match the model's %s",
                             m->name, in->name, pjs_dtype_kserve_name(dt),
                             pjs_dtype_kserve_name(s->dtype));
    return 0;
}

/* What the -1 extents of a tensor's shape mean, for messages. */
static const char *shape_legend(const pjs_tensor_spec *s)
{
    bool varies = false;
    for (int d = s->batched ? 1 : 0; d < s->shape.rank; d++)
        varies = varies || s->shape.dims[d] < 0;
    if (s->batched && varies)
        return " (-1: the batch size first, any extent elsewhere)";
    if (s->batched)
        return " (-1: the batch size)";
    return varies ? " (-1: any extent)" : "";
}

/* A BYTES input: well formed, one element per position of its shape. */
static int check_bytes(const pjs_infer_input *in, const pjs_manifest *m, pjs_error *err)
{
    char got[160];
    int64_t numel = 0;
    uint64_t count = 0;
    if (!pjs_shape_numel(&in->shape, &numel))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": shape %s is too large", m->name, in->name,
                             pjs_shape_format(&in->shape, got, sizeof got));
    if (in->data == NULL && in->nbytes > 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": no data", m->name, in->name);
    if (pjs_bytes_count(in->data, in->nbytes, &count, err) != 0)
        return pjs_error_prefix(err, "model %s: input \"%s\": ", m->name, in->name);
    if (count != (uint64_t)numel)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": the BYTES data holds %llu elements but "
                             "shape %s has %lld",
                             m->name, in->name, (unsigned long long)count,
                             pjs_shape_format(&in->shape, got, sizeof got), (long long)numel);
    return 0;
}

static int check_input(const pjs_infer_input *in, const pjs_manifest *m, int64_t max_batch,
                       pjs_error *err)
{
    const pjs_tensor_spec *s = in->spec;
    char got[160], want[160];
    int rc = check_datatype(in, m, err);
    if (rc != 0)
        return rc;
    const pjs_shape *sh = &in->shape;
    bool ok = sh->rank == s->shape.rank;
    for (int d = s->batched ? 1 : 0; ok && d < sh->rank; d++)
        ok = s->shape.dims[d] < 0 ? sh->dims[d] >= 0 : sh->dims[d] == s->shape.dims[d];
    if (!ok)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": shape %s does not match the model's %s%s",
                             m->name, in->name, pjs_shape_format(sh, got, sizeof got),
                             expected_shape(s, want, sizeof want), shape_legend(s));
    if (s->batched && (sh->dims[0] < 1 || sh->dims[0] > max_batch))
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": batch size %lld is outside 1..%lld (the "
                             "model's max_batch_size)",
                             m->name, in->name, (long long)sh->dims[0], (long long)max_batch);
    if (s->dtype == PJS_DTYPE_BYTES)
        return check_bytes(in, m, err);
    uint64_t want_bytes = 0;
    if (!pjs_shape_nbytes(sh, pjs_dtype_size(s->dtype), &want_bytes) || want_bytes > SIZE_MAX)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": shape %s is too large", m->name, in->name,
                             pjs_shape_format(sh, got, sizeof got));
    if (in->nbytes != want_bytes)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": got %zu bytes of data but shape %s of %s "
                             "needs %llu",
                             m->name, in->name, in->nbytes, pjs_shape_format(sh, got, sizeof got),
                             pjs_dtype_kserve_name(s->dtype), (unsigned long long)want_bytes);
    if (in->data == NULL && in->device == NULL && want_bytes > 0)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": no data", m->name, in->name);
    return 0;
}

/* "a [2, 16], b [2, 4]": the request's inputs and shapes, for messages. */
static const char *given_shapes(const pjs_infer_request *r, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < r->n_inputs && used < size; i++) {
        char shape[160];
        int w = snprintf(buf + used, size - used, "%s%s %s", i ? ", " : "", r->inputs[i].name,
                         pjs_shape_format(&r->inputs[i].shape, shape, sizeof shape));
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

/* Sets r->variant to the variant every input's shape fits and points the
 * inputs at its specs (they come in manifest order, with variant 0's specs).
 * A model with one variant needs no resolving: check_input then reports a
 * shape that does not fit, in words that do not mention variants. */
static int resolve_variant(pjs_infer_request *r, const pjs_manifest *m, pjs_error *err)
{
    r->variant = 0;
    if (m->n_variants <= 1)
        return 0;
    bool batched = false;
    for (size_t i = 0; i < r->n_inputs; i++) {
        int rc = check_datatype(&r->inputs[i], m, err);
        if (rc != 0)
            return rc;
        batched = batched || m->inputs[i].batched;
    }
    const pjs_shape *shapes[PJS_INFER_MAX_TENSORS];
    for (size_t i = 0; i < r->n_inputs; i++)
        shapes[i] = &r->inputs[i].shape;
    if (pjs_manifest_find_variant(m, shapes, &r->variant)) {
        for (size_t i = 0; i < r->n_inputs; i++)
            r->inputs[i].spec = &m->variants[r->variant].inputs[i];
        return 0;
    }
    char given[512], accepted[1024];
    pjs_manifest_format_variants(m, accepted, sizeof accepted);
    if (r->n_inputs == 1)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                             "model %s: input \"%s\": shape %s matches no variant of the model "
                             "(accepted: %s%s)",
                             m->name, r->inputs[0].name,
                             pjs_shape_format(&r->inputs[0].shape, given, sizeof given), accepted,
                             batched ? "; -1: the batch size" : "");
    return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                         "model %s: input shapes %s match no variant of the model (accepted: "
                         "%s%s)",
                         m->name, given_shapes(r, given, sizeof given), accepted,
                         batched ? "; -1: the batch size" : "");
}

/* Every given input known among specs[n] and given once; then the inputs
 * are put in the specs' order, naming the first missing one. */
static int match_inputs(pjs_infer_request *r, const pjs_manifest *m,
                        const pjs_tensor_spec *specs, size_t n, pjs_error *err)
{
    char names[1024];
    for (size_t i = 0; i < r->n_inputs; i++) {
        pjs_infer_input *in = &r->inputs[i];
        if (in->name == NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "model %s: input %zu has no name", m->name, i);
        in->spec = find_spec(specs, n, in->name);
        if (in->spec == NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "model %s: unexpected input \"%.256s\" (the model's inputs: %s)",
                                 m->name, in->name, tensor_names(specs, n, names, sizeof names));
        for (size_t j = 0; j < i; j++)
            if (r->inputs[j].spec == in->spec)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "model %s: input \"%s\" given more than once", m->name,
                                     in->name);
    }
    for (size_t j = 0; j < n; j++) {
        size_t i = j;
        while (i < r->n_inputs && r->inputs[i].spec != &specs[j])
            i++;
        if (i >= r->n_inputs)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "model %s: missing input \"%s\" (the model's inputs: %s)",
                                 m->name, specs[j].name,
                                 tensor_names(specs, n, names, sizeof names));
        pjs_infer_input given = r->inputs[i];
        r->inputs[i] = r->inputs[j];
        r->inputs[j] = given;
    }
    return 0;
}

/* Each input against its spec, then agreement on the batch: sets r->batch
 * (1 when no input is batched). */
static int check_inputs(pjs_infer_request *r, const pjs_manifest *m, int64_t max_batch,
                        pjs_error *err)
{
    r->batch = 1;
    bool have_batch = false;
    for (size_t i = 0; i < r->n_inputs; i++) {
        pjs_infer_input *in = &r->inputs[i];
        int rc = check_input(in, m, max_batch, err);
        if (rc != 0)
            return rc;
        if (!in->spec->batched)
            continue;
        if (have_batch && in->shape.dims[0] != r->batch)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "model %s: input \"%s\" has batch size %lld but an earlier input "
                                 "has %lld; batched inputs must agree",
                                 m->name, in->name, (long long)in->shape.dims[0],
                                 (long long)r->batch);
        r->batch = in->shape.dims[0];
        have_batch = true;
    }
    return 0;
}

/* Requested outputs known among outputs[n], named once, and numeric when
 * they are to be classified. */
static int check_requested(const pjs_infer_request *r, const pjs_manifest *m,
                           const pjs_tensor_spec *outputs, size_t n, pjs_error *err)
{
    char names[1024];
    for (size_t k = 0; k < r->n_requested; k++) {
        const char *name = r->requested[k].name;
        const pjs_tensor_spec *spec = name != NULL ? find_spec(outputs, n, name) : NULL;
        int rc = spec != NULL && r->requested[k].class_count > 0
                     ? pjs_classify_check(spec, m->name, err)
                     : 0;
        if (rc != 0)
            return rc;
        if (spec == NULL)
            return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                 "model %s: unknown output \"%.256s\" requested (the model's "
                                 "outputs: %s)",
                                 m->name, name ? name : "",
                                 tensor_names(outputs, n, names, sizeof names));
        for (size_t j = 0; j < k; j++)
            if (strcmp(r->requested[j].name, name) == 0)
                return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT,
                                     "model %s: output \"%s\" requested more than once", m->name,
                                     name);
    }
    return 0;
}

static int check_counts(const pjs_infer_request *r, const pjs_manifest *m, pjs_error *err)
{
    if (r->n_inputs > PJS_INFER_MAX_TENSORS || r->n_requested > PJS_INFER_MAX_TENSORS)
        return pjs_error_set(err, PJS_ERR_INVALID_ARGUMENT, "model %s: too many tensors",
                             m->name);
    return 0;
}

int pjs_infer_validate(pjs_infer_request *r, const pjs_manifest *m, int64_t max_batch,
                       pjs_error *err)
{
    int rc = check_counts(r, m, err);
    if (rc == 0)
        rc = match_inputs(r, m, m->inputs, m->n_inputs, err);
    if (rc == 0)
        rc = resolve_variant(r, m, err);
    if (rc == 0)
        rc = check_inputs(r, m, max_batch, err);
    if (rc == 0)
        rc = check_requested(r, m, m->outputs, m->n_outputs, err);
    return rc;
}

int pjs_infer_validate_client(pjs_infer_request *r, const pjs_manifest *m, int64_t max_batch,
                              pjs_error *err)
{
    size_t n_inputs = 0, n_outputs = 0;
    const pjs_tensor_spec *inputs = pjs_manifest_client_tensors(m, false, &n_inputs);
    const pjs_tensor_spec *outputs = pjs_manifest_client_tensors(m, true, &n_outputs);
    r->variant = 0;
    int rc = check_counts(r, m, err);
    if (rc == 0)
        rc = match_inputs(r, m, inputs, n_inputs, err);
    if (rc == 0)
        rc = check_inputs(r, m, max_batch, err);
    if (rc == 0)
        rc = check_requested(r, m, outputs, n_outputs, err);
    return rc;
}
