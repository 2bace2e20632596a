/*
 * fuzz_safetensors.c - libFuzzer driver for the safetensors reader.
 *
 * Each input is parsed twice: first as a whole safetensors file, exactly as
 * given; then reframed as "JSON header, NUL byte, data" with the correct
 * length prefix put in front. The second form lets mutations that grow or
 * shrink the JSON reach the header validation instead of dying at the length
 * check, which is where most of the reader's branches are.
 *
 * On a successful parse the driver reads every byte of every tensor (so ASan
 * proves offsets and sizes stay inside the input), looks each tensor up by
 * name, and checks that sizes agree with shapes, aborting on any
 * inconsistency the validator should have caught.
 * Built with -fsanitize=fuzzer for fuzzing and with replay_main.c to replay
 * the seed corpus in `make test`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_tensor(const pjs_safetensors *st, const pjs_st_tensor *t)
{
    uint64_t nbytes;
    if (!pjs_shape_nbytes(&t->shape, pjs_dtype_size(t->dtype), &nbytes) || nbytes != t->nbytes)
        abort();
    if (t->offset > st->size || t->nbytes > st->size - t->offset)
        abort();
    if (pjs_safetensors_find(st, t->name) != t)
        abort();
}

static void parse_and_touch(const uint8_t *data, size_t size)
{
    pjs_safetensors st;
    pjs_error err;
    if (pjs_safetensors_parse(&st, data, size, "fuzz", &err) != 0) {
        pjs_safetensors_close(&st);
        return;
    }
    uint64_t total = 0;
    volatile unsigned sum = 0;
    for (size_t i = 0; i < st.n_tensors; i++) {
        const pjs_st_tensor *t = &st.tensors[i];
        check_tensor(&st, t);
        const unsigned char *p = pjs_safetensors_data(&st, t);
        for (uint64_t k = 0; k < t->nbytes; k++)
            sum += p[k];
        total += t->nbytes;
    }
    (void)sum; /* volatile: the reads above are not optimised away */
    if (total != pjs_safetensors_total_bytes(&st))
        abort();
    pjs_safetensors_close(&st);
}

/* Rebuilds `json NUL data` as prefix + json + data and parses that. */
static void parse_reframed(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul != NULL ? (size_t)(nul - data) : size;
    size_t rest = nul != NULL ? size - json_len - 1 : 0;
    uint8_t *buf = malloc(8 + json_len + rest);
    if (buf == NULL)
        return;
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)json_len >> (8 * i));
    memcpy(buf + 8, data, json_len);
    if (rest > 0)
        memcpy(buf + 8 + json_len, nul + 1, rest);
    parse_and_touch(buf, 8 + json_len + rest);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_and_touch(data, size);
    if (size > 0)
        parse_reframed(data, size);
    return 0;
}
