/*
 * deadline.h - how front ends turn what a client says about time into
 * pjs_infer_request.deadline_ns.
 *
 * A client bounds a request two ways: the KServe `timeout` parameter
 * (microseconds from when the server received the request, 0: none, as
 * Triton) and, on gRPC, the call's deadline. Both become monotonic
 * nanoseconds on pjs_now_ns()'s clock and the earlier one wins. 0 means no
 * deadline throughout, so a deadline that has already passed is kept at 1
 * or later, never 0, and one too far away to represent is no deadline.
 * Pure functions; any thread.
 */
#ifndef PJS_FRONTEND_DEADLINE_H
#define PJS_FRONTEND_DEADLINE_H

#include <stdint.h>

/* `remaining_ns` (negative: already passed) after `now_ns`. */
static inline uint64_t pjs_deadline_after_ns(uint64_t now_ns, int64_t remaining_ns)
{
    if (remaining_ns < 0) {
        uint64_t ago = (uint64_t)(-(remaining_ns + 1)) + 1;
        return ago >= now_ns ? 1 : now_ns - ago;
    }
    if ((uint64_t)remaining_ns > UINT64_MAX - now_ns)
        return 0;
    uint64_t at = now_ns + (uint64_t)remaining_ns;
    return at == 0 ? 1 : at;
}

/* The deadline of a KServe `timeout` of `timeout_us` microseconds counted
 * from `received_ns`; 0 (none) for a timeout of 0. */
static inline uint64_t pjs_deadline_from_timeout_us(uint64_t received_ns, uint64_t timeout_us)
{
    if (timeout_us == 0 || timeout_us > (UINT64_MAX - received_ns) / 1000u)
        return 0;
    return received_ns + timeout_us * 1000u;
}

/* Whether something that began at `since_ns` has waited `bound_ns` by
 * `now_ns`. A `since_ns` later than `now_ns` (it began after the caller
 * read its clock) has not waited at all: never an unsigned wrap-around. */
static inline int pjs_waited_at_least(uint64_t since_ns, uint64_t now_ns, uint64_t bound_ns)
{
    return now_ns >= since_ns && now_ns - since_ns >= bound_ns;
}

/* The earlier of two deadlines (0: none). */
static inline uint64_t pjs_deadline_earlier(uint64_t a, uint64_t b)
{
    if (a == 0)
        return b;
    if (b == 0)
        return a;
    return a < b ? a : b;
}

#endif
