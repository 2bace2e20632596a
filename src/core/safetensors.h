/*
 * safetensors.h - a validating reader of safetensors files.
 *
 * File layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON,
 * then the data region. The JSON maps tensor names to
 * {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (offsets
 * relative to the data region) plus an optional "__metadata__" object of
 * string values. pjserve requires the metadata key "argument_order": a JSON
 * list (encoded as a string) naming every tensor exactly once, in the order the
 * compiled modules take them as arguments.
 *
 * The whole header is validated before any tensor byte is touched: JSON
 * syntax, offsets within the file, no overlapping tensors, known dtypes, sizes
 * consistent with shapes, argument_order a permutation of the tensor names.
 * Every rejection names the file (the `label`) and the offending field.
 *
 * A pjs_safetensors borrows its bytes (pjs_safetensors_parse) or owns a
 * mapping (pjs_safetensors_open). Read-only after opening; safe to share.
 */
#ifndef PJS_CORE_SAFETENSORS_H
#define PJS_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/shape.h"
#include "core/status.h"

/* Largest JSON header accepted (the format's own limit is 100 MB). */
#define PJS_SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u)

typedef struct pjs_st_tensor {
    char *name;
    pjs_dtype dtype;
    pjs_shape shape;
    uint64_t offset; /* absolute byte offset of the data in the file */
    uint64_t nbytes;
} pjs_st_tensor;

typedef struct pjs_safetensors {
    pjs_mapped_file map;           /* the mapping when opened from a path */
    const unsigned char *bytes;    /* the whole file */
    size_t size;
    size_t n_tensors;
    pjs_st_tensor *tensors;        /* in argument order */
} pjs_safetensors;

/* Validates `bytes` (not copied; must outlive st). `label` names the file in
 * errors. Tensors are stored in argument_order order. */
int pjs_safetensors_parse(pjs_safetensors *st, const unsigned char *bytes, size_t size,
                          const char *label, pjs_error *err);
/* Maps and validates the file at path. */
int pjs_safetensors_open(pjs_safetensors *st, const char *path, pjs_error *err);
void pjs_safetensors_close(pjs_safetensors *st);

/* NULL when no tensor has that name. */
const pjs_st_tensor *pjs_safetensors_find(const pjs_safetensors *st, const char *name);
/* Pointer to the tensor's bytes inside the mapping (unaligned in general). */
const void *pjs_safetensors_data(const pjs_safetensors *st, const pjs_st_tensor *t);
/* Sum of all tensors' nbytes: the model's weight footprint. */
uint64_t pjs_safetensors_total_bytes(const pjs_safetensors *st);

#endif
