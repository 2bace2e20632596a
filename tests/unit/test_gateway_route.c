/*
 * test_gateway_route.c - unit tests of what the gateway decides without
 * a network: the model name and sequence id read from a request
 * (gateway/route_key.c) and lpt_packing's placement (gateway/placement.c)
 * on synthetic costs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "gateway/placement.h"
#include "gateway/route_key.h"

/* ---- a protobuf writer for the tests ---------------------------------------- */

typedef struct pb {
    uint8_t b[512];
    size_t n;
} pb;

static void varint(pb *p, uint64_t v)
{
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        p->b[p->n++] = byte | (v ? 0x80 : 0);
    } while (v);
}

static void bytes_field(pb *p, unsigned field, const void *data, size_t len)
{
    varint(p, (uint64_t)field << 3 | 2);
    varint(p, len);
    memcpy(p->b + p->n, data, len);
    p->n += len;
}

static void str_field(pb *p, unsigned field, const char *s)
{
    bytes_field(p, field, s, strlen(s));
}

static void varint_field(pb *p, unsigned field, uint64_t v)
{
    varint(p, (uint64_t)field << 3);
    varint(p, v);
}

/* A parameters map entry (ModelInferRequest field 4): key -> InferParameter. */
static void parameter(pb *p, const char *key, const pb *value)
{
    pb entry = {0};
    str_field(&entry, 1, key);
    bytes_field(&entry, 2, value->b, value->n);
    bytes_field(p, 4, entry.b, entry.n);
}

static void test_model_and_sequence_ids(void **state)
{
    (void)state;
    pjs_gw_route_key key;
    pjs_error err;
    pb m = {0};
    str_field(&m, 1, "resnet");
    str_field(&m, 2, "1");
    str_field(&m, 3, "request-7");
    pb other = {0};
    varint_field(&other, 1, 1); /* bool_param */
    parameter(&m, "priority", &other);
    pb seq = {0};
    varint_field(&seq, 2, (uint64_t)(int64_t)-42); /* int64_param */
    parameter(&m, "sequence_id", &seq);
    uint8_t tensor[64] = {0};
    bytes_field(&m, 7, tensor, sizeof tensor); /* raw_input_contents: skipped */
    assert_int_equal(pjs_gw_route_key_read(m.b, m.n, true, &key, &err), 0);
    assert_string_equal(key.model, "resnet");
    assert_string_equal(key.sequence, "-42");
    /* Not an inference request: parameters are not looked at. */
    assert_int_equal(pjs_gw_route_key_read(m.b, m.n, false, &key, &err), 0);
    assert_string_equal(key.sequence, "");

    pb s = {0};
    str_field(&s, 1, "lm");
    pb text = {0};
    str_field(&text, 3, "chat-9");
    parameter(&s, "sequence_id", &text);
    assert_int_equal(pjs_gw_route_key_read(s.b, s.n, true, &key, &err), 0);
    assert_string_equal(key.model, "lm");
    assert_string_equal(key.sequence, "chat-9");

    pb u = {0};
    str_field(&u, 1, "lm");
    pb big = {0};
    varint_field(&big, 5, UINT64_MAX); /* uint64_param */
    parameter(&u, "sequence_id", &big);
    assert_int_equal(pjs_gw_route_key_read(u.b, u.n, true, &key, &err), 0);
    assert_string_equal(key.sequence, "18446744073709551615");

    assert_int_equal(pjs_gw_route_key_read(NULL, 0, true, &key, &err), 0);
    assert_string_equal(key.model, "");
}

