/*
 * shape.h - tensor shapes: a rank and up to PJS_MAX_RANK extents.
 *
 * Shapes read from untrusted bytes are checked with pjs_shape_numel, which
 * refuses negative extents and products that overflow, before anything is
 * sized from them.
 */
#ifndef PJS_CORE_SHAPE_H
#define PJS_CORE_SHAPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PJS_MAX_RANK 8

typedef struct pjs_shape {
    int rank;
    int64_t dims[PJS_MAX_RANK];
} pjs_shape;

/* Number of elements; false when an extent is negative or the product (or
 * product times elem_size) does not fit in int64. */
bool pjs_shape_numel(const pjs_shape *s, int64_t *out_numel);
bool pjs_shape_nbytes(const pjs_shape *s, size_t elem_size, uint64_t *out_nbytes);

bool pjs_shape_equal(const pjs_shape *a, const pjs_shape *b);

/* Writes "[4, 8]" (or "[]" for a scalar) into buf; returns buf. */
char *pjs_shape_format(const pjs_shape *s, char *buf, size_t bufsize);

#endif
