/*
 * test_config.c - unit tests of the server configuration
 * (src/server/config.c): defaults, the YAML file, PJSERVE_SCHEDULER_* and
 * PJSERVE_META_* variables (from crafted envp arrays), pjs_server_config_set
 * (what the command line uses), their precedence, model policies, the meta
 * model settings and byte counts, and the start-up log lines.
 *
 * Every rejection is checked for its whole message (origin, key, problem,
 * line) and for leaving the configuration as it was. Run under ASan, so the
 * error paths are checked for leaks too.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/config.h"

#define LABEL "pjserve.yaml"

static int parse(pjs_server_config *c, const char *yaml, pjs_error *err)
{
    pjs_error_clear(err);
    return pjs_server_config_parse(c, yaml, strlen(yaml), LABEL, err);
}

/* Field by field: the structs have padding. */
static void assert_same_sched(const pjs_sched_config *a, const pjs_sched_config *b)
{
    assert_int_equal(a->discipline, b->discipline);
    assert_true(a->half_life_s == b->half_life_s);
    assert_true(a->coalesce_discount == b->coalesce_discount);
    assert_true(a->fair_clamp == b->fair_clamp);
    assert_true(a->cost_smoothing == b->cost_smoothing);
    assert_int_equal(a->edf_laxity_margin_us, b->edf_laxity_margin_us);
    assert_int_equal(a->max_queue_depth, b->max_queue_depth);
    assert_int_equal(a->default_timeout_us, b->default_timeout_us);
    assert_int_equal(a->warmup_runs, b->warmup_runs);
    assert_true(a->cold_model_defer_ms == b->cold_model_defer_ms);
    assert_int_equal(a->eviction, b->eviction);
    assert_int_equal(a->weight_prefetch, b->weight_prefetch);
    assert_int_equal(a->hand_off, b->hand_off);
}

static void assert_same_config(const pjs_server_config *a, const pjs_server_config *b)
{
    assert_same_sched(&a->sched, &b->sched);
    assert_int_equal(a->meta.concurrency, b->meta.concurrency);
    assert_int_equal(a->meta.scratch_bytes, b->meta.scratch_bytes);
    assert_int_equal(a->n_models, b->n_models);
    for (size_t i = 0; i < a->n_models; i++) {
        assert_string_equal(a->models[i].name, b->models[i].name);
        assert_true(a->models[i].weight == b->models[i].weight);
        assert_int_equal(a->models[i].max_queue_depth, b->models[i].max_queue_depth);
        assert_int_equal(a->models[i].default_timeout_us, b->models[i].default_timeout_us);
    }
}

/* A configuration that is not the defaults, to show a failure changes nothing. */
#define BASE                                                                                  \
    "scheduler: {discipline: edf, warmup_runs: 5}\nmodels: {mlp: {weight: 3}}\n"              \
    "meta: {concurrency: 3, scratch_bytes: 1Mi}\n"

static void base_config(pjs_server_config *c)
{
    pjs_error err;
    pjs_server_config_init(c);
    assert_int_equal(parse(c, BASE, &err), 0);
}

/* Parses yaml over BASE; expects INVALID_ARGUMENT with exactly `message`
 * and an unchanged configuration. */
static void expect_reject(const char *yaml, const char *message)
{
    pjs_server_config c, before;
    base_config(&c);
    base_config(&before);
    pjs_error err;
    int rc = parse(&c, yaml, &err);
    if (getenv("PJS_TEST_VERBOSE") != NULL)
        print_message("%s\n", err.msg);
    if (rc != PJS_ERR_INVALID_ARGUMENT || strcmp(err.msg, message) != 0)
        print_error("rc=%d msg: %s\n", rc, err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, message);
    assert_same_config(&c, &before);
    pjs_server_config_free(&c);
    pjs_server_config_free(&before);
}

/* ---- defaults and a full file ------------------------------------------------ */

static void test_defaults(void **state)
{
    (void)state;
    pjs_server_config c;
    pjs_server_config_init(&c);
    pjs_sched_config want;
    pjs_sched_config_defaults(&want);
    assert_same_sched(&c.sched, &want);
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_FAIR);
    assert_true(c.sched.half_life_s == 1.0);
    assert_int_equal(c.n_models, 0);
    assert_null(pjs_server_config_model(&c, "mlp"));
    assert_int_equal(c.meta.concurrency, 2);
    assert_int_equal(c.meta.scratch_bytes, 0);
    pjs_error err;
    assert_int_equal(pjs_server_config_check(&c, &err), 0);
    pjs_server_config_free(&c);
}

static const char full_file[] =
    "# every setting\n"
    "scheduler:\n"
    "  discipline: edf\n"
    "  half_life_ms: 250\n"
    "  coalesce_discount: 0.75\n"
    "  fair_clamp: 8\n"
    "  cost_smoothing: 0.5\n"
    "  edf_laxity_margin_us: 300\n"
    "  max_queue_depth: 64\n"
    "  default_timeout_us: 20000\n"
    "  warmup_runs: 0\n"
    "models:\n"
    "  mlp: {weight: 2, max_queue_depth: 16, default_timeout_us: 50000}\n"
    "  convnet:\n"
    "    weight: 0.5\n"
    "  two_io.v2: {default_timeout_us: 0}\n"
    "  idle:\n"
    "meta:\n"
    "  concurrency: 4\n"
    "  scratch_bytes: 64Mi\n";

