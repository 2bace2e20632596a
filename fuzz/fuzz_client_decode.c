/*
 * fuzz_client_decode.c - libFuzzer driver for what libpjserve-client reads
 * from a server (src/client/decode.c, src/client/pb_json.c).
 *
 * The first byte picks the decoder: a gRPC ModelInferResponse (with one
 * requested output sent to shared memory, so the marking path runs), a
 * ModelStreamInferResponse, a REST answer whose JSON part is as long as
 * the next two bytes say, a REST error body, or a statistics answer turned
 * into JSON. A decoded result must describe bytes that match every
 * output's shape; a refusal must say why.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/internal.h"
#include "grpc_service.pb-c.h"

static void check_result(const pjs_client_result *r)
{
    size_t n = pjs_client_result_output_count(r);
    for (size_t i = 0; i < n; i++) {
        pjs_client_tensor t;
        if (pjs_client_result_output(r, i, &t, NULL) != 0)
            abort();
        if (t.shm_region == NULL && t.nbytes > 0 && t.data == NULL)
            abort();
        size_t size = pjs_client_datatype_size(t.datatype);
        uint64_t elements;
        if (!pjsc_shape_elements(t.shape, t.rank, &elements))
            abort();
        if (size > 0 && t.shm_region == NULL && t.nbytes > 0 && elements * size != t.nbytes)
            abort();
        size_t at = 0, len;
        const char *e;
        while (size == 0 && pjs_client_bytes_next(t.data, t.nbytes, &at, &e, &len) == 1)
            ;
    }
    if (pjs_client_result_model(r) == NULL || pjs_client_result_id(r) == NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    unsigned kind = data[0] % 5;
    size_t split = ((size_t)data[1] << 8) | data[2];
    data += 3;
    size -= 3;
    pjs_client_result *r = NULL;
    pjs_client_error err;
    memset(&err, 0, sizeof err);
    int rc = 0;
    pjsc_output_req shm_out = {.name = (char *)"y", .shm_region = (char *)"out",
                               .shm_offset = 0, .shm_byte_size = 64};
    switch (kind) {
    case 0: rc = pjsc_decode_grpc_infer(data, size, &shm_out, 1, &r, &err); break;
    case 1: rc = pjsc_decode_grpc_stream(data, size, &r, &err); break;
    case 2:
        rc = pjsc_decode_rest_infer(data, size, split < size ? split : size, &shm_out, 1, &r,
                                    &err);
        break;
    case 3: pjsc_decode_rest_error(400 + (long)(split % 200), data, size, &err); break;
    default: {
        ProtobufCMessage *m = protobuf_c_message_unpack(
            &inference__model_statistics_response__descriptor, NULL, size, data);
        if (m != NULL) {
            json_t *doc = pjsc_pb_to_json(m);
            char *text = doc ? pjsc_json_text(doc) : NULL;
            free(text);
            json_decref(doc);
            protobuf_c_message_free_unpacked(m, NULL);
        }
        return 0;
    }
    }
    if (kind == 3 && (err.code == PJS_CLIENT_OK || !err.from_server))
        abort();
    if (kind != 3 && rc == 0) {
        if (r == NULL)
            abort();
        check_result(r);
    } else if (kind != 3 && (r != NULL || err.message[0] == '\0')) {
        abort();
    }
    pjs_client_result_free(r);
    return 0;
}
