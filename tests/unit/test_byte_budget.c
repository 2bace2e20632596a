/*
 * test_byte_budget.c - unit tests of the in-flight byte bound
 * (src/core/byte_budget.c): takes up to the limit and not a byte past it,
 * gives back, counts refusals, names the flag when refusing, an unlimited
 * budget, and concurrent takers never holding more than the limit together.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "core/byte_budget.h"

static void takes_up_to_the_limit(void **state)
{
    (void)state;
    pjs_byte_budget b;
    pjs_byte_budget_init(&b, 100);
    assert_true(pjs_byte_budget_take(&b, 60));
    assert_true(pjs_byte_budget_take(&b, 40));
    assert_int_equal(pjs_byte_budget_used(&b), 100);
    assert_false(pjs_byte_budget_take(&b, 1));
    assert_int_equal(pjs_byte_budget_used(&b), 100); /* nothing taken by a refusal */
    pjs_byte_budget_give(&b, 40);
    assert_true(pjs_byte_budget_take(&b, 40));
    assert_false(pjs_byte_budget_take(&b, UINT64_MAX)); /* no overflow */
    pjs_byte_budget_give(&b, 100);
    assert_false(pjs_byte_budget_take(&b, 101));
    assert_int_equal(pjs_byte_budget_used(&b), 0);
    assert_int_equal(atomic_load(&b.refused), 3);
}

static void refusal_names_the_flag(void **state)
{
    (void)state;
    pjs_byte_budget b;
    pjs_byte_budget_init(&b, 10);
    pjs_error err;
    assert_int_equal(pjs_byte_budget_take_or_fail(&b, 10, "the body", &err), 0);
    assert_int_equal(pjs_byte_budget_take_or_fail(&b, 5, "the body", &err),
                     PJS_ERR_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.msg, "the body: 5 bytes"));
    assert_non_null(strstr(err.msg, "--max-inflight-request-bytes"));
}

static void zero_is_unlimited(void **state)
{
    (void)state;
    pjs_byte_budget b;
    pjs_byte_budget_init(&b, 0);
    assert_true(pjs_byte_budget_take(&b, UINT64_MAX / 2));
    assert_true(pjs_byte_budget_take(&b, UINT64_MAX / 2));
    assert_int_equal(atomic_load(&b.refused), 0);
}

#define TAKERS 4
#define ROUNDS 20000

typedef struct taker {
    pjs_byte_budget *budget;
    _Atomic uint64_t *held; /* what all takers hold right now */
    _Atomic uint64_t *most; /* the most they ever held together */
    int granted;
} taker;

static void *take_and_give(void *arg)
{
    taker *t = arg;
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t n = 1 + (uint64_t)(i % 7) * 10;
        if (!pjs_byte_budget_take(t->budget, n))
            continue;
        t->granted++;
        uint64_t now = atomic_fetch_add(t->held, n) + n;
        uint64_t most = atomic_load(t->most);
        while (now > most && !atomic_compare_exchange_weak(t->most, &most, now))
            ;
        atomic_fetch_sub(t->held, n);
        pjs_byte_budget_give(t->budget, n);
    }
    return NULL;
}

static void concurrent_takers_stay_within_the_limit(void **state)
{
    (void)state;
    pjs_byte_budget b;
    pjs_byte_budget_init(&b, 100);
    _Atomic uint64_t held = 0, most = 0;
    taker takers[TAKERS];
    pthread_t threads[TAKERS];
    for (int i = 0; i < TAKERS; i++) {
        takers[i] = (taker){.budget = &b, .held = &held, .most = &most};
        assert_int_equal(pthread_create(&threads[i], NULL, take_and_give, &takers[i]), 0);
    }
    int granted = 0;
    for (int i = 0; i < TAKERS; i++) {
        pthread_join(threads[i], NULL);
        granted += takers[i].granted;
    }
    assert_true(atomic_load(&most) <= 100);
    assert_true(granted > 0);
    assert_int_equal(pjs_byte_budget_used(&b), 0);
    assert_int_equal((uint64_t)granted + atomic_load(&b.refused), (uint64_t)TAKERS * ROUNDS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(takes_up_to_the_limit),
        cmocka_unit_test(refusal_names_the_flag),
        cmocka_unit_test(zero_is_unlimited),
        cmocka_unit_test(concurrent_takers_stay_within_the_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