static void test_full_file(void **state)
{
    (void)state;
    pjs_server_config c;
    pjs_server_config_init(&c);
    pjs_error err;
    assert_int_equal(parse(&c, full_file, &err), 0);
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_EDF);
    assert_true(c.sched.half_life_s == 0.25);
    assert_true(c.sched.coalesce_discount == 0.75);
    assert_true(c.sched.fair_clamp == 8);
    assert_true(c.sched.cost_smoothing == 0.5);
    assert_int_equal(c.sched.edf_laxity_margin_us, 300);
    assert_int_equal(c.sched.max_queue_depth, 64);
    assert_int_equal(c.sched.default_timeout_us, 20000);
    assert_int_equal(c.sched.warmup_runs, 0);
    assert_int_equal(c.n_models, 4);
    assert_int_equal(c.meta.concurrency, 4);
    assert_int_equal(c.meta.scratch_bytes, 64u << 20);

    const pjs_model_policy *p = pjs_server_config_model(&c, "mlp");
    assert_non_null(p);
    assert_true(p->weight == 2);
    assert_int_equal(p->max_queue_depth, 16);
    assert_int_equal(p->default_timeout_us, 50000);
    p = pjs_server_config_model(&c, "convnet");
    assert_true(p->weight == 0.5);
    assert_int_equal(p->max_queue_depth, 0);       /* inherited */
    assert_int_equal(p->default_timeout_us, -1);   /* inherited */
    p = pjs_server_config_model(&c, "two_io.v2");
    assert_true(p->weight == 0);                   /* the manifest's */
    assert_int_equal(p->default_timeout_us, 0);    /* none, overriding the scheduler's */
    p = pjs_server_config_model(&c, "idle");
    assert_non_null(p);
    assert_int_equal(p->default_timeout_us, -1);
    assert_null(pjs_server_config_model(&c, "MLP"));
    assert_int_equal(pjs_server_config_check(&c, &err), 0);
    pjs_server_config_free(&c);
}

static void test_empty_files_set_nothing(void **state)
{
    (void)state;
    const char *files[] = {"", "# scheduler:\n#   discipline: fifo\n", "scheduler:\nmodels:\n",
                           "---\n", "scheduler: {}\nmodels: {}\n", "meta:\n", "meta: {}\n"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        pjs_server_config c, before;
        base_config(&c);
        base_config(&before);
        pjs_error err;
        assert_int_equal(parse(&c, files[i], &err), 0);
        assert_same_config(&c, &before);
        pjs_server_config_free(&c);
        pjs_server_config_free(&before);
    }
}

/* Each scheduler key alone, over the defaults. */
static void test_each_key(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        size_t offset, size;
        union {
            pjs_discipline d;
            double x;
            uint64_t u;
            size_t z;
            int i;
        } want;
    } cases[] = {
#define F(field) offsetof(pjs_sched_config, field), sizeof(((pjs_sched_config *)0)->field)
        {"discipline: fifo", F(discipline), {.d = PJS_DISCIPLINE_FIFO}},
        {"discipline: fair", F(discipline), {.d = PJS_DISCIPLINE_FAIR}},
        {"half_life_ms: 1500", F(half_life_s), {.x = 1.5}},
        {"coalesce_discount: 0", F(coalesce_discount), {.x = 0}},
        {"coalesce_discount: 1", F(coalesce_discount), {.x = 1}},
        {"fair_clamp: 1", F(fair_clamp), {.x = 1}},
        {"cost_smoothing: 1", F(cost_smoothing), {.x = 1}},
        {"edf_laxity_margin_us: 86400000000", F(edf_laxity_margin_us), {.u = 86400000000u}},
        {"max_queue_depth: 16777216", F(max_queue_depth), {.z = 16777216}},
        {"default_timeout_us: 1", F(default_timeout_us), {.u = 1}},
        {"warmup_runs: 100", F(warmup_runs), {.i = 100}},
        {"cold_model_defer_ms: 2.5", F(cold_model_defer_ms), {.x = 2.5}},
        {"cold_model_defer_ms: 0", F(cold_model_defer_ms), {.x = 0}},
        {"eviction_policy: lru", F(eviction), {.i = PJS_EVICTION_LRU}},
        {"eviction_policy: lfu", F(eviction), {.i = PJS_EVICTION_LFU}},
        {"weight_prefetch: false", F(weight_prefetch), {.i = 0}},
        {"hand_off: off", F(hand_off), {.i = PJS_HAND_OFF_OFF}},
        {"hand_off: on", F(hand_off), {.i = PJS_HAND_OFF_ON}},
#undef F
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char yaml[128];
        snprintf(yaml, sizeof yaml, "scheduler:\n  %s\n", cases[i].yaml);
        pjs_server_config c;
        pjs_server_config_init(&c);
        pjs_error err;
        if (parse(&c, yaml, &err) != 0)
            print_error("%s: %s\n", cases[i].yaml, err.msg);
        assert_int_equal(err.code, PJS_OK);
        assert_memory_equal((const char *)&c.sched + cases[i].offset, &cases[i].want,
                            cases[i].size);
        pjs_server_config_free(&c);
    }
}

/* Each meta key alone, over the defaults; byte counts in every spelling. */
static void test_meta_keys(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        int concurrency;
        uint64_t scratch_bytes;
    } cases[] = {
        {"concurrency: 1", 1, 0},
        {"concurrency: 1024", 1024, 0},
        {"scratch_bytes: 0", 2, 0},
        {"scratch_bytes: 67108864", 2, 67108864},
        {"scratch_bytes: 64Mi", 2, 64ULL << 20},
        {"scratch_bytes: 64MiB", 2, 64ULL << 20},
        {"scratch_bytes: \"64MiB\"", 2, 64ULL << 20},
        {"scratch_bytes: 2G", 2, 2000000000},
        {"scratch_bytes: 512K", 2, 512000},
        {"scratch_bytes: 4096B", 2, 4096},
        {"scratch_bytes: 1024Gi", 2, 1ULL << 40},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char yaml[128];
        snprintf(yaml, sizeof yaml, "meta:\n  %s\n", cases[i].yaml);
        pjs_server_config c;
        pjs_server_config_init(&c);
        pjs_error err;
        if (parse(&c, yaml, &err) != 0)
            print_error("%s: %s\n", cases[i].yaml, err.msg);
        assert_int_equal(err.code, PJS_OK);
        assert_int_equal(c.meta.concurrency, cases[i].concurrency);
        assert_int_equal(c.meta.scratch_bytes, cases[i].scratch_bytes);
        pjs_server_config_free(&c);
    }
}

