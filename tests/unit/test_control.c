/*
 * test_control.c - unit tests of the model control surface's checks
 * (src/server/control.c): a requested policy change becomes the
 * pjs_model_policy that pjs_server_set_model_policy applies, with its
 * "unset" conventions, and every value out of the configuration file's
 * ranges is refused with a message naming the model and the field.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "server/control.h"

static void test_policy_from_change(void **state)
{
    (void)state;
    pjs_model_policy p;
    pjs_error err;
    pjs_control_policy_change c = {.has_weight = true, .weight = 2.5};
    assert_int_equal(pjs_control_policy("mlp", &c, &p, &err), 0);
    assert_null(p.name);
    assert_true(p.weight == 2.5);
    assert_int_equal(p.max_queue_depth, 0);     /* unset */
    assert_int_equal(p.default_timeout_us, -1); /* unset */

    c = (pjs_control_policy_change){.has_max_queue_depth = true,
                                    .max_queue_depth = PJS_CONFIG_MAX_QUEUE_DEPTH,
                                    .has_default_timeout_us = true,
                                    .default_timeout_us = 0};
    assert_int_equal(pjs_control_policy("mlp", &c, &p, &err), 0);
    assert_true(p.weight == 0); /* unset */
    assert_int_equal(p.max_queue_depth, PJS_CONFIG_MAX_QUEUE_DEPTH);
    assert_int_equal(p.default_timeout_us, 0); /* set: no deadline */

    c = (pjs_control_policy_change){.has_max_queue_depth = true,
                                    .max_queue_depth = 1,
                                    .has_default_timeout_us = true,
                                    .default_timeout_us = PJS_CONFIG_MAX_DURATION_US};
    assert_int_equal(pjs_control_policy("mlp", &c, &p, &err), 0);
    assert_int_equal(p.max_queue_depth, 1);
    assert_int_equal(p.default_timeout_us, PJS_CONFIG_MAX_DURATION_US);
}

static void refused(const pjs_control_policy_change *c, const char *message)
{
    pjs_model_policy p = {.weight = 7};
    pjs_error err;
    assert_int_equal(pjs_control_policy("mlp", c, &p, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, message);
    assert_true(p.weight == 7); /* untouched */
}

static void test_policy_refusals(void **state)
{
    (void)state;
    refused(&(pjs_control_policy_change){0},
            "model mlp: the policy change sets nothing (give weight, max_queue_depth or "
            "default_timeout_us)");
    refused(&(pjs_control_policy_change){.has_weight = true, .weight = 0},
            "model mlp: weight must be a finite number > 0, got 0");
    refused(&(pjs_control_policy_change){.has_weight = true, .weight = -1},
            "model mlp: weight must be a finite number > 0, got -1");
    refused(&(pjs_control_policy_change){.has_weight = true, .weight = INFINITY},
            "model mlp: weight must be a finite number > 0, got inf");
    refused(&(pjs_control_policy_change){.has_weight = true, .weight = NAN},
            "model mlp: weight must be a finite number > 0, got nan");
    refused(&(pjs_control_policy_change){.has_max_queue_depth = true, .max_queue_depth = 0},
            "model mlp: max_queue_depth must be in 1..16777216, got 0");
    refused(&(pjs_control_policy_change){.has_max_queue_depth = true,
                                         .max_queue_depth = PJS_CONFIG_MAX_QUEUE_DEPTH + 1},
            "model mlp: max_queue_depth must be in 1..16777216, got 16777217");
    refused(&(pjs_control_policy_change){.has_default_timeout_us = true,
                                         .default_timeout_us = -1},
            "model mlp: default_timeout_us must be in 0..86400000000 (0: none), got -1");
    refused(&(pjs_control_policy_change){.has_default_timeout_us = true,
                                         .default_timeout_us = INT64_MAX},
            "model mlp: default_timeout_us must be in 0..86400000000 (0: none), got "
            "9223372036854775807");
    /* One bad field refuses the whole change. */
    refused(&(pjs_control_policy_change){.has_weight = true,
                                         .weight = 2,
                                         .has_max_queue_depth = true,
                                         .max_queue_depth = -5},
            "model mlp: max_queue_depth must be in 1..16777216, got -5");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_from_change),
        cmocka_unit_test(test_policy_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
