/*
 * fuzz_traceparent.c - libFuzzer driver for W3C traceparent values
 * (src/trace/trace.c), which clients send as an HTTP header or gRPC
 * metadata.
 *
 * Input: the value. Parsing must either fail with the context zeroed, or
 * give a valid context whose version 00 form parses back to the same ids
 * and flag; the sanitizers catch reads past the value. Seeds:
 * fuzz/corpus/fuzz_traceparent/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *value = malloc(size ? size : 1); /* exactly size bytes: no NUL to lean on */
    if (value == NULL)
        return 0;
    memcpy(value, data, size);
    pjs_trace_ctx c;
    bool ok = pjs_trace_parse(value, size, &c);
    free(value);
    if (!ok) {
        if (c.valid || c.sampled)
            abort();
        return 0;
    }
    char again[PJS_TRACEPARENT_LEN + 1];
    pjs_trace_format(&c, again);
    pjs_trace_ctx d;
    if (!c.valid || !pjs_trace_parse(again, PJS_TRACEPARENT_LEN, &d) ||
        memcmp(c.trace_id, d.trace_id, sizeof c.trace_id) != 0 ||
        memcmp(c.span_id, d.span_id, sizeof c.span_id) != 0 || c.sampled != d.sampled)
        abort();
    return 0;
}
