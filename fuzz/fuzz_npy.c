/*
 * fuzz_npy.c - libFuzzer driver for the .npy reader (src/core/npy.c).
 *
 * Feeds arbitrary bytes to pjs_npy_parse as a bf16-expecting caller would (so
 * the "<V2" path is reachable) and frees the result. A successful parse must
 * describe exactly the bytes it copied (for numpy strings: well-formed BYTES,
 * one element per shape entry); anything else is a bug worth a crash.
 * Seeds in fuzz/corpus/fuzz_npy/ were written by numpy (several dtypes and
 * shapes, a scalar, a 2.0 header, bf16 from ml_dtypes) plus malformed files.
 */
#include <stdint.h>
#include <stdlib.h>

#include "core/bytes.h"
#include "core/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pjs_npy a;
    pjs_error err;
    if (pjs_npy_parse(&a, data, size, PJS_DTYPE_BF16, "fuzz", &err) == 0) {
        uint64_t nbytes, count, strings;
        if ((a.nbytes > 0) != (a.data != NULL))
            abort();
        if (a.dtype == PJS_DTYPE_BYTES) {
            /* numpy strings: well-formed BYTES, one element per shape entry */
            if (!pjs_shape_nbytes(&a.shape, 1, &count) ||
                pjs_bytes_count(a.data, a.nbytes, &strings, &err) != 0 || strings != count ||
                a.nbytes > count * 4 + size)
                abort();
        } else if (!pjs_shape_nbytes(&a.shape, pjs_dtype_size(a.dtype), &nbytes) ||
                   nbytes != a.nbytes || nbytes > size) {
            abort();
        }
    } else if (a.data != NULL || err.msg[0] == '\0') {
        abort();
    }
    pjs_npy_free(&a);
    return 0;
}
