/*
 * fuzz_image_decode.c - libFuzzer driver for the JPEG decoding of the
 * image_bytes_classifier example's preprocess hook
 * (examples/bundles/image_bytes_classifier/model.c, compiled into this
 * driver so the fuzzed code is the hook's own).
 *
 * The input is one IMAGE element as a client sends it: a file's bytes,
 * untrusted. image_decode_row must refuse what it cannot decode with a
 * message, or write 3 x 32 x 32 normalized pixels; libjpeg's reads and the
 * resize's are checked by ASan (no request: no deadline). A decoded pixel outside what
 * normalizing a byte can give, or a refusal without a message, aborts.
 * Seeds are fuzz/corpus/fuzz_image_decode/ (JPEGs baseline and progressive,
 * colour and grayscale, cut short, corrupt, claiming oversized frames, with
 * more scans than allowed, not JPEGs at all), replayed by fuzz_image_decode_replay in `make test`.
 */
#include <stdint.h>
#include <stdlib.h>

#include "image_bytes_classifier/model.c"

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size)
{
    static float x[3 * SIZE * SIZE];
    char why[256] = "";
    int rc = image_decode_row(NULL, in, size, x, why, sizeof why);
    if (rc != PJSERVE_OK) {
        if (why[0] == '\0' ||
            (rc != PJSERVE_INVALID_ARGUMENT && rc != PJSERVE_RESOURCE_EXHAUSTED))
            abort();
        return 0;
    }
    for (int c = 0; c < 3; c++) {
        float lo = (float)((0.0 - MEAN[c]) / STD[c]) - 1e-4f;
        float hi = (float)((1.0 - MEAN[c]) / STD[c]) + 1e-4f;
        for (int i = 0; i < SIZE * SIZE; i++) {
            float v = x[c * SIZE * SIZE + i];
            if (!(v >= lo && v <= hi))
                abort();
        }
    }
    return 0;
}