static void test_parse_bytes(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        bool ok;
        uint64_t want;
    } cases[] = {
        {"0", true, 0},
        {"1", true, 1},
        {"1K", true, 1000},
        {"1KB", true, 1000},
        {"1Ki", true, 1024},
        {"1KiB", true, 1024},
        {"3M", true, 3000000},
        {"3Mi", true, 3ULL << 20},
        {"5G", true, 5000000000ULL},
        {"5GiB", true, 5ULL << 30},
        {"18446744073709551615", true, UINT64_MAX},
        {"18446744073709551616", false, 0},
        {"17179869184Gi", false, 0},
        {"", false, 0},
        {"B", false, 0},
        {"Mi", false, 0},
        {"-1", false, 0},
        {"+1", false, 0},
        {" 1", false, 0},
        {"1 Mi", false, 0},
        {"1mi", false, 0},
        {"1MiBB", false, 0},
        {"1T", false, 0},
        {"1.5Gi", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t v = 12345;
        bool ok = pjs_server_config_parse_bytes(cases[i].text, &v);
        if (ok != cases[i].ok)
            print_error("\"%s\": %s\n", cases[i].text, ok ? "accepted" : "refused");
        assert_int_equal(ok, cases[i].ok);
        assert_int_equal(v, cases[i].ok ? cases[i].want : 12345);
    }
}

/* ---- what the file refuses ---------------------------------------------------- */

#define REJECT(test, yaml, message)                                                          \
    static void test(void **state)                                                           \
    {                                                                                        \
        (void)state;                                                                         \
        expect_reject(yaml, message);                                                        \
    }

REJECT(test_reject_unknown_top_key, "scheduler: {}\nschedular: {}\n",
       LABEL ": unknown key \"schedular\" at top level (line 2)")
REJECT(test_reject_unknown_scheduler_key, "scheduler:\n  discipline: fifo\n  half_life: 5\n",
       LABEL ": scheduler: unknown key \"half_life\" (line 3)")
REJECT(test_reject_unknown_model_key, "models:\n  mlp: {weight: 2, priority: 1}\n",
       LABEL ": models.mlp: unknown key \"priority\" (line 2)")
REJECT(test_reject_duplicate_scheduler_key, "scheduler:\n  fair_clamp: 2\n  fair_clamp: 3\n",
       LABEL ": scheduler.fair_clamp: duplicate key (line 3)")
REJECT(test_reject_duplicate_section, "scheduler: {}\nscheduler: {}\n",
       LABEL ": scheduler: duplicate key (line 2)")
REJECT(test_reject_duplicate_model, "models:\n  mlp: {weight: 2}\n  cnn: {}\n  mlp: {weight: 3}\n",
       LABEL ": models: duplicate key \"mlp\" (line 4)")
REJECT(test_reject_duplicate_model_key, "models:\n  mlp: {weight: 2, weight: 3}\n",
       LABEL ": models.mlp.weight: duplicate key (line 2)")
REJECT(test_reject_alias, "scheduler: &s {fair_clamp: 2}\nmodels: *s\n",
       LABEL ": line 1: YAML anchors are not allowed (anchor \"s\")")
REJECT(test_reject_alias_alone, "models:\n  mlp: *w\n",
       LABEL ": line 2: YAML aliases are not allowed (alias \"w\")")
REJECT(test_reject_tag, "scheduler:\n  warmup_runs: !!int 3\n",
       LABEL ": line 2: YAML tags are not allowed (tag \"tag:yaml.org,2002:int\")")
REJECT(test_reject_two_documents, "scheduler: {}\n---\nmodels: {}\n",
       LABEL ": line 2: multiple YAML documents are not allowed")
REJECT(test_reject_syntax, "scheduler:\n  discipline: [fifo\n",
       LABEL ": line 3: YAML syntax error: did not find expected ',' or ']' "
             "(while parsing a flow sequence from line 2)")
REJECT(test_reject_top_not_mapping, "- scheduler\n",
       LABEL ": the top level must be a mapping, got a list (line 1)")
REJECT(test_reject_scheduler_not_mapping, "scheduler: fifo\n",
       LABEL ": scheduler: must be a mapping, got a scalar (line 1)")
REJECT(test_reject_models_list, "models: [mlp]\n",
       LABEL ": models: must be a mapping, got a list (line 1)")
REJECT(test_reject_model_scalar, "models:\n  mlp: 2\n",
       LABEL ": models.mlp: must be a mapping, got a scalar (line 2)")
REJECT(test_reject_bad_model_name, "models:\n  \"my model\": {weight: 2}\n",
       LABEL ": models: \"my model\" may only contain A-Z a-z 0-9 _ . - (line 2)")
REJECT(test_reject_discipline, "scheduler:\n  discipline: round-robin\n",
       LABEL ": scheduler.discipline: \"round-robin\" is not a discipline "
             "(expected fair, fifo or edf) (line 2)")
REJECT(test_reject_discipline_case, "scheduler:\n  discipline: FIFO\n",
       LABEL ": scheduler.discipline: \"FIFO\" is not a discipline "
             "(expected fair, fifo or edf) (line 2)")
REJECT(test_reject_hand_off, "scheduler:\n  hand_off: sometimes\n",
       LABEL ": scheduler.hand_off: \"sometimes\" is not a hand-off setting "
             "(expected on or off) (line 2)")
REJECT(test_reject_discipline_null, "scheduler:\n  discipline:\n",
       LABEL ": scheduler.discipline: must be a string, got null (line 2)")
REJECT(test_reject_quoted_number, "scheduler:\n  fair_clamp: \"2\"\n",
       LABEL ": scheduler.fair_clamp: must be a number, got \"2\" (line 2)")
REJECT(test_reject_quoted_integer, "scheduler:\n  warmup_runs: '3'\n",
       LABEL ": scheduler.warmup_runs: must be an integer, got the quoted string \"3\" (line 2)")
REJECT(test_reject_float_for_integer, "scheduler:\n  max_queue_depth: 64.0\n",
       LABEL ": scheduler.max_queue_depth: must be a decimal integer, got \"64.0\" (line 2)")
REJECT(test_reject_leading_zero, "scheduler:\n  default_timeout_us: 0100\n",
       LABEL ": scheduler.default_timeout_us: must be a decimal integer, got \"0100\" (line 2)")
