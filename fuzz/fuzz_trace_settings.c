/*
 * fuzz_trace_settings.c - libFuzzer driver for the body of
 * POST /v2/trace/setting (src/trace/trace.c: pjs_trace_settings_update_json,
 * Triton's JSON of trace settings).
 *
 * Input: the body, applied to no tracer (a server started without
 * --trace-endpoint), which reads and checks every setting as a tracer's
 * would. It must succeed or fail INVALID_ARGUMENT or UNSUPPORTED with a
 * message; anything else aborts, and the sanitizers catch the rest. Seeds:
 * fuzz/corpus/fuzz_trace_settings/.
 */
#include <stdint.h>
#include <stdlib.h>

#include "trace/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pjs_error err;
    pjs_error_clear(&err);
    int rc = pjs_trace_settings_update_json(NULL, NULL, (const char *)data, size, &err);
    if (rc != 0 && ((rc != PJS_ERR_INVALID_ARGUMENT && rc != PJS_ERR_UNSUPPORTED) ||
                    err.msg[0] == '\0'))
        abort();
    return 0;
}
