/*
 * fuzz_weight_segment.c - libFuzzer driver for the checks a worker runs on a
 * shared weights segment another process wrote (src/registry/weight_store.c:
 * pjs_wstore_header_check, then pjs_wstore_data_check).
 *
 * Input: one byte n (mod 5) of weights, two bytes (little-endian) of size
 * per weight, one byte of size change, then (offset: 4 bytes, xor: 1 byte)
 * mutations. The driver lays the weights out, writes a valid segment for
 * them, resizes it by the size change (exactly that many bytes allocated, so
 * a read past the end is caught) and applies the mutations. The checks must
 * never read outside the segment, must accept the untouched segment, and
 * must explain every refusal. Seeds in fuzz/corpus/fuzz_weight_segment/.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "registry/weight_store.h"

#define MAX_WEIGHTS 4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t n = data[0] % (MAX_WEIGHTS + 1), at = 1;
    if (size < at + 2 * n + 1)
        return 0;
    static const char *names[MAX_WEIGHTS] = {"w0", "w1", "w2", "w3"};
    pjs_shape shapes[MAX_WEIGHTS];
    pjs_wstore_tensor t[MAX_WEIGHTS];
    unsigned char *bytes[MAX_WEIGHTS] = {0};
    for (size_t i = 0; i < n; i++, at += 2) {
        uint64_t nbytes = (uint64_t)data[at] | (uint64_t)data[at + 1] << 8;
        shapes[i] = (pjs_shape){1, {(int64_t)nbytes}};
        bytes[i] = malloc(nbytes + 1);
        for (uint64_t k = 0; k < nbytes; k++)
            bytes[i][k] = (unsigned char)(k * 13 + i);
        t[i] = (pjs_wstore_tensor){.name = names[i], .dtype = PJS_DTYPE_U8, .shape = &shapes[i],
                                   .nbytes = nbytes,
                                   .sum = pjs_checksum_of(bytes[i], (size_t)nbytes)};
    }
    int8_t size_change = (int8_t)data[at++];
    pjs_wstore_layout l;
    pjs_error err;
    if (pjs_wstore_layout_init(&l, t, n, &err) != 0)
        abort(); /* at most 4 weights of 64 KiB: always laid out */
    int64_t resized = (int64_t)l.total_bytes + (int64_t)size_change * 64;
    size_t seg_size = resized > 0 ? (size_t)resized : 0;
    unsigned char *valid = calloc(1, (size_t)l.total_bytes);
    pjs_wstore_header_write(&l, valid);
    for (size_t i = 0; i < n; i++)
        memcpy(valid + l.offsets[i], bytes[i], (size_t)t[i].nbytes);
    unsigned char *seg = malloc(seg_size + (seg_size == 0));
    size_t common = seg_size < l.total_bytes ? seg_size : (size_t)l.total_bytes;
    memcpy(seg, valid, common);
    memset(seg + common, 0, seg_size - common);
    bool mutated = seg_size != l.total_bytes;
    for (; at + 5 <= size; at += 5) {
        uint32_t off;
        memcpy(&off, data + at, 4);
        if (seg_size > 0 && data[at + 4] != 0) {
            seg[off % seg_size] ^= data[at + 4];
            mutated = true;
        }
    }
    int rc = pjs_wstore_header_check(&l, seg, seg_size, &err);
    if (rc == 0)
        rc = pjs_wstore_data_check(&l, seg, &err);
    if (rc != 0 && (rc != PJS_ERR_INVALID_ARGUMENT || err.msg[0] == '\0'))
        abort();
    if (!mutated && rc != 0)
        abort(); /* the segment as written must pass */
    free(seg);
    free(valid);
    pjs_wstore_layout_free(&l);
    for (size_t i = 0; i < n; i++)
        free(bytes[i]);
    return 0;
}
