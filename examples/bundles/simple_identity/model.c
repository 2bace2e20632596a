/*
 * simple_identity: returns its strings unchanged (Triton's simple_identity
 * example model). A compute-only meta: no executable, no sub-calls; the
 * run hands INPUT0, BYTES [batch, -1], back as OUTPUT0 by reference, so
 * every element comes back byte for byte, embedded NULs, bytes that are not
 * UTF-8 and empty strings included.
 */
#include <pjserve/model.h>

int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    (void)ctx, (void)n_in, (void)n_out;
    out[0].shape[0] = in[0].shape[0];
    out[0].shape[1] = in[0].shape[1];
    out[0].data = in[0].data; /* a tensor the run was handed lives until the response is sent */
    out[0].nbytes = in[0].nbytes;
    return PJSERVE_OK;
}