REJECT(test_reject_infinite, "scheduler:\n  half_life_ms: .inf\n",
       LABEL ": scheduler.half_life_ms: must be a number, got \".inf\" (line 2)")
REJECT(test_reject_overflowing_number, "scheduler:\n  fair_clamp: 1e400\n",
       LABEL ": scheduler.fair_clamp: must be a finite number, got \"1e400\" (line 2)")
REJECT(test_reject_list_for_number, "scheduler:\n  cost_smoothing: [0.2]\n",
       LABEL ": scheduler.cost_smoothing: must be a number, got a list (line 2)")
REJECT(test_reject_half_life_zero, "scheduler:\n  half_life_ms: 0\n",
       LABEL ": scheduler.half_life_ms: must be a positive number of milliseconds, got \"0\" "
             "(line 2)")
REJECT(test_reject_discount_above_one, "scheduler:\n  coalesce_discount: 1.5\n",
       LABEL ": scheduler.coalesce_discount: must be between 0 and 1, got \"1.5\" (line 2)")
REJECT(test_reject_clamp_below_one, "scheduler:\n  fair_clamp: 0.5\n",
       LABEL ": scheduler.fair_clamp: must be a finite number >= 1, got \"0.5\" (line 2)")
REJECT(test_reject_smoothing_zero, "scheduler:\n  cost_smoothing: 0\n",
       LABEL ": scheduler.cost_smoothing: must be in (0, 1], got \"0\" (line 2)")
REJECT(test_reject_queue_depth_zero, "scheduler:\n  max_queue_depth: 0\n",
       LABEL ": scheduler.max_queue_depth: must be in 1..16777216, got 0 (line 2)")
REJECT(test_reject_queue_depth_huge, "scheduler:\n  max_queue_depth: 16777217\n",
       LABEL ": scheduler.max_queue_depth: must be in 1..16777216, got 16777217 (line 2)")
REJECT(test_reject_negative_timeout, "scheduler:\n  default_timeout_us: -1\n",
       LABEL ": scheduler.default_timeout_us: must be in 0..86400000000, got -1 (line 2)")
REJECT(test_reject_negative_margin, "scheduler:\n  edf_laxity_margin_us: -5\n",
       LABEL ": scheduler.edf_laxity_margin_us: must be in 0..86400000000, got -5 (line 2)")
REJECT(test_reject_warmup_runs, "scheduler:\n  warmup_runs: 101\n",
       LABEL ": scheduler.warmup_runs: must be in 0..100, got 101 (line 2)")
REJECT(test_reject_cold_defer, "scheduler:\n  cold_model_defer_ms: 60001\n",
       LABEL ": scheduler.cold_model_defer_ms: must be between 0 and 60000, got \"60001\" (line 2)")
REJECT(test_reject_eviction_policy, "scheduler:\n  eviction_policy: gdsf\n",
       LABEL ": scheduler.eviction_policy: \"gdsf\" is not an eviction policy (expected lfu or "
             "lru) (line 2)")
REJECT(test_reject_weight_zero, "models:\n  mlp: {weight: 0}\n",
       LABEL ": models.mlp.weight: must be a positive finite number, got \"0\" (line 2)")
REJECT(test_reject_weight_negative, "models:\n  mlp:\n    weight: -2\n",
       LABEL ": models.mlp.weight: must be a positive finite number, got \"-2\" (line 3)")
REJECT(test_reject_model_queue_depth_zero, "models:\n  mlp: {max_queue_depth: 0}\n",
       LABEL ": models.mlp.max_queue_depth: must be in 1..16777216, got 0 (line 2)")
REJECT(test_reject_model_timeout_negative, "models:\n  mlp: {default_timeout_us: -1}\n",
       LABEL ": models.mlp.default_timeout_us: must be in 0..86400000000, got -1 (line 2)")
REJECT(test_reject_meta_concurrency_zero, "meta:\n  concurrency: 0\n",
       LABEL ": meta.concurrency: must be in 1..1024, got 0 (line 2)")
REJECT(test_reject_meta_concurrency_huge, "meta:\n  concurrency: 1025\n",
       LABEL ": meta.concurrency: must be in 1..1024, got 1025 (line 2)")
REJECT(test_reject_meta_concurrency_quoted, "meta: {concurrency: \"2\"}\n",
       LABEL ": meta.concurrency: must be an integer, got the quoted string \"2\" (line 1)")
REJECT(test_reject_meta_unknown_key, "meta:\n  concurrency: 2\n  scratch: 1Mi\n",
       LABEL ": meta: unknown key \"scratch\" (line 3)")
REJECT(test_reject_meta_not_mapping, "meta: 2\n",
       LABEL ": meta: must be a mapping, got a scalar (line 1)")
REJECT(test_reject_scratch_bytes_spaced, "meta:\n  scratch_bytes: 64 MiB\n",
       LABEL ": meta.scratch_bytes: must be a number of bytes, optionally followed by K, M, G "
             "(powers of 1000) or Ki, Mi, Gi (powers of 1024) and B, got \"64 MiB\" (line 2)")
REJECT(test_reject_scratch_bytes_negative, "meta:\n  scratch_bytes: -1\n",
       LABEL ": meta.scratch_bytes: must be a number of bytes, optionally followed by K, M, G "
             "(powers of 1000) or Ki, Mi, Gi (powers of 1024) and B, got \"-1\" (line 2)")
REJECT(test_reject_scratch_bytes_null, "meta:\n  scratch_bytes:\n",
       LABEL ": meta.scratch_bytes: must be a string, got null (line 2)")
REJECT(test_reject_scratch_bytes_huge, "meta:\n  scratch_bytes: 1025Gi\n",
       LABEL ": meta.scratch_bytes: must be at most 1099511627776 bytes, got \"1025Gi\" "
             "(line 2)")
/* A later error undoes the settings before it. */
REJECT(test_reject_late_error_changes_nothing,
       "scheduler:\n  discipline: fifo\n  warmup_runs: 1\nmodels:\n  mlp: {weight: 9}\n"
       "  new: {weight: 1}\n  bad: {weight: x}\n",
       LABEL ": models.bad.weight: must be a positive number, got \"x\" (line 7)")

