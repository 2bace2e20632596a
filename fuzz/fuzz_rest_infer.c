/*
 * fuzz_rest_infer.c - libFuzzer driver for the REST inference codec
 * (src/frontend/http/http_codec.c).
 *
 * Input: a first line "LENGTH[;ENCODING]" then the request body. LENGTH is
 * passed as the Inference-Header-Content-Length value (an empty one means no
 * header; junk exercises its parser) and ENCODING as Content-Encoding. As
 * the server does, the body is refused past the model's bound
 * (pjs_http_infer_body_bound), inflated if encoded within that bound and a
 * small byte budget (whose accounting is checked: what was charged is what
 * the budget holds), decoded, its shared-memory tensors mapped
 * (against an empty registry), validated with pjs_infer_validate against a
 * fixed manifest that covers most datatypes, batched and not (or, when an
 * input is named TEXT, with pjs_infer_validate_client against a hooked
 * manifest whose client tensors are strings); a valid request gets
 * fabricated outputs (as the dispatcher or a postprocess hook makes them)
 * and is encoded. The response is then checked: its JSON part must parse
 * and the binary part must be exactly the binary outputs; a broken one
 * aborts. Seeds: fuzz/corpus/fuzz_rest_infer/ (JSON, binary, shared memory,
 * compressed, strings, and broken requests).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "frontend/http/http_codec.h"

static const char manifest_yaml[] =
    "format_version: \"2.0\"\n"
    "name: fuzz\n"
    "batch_sizes: [1, 4]\n"
    "inputs:\n"
    "  - {name: a, dtype: f32, shape: [batch, 4]}\n"
    "  - {name: b, dtype: i32, shape: [batch, 2]}\n"
    "  - {name: c, dtype: bool, shape: [batch]}\n"
    "  - {name: h, dtype: f16, shape: [batch, 2]}\n"
    "  - {name: g, dtype: bf16, shape: [2]}\n"
    "  - {name: u, dtype: u64, shape: [batch]}\n"
    "outputs:\n"
    "  - {name: y, dtype: f32, shape: [batch, 3]}\n"
    "  - {name: k, dtype: i8, shape: [batch]}\n"
    "  - {name: z, dtype: f64, shape: [2]}\n";

/* The strings model: its executable's tensors never reach the codec. */
static const char texts_yaml[] = "format_version: \"2.0\"\n"
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

#define MAX_BATCH 4

static const pjs_manifest *fuzz_manifest(void)
{
    static pjs_manifest m;
    static int parsed;
    pjs_error err;
    if (!parsed) {
        if (pjs_manifest_parse(&m, manifest_yaml, sizeof manifest_yaml - 1, "fuzz", &err) != 0)
            abort();
        parsed = 1;
    }
    return &m;
}

static const pjs_manifest *texts_manifest(void)
{
    static pjs_manifest m;
    static int parsed;
    pjs_error err;
    if (!parsed) {
        if (pjs_manifest_parse(&m, texts_yaml, sizeof texts_yaml - 1, "texts", &err) != 0)
            abort();
        parsed = 1;
    }
    return &m;
}

static bool names_text(const pjs_infer_request *r)
{
    for (size_t i = 0; i < r->n_inputs; i++)
        if (r->inputs[i].name != NULL && strcmp(r->inputs[i].name, "TEXT") == 0)
            return true;
    return false;
}

static pjs_shm_registry *empty_registry(void)
{
    static pjs_shm_registry *r;
    pjs_error err;
    pjs_shm_options off = {.allowed = false};
    if (r == NULL && pjs_shm_registry_create(&off, &r, &err) != 0)
        abort();
    return r;
}

/* String output i of n: quotes, backslashes, control characters, NUL and
 * UTF-8 beyond ASCII, all of which the JSON encoding must escape or keep. */
static void fabricate_strings(pjs_infer_output *out, int64_t n)
{
    static const char pool[] = "a\"\\\n\x01\0\xc3\xa8z";
    size_t size = 0;
    for (int64_t e = 0; e < n; e++)
        if (!pjs_bytes_add_size(&size, (size_t)e % sizeof pool))
            abort();
    out->nbytes = size;
    out->data = malloc(size + 1);
    if (out->data == NULL)
        abort();
    pjs_bytes_writer w = pjs_bytes_writer_init(out->data, size);
    for (int64_t e = 0; e < n; e++) {
        size_t len = (size_t)e % sizeof pool;
        /* never cut the two-byte character in half */
        if (len > 0 && (unsigned char)pool[len - 1] == 0xc3)
            len--;
        if (!pjs_bytes_put(&w, pool, len))
            abort();
    }
    out->nbytes = size - (size_t)(w.end - w.at);
}

/* Outputs as the dispatcher (or a postprocess hook) makes them: every
 * wanted output, finite values. */
