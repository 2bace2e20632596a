/*
 * dtype.h - the element types pjserve moves between clients, files and PJRT.
 *
 * One table maps each type to every spelling we meet: the manifest name
 * ("f32"), the safetensors name ("F32"), the KServe V2 datatype ("FP32"), the
 * numpy type string ("<f4"), the MLIR element type ("f32") and the PJRT buffer
 * type. Only the types that KServe V2 (as Triton speaks it) and safetensors
 * share are here, and KServe's BYTES (strings), which only clients, hooks and
 * meta models see. The table is constant; any thread may read it.
 */
#ifndef PJS_CORE_DTYPE_H
#define PJS_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum pjs_dtype {
    PJS_DTYPE_INVALID = 0,
    PJS_DTYPE_BOOL,
    PJS_DTYPE_U8,
    PJS_DTYPE_U16,
    PJS_DTYPE_U32,
    PJS_DTYPE_U64,
    PJS_DTYPE_I8,
    PJS_DTYPE_I16,
    PJS_DTYPE_I32,
    PJS_DTYPE_I64,
    PJS_DTYPE_F16,
    PJS_DTYPE_BF16,
    PJS_DTYPE_F32,
    PJS_DTYPE_F64,
    /* Variable-length strings (KServe BYTES): each element a 4-byte
     * little-endian length and that many bytes, one after another. Clients,
     * hooks and meta models exchange them; no executable takes or returns
     * them, and they have no fixed element size (pjs_dtype_size is 0). */
    PJS_DTYPE_BYTES,
    PJS_DTYPE_COUNT
} pjs_dtype;

/* Bytes per element; 0 for PJS_DTYPE_INVALID and PJS_DTYPE_BYTES. */
size_t pjs_dtype_size(pjs_dtype t);

/* Canonical (manifest) name, e.g. "f32", "bf16", "bool"; "invalid" otherwise. */
const char *pjs_dtype_name(pjs_dtype t);
const char *pjs_dtype_safetensors_name(pjs_dtype t); /* "F32", "BF16", "BOOL" */
const char *pjs_dtype_kserve_name(pjs_dtype t);      /* "FP32", "BF16", "BOOL" */
const char *pjs_dtype_mlir_name(pjs_dtype t);        /* "f32", "bf16", "i1", "ui8" */
/* numpy array-protocol type string for little-endian files ("<f4", "|b1");
 * NULL for bf16, which numpy has no builtin type for. */
const char *pjs_dtype_numpy_descr(pjs_dtype t);

/* PJRT_Buffer_Type value of the type (0 for invalid). */
int pjs_dtype_to_pjrt(pjs_dtype t);
pjs_dtype pjs_dtype_from_pjrt(int pjrt_type);
/* XLA PrimitiveType value (as in HLO protos); differs from PJRT for BF16. */
int pjs_dtype_to_xla(pjs_dtype t);
pjs_dtype pjs_dtype_from_xla(int xla_type);

/* Parsers return PJS_DTYPE_INVALID for unknown names. `len` bounds the name,
 * which need not be NUL-terminated. The manifest parser accepts the canonical
 * name and the KServe name, case-insensitively. */
pjs_dtype pjs_dtype_parse(const char *name, size_t len);
pjs_dtype pjs_dtype_from_safetensors(const char *name, size_t len);
pjs_dtype pjs_dtype_from_kserve(const char *name, size_t len);
pjs_dtype pjs_dtype_from_mlir(const char *name, size_t len);
pjs_dtype pjs_dtype_from_numpy_descr(const char *descr, size_t len);

#endif