static void test_reject_too_large(void **state)
{
    (void)state;
    size_t len = PJS_CONFIG_MAX_BYTES + 1;
    char *yaml = malloc(len);
    assert_non_null(yaml);
    memset(yaml, '#', len);
    pjs_server_config c;
    pjs_server_config_init(&c);
    pjs_error err;
    assert_int_equal(pjs_server_config_parse(&c, yaml, len, LABEL, &err),
                     PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, LABEL ": 1048577 bytes, more than the 1048576 allowed");
    free(yaml);
    pjs_server_config_free(&c);
}

/* ---- files -------------------------------------------------------------------- */

static void test_load_file(void **state)
{
    (void)state;
    char path[] = "/tmp/pjs_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char yaml[] = "scheduler:\n  discipline: fifo\n  fair_clamp: nope\n";
    assert_int_equal(write(fd, yaml, sizeof yaml - 1), (ssize_t)(sizeof yaml - 1));
    close(fd);
    pjs_server_config c;
    pjs_server_config_init(&c);
    pjs_error err;
    assert_int_equal(pjs_server_config_load_file(&c, path, &err), PJS_ERR_INVALID_ARGUMENT);
    char want[256];
    snprintf(want, sizeof want, "%s: scheduler.fair_clamp: must be a number, got \"nope\" (line 3)",
             path);
    assert_string_equal(err.msg, want);
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_FAIR);

    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, yaml, 30), 30); /* up to and including "fifo\n" */
    close(fd);
    assert_int_equal(pjs_server_config_load_file(&c, path, &err), 0);
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_FIFO);
    unlink(path);

    assert_int_not_equal(pjs_server_config_load_file(&c, path, &err), 0);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_FIFO);
    pjs_server_config_free(&c);
}

/* ---- the environment ------------------------------------------------------------ */

static void test_env_overrides(void **state)
{
    (void)state;
    char *envp[] = {"HOME=/root",
                    "PJSERVE_LOG_LEVEL=debug",          /* another PJSERVE_ variable: ignored */
                    "PJSERVE_SCHEDULER_DISCIPLINE=fifo",
                    "PJSERVE_SCHEDULER_HALF_LIFE_MS=500",
                    "PJSERVE_SCHEDULER_COALESCE_DISCOUNT=0.25",
                    "PJSERVE_SCHEDULER_FAIR_CLAMP=2",
                    "PJSERVE_SCHEDULER_COST_SMOOTHING=0.1",
                    "PJSERVE_SCHEDULER_EDF_LAXITY_MARGIN_US=100",
                    "PJSERVE_SCHEDULER_MAX_QUEUE_DEPTH=8",
                    "PJSERVE_SCHEDULER_DEFAULT_TIMEOUT_US=1000",
                    "PJSERVE_SCHEDULER_WARMUP_RUNS=1",
                    "PJSERVE_META_CONCURRENCY=6",
                    "PJSERVE_META_SCRATCH_BYTES=1GiB",
                    NULL};
    pjs_server_config c;
    base_config(&c);
    pjs_error err;
    assert_int_equal(pjs_server_config_apply_env(&c, envp, &err), 0);
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_FIFO);
    assert_true(c.sched.half_life_s == 0.5);
    assert_true(c.sched.coalesce_discount == 0.25);
    assert_true(c.sched.fair_clamp == 2);
    assert_true(c.sched.cost_smoothing == 0.1);
    assert_int_equal(c.sched.edf_laxity_margin_us, 100);
    assert_int_equal(c.sched.max_queue_depth, 8);
    assert_int_equal(c.sched.default_timeout_us, 1000);
    assert_int_equal(c.sched.warmup_runs, 1);
    assert_int_equal(c.meta.concurrency, 6);
    assert_int_equal(c.meta.scratch_bytes, 1ULL << 30);
    assert_true(pjs_server_config_model(&c, "mlp")->weight == 3); /* models untouched */

    char *none[] = {NULL};
    assert_int_equal(pjs_server_config_apply_env(&c, none, &err), 0);
    assert_int_equal(pjs_server_config_apply_env(&c, NULL, &err), 0);
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_FIFO);
    pjs_server_config_free(&c);
}

static void expect_env_reject(char *entry, const char *message)
{
    char *envp[] = {"PJSERVE_SCHEDULER_WARMUP_RUNS=7", entry, NULL};
    pjs_server_config c, before;
    base_config(&c);
    base_config(&before);
    pjs_error err;
    int rc = pjs_server_config_apply_env(&c, envp, &err);
    if (rc == 0 || strcmp(err.msg, message) != 0)
        print_error("%s: %s\n", entry, err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, message);
    assert_same_config(&c, &before); /* WARMUP_RUNS=7 was not applied either */
    pjs_server_config_free(&c);
    pjs_server_config_free(&before);
}

