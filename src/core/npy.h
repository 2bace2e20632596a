/*
 * npy.h - numpy .npy files: reading (validated) and writing.
 *
 * Reads format versions 1.0, 2.0 and 3.0, C order, little-endian, the dtypes
 * of dtype.h. bf16 arrays are written by ml_dtypes with the descr "<V2" and
 * no further marker, so they are read as bf16 only when the caller expects
 * bf16 (see pjs_npy_parse). numpy's fixed-width strings ("|S<n>" bytes,
 * "<U<n>" unicode) are read as a BYTES tensor in pjserve's serialized form
 * (core/bytes.h): each element without its trailing NUL padding, unicode as
 * UTF-8. Everything else is refused with a message that names the file and
 * the header field.
 */
#ifndef PJS_CORE_NPY_H
#define PJS_CORE_NPY_H

#include <stddef.h>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"

/* Largest .npy header accepted. */
#define PJS_NPY_MAX_HEADER 65536u

typedef struct pjs_npy {
    pjs_dtype dtype;
    pjs_shape shape;
    void *data;     /* owned, malloc'd, nbytes long (may be NULL when 0) */
    size_t nbytes;
} pjs_npy;

/* Parses bytes into a fresh array (data copied). `void2_as` is the dtype to
 * give a "<V2"/"|V2" array (PJS_DTYPE_BF16 or PJS_DTYPE_INVALID to refuse). */
int pjs_npy_parse(pjs_npy *a, const unsigned char *bytes, size_t size, pjs_dtype void2_as,
                  const char *label, pjs_error *err);
int pjs_npy_load(pjs_npy *a, const char *path, pjs_dtype void2_as, pjs_error *err);
/* Writes a version 1.0 file; bf16 is written as "<V2" like ml_dtypes does. */
int pjs_npy_save(const char *path, pjs_dtype dtype, const pjs_shape *shape, const void *data,
                 pjs_error *err);
/* Writes a BYTES tensor (serialized, nbytes long, shape's element count of
 * strings) as "|S<n>", n its longest element; refuses an element that ends
 * with a NUL byte (numpy would drop it when reading). */
int pjs_npy_save_bytes(const char *path, const pjs_shape *shape, const void *data, size_t nbytes,
                       pjs_error *err);
void pjs_npy_free(pjs_npy *a);

#endif
