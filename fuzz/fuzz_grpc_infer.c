/*
 * fuzz_grpc_infer.c - libFuzzer driver for the gRPC inference codec
 * (src/frontend/grpc/codec.c).
 *
 * Feeds arbitrary bytes to pjs_grpc_infer_decode as a serialized
 * ModelInferRequest (no shared-memory registry), validates what decodes
 * against a fixed two-input manifest with pjs_infer_validate (or, for
 * model_name "texts", against a hooked manifest's string client tensors
 * with pjs_infer_validate_client), and for a valid request fills the
 * outputs as the dispatcher (or a postprocess hook) would and encodes and
 * packs the response. Invariants worth a crash: a failure always has a
 * message; a validated input's bytes match its shape (for strings: well
 * formed, one element per position); the packed response unpacks again
 * with one raw entry per output; a message is refused as malformed exactly
 * when protobuf-c refuses it whole, and raw_input_contents, read in place,
 * are protobuf-c's.
 *
 * Seeds in fuzz/corpus/fuzz_grpc_infer/ are written by
 * fuzz/make_grpc_infer_corpus.py with tritonclient's own protobuf classes.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
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

/* A hooked model whose clients send and get strings. */
static const char TEXTS[] = "format_version: \"2.0\"\n"
                            "name: texts\n"
                            "batch_sizes: [1, 4]\n"
                            "inputs:\n"
                            "  - {name: tokens, dtype: i32, shape: [batch, 4]}\n"
                            "outputs:\n"
                            "  - {name: logits, dtype: f32, shape: [batch, 2]}\n"
                            "client_inputs:\n"
                            "  - {name: TEXT, dtype: bytes, shape: [batch, -1]}\n"
                            "  - {name: LANG, dtype: bytes, shape: [1]}\n"
                            "client_outputs:\n"
                            "  - {name: LABEL, dtype: bytes, shape: [batch]}\n"
                            "  - {name: SCORE, dtype: f32, shape: [batch]}\n";

static const pjs_manifest *parsed_manifest(pjs_manifest *m, int *parsed, const char *yaml)
{
    pjs_error err;
    if (!*parsed) {
        if (pjs_manifest_parse(m, yaml, strlen(yaml), "fuzz", &err) != 0)
            abort();
        *parsed = 1;
    }
    return m;
}

static const pjs_manifest *fuzz_manifest(void)
{
    static pjs_manifest m;
    static int parsed;
    return parsed_manifest(&m, &parsed, MANIFEST);
}

static const pjs_manifest *texts_manifest(void)
{
    static pjs_manifest m;
    static int parsed;
    return parsed_manifest(&m, &parsed, TEXTS);
}

/* Outputs as the dispatcher (or, for client tensors, a postprocess hook)
 * fills them: every output, marked with its requested index (or -1); a
 * string output holds one string of i bytes at position i. */
static void fill_outputs(pjs_infer_request *r, const pjs_tensor_spec *specs, size_t n)
{
    r->n_outputs = n;
    for (size_t i = 0; i < n; i++) {
        pjs_infer_output *o = &r->outputs[i];
        int64_t numel;
        o->spec = &specs[i];
        o->shape = specs[i].shape;
        o->shape.dims[0] = r->batch;
        if (!pjs_shape_numel(&o->shape, &numel))
            abort();
        if (o->spec->dtype == PJS_DTYPE_BYTES) {
            size_t size = 0;
            for (int64_t e = 0; e < numel; e++)
                if (!pjs_bytes_add_size(&size, (size_t)e))
                    abort();
            o->nbytes = size;
            o->data = calloc(1, size);
            pjs_bytes_writer w = pjs_bytes_writer_init(o->data, size);
            static const char text[8] = "abcdefg";
            for (int64_t e = 0; e < numel; e++)
                if (o->data == NULL || !pjs_bytes_put(&w, text, (size_t)e % 8))
                    abort();
        } else {
            o->nbytes = (size_t)numel * pjs_dtype_size(o->spec->dtype);
            o->data = calloc(1, o->nbytes);
        }
        o->requested = -1;
        for (size_t k = 0; k < r->n_requested; k++)
            if (strcmp(r->requested[k].name, o->spec->name) == 0)
                o->requested = (int)k;
    }
}

/* A validated input's bytes fit its shape. */
static void check_input(const pjs_infer_input *in)
{
    int64_t numel;
    uint64_t nbytes, count;
    pjs_error err;
    if (!pjs_shape_numel(&in->shape, &numel))
        abort();
    if (in->spec->dtype == PJS_DTYPE_BYTES) {
        if (pjs_bytes_count(in->data, in->nbytes, &count, &err) != 0 || count != (uint64_t)numel)
            abort();
    } else if (!pjs_shape_nbytes(&in->shape, pjs_dtype_size(in->spec->dtype), &nbytes) ||
               nbytes != in->nbytes) {
        abort();
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

/* The decoder reads raw_input_contents in place and unpacks the rest: it
 * refuses a message as malformed exactly when protobuf-c refuses it whole,
 * and reads the same raw entries when both take it. */
static void check_against_protobuf_c(const uint8_t *data, size_t size, const pjs_grpc_infer *d,
                                     int rc, const pjs_error *err)
{
    Inference__ModelInferRequest *ref = inference__model_infer_request__unpack(NULL, size, data);
    /* Refused as malformed: no message, INVALID_ARGUMENT (the words may
     * echo the client's strings, so they cannot tell). */
    bool malformed = d->msg == NULL && rc == PJS_ERR_INVALID_ARGUMENT;
    if ((ref == NULL) != malformed)
        abort();
    if (malformed && strstr(err->msg, "malformed ModelInferRequest") == NULL)
        abort();
    if (ref == NULL || d->msg == NULL) /* or over the arena's bound, which protobuf-c has not */
        goto out;
    if (d->msg->n_raw_input_contents != ref->n_raw_input_contents)
        abort();
    for (size_t i = 0; i < ref->n_raw_input_contents; i++) {
        const ProtobufCBinaryData *got = &d->msg->raw_input_contents[i];
        const ProtobufCBinaryData *want = &ref->raw_input_contents[i];
        if (got->len != want->len || (want->len > 0 && memcmp(got->data, want->data, want->len)))
            abort();
        if (want->len > 0 && (got->data < data || got->data + got->len > data + size))
            abort();
    }
out:
    if (ref != NULL)
        inference__model_infer_request__free_unpacked(ref, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pjs_grpc_infer d;
    pjs_error err;
    pjs_grpc_infer_init(&d);
    pjs_error_clear(&err);
    int decoded = pjs_grpc_infer_decode(&d, data, size, NULL, &err);
    check_against_protobuf_c(data, size, &d, decoded, &err);
    if (decoded != 0) {
        if (err.msg[0] == '\0')
            abort();
        pjs_grpc_infer_release(&d);
        return 0;
    }
    bool texts = strcmp(d.msg->model_name, "texts") == 0;
    const pjs_manifest *m = texts ? texts_manifest() : fuzz_manifest();
    int rc = texts ? pjs_infer_validate_client(&d.req, m, 4, &err)
                   : pjs_infer_validate(&d.req, m, 4, &err);
    if (rc != 0) {
        if (err.msg[0] == '\0')
            abort();
    } else {
        for (size_t i = 0; i < d.req.n_inputs; i++)
            check_input(&d.req.inputs[i]);
        size_t n_outputs;
        const pjs_tensor_spec *outputs = pjs_manifest_client_tensors(m, true, &n_outputs);
        fill_outputs(&d.req, outputs, n_outputs);
        check_response(&d);
    }
    pjs_grpc_infer_release(&d);
    return 0;
}