static void test_env_rejects(void **state)
{
    (void)state;
    expect_env_reject("PJSERVE_SCHEDULER_DISCIPLINE=round-robin",
                      "PJSERVE_SCHEDULER_DISCIPLINE: scheduler.discipline: \"round-robin\" is "
                      "not a discipline (expected fair, fifo or edf)");
    expect_env_reject("PJSERVE_SCHEDULER_DISCIPLINE=",
                      "PJSERVE_SCHEDULER_DISCIPLINE: scheduler.discipline: must be a string, "
                      "got null");
    expect_env_reject("PJSERVE_SCHEDULER_FAIR_CLAMP=0.5",
                      "PJSERVE_SCHEDULER_FAIR_CLAMP: scheduler.fair_clamp: must be a finite "
                      "number >= 1, got \"0.5\"");
    expect_env_reject("PJSERVE_SCHEDULER_HALF_LIFE_MS=inf",
                      "PJSERVE_SCHEDULER_HALF_LIFE_MS: scheduler.half_life_ms: must be a "
                      "number, got \"inf\"");
    expect_env_reject("PJSERVE_SCHEDULER_MAX_QUEUE_DEPTH=0x10",
                      "PJSERVE_SCHEDULER_MAX_QUEUE_DEPTH: scheduler.max_queue_depth: must be a "
                      "decimal integer, got \"0x10\"");
    expect_env_reject("PJSERVE_SCHEDULER_WARMUP_RUNS= 3",
                      "PJSERVE_SCHEDULER_WARMUP_RUNS: scheduler.warmup_runs: must be a decimal "
                      "integer, got \" 3\"");
    expect_env_reject("PJSERVE_SCHEDULER_HALFLIFE=5",
                      "environment variable \"PJSERVE_SCHEDULER_HALFLIFE\" is not a scheduler "
                      "setting (expected PJSERVE_SCHEDULER_<KEY>, KEY one of DISCIPLINE, "
                      "HALF_LIFE_MS, COALESCE_DISCOUNT, FAIR_CLAMP, COST_SMOOTHING, "
                      "EDF_LAXITY_MARGIN_US, MAX_QUEUE_DEPTH, DEFAULT_TIMEOUT_US, WARMUP_RUNS, "
                      "COLD_MODEL_DEFER_MS, EVICTION_POLICY, WEIGHT_PREFETCH, HAND_OFF)");
    expect_env_reject("PJSERVE_SCHEDULER_discipline=fifo",
                      "environment variable \"PJSERVE_SCHEDULER_discipline\" is not a scheduler "
                      "setting (expected PJSERVE_SCHEDULER_<KEY>, KEY one of DISCIPLINE, "
                      "HALF_LIFE_MS, COALESCE_DISCOUNT, FAIR_CLAMP, COST_SMOOTHING, "
                      "EDF_LAXITY_MARGIN_US, MAX_QUEUE_DEPTH, DEFAULT_TIMEOUT_US, WARMUP_RUNS, "
                      "COLD_MODEL_DEFER_MS, EVICTION_POLICY, WEIGHT_PREFETCH, HAND_OFF)");
    expect_env_reject("PJSERVE_META_CONCURRENCY=0",
                      "PJSERVE_META_CONCURRENCY: meta.concurrency: must be in 1..1024, got 0");
    expect_env_reject("PJSERVE_META_CONCURRENCY=two",
                      "PJSERVE_META_CONCURRENCY: meta.concurrency: must be a decimal integer, "
                      "got \"two\"");
    expect_env_reject("PJSERVE_META_SCRATCH_BYTES=lots",
                      "PJSERVE_META_SCRATCH_BYTES: meta.scratch_bytes: must be a number of "
                      "bytes, optionally followed by K, M, G (powers of 1000) or Ki, Mi, Gi "
                      "(powers of 1024) and B, got \"lots\"");
    expect_env_reject("PJSERVE_META_CONCURENCY=4",
                      "environment variable \"PJSERVE_META_CONCURENCY\" is not a meta model "
                      "setting (expected PJSERVE_META_<KEY>, KEY one of CONCURRENCY, "
                      "SCRATCH_BYTES)");
}

/* ---- pjs_server_config_set (the command line) --------------------------------- */

static void test_set(void **state)
{
    (void)state;
    pjs_server_config c;
    pjs_server_config_init(&c);
    pjs_error err;
    assert_int_equal(pjs_server_config_set(&c, "scheduler.discipline", "edf", "--x", &err), 0);
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_EDF);
    assert_int_equal(pjs_server_config_set(&c, "scheduler.half_life_ms", "2e3", "--x", &err), 0);
    assert_true(c.sched.half_life_s == 2.0);
    assert_int_equal(pjs_server_config_set(&c, "models.mlp.weight", "2.5", "--x", &err), 0);
    assert_int_equal(pjs_server_config_set(&c, "models.mlp.max_queue_depth", "4", "--x", &err),
                     0);
    assert_int_equal(pjs_server_config_set(&c, "models.a.b.default_timeout_us", "0", "--x", &err),
                     0);
    assert_int_equal(c.n_models, 2);
    const pjs_model_policy *p = pjs_server_config_model(&c, "mlp");
    assert_true(p->weight == 2.5);
    assert_int_equal(p->max_queue_depth, 4);
    assert_int_equal(p->default_timeout_us, -1);
    p = pjs_server_config_model(&c, "a.b");
    assert_non_null(p);
    assert_int_equal(p->default_timeout_us, 0);
    assert_true(p->weight == 0);
    assert_int_equal(pjs_server_config_set(&c, "meta.concurrency", "8", "--meta-concurrency",
                                           &err),
                     0);
    assert_int_equal(pjs_server_config_set(&c, "meta.scratch_bytes", "256MiB",
                                           "--meta-scratch-bytes", &err),
                     0);
    assert_int_equal(c.meta.concurrency, 8);
    assert_int_equal(c.meta.scratch_bytes, 256ULL << 20);
    pjs_server_config_free(&c);
}

static void expect_set_reject(const char *key, const char *value, const char *origin,
                              const char *message)
{
    pjs_server_config c, before;
    base_config(&c);
    base_config(&before);
    pjs_error err;
    int rc = pjs_server_config_set(&c, key, value, origin, &err);
    if (rc == 0 || strcmp(err.msg, message) != 0)
        print_error("%s=%s: %s\n", key, value, err.msg);
    assert_int_equal(rc, PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, message);
    assert_same_config(&c, &before);
    pjs_server_config_free(&c);
    pjs_server_config_free(&before);
}

