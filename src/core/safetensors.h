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
 * A pjs_safetensors borrows its bytes (pjs_safetensors_parse) or reads a
 * file (pjs_safetensors_open): then only the header is read at open and the
 * descriptor stays open, until pjs_safetensors_release_fd closes it (a
 * catalogue of 10,000 models would otherwise hold 10,000 descriptors);
 * tensors are read with pjs_safetensors_read, which refuses a file whose
 * identity changed since it was opened (never a memory map: a truncated
 * mapping raises SIGBUS). Without its descriptor a read opens the path
 * again, so a file replaced there since (renamed over it) is refused too.
 * Read-only after opening (but for the release); safe to share.
 */
#ifndef PJS_CORE_SAFETENSORS_H
#define PJS_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/checksum.h"
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
    const unsigned char *bytes;    /* the whole file when parsed from memory; else NULL */
    size_t size;                   /* bytes of the file */
    int fd;                        /* opened from a path: the descriptor kept open; else -1 */
    char *path;                    /* opened from a path: it (owned); else NULL */
    pjs_file_identity identity;    /* opened from a path: the file when it was opened */
    size_t n_tensors;
    pjs_st_tensor *tensors;        /* in argument order */
} pjs_safetensors;

/* Validates `bytes` (not copied; must outlive st). `label` names the file in
 * errors. Tensors are stored in argument_order order. */
int pjs_safetensors_parse(pjs_safetensors *st, const unsigned char *bytes, size_t size,
                          const char *label, pjs_error *err);
/* Reads and validates the header of the file at path, keeping the file
 * open for pjs_safetensors_read. */
int pjs_safetensors_open(pjs_safetensors *st, const char *path, pjs_error *err);
void pjs_safetensors_close(pjs_safetensors *st);
/* Closes the descriptor of a file opened from a path; later reads open the
 * path for their own use and check it is still the file opened. Not
 * concurrently with a read. */
void pjs_safetensors_release_fd(pjs_safetensors *st);

/* NULL when no tensor has that name. */
const pjs_st_tensor *pjs_safetensors_find(const pjs_safetensors *st, const char *name);
/* Pointer to the tensor's bytes in memory (unaligned in general); only for
 * a pjs_safetensors parsed from memory (NULL for an opened file). */
const void *pjs_safetensors_data(const pjs_safetensors *st, const pjs_st_tensor *t);
/* Copies bytes [begin, begin + n) of the tensor (within t->nbytes) into
 * dst, from memory or the file.
 * For a file: FAILED_PRECONDITION when it is no longer the file opened
 * (written or truncated since: its size or modification time differ), IO when it cannot be read; both
 * name the file. */
/* Reads the whole tensor into dst, summing it into *sum piece by piece
 * while each piece is in the cache (one pass over memory), through one
 * descriptor (the kernel's read-ahead follows it); errors as
 * pjs_safetensors_read. */
int pjs_safetensors_read_summed(const pjs_safetensors *st, const pjs_st_tensor *t, void *dst,
                                pjs_checksum *sum, pjs_error *err);
int pjs_safetensors_read(const pjs_safetensors *st, const pjs_st_tensor *t, uint64_t begin,
                         size_t n, void *dst, pjs_error *err);
/* Sum of all tensors' nbytes: the model's weight footprint. */
uint64_t pjs_safetensors_total_bytes(const pjs_safetensors *st);

#endif
