/*
 * test_bundle_read.c - reading every weight of a bundle, by one thread or
 * several (pjs_bundle_read_weights).
 *
 * A bundle of many weights of uneven sizes is written to a temporary
 * directory; read by 1, 3 and 8 threads, every weight must hold its own
 * bytes, and once sealed a weight rewritten in place must be refused
 * whichever thread reads it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "registry/bundle.h"

enum { N_WEIGHTS = 37 };

static char root[] = "/tmp/pjs-test-bundle-read-XXXXXX";
static char dir[sizeof root + 8]; /* root/wide: a bundle is named after its directory */
static uint64_t offsets[N_WEIGHTS + 1]; /* data offsets, in bytes */

/* Weight i's element j. */
static float value(size_t i, size_t j) { return (float)(i * 100003 + j % 65521); }

static size_t elements(size_t i) { return i % 6 == 0 ? 65536 * (1 + i % 4) : 7 + 13 * i; }

static void write_file(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    if (mkdtemp(root) == NULL)
        return -1;
    snprintf(dir, sizeof dir, "%s/wide", root);
    if (mkdir(dir, 0700) != 0)
        return -1;
    write_file("manifest.yaml", "format_version: \"2.0\"\n"
                                "name: \"wide\"\n"
                                "kind: model\n"
                                "batch_sizes: [1]\n"
                                "inputs:\n"
                                "  - {name: \"x\", dtype: f32, shape: [batch, 4]}\n"
                                "outputs:\n"
                                "  - {name: \"y\", dtype: f32, shape: [batch, 4]}\n");
    write_file("model.b1.mlir", "module @wide {}\n");
    /* the header: every weight, then argument_order naming them in order */
    size_t cap = 64 * N_WEIGHTS + 64 * N_WEIGHTS + 256;
    char *json = malloc(cap), *order = malloc(16 * N_WEIGHTS + 8);
    assert_non_null(json);
    assert_non_null(order);
    size_t at = 0, oat = 0;
    oat += (size_t)snprintf(order + oat, 8, "[");
    at += (size_t)snprintf(json + at, cap - at, "{");
    for (size_t i = 0; i < N_WEIGHTS; i++) {
        offsets[i + 1] = offsets[i] + elements(i) * sizeof(float);
        at += (size_t)snprintf(json + at, cap - at,
                               "\"w%02zu\":{\"dtype\":\"F32\",\"shape\":[%zu],"
                               "\"data_offsets\":[%llu,%llu]},",
                               i, elements(i), (unsigned long long)offsets[i],
                               (unsigned long long)offsets[i + 1]);
        oat += (size_t)snprintf(order + oat, 16, "%s\\\"w%02zu\\\"", i ? "," : "", i);
    }
    snprintf(order + oat, 8, "]");
    at += (size_t)snprintf(json + at, cap - at, "\"__metadata__\":{\"argument_order\":\"%s\"}}",
                           order);
    char path[256];
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = at;
    fwrite(&n, sizeof n, 1, f);
    fwrite(json, 1, at, f);
    for (size_t i = 0; i < N_WEIGHTS; i++)
        for (size_t j = 0; j < elements(i); j++) {
            float v = value(i, j);
            fwrite(&v, sizeof v, 1, f);
        }
    fclose(f);
    free(json);
    free(order);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    const char *names[] = {"manifest.yaml", "model.b1.mlir", "weights.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    rmdir(root);
    return 0;
}

static void **alloc_host(void)
{
    void **host = calloc(N_WEIGHTS, sizeof *host);
    assert_non_null(host);
    for (size_t i = 0; i < N_WEIGHTS; i++) {
        host[i] = aligned_alloc(64, (elements(i) * sizeof(float) + 63) / 64 * 64);
        assert_non_null(host[i]);
        memset(host[i], 0xAB, elements(i) * sizeof(float));
    }
    return host;
}

static void free_host(void **host)
{
    for (size_t i = 0; i < N_WEIGHTS; i++)
        free(host[i]);
    free(host);
}

static pjs_bundle *open_bundle(void)
{
    pjs_bundle *b = NULL;
    pjs_error err;
    if (pjs_bundle_open(dir, &b, &err) != 0)
        fail_msg("%s", err.msg);
    return b;
}

static void test_every_weight_read_by_any_number_of_threads(void **state)
{
    (void)state;
    pjs_bundle *b = open_bundle();
    pjs_error err;
    size_t threads[] = {1, 3, 8};
    for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
        void **host = alloc_host();
        assert_int_equal(pjs_bundle_read_weights(b, host, threads[k], &err), 0);
        for (size_t i = 0; i < N_WEIGHTS; i++) {
            const float *w = host[i];
            for (size_t j = 0; j < elements(i); j++)
                assert_true(w[j] == value(i, j));
        }
        free_host(host);
        if (k == 0) /* later reads are checked against the first one's sums */
            assert_int_equal(pjs_bundle_seal_weights(b, &err), 0);
    }
    pjs_bundle_close(b);
}

static void test_a_weight_rewritten_in_place_is_refused_by_every_reader(void **state)
{
    (void)state;
    pjs_bundle *b = open_bundle();
    pjs_error err;
    assert_int_equal(pjs_bundle_seal_weights(b, &err), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    uint64_t header;
    assert_int_equal(fread(&header, sizeof header, 1, f), 1);
    float changed = -1.0f; /* weight 17's third element */
    fseek(f, (long)(8 + header + offsets[17] + 2 * sizeof(float)), SEEK_SET);
    fwrite(&changed, sizeof changed, 1, f);
    fclose(f);
    size_t threads[] = {1, 4};
    for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
        void **host = alloc_host();
        assert_int_equal(pjs_bundle_read_weights(b, host, threads[k], &err),
                         PJS_ERR_FAILED_PRECONDITION);
        assert_non_null(strstr(err.msg, "weights refused"));
        free_host(host);
    }
    pjs_bundle_close(b);
}

static void test_thread_count_follows_size_and_cpus(void **state)
{
    (void)state;
    pjs_bundle *b = open_bundle();
    /* a few MB of weights: below the size that is worth more threads */
    assert_int_equal(pjs_bundle_read_threads(b), 1);
    pjs_bundle_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_weight_read_by_any_number_of_threads),
        cmocka_unit_test(test_thread_count_follows_size_and_cpus),
        /* last: it changes the file */
        cmocka_unit_test(test_a_weight_rewritten_in_place_is_refused_by_every_reader),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