static void test_set_rejects(void **state)
{
    (void)state;
    expect_set_reject("scheduler.discipline", "lifo", "--scheduler-discipline",
                      "--scheduler-discipline: scheduler.discipline: \"lifo\" is not a "
                      "discipline (expected fair, fifo or edf)");
    expect_set_reject("scheduler.coalesce_discount", "-0.1", "--coalesce-discount",
                      "--coalesce-discount: scheduler.coalesce_discount: must be between 0 and "
                      "1, got \"-0.1\"");
    expect_set_reject("scheduler.warmup_runs", "two", "--warmup-runs",
                      "--warmup-runs: scheduler.warmup_runs: must be a decimal integer, got "
                      "\"two\"");
    expect_set_reject("models.mlp.weight", "0", "--model-weight",
                      "--model-weight: models.mlp.weight: must be a positive finite number, "
                      "got \"0\"");
    expect_set_reject("models.new.weight", "abc", "--model-weight",
                      "--model-weight: models.new.weight: must be a positive number, got "
                      "\"abc\"");
    expect_set_reject("models.my model.weight", "1", "--model-weight",
                      "--model-weight: models: \"my model\" may only contain A-Z a-z 0-9 _ . -");
    expect_set_reject("models.mlp.priority", "1", "--x",
                      "--x: unknown setting \"models.mlp.priority\" (a model has weight, "
                      "max_queue_depth and default_timeout_us)");
    expect_set_reject("scheduler.bogus", "1", "--x", "--x: unknown setting \"scheduler.bogus\"");
    expect_set_reject("bogus", "1", "--x", "--x: unknown setting \"bogus\"");
    expect_set_reject("meta.concurrency", "0", "--meta-concurrency",
                      "--meta-concurrency: meta.concurrency: must be in 1..1024, got 0");
    expect_set_reject("meta.scratch_bytes", "64 Mi", "--meta-scratch-bytes",
                      "--meta-scratch-bytes: meta.scratch_bytes: must be a number of bytes, "
                      "optionally followed by K, M, G (powers of 1000) or Ki, Mi, Gi (powers of "
                      "1024) and B, got \"64 Mi\"");
    expect_set_reject("meta.permits", "2", "--x", "--x: unknown setting \"meta.permits\"");
}

/* ---- precedence: defaults < file < environment < flags ------------------------- */

static void test_precedence(void **state)
{
    (void)state;
    pjs_server_config c;
    pjs_server_config_init(&c);
    pjs_error err;
    assert_int_equal(parse(&c,
                           "scheduler: {discipline: edf, fair_clamp: 2, warmup_runs: 3}\n"
                           "models: {mlp: {weight: 2, max_queue_depth: 8}}\n",
                           &err),
                     0);
    assert_int_equal(parse(&c, "meta: {concurrency: 3, scratch_bytes: 1Mi}\n", &err), 0);
    char *envp[] = {"PJSERVE_SCHEDULER_FAIR_CLAMP=3", "PJSERVE_SCHEDULER_WARMUP_RUNS=4",
                    "PJSERVE_META_CONCURRENCY=4", "PJSERVE_META_SCRATCH_BYTES=2Mi", NULL};
    assert_int_equal(pjs_server_config_apply_env(&c, envp, &err), 0);
    assert_int_equal(pjs_server_config_set(&c, "scheduler.warmup_runs", "5", "--warmup-runs",
                                           &err),
                     0);
    assert_int_equal(pjs_server_config_set(&c, "models.mlp.weight", "7", "--model-weight", &err),
                     0);
    assert_int_equal(pjs_server_config_set(&c, "meta.concurrency", "5", "--meta-concurrency",
                                           &err),
                     0);
    assert_int_equal(c.meta.concurrency, 5);                  /* flag over env over file */
    assert_int_equal(c.meta.scratch_bytes, 2u << 20);         /* env over file */
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_EDF); /* file */
    assert_true(c.sched.fair_clamp == 3);                     /* environment over file */
    assert_int_equal(c.sched.warmup_runs, 5);                 /* flag over both */
    assert_true(c.sched.half_life_s == 1.0);                  /* default */
    const pjs_model_policy *p = pjs_server_config_model(&c, "mlp");
    assert_true(p->weight == 7);                              /* flag over file */
    assert_int_equal(p->max_queue_depth, 8);                  /* file, kept */
    assert_int_equal(c.n_models, 1);
    pjs_server_config_free(&c);
}

/* A second file merges into the first: its settings win, the rest stay. */
static void test_second_file_merges(void **state)
{
    (void)state;
    pjs_server_config c;
    base_config(&c);
    pjs_error err;
    assert_int_equal(parse(&c, "models:\n  mlp: {max_queue_depth: 2}\n  cnn: {weight: 4}\n",
                           &err),
                     0);
    assert_int_equal(c.sched.discipline, PJS_DISCIPLINE_EDF);
    assert_int_equal(c.n_models, 2);
    assert_true(pjs_server_config_model(&c, "mlp")->weight == 3);
    assert_int_equal(pjs_server_config_model(&c, "mlp")->max_queue_depth, 2);
    assert_true(pjs_server_config_model(&c, "cnn")->weight == 4);
    pjs_server_config_free(&c);
}

/* ---- checks and the log line --------------------------------------------------- */

static void test_check(void **state)
{
    (void)state;
    pjs_server_config c;
    base_config(&c);
    pjs_error err;
    assert_int_equal(pjs_server_config_check(&c, &err), 0);
    c.models[0].weight = -1;
    assert_int_equal(pjs_server_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "models.mlp.weight: must be a positive finite number, got -1");
    c.models[0].weight = 0;
    c.models[0].default_timeout_us = -2;
    assert_int_equal(pjs_server_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg,
                        "models.mlp.default_timeout_us: must be in 0..86400000000, got -2");
    c.models[0].default_timeout_us = -1;
    c.sched.max_queue_depth = 16777217;
    assert_int_equal(pjs_server_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "scheduler.max_queue_depth: must be in 1..16777216, got 16777217");
    c.sched.max_queue_depth = 1;
    c.sched.cost_smoothing = 2;
    assert_int_equal(pjs_server_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "scheduler.cost_smoothing: must be in (0, 1]");
    c.sched.cost_smoothing = 0.2;
    c.meta.concurrency = 0;
    assert_int_equal(pjs_server_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg, "meta.concurrency: must be in 1..1024, got 0");
    c.meta.concurrency = 2;
    c.meta.scratch_bytes = (1ULL << 40) + 1;
    assert_int_equal(pjs_server_config_check(&c, &err), PJS_ERR_INVALID_ARGUMENT);
    assert_string_equal(err.msg,
                        "meta.scratch_bytes: must be at most 1099511627776 bytes, got "
                        "1099511627777");
    c.meta.scratch_bytes = 1ULL << 40;
    assert_int_equal(pjs_server_config_check(&c, &err), 0);
    pjs_server_config_free(&c);
}

