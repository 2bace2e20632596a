/*
 * arena.c - a bump allocator over a list of malloc'd blocks.
 *
 * Small allocations are carved from 16 KiB blocks; anything larger than a
 * quarter block gets a block of its own, so a 1 GiB tensor costs exactly
 * one malloc and wastes nothing. Blocks are freed together by reset;
 * rewind keeps one standard block for the arena's next use.
 */
#include "frontend/grpc/arena.h"

#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_BLOCK_BYTES (16u * 1024u)
#define ARENA_ALIGN (alignof(max_align_t))

struct pjs_grpc_arena_block {
    pjs_grpc_arena_block *next;
    size_t size; /* usable bytes after the header */
    alignas(max_align_t) unsigned char data[];
};

static void *arena_pb_alloc(void *ctx, size_t n)
{
    return pjs_grpc_arena_alloc(ctx, n);
}

static void arena_pb_free(void *ctx, void *p)
{
    (void)ctx;
    (void)p; /* freed with the arena */
}

void pjs_grpc_arena_init(pjs_grpc_arena *a, size_t limit)
{
    memset(a, 0, sizeof *a);
    a->limit = limit;
    a->allocator.alloc = arena_pb_alloc;
    a->allocator.free = arena_pb_free;
    a->allocator.allocator_data = a;
}

void pjs_grpc_arena_reset(pjs_grpc_arena *a)
{
    pjs_grpc_arena_block *b = a->blocks;
    while (b != NULL) {
        pjs_grpc_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->blocks = NULL;
    a->used = 0;
    a->total = 0;
    a->exhausted = false;
}

void pjs_grpc_arena_rewind(pjs_grpc_arena *a)
{
    pjs_grpc_arena_block *kept = NULL;
    pjs_grpc_arena_block *b = a->blocks;
    while (b != NULL) {
        pjs_grpc_arena_block *next = b->next;
        if (kept == NULL && b->size == ARENA_BLOCK_BYTES)
            kept = b;
        else
            free(b);
        b = next;
    }
    if (kept != NULL)
        kept->next = NULL;
    a->blocks = kept;
    a->used = 0;
    a->total = 0;
    a->exhausted = false;
}

static pjs_grpc_arena_block *arena_new_block(size_t size)
{
    if (size > SIZE_MAX - sizeof(pjs_grpc_arena_block))
        return NULL;
    pjs_grpc_arena_block *b = malloc(sizeof *b + size);
    if (b != NULL)
        b->size = size;
    return b;
}

void *pjs_grpc_arena_alloc(pjs_grpc_arena *a, size_t n)
{
    if (n == 0)
        n = 1;
    size_t rounded = (n + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
    if (rounded < n || rounded > a->limit - a->total) {
        a->exhausted = true;
        return NULL;
    }
    if (rounded > ARENA_BLOCK_BYTES / 4) {
        /* A block of its own, linked behind the head so the head keeps
         * filling. */
        pjs_grpc_arena_block *big = arena_new_block(rounded);
        if (big == NULL)
            return NULL;
        if (a->blocks == NULL) {
            big->next = NULL;
            a->blocks = big;
            a->used = rounded;
        } else {
            big->next = a->blocks->next;
            a->blocks->next = big;
        }
        a->total += rounded;
        return big->data;
    }
    if (a->blocks == NULL || a->blocks->size - a->used < rounded) {
        pjs_grpc_arena_block *b = arena_new_block(ARENA_BLOCK_BYTES);
        if (b == NULL)
            return NULL;
        b->next = a->blocks;
        a->blocks = b;
        a->used = 0;
    }
    void *p = a->blocks->data + a->used;
    a->used += rounded;
    a->total += rounded;
    return p;
}

void *pjs_grpc_arena_calloc(pjs_grpc_arena *a, size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    void *p = pjs_grpc_arena_alloc(a, n * size);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

char *pjs_grpc_arena_strdup(pjs_grpc_arena *a, const char *s)
{
    size_t len = strlen(s);
    char *p = pjs_grpc_arena_alloc(a, len + 1);
    if (p != NULL)
        memcpy(p, s, len + 1);
    return p;
}
