/*
 * fuzz_gateway_route.c - libFuzzer driver for what the gateway reads of a
 * client's gRPC request to route it (src/gateway/route_key.c).
 *
 * Input: one selector byte (bit 0: read as an inference request, with its
 * parameters) then the message. The reader must return 0 or
 * INVALID_ARGUMENT with a message; on success the model name and sequence
 * id are NUL-terminated within their buffers and the name's bytes occur in
 * the message. Anything else aborts. Seeds:
 * fuzz/corpus/fuzz_gateway_route/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/route_key.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    bool inference = data[0] & 1;
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    pjs_gw_route_key key;
    pjs_error err;
    int rc = pjs_gw_route_key_read(msg, len, inference, &key, &err);
    if (rc != 0) {
        if (rc != PJS_ERR_INVALID_ARGUMENT || err.msg[0] == '\0')
            abort();
        return 0;
    }
    size_t n = strnlen(key.model, sizeof key.model);
    if (n == sizeof key.model || strnlen(key.sequence, sizeof key.sequence) == sizeof key.sequence)
        abort();
    if (n > 0 && memmem(msg, len, key.model, n) == NULL)
        abort();
    return 0;
}