static void test_malformed_requests(void **state)
{
    (void)state;
    pjs_gw_route_key key;
    pjs_error err;
    /* A length past the end. */
    const uint8_t past[] = {0x0a, 0x10, 'a', 'b'};
    assert_int_equal(pjs_gw_route_key_read(past, sizeof past, true, &key, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "well-formed"));
    /* Wire types 3 and 4 (groups) and field 0 are refused. */
    const uint8_t group[] = {0x0b};
    assert_int_equal(pjs_gw_route_key_read(group, sizeof group, true, &key, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    const uint8_t field0[] = {0x02, 0x00};
    assert_int_equal(pjs_gw_route_key_read(field0, sizeof field0, true, &key, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    /* A varint that never ends. */
    const uint8_t endless[] = {0x08, 0xff, 0xff};
    assert_int_equal(pjs_gw_route_key_read(endless, sizeof endless, true, &key, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    /* A name with a NUL, and one too long. */
    pb nul = {0};
    bytes_field(&nul, 1, "a\0b", 3);
    assert_int_equal(pjs_gw_route_key_read(nul.b, nul.n, true, &key, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    pb longname = {0};
    char name[300];
    memset(name, 'm', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    str_field(&longname, 1, name);
    assert_int_equal(pjs_gw_route_key_read(longname.b, longname.n, true, &key, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "longer than 255"));
    /* Broken parameters. */
    pb badparam = {0};
    str_field(&badparam, 1, "m");
    const uint8_t broken[] = {0x0a, 0x20};
    bytes_field(&badparam, 4, broken, sizeof broken);
    assert_int_equal(pjs_gw_route_key_read(badparam.b, badparam.n, true, &key, &err),
                     PJS_ERR_INVALID_ARGUMENT);
}

static int popcount(uint64_t m)
{
    return __builtin_popcountll(m);
}

static void test_lpt_spreads_heaviest_first(void **state)
{
    (void)state;
    /* Costs 8, 4, 3, 3, 2 on 2 workers, one each, heaviest first to the
     * least loaded: 8 -> w0; 4 -> w1 (4); 3 -> w1 (7); 3 -> w1 (10, as 7 <
     * 8); 2 -> w0 (10). Makespan 10. */
    const double cost[] = {3, 8, 2, 4, 3};
    uint64_t masks[5];
    pjs_gw_lpt_place(cost, 5, 2, 1, masks);
    for (int m = 0; m < 5; m++)
        assert_int_equal(popcount(masks[m]), 1);
    assert_int_equal(masks[1], 1u); /* the heaviest first, on worker 0 */
    assert_int_equal(masks[3], 2u);
    double makespan = pjs_gw_makespan(cost, masks, 5, 2);
    assert_true(makespan == 10.0);
    /* k = 2 on 3 workers: every model on two distinct workers, cost split. */
    uint64_t two[5];
    pjs_gw_lpt_place(cost, 5, 3, 2, two);
    for (int m = 0; m < 5; m++) {
        assert_int_equal(popcount(two[m]), 2);
        assert_true(two[m] < 8u);
    }
    /* k beyond the workers: everywhere. */
    pjs_gw_lpt_place(cost, 5, 2, 5, two);
    for (int m = 0; m < 5; m++)
        assert_int_equal(two[m], 3u);
    /* Equal costs spread by count; the same input gives the same placement. */
    const double same[] = {1, 1, 1, 1};
    uint64_t a[4], b[4];
    pjs_gw_lpt_place(same, 4, 2, 1, a);
    pjs_gw_lpt_place(same, 4, 2, 1, b);
    assert_memory_equal(a, b, sizeof a);
    int on0 = 0;
    for (int m = 0; m < 4; m++)
        on0 += a[m] == 1u;
    assert_int_equal(on0, 2);
}

static void test_hysteresis(void **state)
{
    (void)state;
    const double cost[] = {5, 5};
    uint64_t spread[] = {1, 2}, piled[] = {1, 1}, unplaced[] = {0, 2};
    /* Piled (makespan 10) -> spread (5): taken. */
    assert_true(pjs_gw_placement_better(cost, piled, spread, 2, 2));
    /* Spread -> piled: never. */
    assert_false(pjs_gw_placement_better(cost, spread, piled, 2, 2));
    /* A model with no worker: always replaced. */
    assert_true(pjs_gw_placement_better(cost, unplaced, piled, 2, 2));
    /* A gain under a tenth is not worth moving caches. */
    const double close[] = {5, 5.4};
    uint64_t current[] = {1, 2}, other[] = {2, 1};
    assert_false(pjs_gw_placement_better(close, current, other, 2, 2));
    const double shifted[] = {10, 1, 1};
    uint64_t bad[] = {1, 1, 2}, good[] = {1, 2, 2};
    assert_true(pjs_gw_placement_better(shifted, bad, good, 3, 2) == 0); /* 11 -> 10: < 10 % */
    const double skewed[] = {10, 4, 1};
    uint64_t worse[] = {1, 1, 2}, better[] = {1, 2, 2};
    assert_true(pjs_gw_placement_better(skewed, worse, better, 3, 2)); /* 14 -> 10 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_and_sequence_ids),
        cmocka_unit_test(test_malformed_requests),
        cmocka_unit_test(test_lpt_spreads_heaviest_first),
        cmocka_unit_test(test_hysteresis),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
