/*
 * fuzz_shm_json.c - libFuzzer driver for the body of
 * POST /v2/cudasharedmemory/region/{r}/register
 * (src/frontend/http/shm_json.c: JSON, then base64 of the IPC handle).
 *
 * Input: the body. It must either parse (a non-negative device_id; the
 * handle is then exactly PJS_CUDA_IPC_HANDLE_SIZE bytes by its type) or
 * fail INVALID_ARGUMENT with a message; anything else aborts, and the
 * sanitizers catch reads past the body or the handle. Seeds:
 * fuzz/corpus/fuzz_shm_json/.
 */
#include <stdint.h>
#include <stdlib.h>

#include "frontend/http/shm_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pjs_cuda_shm_register_body body;
    pjs_error err;
    int rc = pjs_cuda_shm_parse_register((const char *)data, size, &body, &err);
    if (rc != 0 && (rc != PJS_ERR_INVALID_ARGUMENT || err.msg[0] == '\0'))
        abort();
    if (rc == 0 && body.device_id < 0)
        abort();
    return 0;
}
