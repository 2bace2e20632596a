/*
 * fuzz_grpc_infer.c - libFuzzer driver for the gRPC inference codec
 * (src/frontend/grpc/codec.c).
 *
 * Feeds arbitrary bytes to pjs_grpc_infer_decode as a serialized
 * ModelInferRequest (no shared-memory registry), validates what decodes
 * against a fixed two-input manifest with pjs_infer_validate, and for a
 * valid request fills the outputs as the dispatcher would and encodes and
 * packs the response. Invariants worth a crash: a failure always has a
 * message; a validated input's bytes match its shape; the packed response
 * unpacks again with one raw entry per output.
 *
 * Seeds in fuzz/corpus/fuzz_grpc_infer/ are written by
 * fuzz/make_grpc_infer_corpus.py with tritonclient's own protobuf classes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/manifest.h"
#include "frontend/grpc/codec.h"

static const char MANIFEST[] = "format_version: \"2.0\"\n"
                               "name: fuzz\n"
                               "batch_sizes: [1, 4]\n"
                               "inputs:\n"
                               "  - {name: x, dtype: f32, shape: [batch, 4]}\n"
                               "  - {name: mask, dtype: i8, shape: [batch, 2]}\n"
                               "outputs:\n"
                               "  - {name: y, dtype: f32, shape: [batch, 3]}\n"
                               "  - {name: n, dtype: i64, shape: [batch]}\n";

static const pjs_manifest *fuzz_manifest(void)
{
    static pjs_manifest m;
    static int parsed;
    pjs_error err;
    if (!parsed) {
        if (pjs_manifest_parse(&m, MANIFEST, strlen(MANIFEST), "fuzz", &err) != 0)
            abort();
        parsed = 1;
    }
    return &m;
}

/* Outputs of a batch as the dispatcher fills them: every output, marked
 * with its requested index (or -1). */
static void fill_outputs(pjs_infer_request *r, const pjs_manifest *m)
{
    r->n_outputs = m->n_outputs;
    for (size_t i = 0; i < m->n_outputs; i++) {
        pjs_infer_output *o = &r->outputs[i];
        int64_t numel;
        o->spec = &m->outputs[i];
        o->shape = m->outputs[i].shape;
        o->shape.dims[0] = r->batch;
        if (!pjs_shape_numel(&o->shape, &numel))
            abort();
        o->nbytes = (size_t)numel * pjs_dtype_size(o->spec->dtype);
        o->data = calloc(1, o->nbytes);
        o->requested = -1;
        for (size_t k = 0; k < r->n_requested; k++)
            if (strcmp(r->requested[k].name, o->spec->name) == 0)
                o->requested = (int)k;
    }
}

static void check_response(pjs_grpc_infer *d)
{
    Inference__ModelInferResponse *resp;
    pjs_error err;
    uint8_t *buf;
    size_t len;
    if (pjs_grpc_infer_response(d, "1", &resp, &err) != 0 ||
        pjs_grpc_pack(&resp->base, &buf, &len, &err) != 0)
        abort();
    Inference__ModelInferResponse *back = inference__model_infer_response__unpack(NULL, len, buf);
    if (back == NULL || back->n_outputs != back->n_raw_output_contents || back->n_outputs == 0)
        abort();
    inference__model_infer_response__free_unpacked(back, NULL);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const pjs_manifest *m = fuzz_manifest();
    pjs_grpc_infer d;
    pjs_error err;
    pjs_grpc_infer_init(&d);
    pjs_error_clear(&err);
    if (pjs_grpc_infer_decode(&d, data, size, NULL, &err) != 0) {
        if (err.msg[0] == '\0')
            abort();
    } else if (pjs_infer_validate(&d.req, m, 4, &err) != 0) {
        if (err.msg[0] == '\0')
            abort();
    } else {
        for (size_t i = 0; i < d.req.n_inputs; i++) {
            uint64_t nbytes;
            const pjs_infer_input *in = &d.req.inputs[i];
            if (!pjs_shape_nbytes(&in->shape, pjs_dtype_size(in->spec->dtype), &nbytes) ||
                nbytes != in->nbytes)
                abort();
        }
        fill_outputs(&d.req, m);
        check_response(&d);
    }
    pjs_grpc_infer_release(&d);
    return 0;
}
