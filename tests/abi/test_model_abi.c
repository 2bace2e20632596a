/*
 * test_model_abi.c - the bundle ABI table (include/pjserve/model.h) stays
 * append-only, and a wrapper for an appended entry works against a server
 * whose table predates it.
 *
 * The offsets are those of x86-64 and aarch64 Linux (LP64), where bundles
 * are built; an entry moved or inserted before the end changes one of them.
 * The older server is a table whose `size` ends before `cancelled`, as a
 * server built before that entry hands out: pjserve_cancelled must fall
 * back to the deadline and never read past `size`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#define PJSERVE_HOST_SIDE
#include "pjserve/model.h"

#define SLOT(field, offset) assert_int_equal(offsetof(pjserve_api, field), offset)

static void test_table_layout_is_append_only(void **state)
{
    (void)state;
    SLOT(abi_version, 0);
    SLOT(size, 8);
    SLOT(alloc, 16);
    SLOT(set_error, 24);
    SLOT(log, 32);
    SLOT(state, 40);
    SLOT(bundle_dir, 48);
    SLOT(model_name, 56);
    SLOT(request_id, 64);
    SLOT(remaining_ns, 72);
    SLOT(scratch, 80);
    SLOT(call_start, 88);
    SLOT(call_wait, 96);
    SLOT(respond, 104);
    SLOT(cancelled, 112);
    assert_int_equal(sizeof(pjserve_api), 120);
    assert_int_equal(PJSERVE_MODEL_ABI_VERSION, 1);
}

static int64_t remaining;
static int64_t fake_remaining_ns(pjserve_ctx *ctx)
{
    (void)ctx;
    return remaining;
}

static bool fake_cancelled(pjserve_ctx *ctx)
{
    (void)ctx;
    return true;
}

static void test_cancelled_falls_back_to_the_deadline_on_an_older_table(void **state)
{
    (void)state;
    /* A table as an older server hands it out: `cancelled` lies past its
     * size, and holds garbage that must not be called. */
    pjserve_api older = {.abi_version = 1, .size = offsetof(pjserve_api, cancelled),
                         .remaining_ns = fake_remaining_ns,
                         .cancelled = (bool (*)(pjserve_ctx *))(uintptr_t)1};
    pjserve_ctx ctx = {.api = &older};
    remaining = 5;
    assert_false(pjserve_cancelled(&ctx));
    remaining = 0;
    assert_true(pjserve_cancelled(&ctx));
    remaining = INT64_MAX;
    assert_false(pjserve_cancelled(&ctx));

    pjserve_api current = older;
    current.size = sizeof(pjserve_api);
    current.cancelled = fake_cancelled;
    ctx.api = &current;
    assert_true(pjserve_cancelled(&ctx)); /* the server's answer, whatever the deadline */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_layout_is_append_only),
        cmocka_unit_test(test_cancelled_falls_back_to_the_deadline_on_an_older_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
