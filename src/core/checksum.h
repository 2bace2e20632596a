/*
 * checksum.h - a fast 64-bit checksum of byte streams, to tell whether bytes
 * read again are the bytes read before (weights re-read from their file).
 *
 * Not cryptographic: it detects changed bytes (a file rewritten or
 * truncated under us), it does not authenticate them against someone who
 * crafts a collision. The bytes may be fed in pieces of any size; the result
 * depends only on the concatenated bytes (and the machine's byte order: a
 * sum is compared only within the process that took it). A pjs_checksum is
 * a plain value owned by one thread; no globals.
 */
#ifndef PJS_CORE_CHECKSUM_H
#define PJS_CORE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

typedef struct pjs_checksum {
    uint64_t lane[4];
    uint64_t total;             /* bytes fed so far */
    unsigned char pending[32];  /* the start of an incomplete block */
    size_t n_pending;
} pjs_checksum;

void pjs_checksum_init(pjs_checksum *c);
void pjs_checksum_update(pjs_checksum *c, const void *data, size_t len);
uint64_t pjs_checksum_final(const pjs_checksum *c);
/* The checksum of one buffer. */
uint64_t pjs_checksum_of(const void *data, size_t len);

#endif
