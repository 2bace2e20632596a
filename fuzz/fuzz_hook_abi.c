/*
 * fuzz_hook_abi.c - libFuzzer driver for what crosses the bundle ABI back
 * into pjserve: the tensors bundle code fills in (pjs_hook_check_produced).
 *
 * Hooks and meta runs are trusted code, but a mistake in them (a wrong
 * dtype, an extent left at -1, nbytes that disagree with the shape, a
 * malformed string tensor) must become an INTERNAL error naming the tensor,
 * never a read past the data handed over. The input is split into a slot
 * (what pjserve declared), the tensor as bundle code left it, and its data;
 * the check reads at most nbytes of that data (ASan catches more), and an
 * accepted tensor is checked against the promises: every extent set and
 * fixed ones kept, dtype and rank unchanged, and the bytes sized right
 * (strings well formed, one per element). A broken promise aborts. Seeds are
 * fuzz/corpus/fuzz_hook_abi/, replayed by fuzz_hook_abi_replay in
 * `make test`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "registry/model.h"
#include "server/hook_ctx.h"

/* Header: slot dtype, slot rank, got dtype, got rank (one byte each), then
 * PJSERVE_MAX_RANK slot extents and PJSERVE_MAX_RANK got extents (one signed
 * byte each, small so shapes stay plausible), then a 4-byte little-endian
 * nbytes claim; the rest is the data. */
#define HEADER (4 + 2 * PJSERVE_MAX_RANK + 4)

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size)
{
    if (size < HEADER)
        return 0;
    pjserve_tensor slot = {.name = "t", .dtype = (pjserve_dtype)(in[0] % 14 + 1),
                           .rank = in[1] % (PJSERVE_MAX_RANK + 2)};
    pjserve_tensor got = {.name = "t", .dtype = (pjserve_dtype)(in[2] % 16),
                          .rank = in[3] % (PJSERVE_MAX_RANK + 2)};
    for (int d = 0; d < PJSERVE_MAX_RANK; d++) {
        slot.shape[d] = (int8_t)in[4 + d];
        got.shape[d] = (int8_t)in[4 + PJSERVE_MAX_RANK + d];
    }
    const uint8_t *p = in + 4 + 2 * PJSERVE_MAX_RANK;
    size_t claim = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
    size_t avail = size - HEADER;
    /* Claims past the data would be the hook's lie; keep them inside so
     * that ASan sees a read past nbytes as the bug it would be. */
    got.nbytes = claim <= avail ? claim : avail;
    void *data = malloc(got.nbytes > 0 ? got.nbytes : 1);
    if (data == NULL)
        return 0;
    memcpy(data, in + HEADER, got.nbytes);
    got.data = (in[0] & 0x80) && got.nbytes == 0 ? NULL : data;

    pjs_model model = {.name = "fuzz"};
    pjs_infer_request r;
    pjs_infer_request_init(&r);
    r.model = &model;
    pjs_hook_ctx ctx;
    pjs_hook_ctx_init(&ctx, NULL, &r, NULL);
    ctx.stage = "postprocess";
    pjs_error err;
    pjs_error_clear(&err);
    if (pjs_hook_check_produced(&ctx, &slot, &got, 1, &err) == 0) {
        if (got.dtype != slot.dtype || got.rank != slot.rank || got.rank < 0 ||
            got.rank > PJSERVE_MAX_RANK)
            abort();
        int64_t numel = 1;
        for (int d = 0; d < got.rank; d++) {
            if (got.shape[d] < 0 || (slot.shape[d] >= 0 && got.shape[d] != slot.shape[d]))
                abort();
            numel *= got.shape[d];
        }
        if (got.dtype == PJSERVE_BYTES) {
            uint64_t count = 0;
            if (pjs_bytes_count(got.data, got.nbytes, &count, &err) != 0 ||
                count != (uint64_t)numel)
                abort();
        } else if (pjserve_dtype_size(got.dtype) == 0 ||
                   got.nbytes != (size_t)numel * pjserve_dtype_size(got.dtype)) {
            abort();
        }
    } else if (err.code != PJS_ERR_INTERNAL) {
        abort();
    }
    pjs_hook_ctx_release(&ctx);
    free(data);
    return 0;
}