static void fabricate_outputs(pjs_infer_request *r, const pjs_tensor_spec *specs, size_t n)
{
    r->n_outputs = n;
    for (size_t o = 0; o < n; o++) {
        pjs_infer_output *out = &r->outputs[o];
        out->spec = &specs[o];
        out->shape = out->spec->shape;
        if (out->spec->batched)
            out->shape.dims[0] = r->batch;
        out->requested = -1;
        bool wanted = r->n_requested == 0;
        for (size_t k = 0; k < r->n_requested; k++)
            if (strcmp(r->requested[k].name, out->spec->name) == 0) {
                out->requested = (int)k;
                wanted = true;
            }
        if (!wanted)
            continue;
        int64_t numel;
        if (!pjs_shape_numel(&out->shape, &numel))
            abort();
        if (out->spec->dtype == PJS_DTYPE_BYTES) {
            fabricate_strings(out, numel);
            continue;
        }
        uint64_t nbytes;
        if (!pjs_shape_nbytes(&out->shape, pjs_dtype_size(out->spec->dtype), &nbytes))
            abort();
        out->nbytes = (size_t)nbytes;
        out->data = malloc(out->nbytes + 1);
        if (out->data == NULL)
            abort();
        for (size_t i = 0; i < out->nbytes; i++) /* bytes below 0x40: no NaN or infinity */
            ((unsigned char *)out->data)[i] = (unsigned char)((i * 37u) & 0x3fu);
    }
}

/* The response must be JSON, then exactly the binary outputs' bytes. */
static void check_response(const pjs_http_buf *b, size_t header_len)
{
    size_t json_len = header_len > 0 ? header_len : b->len;
    json_error_t jerr;
    json_t *doc = json_loadb(b->data, json_len, JSON_ALLOW_NUL, &jerr);
    if (doc == NULL)
        abort();
    size_t binary = 0;
    json_t *outputs = json_object_get(doc, "outputs");
    size_t i;
    json_t *o;
    json_array_foreach(outputs, i, o)
    {
        json_t *size = json_object_get(json_object_get(o, "parameters"), "binary_data_size");
        binary += size ? (size_t)json_integer_value(size) : 0;
    }
    json_decref(doc);
    if (json_len + binary != b->len)
        abort();
}

static void run(const uint8_t *body, size_t size, const char *length, const char *encoding)
{
    const pjs_manifest *m = fuzz_manifest();
    pjs_http_buf plain, response;
    pjs_http_infer *d = malloc(sizeof *d);
    pjs_error err;
    bool inflated = false;
    uint64_t bound = pjs_http_infer_body_bound(m, MAX_BATCH);
    uint64_t charged = 0;
    pjs_byte_budget budget;
    pjs_byte_budget_init(&budget, 256u << 10);
    if (bound == 0)
        abort(); /* every extent of the fuzz manifest is known */
    pjs_http_buf_init(&plain, (size_t)bound);
    pjs_http_buf_init(&response, 64u << 20);
    if (d == NULL)
        abort();
    if (size > bound)
        goto out_buffers;
    int inflate_rc =
        pjs_http_inflate(encoding, body, size, &plain, &budget, &charged, &inflated, &err);
    if (pjs_byte_budget_used(&budget) != charged || charged > plain.cap)
        abort();
    if (inflate_rc != 0)
        goto out_buffers;
    if (inflated) {
        body = (const uint8_t *)plain.data;
        size = plain.len;
    }
    int rc = pjs_http_infer_decode(d, body, size, length, &err);
    if (rc == 0)
        rc = pjs_http_infer_map_shm(d, empty_registry(), &err);
    const pjs_manifest *target = rc == 0 && names_text(&d->req) ? texts_manifest() : m;
    if (rc == 0)
        rc = target == m ? pjs_infer_validate(&d->req, m, MAX_BATCH, &err)
                         : pjs_infer_validate_client(&d->req, target, MAX_BATCH, &err);
    if (rc == 0) {
        size_t header_len = 0, n_outputs = 0;
        const pjs_tensor_spec *outputs = pjs_manifest_client_tensors(target, true, &n_outputs);
        fabricate_outputs(&d->req, outputs, n_outputs);
        if (pjs_http_infer_write_shm_outputs(d, &err) != 0 ||
            pjs_http_infer_encode(&d->req, "fuzz", "1", &response, &header_len, &err) != 0)
            abort();
        check_response(&response, header_len);
    }
    pjs_infer_request_release(&d->req);
    pjs_http_infer_free(d);
out_buffers:
    free(d);
    pjs_http_buf_free(&plain);
    pjs_http_buf_free(&response);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *newline = memchr(data, '\n', size < 64 ? size : 64);
    char first[65] = "";
    if (newline != NULL) {
        memcpy(first, data, (size_t)(newline - data));
        first[newline - data] = '\0';
        size -= (size_t)(newline - data) + 1;
        data = newline + 1;
    }
    char *encoding = strchr(first, ';');
    if (encoding != NULL)
        *encoding++ = '\0';
    run(data, size, first[0] ? first : NULL, encoding);
    return 0;
}
