/*
 * shm_json.h - the request body of POST /v2/cudasharedmemory/region/{r}/register
 * as Triton defines it: {"raw_handle": {"b64": "<base64 of the CUDA IPC
 * handle>"}, "device_id": integer, "byte_size": integer}.
 *
 * A pure function, tested and fuzzed without a server; any thread. Keys
 * other than these are ignored, as the system shared-memory body's are.
 * Errors are INVALID_ARGUMENT with a message naming the field.
 */
#ifndef PJS_FRONTEND_HTTP_SHM_JSON_H
#define PJS_FRONTEND_HTTP_SHM_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "core/cuda_ipc.h"
#include "core/status.h"

typedef struct pjs_cuda_shm_register_body {
    unsigned char raw_handle[PJS_CUDA_IPC_HANDLE_SIZE]; /* decoded: exactly this size */
    int64_t device_id;                                  /* >= 0 */
    uint64_t byte_size;
} pjs_cuda_shm_register_body;

int pjs_cuda_shm_parse_register(const char *body, size_t len, pjs_cuda_shm_register_body *out,
                                pjs_error *err);

#endif
