/*
 * dtype.c - the element-type table (see dtype.h).
 */
#include "core/dtype.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

struct dtype_info {
    size_t size;
    const char *name;
    const char *safetensors;
    const char *kserve;
    const char *mlir;
    const char *numpy;
    int pjrt; /* PJRT_Buffer_Type */
    int xla;  /* xla::PrimitiveType */
};

static const struct dtype_info table[PJS_DTYPE_COUNT] = {
    [PJS_DTYPE_INVALID] = {0, "invalid", "", "", "", NULL, 0, 0},
    [PJS_DTYPE_BOOL] = {1, "bool", "BOOL", "BOOL", "i1", "|b1", 1, 1},
    [PJS_DTYPE_I8] = {1, "i8", "I8", "INT8", "i8", "|i1", 2, 2},
    [PJS_DTYPE_I16] = {2, "i16", "I16", "INT16", "i16", "<i2", 3, 3},
    [PJS_DTYPE_I32] = {4, "i32", "I32", "INT32", "i32", "<i4", 4, 4},
    [PJS_DTYPE_I64] = {8, "i64", "I64", "INT64", "i64", "<i8", 5, 5},
    [PJS_DTYPE_U8] = {1, "u8", "U8", "UINT8", "ui8", "|u1", 6, 6},
    [PJS_DTYPE_U16] = {2, "u16", "U16", "UINT16", "ui16", "<u2", 7, 7},
    [PJS_DTYPE_U32] = {4, "u32", "U32", "UINT32", "ui32", "<u4", 8, 8},
    [PJS_DTYPE_U64] = {8, "u64", "U64", "UINT64", "ui64", "<u8", 9, 9},
    [PJS_DTYPE_F16] = {2, "f16", "F16", "FP16", "f16", "<f2", 10, 10},
    [PJS_DTYPE_F32] = {4, "f32", "F32", "FP32", "f32", "<f4", 11, 11},
    [PJS_DTYPE_F64] = {8, "f64", "F64", "FP64", "f64", "<f8", 12, 12},
    [PJS_DTYPE_BF16] = {2, "bf16", "BF16", "BF16", "bf16", NULL, 13, 16},
    [PJS_DTYPE_BYTES] = {0, "bytes", "", "BYTES", "", NULL, 0, 0},
};

static const struct dtype_info *info(pjs_dtype t)
{
    if ((int)t <= PJS_DTYPE_INVALID || t >= PJS_DTYPE_COUNT)
        return &table[PJS_DTYPE_INVALID];
    return &table[t];
}

size_t pjs_dtype_size(pjs_dtype t) { return info(t)->size; }
const char *pjs_dtype_name(pjs_dtype t) { return info(t)->name; }
const char *pjs_dtype_safetensors_name(pjs_dtype t) { return info(t)->safetensors; }
const char *pjs_dtype_kserve_name(pjs_dtype t) { return info(t)->kserve; }
const char *pjs_dtype_mlir_name(pjs_dtype t) { return info(t)->mlir; }
const char *pjs_dtype_numpy_descr(pjs_dtype t) { return info(t)->numpy; }
int pjs_dtype_to_pjrt(pjs_dtype t) { return info(t)->pjrt; }
int pjs_dtype_to_xla(pjs_dtype t) { return info(t)->xla; }

/* Which column of the table a lookup compares against. */
enum column { COL_NAME, COL_SAFETENSORS, COL_KSERVE, COL_MLIR, COL_NUMPY };

static const char *column_of(const struct dtype_info *d, enum column c)
{
    switch (c) {
    case COL_NAME: return d->name;
    case COL_SAFETENSORS: return d->safetensors;
    case COL_KSERVE: return d->kserve;
    case COL_MLIR: return d->mlir;
    case COL_NUMPY: return d->numpy;
    }
    return NULL;
}

static pjs_dtype lookup(enum column c, const char *s, size_t len, bool nocase)
{
    if (s == NULL || len == 0)
        return PJS_DTYPE_INVALID;
    for (int t = PJS_DTYPE_INVALID + 1; t < PJS_DTYPE_COUNT; t++) {
        const char *cand = column_of(&table[t], c);
        if (cand == NULL || strlen(cand) != len)
            continue;
        if (nocase ? strncasecmp(cand, s, len) == 0 : memcmp(cand, s, len) == 0)
            return (pjs_dtype)t;
    }
    return PJS_DTYPE_INVALID;
}

pjs_dtype pjs_dtype_parse(const char *name, size_t len)
{
    pjs_dtype t = lookup(COL_NAME, name, len, true);
    return t != PJS_DTYPE_INVALID ? t : lookup(COL_KSERVE, name, len, true);
}

pjs_dtype pjs_dtype_from_safetensors(const char *name, size_t len)
{
    return lookup(COL_SAFETENSORS, name, len, false);
}

pjs_dtype pjs_dtype_from_kserve(const char *name, size_t len)
{
    return lookup(COL_KSERVE, name, len, false);
}

pjs_dtype pjs_dtype_from_mlir(const char *name, size_t len)
{
    return lookup(COL_MLIR, name, len, false);
}

pjs_dtype pjs_dtype_from_numpy_descr(const char *descr, size_t len)
{
    /* Single-byte types may be written with any byte-order mark. */
    if (len == 3 && (descr[0] == '<' || descr[0] == '|' || descr[0] == '=') && descr[2] == '1') {
        char canon[3] = {'|', descr[1], '1'};
        return lookup(COL_NUMPY, canon, 3, false);
    }
    if (len == 3 && descr[0] == '=') {
        char canon[3] = {'<', descr[1], descr[2]};
        return lookup(COL_NUMPY, canon, 3, false);
    }
    return lookup(COL_NUMPY, descr, len, false);
}

pjs_dtype pjs_dtype_from_pjrt(int pjrt_type)
{
    for (int t = PJS_DTYPE_INVALID + 1; t < PJS_DTYPE_COUNT; t++)
        if (table[t].pjrt != 0 && table[t].pjrt == pjrt_type)
            return (pjs_dtype)t;
    return PJS_DTYPE_INVALID;
}

pjs_dtype pjs_dtype_from_xla(int xla_type)
{
    for (int t = PJS_DTYPE_INVALID + 1; t < PJS_DTYPE_COUNT; t++)
        if (table[t].xla != 0 && table[t].xla == xla_type)
            return (pjs_dtype)t;
    return PJS_DTYPE_INVALID;
}
