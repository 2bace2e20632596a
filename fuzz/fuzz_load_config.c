/*
 * fuzz_load_config.c - libFuzzer driver for a load's configuration override
 * (src/server/load_config.c): the `config` parameter of RepositoryModelLoad
 * and POST /v2/repository/models/NAME/load, parsed and checked against a
 * bundle's manifest.
 *
 * Input: one selector byte (modulo 3: a model that coalesces, compiled at 1,
 * 4 and 8; one with an output without a batch axis; one without any batch
 * axis) then the config text. Every input must either be refused
 * INVALID_ARGUMENT with a message starting "config override" or yield an
 * override the server can serve: a cap of 0 exactly when the model has no
 * batch axis, else a compiled size with the served sizes ending at it;
 * coalescing only where the model's tensors allow it; a queue bound and
 * default timeout in the configuration's ranges. The same text (up to its
 * first NUL) as the key of a load parameter: ignored unless it begins
 * "file:", which is refused UNSUPPORTED or, for a path no model directory
 * could hold, IO. Seeds: fuzz/corpus/fuzz_load_config/.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sched/coalesce.h"
#include "server/config.h"
#include "server/load_config.h"

static const char *const manifests[] = {
    "format_version: \"2.0\"\nname: mlp\nbatch_sizes: [1, 4, 8]\ninputs:\n"
    "  - {name: x, dtype: f32, shape: [batch, 16]}\noutputs:\n"
    "  - {name: y, dtype: f32, shape: [batch, 4]}\n",
    "format_version: \"2.0\"\nname: pooled\nbatch_sizes: [1, 8]\ninputs:\n"
    "  - {name: x, dtype: f32, shape: [batch, 4]}\noutputs:\n"
    "  - {name: total, dtype: f32, shape: [4]}\n",
    "format_version: \"2.0\"\nname: fixed\nbatch_sizes: [1]\ninputs:\n"
    "  - {name: img, dtype: u8, shape: [4, 5, 3], format: NHWC}\noutputs:\n"
    "  - {name: out, dtype: i64, shape: [2]}\n",
};
static const char *const names[] = {"mlp", "pooled", "fixed"};

static void check_refusal(int rc, const pjs_error *err)
{
    if (rc != PJS_ERR_INVALID_ARGUMENT || strncmp(err->msg, "config override", 15) != 0)
        abort();
}

static void check_override(const pjs_manifest *m, const pjs_load_override *ov)
{
    bool batched = m->inputs[0].batched;
    if (ov->n_served_sizes < 1 || ov->n_served_sizes > m->n_batch_sizes)
        abort();
    if (batched ? ov->max_batch_size != m->batch_sizes[ov->n_served_sizes - 1]
                : ov->max_batch_size != 0 || ov->n_served_sizes != m->n_batch_sizes)
        abort();
    if (ov->coalesce && !pjs_model_coalesces(m, ov->max_batch_size))
        abort();
    if (ov->default_timeout_us < -1 || ov->default_timeout_us > PJS_CONFIG_MAX_DURATION_US ||
        ov->max_queue_depth > PJS_CONFIG_MAX_QUEUE_DEPTH)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t which = data[0] % 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    pjs_manifest m;
    pjs_error err;
    if (pjs_manifest_parse(&m, manifests[which], strlen(manifests[which]), names[which], &err) !=
        0)
        abort();
    pjs_load_config *c = NULL;
    int rc = pjs_load_config_parse(names[which], text, len, &c, &err);
    if (rc == 0) {
        const char *copy = pjs_load_config_text(c);
        if (memcmp(copy, text, len) != 0 || copy[len] != '\0')
            abort();
        pjs_load_override ov;
        rc = pjs_load_config_apply(c, names[which], "pjrt_cpu", &m, &ov, &err);
        if (rc == 0)
            check_override(&m, &ov);
    }
    if (rc != 0)
        check_refusal(rc, &err);
    pjs_load_config_free(c);

    char *key = strndup(text, len);
    if (key == NULL)
        abort();
    rc = pjs_load_parameter_check(names[which], key, &err);
    bool is_file = strncmp(key, "file:", 5) == 0;
    if (is_file ? rc != PJS_ERR_UNSUPPORTED && rc != PJS_ERR_IO : rc != 0)
        abort();
    free(key);
    pjs_manifest_free(&m);
    return 0;
}