static void test_describe(void **state)
{
    (void)state;
    pjs_server_config c;
    pjs_server_config_init(&c);
    char line[512];
    pjs_server_config_describe(&c, line, sizeof line);
    assert_string_equal(line,
                        "scheduler: fair, half-life 1000 ms, coalesce discount 0.5, fair clamp "
                        "4, cost smoothing 0.2, edf laxity margin 0 us, max queue depth 1024 "
                        "per model, default timeout none, warm-up runs 2, cold models deferred "
                        "up to 10 ms, lfu eviction, weight prefetch on, hand-off on, 0 model "
                        "policies");
    pjs_error err;
    assert_int_equal(parse(&c, full_file, &err), 0);
    pjs_server_config_describe(&c, line, sizeof line);
    assert_string_equal(line,
                        "scheduler: edf, half-life 250 ms, coalesce discount 0.75, fair clamp 8, "
                        "cost smoothing 0.5, edf laxity margin 300 us, max queue depth 64 per "
                        "model, default timeout 20000 us, warm-up runs 0, cold models deferred "
                        "up to 10 ms, lfu eviction, weight prefetch on, hand-off on, 4 model "
                        "policies");
    pjs_model_policy_describe(pjs_server_config_model(&c, "mlp"), line, sizeof line);
    assert_string_equal(line, "model policy mlp: weight 2, max queue depth 16, default timeout "
                              "50000 us");
    pjs_model_policy_describe(pjs_server_config_model(&c, "two_io.v2"), line, sizeof line);
    assert_string_equal(line, "model policy two_io.v2: default timeout none");
    pjs_model_policy_describe(pjs_server_config_model(&c, "idle"), line, sizeof line);
    assert_string_equal(line, "model policy idle: the scheduler's defaults");
    pjs_meta_config_describe(&c.meta, line, sizeof line);
    assert_string_equal(line, "meta models: 4 permits (compute-only metas take none), scratch "
                              "pool 67108864 bytes");
    pjs_meta_config one = {.concurrency = 1};
    pjs_meta_config_describe(&one, line, sizeof line);
    assert_string_equal(line, "meta models: 1 permit (compute-only metas take none), no scratch "
                              "pool (plain memory)");
    pjs_server_config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_file),
        cmocka_unit_test(test_empty_files_set_nothing),
        cmocka_unit_test(test_each_key),
        cmocka_unit_test(test_meta_keys),
        cmocka_unit_test(test_parse_bytes),
        cmocka_unit_test(test_reject_unknown_top_key),
        cmocka_unit_test(test_reject_unknown_scheduler_key),
        cmocka_unit_test(test_reject_unknown_model_key),
        cmocka_unit_test(test_reject_duplicate_scheduler_key),
        cmocka_unit_test(test_reject_duplicate_section),
        cmocka_unit_test(test_reject_duplicate_model),
        cmocka_unit_test(test_reject_duplicate_model_key),
        cmocka_unit_test(test_reject_alias),
        cmocka_unit_test(test_reject_alias_alone),
        cmocka_unit_test(test_reject_tag),
        cmocka_unit_test(test_reject_two_documents),
        cmocka_unit_test(test_reject_syntax),
        cmocka_unit_test(test_reject_top_not_mapping),
        cmocka_unit_test(test_reject_scheduler_not_mapping),
        cmocka_unit_test(test_reject_models_list),
        cmocka_unit_test(test_reject_model_scalar),
        cmocka_unit_test(test_reject_bad_model_name),
        cmocka_unit_test(test_reject_discipline),
        cmocka_unit_test(test_reject_discipline_case),
        cmocka_unit_test(test_reject_hand_off),
        cmocka_unit_test(test_reject_discipline_null),
        cmocka_unit_test(test_reject_quoted_number),
        cmocka_unit_test(test_reject_quoted_integer),
        cmocka_unit_test(test_reject_float_for_integer),
        cmocka_unit_test(test_reject_leading_zero),
        cmocka_unit_test(test_reject_infinite),
        cmocka_unit_test(test_reject_overflowing_number),
        cmocka_unit_test(test_reject_list_for_number),
        cmocka_unit_test(test_reject_half_life_zero),
        cmocka_unit_test(test_reject_discount_above_one),
        cmocka_unit_test(test_reject_clamp_below_one),
        cmocka_unit_test(test_reject_smoothing_zero),
        cmocka_unit_test(test_reject_queue_depth_zero),
        cmocka_unit_test(test_reject_queue_depth_huge),
        cmocka_unit_test(test_reject_negative_timeout),
        cmocka_unit_test(test_reject_negative_margin),
        cmocka_unit_test(test_reject_warmup_runs),
        cmocka_unit_test(test_reject_cold_defer),
        cmocka_unit_test(test_reject_eviction_policy),
        cmocka_unit_test(test_reject_weight_zero),
        cmocka_unit_test(test_reject_weight_negative),
        cmocka_unit_test(test_reject_model_queue_depth_zero),
        cmocka_unit_test(test_reject_model_timeout_negative),
        cmocka_unit_test(test_reject_meta_concurrency_zero),
        cmocka_unit_test(test_reject_meta_concurrency_huge),
        cmocka_unit_test(test_reject_meta_concurrency_quoted),
        cmocka_unit_test(test_reject_meta_unknown_key),
        cmocka_unit_test(test_reject_meta_not_mapping),
        cmocka_unit_test(test_reject_scratch_bytes_spaced),
        cmocka_unit_test(test_reject_scratch_bytes_negative),
        cmocka_unit_test(test_reject_scratch_bytes_null),
        cmocka_unit_test(test_reject_scratch_bytes_huge),
        cmocka_unit_test(test_reject_late_error_changes_nothing),
        cmocka_unit_test(test_reject_too_large),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_env_overrides),
        cmocka_unit_test(test_env_rejects),
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_set_rejects),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_second_file_merges),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
