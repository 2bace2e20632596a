/*
 * fuzz_control_json.c - libFuzzer driver for the request bodies of the REST
 * model control endpoints (src/frontend/http/control_json.c) and the check
 * of a policy change (src/server/control.c).
 *
 * Input: one selector byte (modulo 3: residency, policy, compact) then the
 * body. Every path must either succeed with a sane result (a residency of
 * the three; compact names non-empty strings in one block, NULL when none;
 * a policy change that pjs_control_policy accepts yields a policy whose set
 * fields are in range) or fail INVALID_ARGUMENT with a message; a result
 * that is not aborts. Seeds: fuzz/corpus/fuzz_control_json/.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/http/control_json.h"
#include "server/control.h"

static void check_refusal(int rc, const pjs_error *err)
{
    if (rc != PJS_ERR_INVALID_ARGUMENT || err->msg[0] == '\0')
        abort();
}

static void residency(const char *body, size_t len)
{
    pjs_residency r;
    pjs_error err;
    int rc = pjs_control_parse_residency(body, len, &r, &err);
    if (rc != 0)
        check_refusal(rc, &err);
    else if (r != PJS_RESIDENCY_DEVICE && r != PJS_RESIDENCY_HOST && r != PJS_RESIDENCY_UNPINNED)
        abort();
}

static void policy(const char *body, size_t len)
{
    pjs_control_policy_change c;
    pjs_model_policy p;
    pjs_error err;
    int rc = pjs_control_parse_policy(body, len, &c, &err);
    if (rc == 0)
        rc = pjs_control_policy("fuzz", &c, &p, &err);
    if (rc != 0) {
        check_refusal(rc, &err);
        return;
    }
    if ((c.has_weight && !(isfinite(p.weight) && p.weight > 0)) ||
        (c.has_max_queue_depth &&
         (p.max_queue_depth < 1 || p.max_queue_depth > PJS_CONFIG_MAX_QUEUE_DEPTH)) ||
        (c.has_default_timeout_us &&
         (p.default_timeout_us < 0 || p.default_timeout_us > PJS_CONFIG_MAX_DURATION_US)))
        abort();
}

static void compact(const char *body, size_t len)
{
    char **names;
    size_t n;
    pjs_error err;
    int rc = pjs_control_parse_compact(body, len, &names, &n, &err);
    if (rc != 0) {
        check_refusal(rc, &err);
        return;
    }
    if ((n == 0) != (names == NULL))
        abort();
    for (size_t i = 0; i < n; i++)
        if (names[i] == NULL || names[i][0] == '\0')
            abort();
    free(names);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const char *body = (const char *)data + 1;
    switch (data[0] % 3) {
    case 0: residency(body, size - 1); break;
    case 1: policy(body, size - 1); break;
    default: compact(body, size - 1); break;
    }
    return 0;
}
