/*
 * repeat_int32: Triton's example decoupled model of that name, as a
 * compute-only decoupled meta (docs/meta-models.md, "Decoupled models"): no
 * executable, no sub-calls; the run sleeps and sends responses with
 * pjserve_respond over a ModelStreamInfer stream.
 *
 * Clients send IN i32 [n], DELAY u32 [n] and WAIT u32 [1]. For each i in
 * order the run waits DELAY[i] milliseconds, then sends one response OUT
 * i32 [1] = IN[i], IDX u32 [1] = i. After the last it waits WAIT
 * milliseconds and returns without outputs, so the server sends the final
 * response. An empty IN sends no data response at all.
 *
 * The run holds one of the server's compute-only meta threads while it
 * sleeps, so the waits are bounded: each DELAY and WAIT at most
 * MAX_WAIT_MS, and all of them together at most MAX_TOTAL_MS; more is
 * refused with INVALID_ARGUMENT before anything is sent. A wait never runs
 * past the request's deadline (DEADLINE_EXCEEDED then), and it ends within
 * SLICE_MS once the client closed the stream (pjserve_cancelled); the run
 * also stops at the first pjserve_respond that fails.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <time.h>

#include <pjserve/model.h>

#define MAX_WAIT_MS 10000u  /* one DELAY or WAIT: 10 s */
#define MAX_TOTAL_MS 60000u /* every DELAY and the WAIT of one request: 1 min */

static uint32_t u32_at(const pjserve_tensor *t, int64_t i)
{
    uint32_t v;
    memcpy(&v, (const char *)t->data + i * (int64_t)sizeof v, sizeof v);
    return v;
}

static int check_waits(pjserve_ctx *ctx, const pjserve_tensor *delay, uint32_t wait_ms)
{
    int64_t n = delay->shape[0];
    uint64_t total = wait_ms;
    if (wait_ms > MAX_WAIT_MS) {
        pjserve_error(ctx, "WAIT is %u ms; at most %u ms (10 s) are allowed", (unsigned)wait_ms,
                      MAX_WAIT_MS);
        return PJSERVE_INVALID_ARGUMENT;
    }
    for (int64_t i = 0; i < n; i++) {
        uint32_t d = u32_at(delay, i);
        if (d > MAX_WAIT_MS) {
            pjserve_error(ctx, "DELAY[%lld] is %u ms; at most %u ms (10 s) are allowed",
                          (long long)i, (unsigned)d, MAX_WAIT_MS);
            return PJSERVE_INVALID_ARGUMENT;
        }
        total += d;
    }
    if (total > MAX_TOTAL_MS) {
        pjserve_error(ctx, "DELAY and WAIT add up to %llu ms; at most %u ms (1 min) per request "
                      "are allowed: send fewer values or shorter delays",
                      (unsigned long long)total, MAX_TOTAL_MS);
        return PJSERVE_INVALID_ARGUMENT;
    }
    return PJSERVE_OK;
}

/* Sleeps ms milliseconds in slices of at most SLICE_MS, stopping early
 * (DEADLINE_EXCEEDED) once the request's deadline passed or its client has
 * gone: a closed stream frees the thread within a slice. */
#define SLICE_MS 50
static int sleep_ms(pjserve_ctx *ctx, uint32_t ms)
{
    int64_t left_ns = (int64_t)ms * 1000000;
    while (left_ns > 0) {
        if (pjserve_cancelled(ctx)) {
            pjserve_error(ctx, "the request's deadline passed while waiting %u ms (or its "
                               "client went away)",
                          (unsigned)ms);
            return PJSERVE_DEADLINE_EXCEEDED;
        }
        int64_t ns = left_ns < SLICE_MS * 1000000 ? left_ns : SLICE_MS * 1000000;
        int64_t deadline_ns = pjserve_remaining_ns(ctx);
        if (deadline_ns > 0 && deadline_ns < ns)
            ns = deadline_ns;
        left_ns -= ns;
        struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    return PJSERVE_OK;
}

int pjserve_run(pjserve_ctx *ctx, const pjserve_tensor *in, size_t n_in, pjserve_tensor *out,
                size_t n_out)
{
    if (n_in != 3 || n_out != 2) {
        pjserve_error(ctx, "expected 3 client inputs and 2 outputs, got %zu and %zu", n_in,
                      n_out);
        return PJSERVE_INTERNAL;
    }
    const pjserve_tensor *values = &in[0], *delay = &in[1];
    uint32_t wait_ms = u32_at(&in[2], 0);
    int64_t n = values->shape[0];
    if (delay->shape[0] != n) {
        pjserve_error(ctx, "IN holds %lld values and DELAY %lld; send one delay per value",
                      (long long)n, (long long)delay->shape[0]);
        return PJSERVE_INVALID_ARGUMENT;
    }
    int rc = check_waits(ctx, delay, wait_ms);
    if (rc != PJSERVE_OK)
        return rc;

    for (int64_t i = 0; i < n; i++) {
        if ((rc = sleep_ms(ctx, u32_at(delay, i))) != PJSERVE_OK)
            return rc;
        int32_t value;
        uint32_t index = (uint32_t)i;
        memcpy(&value, (const char *)values->data + i * (int64_t)sizeof value, sizeof value);
        pjserve_tensor response[2] = {out[0], out[1]};
        response[0].shape[0] = 1;
        response[0].data = &value;
        response[0].nbytes = sizeof value;
        response[1].shape[0] = 1;
        response[1].data = &index;
        response[1].nbytes = sizeof index;
        if ((rc = pjserve_respond(ctx, response, 2, false)) != PJSERVE_OK)
            return rc; /* the client went away, or its deadline passed */
    }
    return sleep_ms(ctx, wait_ms); /* no outputs: the server sends the final response */
}
