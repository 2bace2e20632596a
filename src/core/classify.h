/*
 * classify.h - the classification extension: an output's best classes as
 * strings instead of the output itself.
 *
 * A client asks for it per requested output with a class count K (gRPC: the
 * output's "classification" int64 parameter; REST: "classification" in the
 * output's parameters). Each row of the output (the batch axis left out;
 * the whole tensor when the output has none) is ranked by value, highest
 * first, ties by lower index, NaN last, and its best min(K, row elements)
 * entries become BYTES strings "score:index", or "score:index:label" when
 * the manifest gives the output a labels file with a non-empty line for
 * that index. Scores are written as Triton writes them: integers in
 * decimal, floating-point values with six decimals ("%f"). The classified
 * output has shape [batch, min(K, row elements)], or [min(K, elements)]
 * without a batch axis, and replaces the tensor in either protocol's
 * response (raw contents, JSON strings or HTTP binary data alike).
 *
 * Every numeric dtype can be classified (f16 and bf16 too); bool and bytes
 * cannot. Pure functions over caller-owned memory; any thread.
 */
#ifndef PJS_CORE_CLASSIFY_H
#define PJS_CORE_CLASSIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/infer.h"
#include "core/manifest.h"
#include "core/shape.h"
#include "core/status.h"

/* Whether outputs of this dtype have classes to rank (numbers). */
bool pjs_classify_supported(pjs_dtype t);

/* The check made when a request asks to classify output `spec` of `model`:
 * INVALID_ARGUMENT, naming both, unless its dtype is supported. */
int pjs_classify_check(const pjs_tensor_spec *spec, const char *model, pjs_error *err);

/* Classifies the tensor at data (dtype, shape; exactly numel * size bytes;
 * `batched`: shape's first extent is the batch axis) keeping the best k of
 * each row, k >= 1, with names from labels (may be NULL). *out is a fresh
 * buffer (free()) of *out_nbytes bytes in the serialized BYTES form, with
 * *out_shape its shape. */
int pjs_classify(const void *data, pjs_dtype dtype, const pjs_shape *shape, bool batched,
                 uint64_t k, const pjs_labels *labels, void **out, size_t *out_nbytes,
                 pjs_shape *out_shape, pjs_error *err);

/* Replaces each output of r that the client asked to classify
 * (requested[...].class_count > 0) by its classification: the data is freed
 * and replaced, the shape set, and the spec pointed at the requested
 * output's class_spec (BYTES, same name). Outputs already replaced are left
 * as they are, so a second call changes nothing. Front ends call it before
 * encoding a response. */
int pjs_classify_outputs(pjs_infer_request *r, pjs_error *err);

#endif
