/*
 * byte_budget.c - the in-flight byte bound (compare-and-swap on one counter).
 */
#include "core/byte_budget.h"

void pjs_byte_budget_init(pjs_byte_budget *b, uint64_t limit)
{
    b->limit = limit;
    atomic_init(&b->used, 0);
    atomic_init(&b->refused, 0);
}

bool pjs_byte_budget_take(pjs_byte_budget *b, uint64_t n)
{
    uint64_t used = atomic_load_explicit(&b->used, memory_order_relaxed);
    do {
        if (b->limit != 0 && (n > b->limit || used > b->limit - n)) {
            atomic_fetch_add_explicit(&b->refused, 1, memory_order_relaxed);
            return false;
        }
    } while (!atomic_compare_exchange_weak_explicit(&b->used, &used, used + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

void pjs_byte_budget_give(pjs_byte_budget *b, uint64_t n)
{
    atomic_fetch_sub_explicit(&b->used, n, memory_order_relaxed);
}

int pjs_byte_budget_take_or_fail(pjs_byte_budget *b, uint64_t n, const char *what,
                                 pjs_error *err)
{
    if (pjs_byte_budget_take(b, n))
        return 0;
    return pjs_error_set(err, PJS_ERR_RESOURCE_EXHAUSTED,
                         "%s: %llu bytes would pass the server's budget of %llu bytes for "
                         "requests in flight (--max-inflight-request-bytes); retry later",
                         what, (unsigned long long)n, (unsigned long long)b->limit);
}

uint64_t pjs_byte_budget_used(pjs_byte_budget *b)
{
    return atomic_load_explicit(&b->used, memory_order_relaxed);
}
