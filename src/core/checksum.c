/*
 * checksum.c - the 64-bit byte-stream checksum (see checksum.h).
 *
 * Four independent lanes each take one 64-bit word of every 32-byte block (multiply, rotate, multiply), so the loop keeps four
 * multiplications in flight and runs at memory speed. A final block holds
 * the tail padded with zeros; the total length and the lanes are folded and
 * mixed so that every input bit reaches every output bit.
 */
#include "core/checksum.h"

#include <string.h>

#define K1 0x9f1bc5a7e3d26b49ULL
#define K2 0xd4e8a1c36b0f5973ULL
#define K3 0x8c3f0e5b2a71d6c5ULL

static inline uint64_t rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

/* A 64-bit word in the machine's byte order: sums are compared only within
 * one process, never stored or sent. */
static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void block(uint64_t lane[4], const unsigned char *p)
{
    for (int j = 0; j < 4; j++)
        lane[j] = rotl(lane[j] + load64(p + 8 * j) * K1, 31) * K2;
}

void pjs_checksum_init(pjs_checksum *c)
{
    memset(c, 0, sizeof *c);
    for (int j = 0; j < 4; j++)
        c->lane[j] = K3 * (uint64_t)(j + 1);
}

void pjs_checksum_update(pjs_checksum *c, const void *data, size_t len)
{
    const unsigned char *p = data;
    c->total += len;
    if (c->n_pending > 0) {
        size_t take = 32 - c->n_pending < len ? 32 - c->n_pending : len;
        memcpy(c->pending + c->n_pending, p, take);
        c->n_pending += take;
        p += take;
        len -= take;
        if (c->n_pending < 32)
            return;
        block(c->lane, c->pending);
        c->n_pending = 0;
    }
    for (; len >= 32; p += 32, len -= 32)
        block(c->lane, p);
    memcpy(c->pending, p, len);
    c->n_pending = len;
}

uint64_t pjs_checksum_final(const pjs_checksum *c)
{
    uint64_t lane[4];
    memcpy(lane, c->lane, sizeof lane);
    if (c->n_pending > 0) {
        unsigned char last[32] = {0};
        memcpy(last, c->pending, c->n_pending);
        block(lane, last);
    }
    uint64_t h = c->total * K3;
    for (int j = 0; j < 4; j++)
        h = rotl(h ^ lane[j], 27) * K1 + K2;
    h ^= h >> 33;
    h *= K2;
    h ^= h >> 29;
    h *= K3;
    h ^= h >> 32;
    return h;
}

uint64_t pjs_checksum_of(const void *data, size_t len)
{
    pjs_checksum c;
    pjs_checksum_init(&c);
    pjs_checksum_update(&c, data, len);
    return pjs_checksum_final(&c);
}
