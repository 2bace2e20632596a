/*
 * tensor_json.h - tensor elements as KServe V2 JSON "data" lists.
 *
 * Decoding turns a JSON list (flat, or nested in row-major order as Triton
 * accepts it) into packed little-endian elements of a datatype: numbers for
 * every numeric type (FP16 and BF16 rounded to nearest even), true/false or
 * 0/1 for BOOL. Encoding writes a flat list, floats with enough digits to
 * round-trip and NaN/Infinity spelled as Python's json module reads them.
 * Pure functions; any thread.
 */
#ifndef PJS_FRONTEND_HTTP_TENSOR_JSON_H
#define PJS_FRONTEND_HTTP_TENSOR_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "frontend/http/http_buf.h"

/* Number of scalars in a JSON list, nested lists flattened. INVALID_ARGUMENT
 * when `data` is not a list or holds objects or strings; `what` names the
 * tensor in messages ("input \"x\""). */
int pjs_tensor_json_count(const json_t *data, const char *what, size_t *out_count,
                          pjs_error *err);

/* Writes the scalars of `data` (exactly `count` of them, as counted above) as
 * `dt` into out[count * pjs_dtype_size(dt)]. INVALID_ARGUMENT for a value
 * the datatype cannot hold (a fraction or an out-of-range integer for an
 * integer type, a non-boolean for BOOL). */
int pjs_tensor_json_decode(const json_t *data, pjs_dtype dt, const char *what, void *out,
                           size_t count, pjs_error *err);

/* Appends `count` elements of `dt` from `data` as a flat JSON list. */
int pjs_tensor_json_encode(pjs_http_buf *b, pjs_dtype dt, const void *data, size_t count,
                           pjs_error *err);

/* IEEE half and bfloat16 from and to float, rounding to nearest even. */
uint16_t pjs_f32_to_f16(float f);
float pjs_f16_to_f32(uint16_t h);
uint16_t pjs_f32_to_bf16(float f);
float pjs_bf16_to_f32(uint16_t h);

#endif
